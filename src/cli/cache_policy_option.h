// --cache-policy, the expert cache's eviction policy on run, chat, serve, bench, perplexity and plan:
// one option, checked against the store's own list of policies (storage::eviction_names), and one
// place that turns the name into the store's EvictionKind, so a new policy needs no command edited.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "storage/eviction_policy.h"

namespace sluice::cli {

// Registers --cache-policy on `sub`, storing the name in `name` (whose value is the default).
CLI::Option* add_cache_policy_option(CLI::App* sub, std::string& name);

// The policy `name` selects; UsageError (exit 2) naming the choices when it is none of them.
storage::EvictionKind cache_policy_kind(const std::string& name);

}  // namespace sluice::cli
