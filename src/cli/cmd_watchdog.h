// `sluice watchdog`: runs a command in its own process group under memory limits
// (src/runtime/watchdog.h). Declared here rather than in commands.h (owned by the CLI); main.cpp
// registers it like the other subcommands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace sluice::cli {

struct WatchdogCommandOptions {
  std::string soft, hard, host_soft, host_hard;  // byte sizes; empty: off
  uint32_t interval_ms = 100;
  uint32_t kill_after_ms = 0;
  std::vector<std::string> command;
};
CLI::App* setup_watchdog(CLI::App& app, WatchdogCommandOptions& o);
// Returns the command's exit status (shell convention: code, or 128 + signal; 127: not started).
int run_watchdog(const WatchdogCommandOptions& o);

}  // namespace sluice::cli
