// Opens every file of the hand-made corpus (tests/make_gguf_corpus.py) and checks that the
// malformed ones fail with the expected message and the valid_* controls open.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "util/error.h"

namespace fs = std::filesystem;
using namespace sluice;

namespace {

struct Entry {
  std::string file;
  std::string expect;
};

const fs::path kDir = fs::path(SLUICE_TEST_DATA) / "gguf_corpus";

std::vector<Entry> manifest() {
  std::ifstream in(kDir / "MANIFEST.txt");
  std::vector<Entry> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    out.push_back({line.substr(0, sp), line.substr(sp + 1)});
  }
  return out;
}

}  // namespace

TEST(GgufMalformed, ManifestCoversTheCorpus) {
  auto entries = manifest();
  ASSERT_GE(entries.size(), 100u) << "manifest missing or truncated in " << kDir;
  std::set<std::string> listed;
  for (const auto& e : entries) {
    EXPECT_TRUE(listed.insert(e.file).second) << "listed twice: " << e.file;
    EXPECT_FALSE(e.expect.empty()) << e.file;
    EXPECT_TRUE(fs::exists(kDir / e.file)) << e.file;
    EXPECT_EQ(e.file.rfind("valid_", 0) == 0, e.expect == "OK") << e.file;
  }
  for (const auto& f : fs::directory_iterator(kDir)) {
    if (f.path().extension() != ".gguf") continue;
    EXPECT_TRUE(listed.count(f.path().filename().string())) << "not in MANIFEST.txt: " << f.path();
    EXPECT_LT(fs::file_size(f.path()), 64u * 1024) << f.path();
  }
}

TEST(GgufMalformed, EveryFileFailsAsExpected) {
  int valid = 0, invalid = 0;
  for (const auto& e : manifest()) {
    const std::string path = (kDir / e.file).string();
    if (e.expect == "OK") {
      ++valid;
      try {
        gguf::File f = gguf::File::open(path);
        for (const auto& t : f.tensors()) {
          // The whole payload of a valid file must be readable.
          std::vector<uint8_t> buf(t.nbytes);
          f.read_bytes(t, 0, buf.data(), t.nbytes);
        }
      } catch (const std::exception& ex) {
        ADD_FAILURE() << e.file << " should open but threw: " << ex.what();
      }
      continue;
    }
    ++invalid;
    try {
      gguf::File::open(path);
      ADD_FAILURE() << e.file << " opened but should fail with '" << e.expect << "'";
    } catch (const FormatError& ex) {
      EXPECT_NE(std::string(ex.what()).find(e.expect), std::string::npos)
          << e.file << ": message '" << ex.what() << "' lacks '" << e.expect << "'";
      // A FormatError always names a field and a byte offset inside (or at the end of) the file.
      EXPECT_FALSE(ex.field.empty()) << e.file;
      EXPECT_LE(ex.offset, fs::file_size(path)) << e.file << ": " << ex.what();
    } catch (const std::exception& ex) {
      ADD_FAILURE() << e.file << ": expected a FormatError, got: " << ex.what();
    }
  }
  EXPECT_GE(valid, 5);
  EXPECT_GE(invalid, 90);
}

TEST(GgufMalformed, BadTensorTypesAreFormatErrorsNamingTheField) {
  try {
    gguf::File::open((kDir / "tensor_type_31.gguf").string());
    FAIL() << "type 31 accepted";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.field, "tensor[0](t).type");
  }
}

TEST(GgufMalformed, HeaderLimitIsEnforced) {
  gguf::Limits lim;
  lim.max_header_bytes = 40;  // valid_basic.gguf's KVs go well past byte 40
  try {
    gguf::File::open((kDir / "valid_basic.gguf").string(), lim);
    FAIL() << "max_header_bytes ignored";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("max_header_bytes"), std::string::npos) << e.what();
  }
  lim = {};
  lim.max_kv = 2;
  EXPECT_THROW(gguf::File::open((kDir / "valid_basic.gguf").string(), lim), FormatError);
  lim = {};
  lim.max_tensors = 3;
  EXPECT_THROW(gguf::File::open((kDir / "valid_basic.gguf").string(), lim), FormatError);
  lim = {};
  lim.max_array = 2;  // test.names has 3 elements
  EXPECT_THROW(gguf::File::open((kDir / "valid_basic.gguf").string(), lim), FormatError);
  lim = {};
  lim.max_string = 3;  // general.architecture = "test"
  EXPECT_THROW(gguf::File::open((kDir / "valid_basic.gguf").string(), lim), FormatError);
  lim = {};
  lim.max_dim = 7;  // tok.weight has ne[0] = 8
  EXPECT_THROW(gguf::File::open((kDir / "valid_basic.gguf").string(), lim), FormatError);
  EXPECT_NO_THROW(gguf::File::open((kDir / "valid_basic.gguf").string()));
}

TEST(GgufMalformed, NonFilesAreRejected) {
  EXPECT_THROW(gguf::File::open((kDir / "does_not_exist.gguf").string()), Error);
  EXPECT_THROW(gguf::File::open(kDir.string()), Error);  // a directory
}
