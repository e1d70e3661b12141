// Reaching the worker from a handler thread, with the 503 answers every endpoint gives: the
// model still loading or failed, or the queue full.
#pragma once
#include <memory>

#include "runtime/session.h"
#include "server/context.h"

namespace sluice::server {

// The loaded session, or ApiError 503 ("loading" / "failed to load").
const Session& ready_session(ServerContext& ctx);

// Queues the request; ApiError 503 with Retry-After when the queue is full.
std::shared_ptr<Job> submit(ServerContext& ctx, GenerateRequest r);

}  // namespace sluice::server
