#include "fabric/local_fabric.h"

#include <string>

#include "util/error.h"

namespace sluice::fabric {

namespace {

void check_peer(int peer, int ranks) {
  if (peer < 0 || peer >= ranks)
    throw Error("fabric: no rank " + std::to_string(peer) + " (the job has " + std::to_string(ranks) + ")");
}

}  // namespace

LocalFabric::LocalFabric(LocalHub& hub, int rank) : hub_(hub), rank_(rank) { check_peer(rank, hub.ranks()); }

void LocalFabric::send(int peer, uint32_t tag, std::vector<uint8_t> bytes) {
  check_peer(peer, hub_.ranks());
  const uint64_t n = bytes.size();
  {
    std::lock_guard<std::mutex> lk(hub_.mu_);
    if (hub_.aborted_) throw Error("fabric: the job was aborted (code " + std::to_string(hub_.aborted_) + ")");
    hub_.boxes_[{rank_, peer, tag}].push_back(std::move(bytes));
  }
  hub_.cv_.notify_all();
  counters_.sent_messages += 1;
  counters_.sent_bytes += n;
}

std::optional<std::vector<uint8_t>> LocalFabric::recv(int peer, uint32_t tag, size_t max_bytes,
                                                      Clock::time_point deadline) {
  check_peer(peer, hub_.ranks());
  std::unique_lock<std::mutex> lk(hub_.mu_);
  std::deque<std::vector<uint8_t>>& box = hub_.boxes_[{peer, rank_, tag}];
  auto ready = [&] { return hub_.aborted_ != 0 || !box.empty(); };
  if (deadline == Clock::time_point::max())
    hub_.cv_.wait(lk, ready);
  else if (!hub_.cv_.wait_until(lk, deadline, ready))
    return std::nullopt;
  if (hub_.aborted_) throw Error("fabric: the job was aborted (code " + std::to_string(hub_.aborted_) + ")");
  if (box.front().size() > max_bytes)
    throw Error("fabric: rank " + std::to_string(peer) + " sent a message of " + std::to_string(box.front().size()) +
                " bytes, more than the " + std::to_string(max_bytes) + " expected");
  std::vector<uint8_t> m = std::move(box.front());
  box.pop_front();
  counters_.received_messages += 1;
  counters_.received_bytes += m.size();
  return m;
}

void LocalFabric::abort(int code) {
  {
    std::lock_guard<std::mutex> lk(hub_.mu_);
    if (!hub_.aborted_) hub_.aborted_ = code ? code : 1;
  }
  hub_.cv_.notify_all();
}

}  // namespace sluice::fabric
