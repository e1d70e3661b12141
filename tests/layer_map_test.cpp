// The layer map is enforced by the build: each layer compiles against an include tree holding
// only its own folder and the folders below it (CMakeLists.txt, SLUICE_LAYER_MAP). This compiles
// one-line files against those same trees, as the build would: an include running up the map,
// or sideways between text and storage, must not compile; one running down must.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace sluice {
namespace {

// Whether `#include "<header>"` compiles in <layer>'s include tree.
bool compiles_in(const std::string& layer, const std::string& header, const std::string& dir) {
  const std::string src = dir + "/probe_" + layer + ".cpp";
  std::ofstream(src) << "#include \"" << header << "\"\nint probe_" << layer << ";\n";
  const std::string cmd = std::string("'") + SLUICE_CXX + "' -std=c++20 -fsyntax-only -I'" + SLUICE_LAYER_TREES + "/" +
                          layer + "' '" + src + "' >'" + dir + "/probe.log' 2>&1";
  const int rc = std::system(cmd.c_str());
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

TEST(LayerMap, UpwardIncludesDoNotCompile) {
  test::TempDir tmp("layer_map");
  const std::string dir = tmp.path.string();
  EXPECT_TRUE(compiles_in("model", "storage/expert_store.h", dir));
  EXPECT_TRUE(compiles_in("model", "backend/thread_pool.h", dir));
  EXPECT_TRUE(compiles_in("server", "runtime/session.h", dir));
  EXPECT_TRUE(compiles_in("kernels", "format/tensor_type.h", dir));
  EXPECT_FALSE(compiles_in("model", "runtime/session.h", dir));
  EXPECT_FALSE(compiles_in("model", "server/http.h", dir));
  EXPECT_FALSE(compiles_in("format", "kernels/types.h", dir));
  EXPECT_FALSE(compiles_in("kernels", "backend/thread_pool.h", dir));
  EXPECT_FALSE(compiles_in("text", "storage/expert_store.h", dir));
  EXPECT_FALSE(compiles_in("storage", "text/tokenizer.h", dir));
  EXPECT_FALSE(compiles_in("util", "format/gguf.h", dir));
  EXPECT_FALSE(compiles_in("runtime", "cli/commands.h", dir));
  EXPECT_TRUE(compiles_in("runtime", "fabric/frames.h", dir));
  EXPECT_FALSE(compiles_in("model", "fabric/fabric.h", dir));
  EXPECT_FALSE(compiles_in("fabric", "format/gguf.h", dir));
}

// One architecture's subfolders (model/deepseek41, text/deepseek41) belong to their layer: they
// are reachable where the layer is and nowhere else.
TEST(LayerMap, ArchitectureSubfoldersFollowTheirLayer) {
  test::TempDir tmp("layer_map_sub");
  const std::string dir = tmp.path.string();
  EXPECT_TRUE(compiles_in("model", "model/deepseek41/schema.h", dir));
  EXPECT_TRUE(compiles_in("runtime", "model/deepseek41/config.h", dir));
  EXPECT_TRUE(compiles_in("model", "text/deepseek41/chat.h", dir));
  EXPECT_TRUE(compiles_in("server", "text/deepseek41/dsml.h", dir));
  EXPECT_FALSE(compiles_in("text", "model/deepseek41/config.h", dir));
  EXPECT_FALSE(compiles_in("storage", "text/deepseek41/chat.h", dir));
  EXPECT_FALSE(compiles_in("format", "text/deepseek41/dsml.h", dir));
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// "name=dep,dep" entries of SLUICE_LAYER_MAP in CMakeLists.txt, in order, as "name: dep, dep"
// ("name: -" for none): the build's map.
std::vector<std::string> build_map(const std::string& cmake) {
  std::vector<std::string> out;
  const size_t at = cmake.find("set(SLUICE_LAYER_MAP");
  if (at == std::string::npos) return out;
  const std::string block = cmake.substr(at, cmake.find(')', at) - at);
  for (size_t q = block.find('"'); q != std::string::npos; q = block.find('"', block.find('"', q + 1) + 1)) {
    const std::string e = block.substr(q + 1, block.find('"', q + 1) - q - 1);
    const size_t eq = e.find('=');
    std::string deps = e.substr(eq + 1);
    for (size_t c = deps.find(','); c != std::string::npos; c = deps.find(',', c + 2)) deps.replace(c, 1, ", ");
    out.push_back(e.substr(0, eq) + ": " + (deps.empty() ? "-" : deps));
  }
  return out;
}

// The table at the top of docs/ARCHITECTURE.md, in the same form.
std::vector<std::string> doc_map(const std::string& doc) {
  std::vector<std::string> out;
  const size_t head = doc.find("layer     uses directly");
  if (head == std::string::npos) return out;
  std::istringstream lines(doc.substr(doc.find('\n', head) + 1));
  std::string line;
  while (std::getline(lines, line) && line.rfind("```", 0) != 0) {
    const size_t sp = line.find(' ');
    const size_t deps = line.find_first_not_of(' ', sp);
    out.push_back(line.substr(0, sp) + ": " + line.substr(deps));
  }
  return out;
}

TEST(LayerMap, TheArchitectureDocShowsTheBuildsMap) {
  const std::string root = std::string(SLUICE_TEST_DATA) + "/../..";
  const std::vector<std::string> built = build_map(test::slurp(root + "/CMakeLists.txt"));
  ASSERT_GE(built.size(), 10u);
  EXPECT_EQ(doc_map(test::slurp(root + "/docs/ARCHITECTURE.md")), built)
      << "docs/ARCHITECTURE.md's layer table differs from SLUICE_LAYER_MAP";
}

}  // namespace
}  // namespace sluice
