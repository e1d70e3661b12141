// The layer map is enforced by the build: each layer compiles against an include tree holding
// only its own folder and the folders below it (CMakeLists.txt, SLUICE_LAYER_MAP). This compiles
// one-line files against those same trees, as the build would: an include running up the map,
// or sideways between text and storage, must not compile; one running down must.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

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
