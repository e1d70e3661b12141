// The Session's prefix checkpoints of its kept sequence, within a byte budget. Every checkpoint
// held is of a prefix of that one sequence, in ascending position. Which to drop when a new one
// does not fit is decided here, before the new one is allocated (see SessionOptions for the
// rule), so the bytes held never exceed the budget.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/deepseek41/sequence_state.h"

namespace sluice {

struct SessionCheckpoint {
  SequenceCheckpoint seq;
  std::vector<float> logits;  // the row after the last token; only at the end of a prompt
  bool prompt_end = false;    // taken at the end of a prompt (after its last token or before it)
  // --dspark: the drafter's rings at pos (empty: none) and the first position they hold that
  // was committed from an evaluation (Session's Slot::draft_from), so a rollback restores them.
  std::vector<uint16_t> draft_rings;
  uint32_t draft_from = 0;
  uint32_t pos() const { return seq.pos; }
  uint64_t bytes() const { return seq.bytes() + logits.size() * sizeof(float) + draft_rings.size() * sizeof(uint16_t); }
};

class CheckpointSet {
 public:
  explicit CheckpointSet(uint64_t budget) : budget_(budget) {}

  // Frees room for a checkpoint of `bytes` at `pos` (at or after every one held; one held at
  // pos is removed): drops by the rule until it fits. Returns false, dropping nothing, when
  // `bytes` alone exceeds the budget.
  bool make_room(uint32_t pos, uint64_t bytes);
  // Adds a checkpoint make_room(c.pos(), c.bytes()) made room for (throws Error otherwise).
  void add(SessionCheckpoint c);
  // The newest checkpoint a prompt of prompt_len tokens whose first `common` tokens are the
  // sequence's can start from: pos <= common, and pos < prompt_len unless it has the logits
  // row (a prompt needs the row after its last token). null: none.
  const SessionCheckpoint* best_for(uint32_t common, uint32_t prompt_len) const;
  const SessionCheckpoint* at(uint32_t pos) const;
  void mark_prompt_end(uint32_t pos);
  // The sequence was rolled back to pos: checkpoints after it describe tokens it lost.
  void drop_after(uint32_t pos);
  void clear();

  std::span<const SessionCheckpoint> items() const { return items_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t budget() const { return budget_; }
  uint64_t dropped() const { return dropped_; }
  uint64_t skipped() const { return skipped_; }

 private:
  // Index of the checkpoint to drop for one arriving at next_pos.
  size_t victim(uint32_t next_pos) const;
  void erase(size_t i);

  uint64_t budget_ = 0, bytes_ = 0, dropped_ = 0, skipped_ = 0;
  std::vector<SessionCheckpoint> items_;
};

}  // namespace sluice
