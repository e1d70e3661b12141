// `sluice devices`: the Vulkan devices this machine offers (for --backend vulkan --device N).
// Registered like the other subcommands (see commands.h).
#pragma once
#include <CLI/CLI.hpp>

namespace sluice::cli {

struct DevicesOptions {
  bool json = false;
};
CLI::App* setup_devices(CLI::App& app, DevicesOptions& o);
int run_devices(const DevicesOptions& o);

}  // namespace sluice::cli
