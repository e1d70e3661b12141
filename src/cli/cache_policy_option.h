// --cache-policy, the expert cache's eviction policy on run, chat, serve, bench, perplexity and plan:
// one option, checked against the store's own list of policies (storage::eviction_names), and one
// place that turns the name into the store's EvictionKind, so a new policy needs no command edited.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "storage/eviction_policy.h"

namespace sluice::cli {

// The default: on the trained model's routing (docs/routing.md) lfu-per-layer hit 40.0% of the
// expert lookups at a 25% cache where lru-per-layer hit 35.6% (17.6 / 15.5 at 10%, 65.8 / 63.4 at
// 50%), and it was ahead on the random-weight twin too.
inline constexpr const char* kDefaultCachePolicy = "lfu-per-layer";

// Registers --cache-policy on `sub`, storing the name in `name` (whose value is the default).
CLI::Option* add_cache_policy_option(CLI::App* sub, std::string& name);

// The policy `name` selects; UsageError (exit 2) naming the choices when it is none of them.
storage::EvictionKind cache_policy_kind(const std::string& name);

}  // namespace sluice::cli
