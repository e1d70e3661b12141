#include "server/request_body.h"

#include <string>

#include "server/api_error.h"
#include "server/request_json.h"
#include "text/json_cost.h"
#include "util/format_bytes.h"

namespace sluice::server {

nlohmann::json parse_charged_body(ServerContext& ctx, const HttpRequest& req, Connection& conn, uint64_t work_per_byte,
                                  uint64_t fixed_bytes) {
  const uint64_t need = text::json_tree_bound(req.body) + work_per_byte * req.body.size() + fixed_bytes;
  const RequestMemory::Take t = ctx.memory.take(need, conn.memory);
  const std::string pool = format_bytes(ctx.memory.capacity());
  if (t == RequestMemory::Take::Busy) {
    ApiError e(503, "unavailable_error",
               "the server's request memory (" + pool + ", --request-memory) is held by other requests; retry later");
    e.retry_after = 1;
    e.refusal = "request_memory";
    throw e;
  }
  if (t == RequestMemory::Take::TooLarge) {
    ApiError e(413, "invalid_request_error",
               "this request needs " + format_bytes(need + conn.memory.bytes()) +
                   " of working memory (its body, the parsed JSON and what is built from it), more than the "
                   "server's request memory (" + pool + ", --request-memory)");
    e.refusal = "too_large";
    throw e;
  }
  return parse_body(req.body, ctx.opts.max_json_depth);
}

}  // namespace sluice::server
