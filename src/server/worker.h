// The one thread that owns the Session, and the bounded queue in front of it. HTTP handler
// threads submit Jobs and read the Job's events (prefill progress, token ids, the result); the
// worker never touches a socket, so a slow or vanished client cannot stall generation for the
// others. With --parallel N the worker runs up to N jobs at once on the Session's slots
// (continuous batching): a job joins at the next step boundary on the free slot that shares the
// most of its prompt, its prefill goes in pieces beside the others' decode (at most
// prefill_step prompt tokens per step while any stream decodes), and its slot is free for the
// next job as soon as it ends. A handler cancels by setting Job::cancelled: the worker ends the
// job at the next step (or its callbacks return false first), and a job still in the queue is
// dropped unrun.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/session.h"

namespace sluice::server {

struct JobEvent {
  enum class Kind { Started, Prefill, Token, Done, Failed };
  static JobEvent make(Kind k, uint32_t a = 0, uint32_t b = 0) {
    JobEvent e;
    e.kind = k;
    e.a = a;
    e.b = b;
    return e;
  }
  Kind kind = Kind::Done;
  uint32_t a = 0, b = 0;       // Prefill: done, total; Token: id
  GenerateResult result;       // Done
  int status = 500;            // Failed: HTTP status (400: the request, 500: the engine, 503: shutdown)
  std::string error;           // Failed
};

// Why a job was cancelled (the first cause wins).
enum class CancelCause : uint8_t {
  None,
  ClientGone,  // the client disconnected
  Shutdown,    // the server is stopping
  StopString,  // a stop string matched in the text (the request is complete)
};

class Job {
 public:
  explicit Job(GenerateRequest r) : request(std::move(r)) {}
  const GenerateRequest request;
  std::atomic<bool> cancelled{false};
  std::atomic<CancelCause> cancel_reason{CancelCause::None};

  void cancel(CancelCause reason) {
    CancelCause none = CancelCause::None;
    cancel_reason.compare_exchange_strong(none, reason);
    cancelled = true;
  }
  void push(JobEvent e);
  // Moves every pending event into `out`; waits up to `timeout` when there is none.
  void wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

// Counters the worker keeps besides the Session's own (read by /metrics).
struct WorkerCounters {
  std::atomic<uint64_t> completed{0}, cancelled_disconnect{0}, cancelled_shutdown{0}, failed{0};
  std::atomic<uint64_t> reused_tokens{0};
};

class Worker {
 public:
  enum class State { Loading, Ready, Failed, Stopped };
  using Factory = std::function<std::unique_ptr<Session>()>;

  // Starts the thread, which builds the Session with `factory` (loading can take minutes; the
  // server answers /health with 503 meanwhile). queue_depth: jobs that may wait behind the
  // running ones (as many run as the Session has slots). prefill_step: see above (0: the
  // chunk). on_state is called from the worker thread on every state change.
  // on_step_error: see ServerOptions.
  Worker(Factory factory, size_t queue_depth, uint32_t prefill_step = 0, std::function<void(State)> on_state = {},
         std::function<void(const std::string&)> on_step_error = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  State state() const { return state_.load(); }
  std::string load_error() const;
  // Null unless Ready. Its const accessors (tokenizer, config, ctx, model_id) are safe from any
  // thread; generate() belongs to the worker.
  // The loaded session, also after the worker stopped: a handler that was given its job before
  // a shutdown still follows it to the end (the session lives until the Worker is destroyed,
  // which is after every connection has closed). Null while loading or after a failed load.
  const Session* session() const {
    return state_ == State::Ready || state_ == State::Stopped ? session_.get() : nullptr;
  }

  // false when every slot is taken and queue_depth jobs wait already (or the worker is not Ready).
  bool submit(std::shared_ptr<Job> job);
  size_t waiting() const;
  bool busy() const { return running_.load() > 0; }
  size_t running() const { return running_.load(); }  // jobs on slots now
  // The Session's stats as of the end of the last job (or a moment during the running one).
  SessionStats stats() const;
  const WorkerCounters& counters() const { return counters_; }

  // Refuses new jobs, cancels the running ones (their handlers report "shutting down") and fails
  // the queued ones with 503, without waiting: handlers can still write their error events.
  void shutdown();
  // shutdown(), then joins the thread.
  void stop();

 private:
  void run(Factory factory);
  void set_state(State s);

  size_t depth_;
  uint32_t prefill_step_;
  std::function<void(const std::string&)> on_step_error_;
  std::function<void(State)> on_state_;
  std::atomic<State> state_{State::Loading};
  std::atomic<size_t> running_{0};
  size_t slots_ = 1;                 // the Session's, once loaded
  std::unique_ptr<Session> session_;
  WorkerCounters counters_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> current_;  // per slot; null: free
  bool stop_ = false;
  std::string load_error_;
  SessionStats stats_;
  std::thread thread_;
};

}  // namespace sluice::server
