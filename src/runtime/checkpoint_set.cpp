#include "runtime/checkpoint_set.h"

#include <limits>
#include <string>

#include "util/error.h"

namespace sluice {

size_t CheckpointSet::victim(uint32_t next_pos) const {
  // The newest prompt's end (its last token and the one before) is where the next request of
  // a conversation most often diverges (the client re-renders the last answer or the
  // generation prompt differently): kept while anything else can go.
  uint64_t newest_end = 0;
  bool any_end = false;
  for (const SessionCheckpoint& c : items_)
    if (c.prompt_end) newest_end = c.pos(), any_end = true;
  auto kept = [&](const SessionCheckpoint& c) { return any_end && c.prompt_end && c.pos() + 1ull >= newest_end; };
  size_t best = items_.size();
  uint64_t best_gap = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (kept(items_[i])) continue;
    const uint64_t prev = i ? items_[i - 1].pos() : 0;
    const uint64_t next = i + 1 < items_.size() ? items_[i + 1].pos() : next_pos;
    if (next - prev < best_gap) {  // strict: the oldest wins ties
      best_gap = next - prev;
      best = i;
    }
  }
  return best < items_.size() ? best : 0;
}

void CheckpointSet::erase(size_t i) {
  bytes_ -= items_[i].bytes();
  items_.erase(items_.begin() + (std::ptrdiff_t)i);
}

bool CheckpointSet::make_room(uint32_t pos, uint64_t bytes) {
  if (bytes > budget_) {
    ++skipped_;
    return false;
  }
  if (!items_.empty() && items_.back().pos() == pos) erase(items_.size() - 1);
  while (bytes_ + bytes > budget_) {
    erase(victim(pos));
    ++dropped_;
  }
  return true;
}

void CheckpointSet::add(SessionCheckpoint c) {
  if (!items_.empty() && items_.back().pos() >= c.pos())
    throw Error("checkpoint at position " + std::to_string(c.pos()) + " is not after the newest (" +
                std::to_string(items_.back().pos()) + ")");
  if (bytes_ + c.bytes() > budget_)
    throw Error("checkpoint of " + std::to_string(c.bytes()) + " bytes does not fit the budget");
  bytes_ += c.bytes();
  items_.push_back(std::move(c));
}

const SessionCheckpoint* CheckpointSet::best_for(uint32_t common, uint32_t prompt_len) const {
  for (size_t i = items_.size(); i-- > 0;) {
    const SessionCheckpoint& c = items_[i];
    if (c.pos() <= common && (c.pos() < prompt_len || !c.logits.empty())) return &c;
  }
  return nullptr;
}

const SessionCheckpoint* CheckpointSet::at(uint32_t pos) const {
  for (const SessionCheckpoint& c : items_)
    if (c.pos() == pos) return &c;
  return nullptr;
}

void CheckpointSet::mark_prompt_end(uint32_t pos) {
  for (SessionCheckpoint& c : items_)
    if (c.pos() == pos) c.prompt_end = true;
}

void CheckpointSet::drop_after(uint32_t pos) {
  while (!items_.empty() && items_.back().pos() > pos) erase(items_.size() - 1);
}

void CheckpointSet::clear() {
  items_.clear();
  bytes_ = 0;
}

}  // namespace sluice
