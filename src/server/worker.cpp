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

Worker::Worker(Factory factory, size_t queue_depth, uint32_t prefill_step, std::function<void(State)> on_state,
               std::function<void(const std::string&)> on_step_error)
    : depth_(queue_depth), prefill_step_(prefill_step), on_step_error_(std::move(on_step_error)),
      on_state_(std::move(on_state)) {
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
  // depth_ counts the jobs waiting behind the running ones: free slots take jobs first (the
  // ones the worker is about to start), so --queue 0 still runs one request per slot.
  if (running_ + queue_.size() >= slots_ + depth_) return false;
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
    for (auto& j : current_)
      if (j) j->cancel(CancelCause::Shutdown);
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
    slots_ = session_->parallel();
    current_.assign(slots_, nullptr);
  } catch (const std::exception& e) {
    {
      std::lock_guard lk(mu_);
      load_error_ = e.what();
    }
    set_state(State::Failed);
    return;
  }
  set_state(State::Ready);

  // Jobs that ended during a start() or step(), with their last event. Their slots are counted
  // free before the events go out: a client that sends its next request on this answer finds
  // room (with --queue 0 it would otherwise be refused).
  struct Ended {
    uint32_t slot;
    JobEvent event;
  };
  std::vector<Ended> ended;
  auto events_for = [&](uint32_t k, const std::shared_ptr<Job>& job) {
    Session::SlotEvents ev;
    ev.on_prefill = [job](uint32_t done, uint32_t total) {
      job->push(JobEvent::make(JobEvent::Kind::Prefill, done, total));
      return !job->cancelled.load();
    };
    ev.on_token = [job](TokenId id) {
      job->push(JobEvent::make(JobEvent::Kind::Token, id));
      return !job->cancelled.load();
    };
    ev.on_done = [this, &ended, k, job](GenerateResult r) {
      JobEvent done;
      done.kind = JobEvent::Kind::Done;
      if (r.finish == Finish::Cancelled) {
        if (job->cancel_reason == CancelCause::Shutdown) counters_.cancelled_shutdown++;
        else if (job->cancel_reason == CancelCause::StopString) counters_.completed++;  // a stop string ended it
        else counters_.cancelled_disconnect++;
      } else {
        counters_.completed++;
      }
      counters_.reused_tokens += r.reused_tokens;
      done.result = std::move(r);
      ended.push_back({k, std::move(done)});
    };
    ev.on_failed = [this, &ended, k](const std::string& msg) {
      counters_.failed++;
      ended.push_back({k, failed(500, msg)});
    };
    return ev;
  };
  auto publish = [&] {
    SessionStats st = session_->stats();
    std::vector<std::pair<std::shared_ptr<Job>, JobEvent>> out;
    {
      std::lock_guard lk(mu_);
      stats_ = std::move(st);
      for (Ended& e : ended) {
        out.emplace_back(std::move(current_[e.slot]), std::move(e.event));
        --running_;
      }
    }
    ended.clear();
    for (auto& [job, ev] : out) job->push(std::move(ev));
  };

  auto last_stats = std::chrono::steady_clock::now();
  while (true) {
    std::vector<std::shared_ptr<Job>> starting;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || running_ > 0; });
      if (stop_) break;
      // Join at this step boundary, as many as there are free slots. A job counts as running
      // from the moment it leaves the queue, so submit() never sees its place as free.
      while (!queue_.empty() && running_ < slots_) {
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        if (job->cancelled) {
          JobEvent e;
          e.result.finish = Finish::Cancelled;
          job->push(std::move(e));
          continue;
        }
        starting.push_back(std::move(job));
        ++running_;
      }
    }
    // Each on the free slot sharing the most of its prompt; one at a time, as a start can end
    // its job at once (and free the slot again).
    for (std::shared_ptr<Job>& job : starting) {
      const int k = session_->pick_slot(job->request.prompt, job->request.scope);
      if (k < 0) throw Error("no free slot though fewer jobs run than there are slots");  // cannot happen
      {
        std::lock_guard lk(mu_);
        current_[(uint32_t)k] = job;
        // A shutdown since it left the queue did not see it on a slot.
        if (stop_) job->cancel(CancelCause::Shutdown);
      }
      job->push(JobEvent::make(JobEvent::Kind::Started));
      try {
        session_->start((uint32_t)k, job->request, events_for((uint32_t)k, job));
      } catch (const std::exception& e) {
        // Session::start rejects a bad request before touching the slot.
        counters_.failed++;
        ended.push_back({(uint32_t)k, failed(dynamic_cast<const Error*>(&e) ? 400 : 500, e.what())});
      }
      if (!ended.empty()) publish();
    }
    for (uint32_t k = 0; k < slots_; ++k) {
      std::shared_ptr<Job> job;
      {
        std::lock_guard lk(mu_);
        job = current_[k];
      }
      if (job && job->cancelled && session_->slot_busy(k)) session_->cancel(k);
    }
    if (!ended.empty()) publish();
    if (session_->busy_slots() == 0) continue;
    try {
      session_->step(prefill_step_);
    } catch (const std::exception& e) {
      // The step's requests ended with on_failed (their slots as before the step); the others
      // go on, unless the hook ends the process (after the failed requests heard of it).
      if (on_step_error_) {
        publish();
        on_step_error_(e.what());
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (!ended.empty() || now - last_stats > std::chrono::seconds(1)) {
      // Refresh the /metrics snapshot now and then during long generations.
      last_stats = now;
      publish();
    }
  }
  // Stopping: the running jobs end as cancelled (their handlers report "shutting down").
  for (uint32_t k = 0; k < slots_; ++k)
    if (session_->slot_busy(k)) session_->cancel(k);
  publish();
  set_state(State::Stopped);
}

}  // namespace sluice::server
