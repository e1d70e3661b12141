// The server's worker with --parallel (issue 13 item 2): jobs submitted at once run together on
// the Session's slots and each gets the tokens it gets alone; the queue refuses only beyond
// parallel + queue; cancelled jobs end as cancelled and free their slots; shutdown ends the
// running ones.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/session.h"
#include "server/worker.h"

namespace sluice::server {
namespace {

namespace fs = std::filesystem;

class WorkerParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-worker-parallel-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static SessionOptions options(uint32_t parallel) {
    SessionOptions so;
    so.model_path = path_;
    so.ctx = 1024;
    so.chunk = 16;
    so.threads = 2;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;
    so.stream_experts = false;
    so.parallel = parallel;
    return so;
  }
  static GenerateRequest request(uint32_t k, uint32_t max_tokens) {
    GenerateRequest r;
    for (uint32_t i = 0; i < 4 + 7 * k; ++i) r.prompt.push_back((i * 31u + 17u * k + 5u) % 200u);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temp = 0.8f;
    r.sampling.seed = 7 + k;
    return r;
  }
  static std::unique_ptr<Worker> ready_worker(uint32_t parallel, size_t queue) {
    auto w = std::make_unique<Worker>([parallel] { return std::make_unique<Session>(options(parallel)); }, queue, 4);
    for (int i = 0; i < 2000 && w->state() == Worker::State::Loading; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(w->state(), Worker::State::Ready) << w->load_error();
    return w;
  }
  // Follows a job to its last event.
  static JobEvent last_event(Job& j, std::vector<TokenId>* tokens = nullptr, const Worker* w = nullptr,
                             size_t* most_running = nullptr) {
    for (int i = 0; i < 6000; ++i) {
      if (w) *most_running = std::max(*most_running, w->running());
      std::vector<JobEvent> evs;
      j.wait(evs, std::chrono::milliseconds(10));
      for (JobEvent& e : evs) {
        if (e.kind == JobEvent::Kind::Token && tokens) tokens->push_back(e.a);
        if (e.kind == JobEvent::Kind::Done || e.kind == JobEvent::Kind::Failed) return e;
      }
    }
    ADD_FAILURE() << "the job never ended";
    return {};
  }

  static fs::path dir_;
  static std::string path_;
};

fs::path WorkerParallel::dir_;
std::string WorkerParallel::path_;

TEST_F(WorkerParallel, JobsRunTogetherAndEachGetsItsTokensAlone) {
  auto w = ready_worker(3, 4);
  std::vector<std::shared_ptr<Job>> jobs;
  for (uint32_t k = 0; k < 7; ++k) {
    jobs.push_back(std::make_shared<Job>(request(k, 12)));
    ASSERT_TRUE(w->submit(jobs.back())) << "job " << k << " (3 slots + 4 waiting)";
  }
  size_t most = 0;
  std::vector<std::vector<TokenId>> streamed(jobs.size());
  std::vector<JobEvent> ends;
  for (size_t k = 0; k < jobs.size(); ++k) {
    ends.push_back(last_event(*jobs[k], &streamed[k], w.get(), &most));
  }
  Session alone(options(1));
  for (uint32_t k = 0; k < jobs.size(); ++k) {
    SCOPED_TRACE("job " + std::to_string(k));
    ASSERT_EQ(ends[k].kind, JobEvent::Kind::Done) << ends[k].error;
    EXPECT_EQ(ends[k].result.finish, Finish::Length);
    const GenerateResult want = alone.generate(request(k, 12), {}, {});
    EXPECT_EQ(ends[k].result.tokens, want.tokens);
    EXPECT_EQ(streamed[k], want.tokens);
  }
  EXPECT_GE(most, 2u) << "the jobs never ran together";
  EXPECT_EQ(w->counters().completed.load(), 7u);
  EXPECT_EQ(w->running(), 0u);
}

TEST_F(WorkerParallel, TheQueueRefusesOnlyBeyondParallelPlusQueueAndCancelFreesSlots) {
  auto w = ready_worker(3, 1);
  std::vector<std::shared_ptr<Job>> jobs;
  for (uint32_t k = 0; k < 4; ++k) {
    jobs.push_back(std::make_shared<Job>(request(k, 900)));  // long enough to still run below
    ASSERT_TRUE(w->submit(jobs.back())) << "job " << k;
  }
  auto extra = std::make_shared<Job>(request(5, 4));
  EXPECT_FALSE(w->submit(extra)) << "a 5th job was taken by 3 slots and a queue of 1";
  // Again while the worker may be moving jobs from the queue onto slots: a job between the two
  // still holds its place.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_FALSE(w->submit(extra)) << "a 5th job was taken while the others were starting";
  for (int i = 0; i < 2000 && w->running() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(w->running(), 3u);
  for (auto& j : jobs) j->cancel(CancelCause::ClientGone);
  for (size_t k = 0; k < jobs.size(); ++k) {
    const JobEvent e = last_event(*jobs[k]);
    ASSERT_EQ(e.kind, JobEvent::Kind::Done) << e.error;
    EXPECT_EQ(e.result.finish, Finish::Cancelled) << "job " << k;
    EXPECT_LT(e.result.tokens.size(), 900u) << "job " << k;
  }
  EXPECT_TRUE(w->submit(extra));
  const JobEvent e = last_event(*extra);
  EXPECT_EQ(e.result.finish, Finish::Length);

  // Shutdown ends the running jobs as cancelled.
  auto a = std::make_shared<Job>(request(1, 900)), b = std::make_shared<Job>(request(2, 900));
  ASSERT_TRUE(w->submit(a));
  ASSERT_TRUE(w->submit(b));
  for (int i = 0; i < 2000 && w->running() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  w->stop();
  EXPECT_EQ(last_event(*a).result.finish, Finish::Cancelled);
  EXPECT_EQ(last_event(*b).result.finish, Finish::Cancelled);
  EXPECT_EQ(w->counters().cancelled_shutdown.load(), 2u);
}

}  // namespace
}  // namespace sluice::server
