#include "server/worker_access.h"

#include <string>

#include "server/api_error.h"

namespace sluice::server {

const Session& ready_session(ServerContext& ctx) {
  switch (ctx.worker.state()) {
    case Worker::State::Ready: return *ctx.worker.session();
    case Worker::State::Loading: {
      ApiError e(503, "unavailable_error", "Loading model");
      e.retry_after = 5;
      throw e;
    }
    default: throw ApiError(503, "unavailable_error", "the model is not available: " + ctx.worker.load_error());
  }
}

std::shared_ptr<Job> submit(ServerContext& ctx, GenerateRequest r) {
  auto job = std::make_shared<Job>(std::move(r));
  if (!ctx.worker.submit(job)) {
    ready_session(ctx);  // 503 "loading" rather than "full" while the model loads
    ApiError e(503, "unavailable_error",
               "the server is busy: " + std::to_string(ctx.opts.queue_depth) +
                   " requests are already waiting (--queue); retry later");
    e.retry_after = ctx.opts.retry_after_s;
    throw e;
  }
  return job;
}

}  // namespace sluice::server
