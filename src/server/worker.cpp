#include "server/worker.h"

#include <exception>

#include "util/error.h"

namespace sluice::server {

void Job::push(JobEvent e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void Job::wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (events_.empty()) cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
}

namespace {
JobEvent failed(int status, std::string msg) {
  JobEvent e;
  e.kind = JobEvent::Kind::Failed;
  e.status = status;
  e.error = std::move(msg);
  return e;
}
}  // namespace

Worker::Worker(Factory factory, size_t queue_depth, std::function<void(State)> on_state)
    : depth_(queue_depth), on_state_(std::move(on_state)) {
  thread_ = std::thread([this, f = std::move(factory)]() mutable { run(std::move(f)); });
}

Worker::~Worker() { stop(); }

std::string Worker::load_error() const {
  std::lock_guard lk(mu_);
  return load_error_;
}

void Worker::set_state(State s) {
  state_ = s;
  if (on_state_) on_state_(s);
}

bool Worker::submit(std::shared_ptr<Job> job) {
  std::lock_guard lk(mu_);
  if (stop_ || state_ != State::Ready) return false;
  // Jobs whose clients left are dropped here too, so they do not hold places in the queue.
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled) {
      JobEvent e;
      e.result.finish = Finish::Cancelled;
      (*it)->push(std::move(e));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  // depth_ counts the jobs waiting behind the running one: an idle worker takes one more (the
  // job it is about to run), so --queue 0 still runs one request at a time.
  if (queue_.size() >= depth_ + (current_ ? 0 : 1)) return false;
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return true;
}

size_t Worker::waiting() const {
  std::lock_guard lk(mu_);
  return queue_.size();
}

SessionStats Worker::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Worker::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    if (current_) current_->cancel(CancelCause::Shutdown);
    for (auto& j : queue_) j->push(failed(503, "the server is shutting down"));
    queue_.clear();
  }
  cv_.notify_all();
}

void Worker::stop() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

void Worker::run(Factory factory) {
  try {
    auto s = factory();
    std::lock_guard lk(mu_);
    session_ = std::move(s);
    stats_ = session_->stats();
  } catch (const std::exception& e) {
    {
      std::lock_guard lk(mu_);
      load_error_ = e.what();
    }
    set_state(State::Failed);
    return;
  }
  set_state(State::Ready);

  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      job = std::move(queue_.front());
      queue_.pop_front();
      if (job->cancelled) {
        JobEvent e;
        e.result.finish = Finish::Cancelled;
        job->push(std::move(e));
        continue;
      }
      current_ = job;
      running_ = true;
    }
    job->push(JobEvent::make(JobEvent::Kind::Started));
    bool prefill_called = false;
    auto last_stats = std::chrono::steady_clock::now();
    auto on_prefill = [&](uint32_t done, uint32_t total) {
      prefill_called = true;
      job->push(JobEvent::make(JobEvent::Kind::Prefill, done, total));
      return !job->cancelled.load();
    };
    auto on_token = [&](TokenId id) {
      job->push(JobEvent::make(JobEvent::Kind::Token, id));
      // Refresh the /metrics snapshot now and then during long generations.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_stats > std::chrono::seconds(1)) {
        last_stats = now;
        SessionStats st = session_->stats();
        std::lock_guard lk(mu_);
        stats_ = std::move(st);
      }
      return !job->cancelled.load();
    };
    JobEvent done;
    try {
      done.result = session_->generate(job->request, on_prefill, on_token);
      done.kind = JobEvent::Kind::Done;
      if (done.result.finish == Finish::Cancelled) {
        if (job->cancel_reason == CancelCause::Shutdown) counters_.cancelled_shutdown++;
        else if (job->cancel_reason == CancelCause::StopString) counters_.completed++;  // a stop string ended it
        else counters_.cancelled_disconnect++;
      } else {
        counters_.completed++;
      }
      counters_.reused_tokens += done.result.reused_tokens;
    } catch (const Error& e) {
      // Session::generate rejects a bad request before its first prefill callback.
      done = failed(prefill_called ? 500 : 400, e.what());
      counters_.failed++;
    } catch (const std::exception& e) {
      done = failed(500, e.what());
      counters_.failed++;
    }
    SessionStats st = session_->stats();
    {
      std::lock_guard lk(mu_);
      stats_ = std::move(st);
      current_.reset();
      running_ = false;
    }
    // Only now: a client that sends its next request on this answer finds the worker idle
    // (with --queue 0 it would otherwise be refused).
    job->push(std::move(done));
  }
  set_state(State::Stopped);
}

}  // namespace sluice::server
