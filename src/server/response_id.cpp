#include "server/response_id.h"

#include <cstdio>
#include <random>

namespace sluice::server {

std::string new_id(ServerContext& ctx, const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%llx%08llx", prefix, (unsigned long long)ctx.next_id.fetch_add(1),
                (unsigned long long)(rng() & 0xffffffffu));
  return buf;
}

}  // namespace sluice::server
