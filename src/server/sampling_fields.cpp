#include "server/chat_request.h"

#include "runtime/sampler.h"
#include "server/api_error.h"
#include "server/request_json.h"
#include "util/error.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::optional<uint64_t> seed_field(const json& body) {
  const auto it = body.find("seed");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<uint64_t>();  // the whole uint64 range
  const int64_t v = *get_int(body, "seed");
  if (v == -1) return std::nullopt;
  if (v < 0) throw bad_request("'seed' must be an integer in [0, 2^64) (or -1: random)");
  return (uint64_t)v;
}

}  // namespace

SamplingFields sampling_fields(const json& body, std::optional<int64_t> max_tokens) {
  SamplingFields s;
  s.temperature = get_number(body, "temperature");
  s.top_p = get_number(body, "top_p");
  s.min_p = get_number(body, "min_p");
  s.top_k = get_int(body, "top_k");
  s.seed = seed_field(body);
  SamplingRequest r;
  r.temperature = s.temperature;
  r.top_p = s.top_p;
  r.min_p = s.min_p;
  r.top_k = s.top_k;
  r.max_tokens = max_tokens;
  try {
    check_sampling(r);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  return s;
}

std::optional<int64_t> openai_max_tokens(const json& body) {
  if (auto v = get_int(body, "max_completion_tokens")) return v;
  if (auto v = get_int(body, "max_tokens")) return v;
  return get_int(body, "n_predict");
}

}  // namespace sluice::server
