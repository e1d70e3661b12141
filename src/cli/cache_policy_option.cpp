#include "cli/cache_policy_option.h"

#include <vector>

#include "cli/commands.h"

namespace sluice::cli {

namespace {
std::vector<std::string> names() {
  std::vector<std::string> v;
  for (std::string_view n : storage::eviction_names()) v.emplace_back(n);
  return v;
}
std::string joined() {
  std::string s;
  for (const std::string& n : names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

CLI::Option* add_cache_policy_option(CLI::App* sub, std::string& name) {
  return sub
      ->add_option("--cache-policy", name,
                   "expert cache eviction: " + joined() +
                       " (lru-per-layer and lfu-per-layer give each layer an equal share of the slots; "
                       "lfu-per-layer keeps the most used experts, docs/storage.md)")
      ->check(CLI::IsMember(names()))
      ->capture_default_str();
}

storage::EvictionKind cache_policy_kind(const std::string& name) {
  const std::optional<storage::EvictionKind> k = storage::eviction_kind(name);
  if (!k) throw UsageError("--cache-policy " + name + " is not one of " + joined());
  return *k;
}

}  // namespace sluice::cli
