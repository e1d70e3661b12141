// `sluice chat`: an interactive conversation on the terminal. Each line read from stdin is a
// user turn; the reply streams to stdout as it is generated (reasoning, when thinking is on, to
// stderr), followed by a one-line summary on stderr. The whole conversation is re-rendered with
// DeepSeek's chat format each turn; the session's prefix reuse means only the new tokens are
// evaluated when the rendering extends the previous one (thinking off).
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cmd_run.h"

namespace sluice::cli {

struct ChatCommandOptions {
  std::string model;
  std::string system;
  std::string think = "off";  // on | off
  int64_t n_predict = 1024;   // per reply
  float temp = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int64_t top_k = 0;
  float min_p = 0.0f;
  uint32_t ctx = 0;           // 0: min(max_position_embeddings, 4096)
  EngineCliOptions engine;
  FabricCliOptions fabric;    // --fabric mpi: routed experts spread over the ranks (rank 0 chats)
};
CLI::App* setup_chat(CLI::App& app, ChatCommandOptions& o);
int run_chat(const ChatCommandOptions& o);

}  // namespace sluice::cli
