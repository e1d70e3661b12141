// Ranks that are threads of one process: a Hub holds the mailboxes, each thread gets the
// LocalFabric of its rank. Same semantics as MpiFabric (ordered per (from, to, tag), deadlines,
// size limits), so the expert-parallel protocol runs whole in a unit test. A test can make a
// rank stop answering (it simply does not recv) or inject raw frames with send().
#pragma once
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "fabric/fabric.h"

namespace sluice::fabric {

class LocalHub {
 public:
  explicit LocalHub(int ranks) : ranks_(ranks) {}
  int ranks() const { return ranks_; }

 private:
  friend class LocalFabric;
  using Key = std::tuple<int, int, uint32_t>;  // from, to, tag
  int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<uint8_t>>> boxes_;
  int aborted_ = 0;  // the code abort() was given; 0: running
};

class LocalFabric final : public Fabric {
 public:
  LocalFabric(LocalHub& hub, int rank);
  int rank() const override { return rank_; }
  int size() const override { return hub_.ranks(); }
  std::string_view name() const override { return "local"; }
  void send(int peer, uint32_t tag, std::vector<uint8_t> bytes) override;
  std::optional<std::vector<uint8_t>> recv(int peer, uint32_t tag, size_t max_bytes, Clock::time_point deadline) override;
  bool flush(Clock::time_point) override { return true; }
  void abort(int code) override;

 private:
  LocalHub& hub_;
  int rank_;
};

}  // namespace sluice::fabric
