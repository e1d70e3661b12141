// `sluice serve`: the HTTP transport, the worker that owns the model, and the routing of
// endpoints to the OpenAI and Anthropic handlers. The model loads in the worker thread after
// the socket is bound, so /health answers 503 "Loading model" until it is ready.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "server/context.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/worker.h"

namespace sluice::server {

// What the server holds beside the engine, as lines of the plan the model is admitted with:
// the request memory (--request-memory) and the connections' and answers' own buffers.
std::vector<PlanLine> plan_lines(const ServerOptions& o, uint32_t parallel);

class Server {
 public:
  // model_id: what /v1/models reports (the alias, or the file name without .gguf).
  Server(ServerOptions opts, Worker::Factory factory, std::string model_id);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (port 0: any free port) and returns the port; loading starts here.
  uint16_t listen();
  // Serves until stop() or a failed load; then stops the worker. Throws Error with the load
  // error when the model could not be loaded.
  void serve();
  // From any thread: running and queued generations end with an error event ("shutting down"),
  // their handlers get up to kShutdownGrace to write it, then every connection is closed.
  void stop();

 private:
  void handle(const HttpRequest& req, Connection& conn);
  int route(const HttpRequest& req, Connection& conn);

  ServerOptions opts_;
  HttpCounters counters_;
  RequestMemory memory_;
  std::unique_ptr<HttpServer> http_;
  Worker::Factory factory_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<ServerContext> ctx_;
  std::string model_id_;
  // Requests inside handle(), so stop() can wait for them to write their last words.
  std::mutex active_mu_;
  std::condition_variable active_cv_;
  size_t active_ = 0;
};

}  // namespace sluice::server
