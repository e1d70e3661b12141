// Issue 53 finding 7: a model's identity (what state files are keyed by and what expert-parallel
// ranks compare) covers every byte of the file, so a model that differs anywhere, a weight deep
// in token_embd included, is never taken for the same one. The digest is cached per version of
// the file (device, inode, size, mtime, ctime) in a directory of this user's only.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "runtime/model_identity.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

void write_bytes(const std::string& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), (std::streamsize)b.size());
}

std::vector<char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> b(n);
  for (char& c : b) c = (char)rng();
  return b;
}

// Points the cache at `dir` for one test.
struct CacheDir {
  explicit CacheDir(const std::string& dir) { ::setenv("SLUICE_CACHE_DIR", dir.c_str(), 1); }
  ~CacheDir() { ::unsetenv("SLUICE_CACHE_DIR"); }
};

TEST(ModelIdentity, EveryByteCounts) {
  test::TempDir dir("sluice-identity");
  const CacheDir cache(dir / "cache");
  const std::vector<char> base = random_bytes(3u << 20, 1);
  // Bytes far from the start and from any sampling grid a shortcut might use.
  for (const size_t at : {size_t{0}, size_t{4096 + 100}, base.size() / 3 + 7, base.size() - 1}) {
    std::vector<char> other = base;
    other[at] ^= 0x01;
    write_bytes(dir / "a.gguf", base);
    write_bytes(dir / "b.gguf", other);
    EXPECT_NE(model_content_digest(dir / "a.gguf"), model_content_digest(dir / "b.gguf")) << at;
    EXPECT_NE(model_file_identity(dir / "a.gguf", 0.0f), model_file_identity(dir / "b.gguf", 0.0f)) << at;
  }
  write_bytes(dir / "c.gguf", base);
  EXPECT_EQ(model_file_identity(dir / "a.gguf", 0.0f), model_file_identity(dir / "c.gguf", 0.0f))
      << "a copy of the same bytes is the same model";
  EXPECT_NE(model_file_identity(dir / "a.gguf", 0.0f), model_file_identity(dir / "a.gguf", 0.25f))
      << "a lossy route bias changes what a state holds";
}

TEST(ModelIdentity, TheDigestIsCachedPerVersionOfTheFile) {
  test::TempDir dir("sluice-identity-cache");
  const CacheDir cache(dir / "cache");
  const std::string m = dir / "m.gguf";
  write_bytes(m, random_bytes(1u << 20, 2));
  const Digest128 first = model_file_identity(m, 0.0f);
  const fs::path file = fs::path(dir / "cache") / "model-identity";
  ASSERT_TRUE(fs::exists(file)) << "the digest was not cached";
  EXPECT_EQ(fs::status(file).permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
  std::string line;
  std::getline(std::ifstream(file), line);
  EXPECT_NE(line.find(digest_hex(model_content_digest(m)).data()), std::string::npos) << line;
  EXPECT_EQ(model_file_identity(m, 0.0f), first);

  // Rewritten in place with other bytes (a new mtime and ctime): hashed again, not taken from
  // the cache.
  write_bytes(m, random_bytes(1u << 20, 3));
  EXPECT_NE(model_file_identity(m, 0.0f), first);
  // A cache line that does not parse is ignored.
  std::ofstream(file, std::ios::trunc) << "garbage\n";
  EXPECT_EQ(model_file_identity(m, 0.0f), model_file_identity(m, 0.0f));
}

TEST(ModelIdentity, ACacheOthersCanWriteIsNotUsed) {
  test::TempDir dir("sluice-identity-open");
  const std::string c = dir / "cache";
  fs::create_directories(c);
  ::chmod(c.c_str(), 0777);
  const CacheDir cache(c);
  const std::string m = dir / "m.gguf";
  write_bytes(m, random_bytes(1u << 16, 4));
  const Digest128 id = model_file_identity(m, 0.0f);
  EXPECT_FALSE(fs::exists(fs::path(c) / "model-identity")) << "wrote to a cache others can write";
  // A forged entry there (another digest for this very version) is not believed.
  struct stat st {};
  ASSERT_EQ(::stat(m.c_str(), &st), 0);
  const auto ns = [](const struct timespec& t) { return std::to_string((int64_t)t.tv_sec * 1'000'000'000 + t.tv_nsec); };
  std::ofstream(fs::path(c) / "model-identity")
      << std::to_string((uint64_t)st.st_dev) << " " << std::to_string((uint64_t)st.st_ino) << " "
      << std::to_string((uint64_t)st.st_size) << " " << ns(st.st_mtim) << " " << ns(st.st_ctim) << " "
      << std::string(32, '0') << "\n";
  EXPECT_EQ(model_file_identity(m, 0.0f), id);
}

}  // namespace
}  // namespace sluice
