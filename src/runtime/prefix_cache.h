// The shared prefix cache (--cache-ram): complete states at prompt boundaries of any slot,
// within a byte budget, found again by the longest matching token prefix. A slot's own
// checkpoints (runtime/checkpoint_set.h) only roll its own sequence back; this cache lets a
// request on any slot start from a state another slot (or an earlier conversation the slot
// has since left) computed, e.g. a shared system prompt + tools, or the end of a previous
// turn whose re-rendered history diverges later (thinking mode drops the reasoning).
//
// A radix tree over token ids: each edge holds a run of tokens, a node the prefix spelled from
// the root, and an entry at a node is the state after exactly that prefix. Lookup walks the
// prompt down the tree and keeps the deepest entry a prompt can start from. Room is made before
// a snapshot is taken (make_room evicts the least recently used entries), so the bytes held
// never exceed the budget; an entry is charged its snapshot, its logits row and its whole token
// prefix (an upper bound on the edge storage it adds, which shared edges make smaller).
//
// Scopes: every entry belongs to a scope (serve: the API key that computed it; 0 when there is
// one key or none), and a prompt finds only its own scope's entries: one tree per scope, so a
// client can neither reuse nor detect another key's prompts. The budget is shared.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/deepseek41/sequence_state.h"
#include "util/token_id.h"

namespace sluice {

struct PrefixEntry {
  SequenceSnapshot snap;
  std::vector<float> logits;  // the row after the prefix's last token (empty: not kept)
  // --dspark: the drafter's rings at pos (DraftState::rings; empty: not kept) and the first
  // position whose entries its sequence committed (0: all), so a restored state drafts at once.
  std::vector<uint16_t> draft_rings;
  uint32_t draft_from = 0;
  uint32_t pos() const { return snap.pos(); }
  uint64_t bytes() const {
    return snap.bytes() + logits.size() * sizeof(float) + draft_rings.size() * sizeof(uint16_t);
  }
  // Heap blocks an entry holds: the snapshot's vectors, the logits row and the rings, plus the
  // tree node, its map slot and its label, which an entry may add.
  size_t blocks() const {
    return 2 + snap.ck.carry_k.size() + snap.ck.carry_s.size() + snap.kv.size() + snap.index_k.size() + 2 + 3;
  }
};
// The same count from the number of KV sources (before a snapshot exists).
inline size_t prefix_entry_blocks(size_t kv_sources) { return 7 + 4 * kv_sources; }

// What an entry is charged: its bytes, its whole token prefix and, per heap block, the
// allocator's bound (a page plus a header, as admission counts long-lived allocations).
inline constexpr uint64_t kPrefixBlockSlack = 4096 + 16;
inline uint64_t prefix_entry_charge(uint64_t entry_bytes, size_t blocks, size_t tokens) {
  return entry_bytes + tokens * sizeof(TokenId) + blocks * kPrefixBlockSlack;
}

struct PrefixCacheStats {
  uint64_t entries = 0, bytes = 0, budget = 0;
  uint64_t lookups = 0, hits = 0, hit_tokens = 0;  // hits: entries a slot restored, and their tokens
  uint64_t inserted = 0, evicted = 0, skipped = 0;  // skipped: one entry alone exceeds the budget
};

class PrefixCache {
 public:
  explicit PrefixCache(uint64_t budget);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The deepest entry a prompt can start from: its prefix is a prefix of prompt, and shorter
  // than the prompt unless the entry has its logits row (a prompt needs the row after its last
  // token). Counted as a lookup; the entry found is marked as used. null: none.
  const PrefixEntry* lookup(std::span<const TokenId> prompt, uint64_t scope = 0);
  // The same entry, neither counted nor marked as used.
  const PrefixEntry* peek(std::span<const TokenId> prompt, uint64_t scope = 0) const;
  // Whether an entry for exactly this prefix is held (with logits, when with_logits).
  bool contains(std::span<const TokenId> prefix, bool with_logits, uint64_t scope = 0) const;
  // Evicts least recently used entries until `charge` more bytes fit. false (nothing evicted,
  // counted as skipped) when charge alone exceeds the budget.
  bool make_room(uint64_t charge);
  // Adds (or replaces) the entry for prefix == e's tokens (prefix.size() == e.pos()). The
  // caller made room for its prefix_entry_charge first; throws Error if
  // it does not fit (nothing changed).
  void insert(std::span<const TokenId> prefix, PrefixEntry e, uint64_t scope = 0);
  // Counted a hit of `tokens` reused tokens (the caller restored the entry).
  void count_hit(uint32_t tokens) { ++stats_.hits, stats_.hit_tokens += tokens; }
  void clear();

  PrefixCacheStats stats() const;
  uint64_t budget() const { return stats_.budget; }

 private:
  struct Node;
  Node* root(uint64_t scope) const;  // null: the scope holds nothing
  Node* find(std::span<const TokenId> prefix, uint64_t scope) const;
  Node* deepest(std::span<const TokenId> prompt, uint64_t scope) const;
  void erase_entry(Node* n);
  void prune(Node* n);

  std::map<uint64_t, std::unique_ptr<Node>> roots_;  // a scope's tree, while it holds an entry
  std::vector<Node*> holders_;  // nodes with an entry (few: the budget bounds them)
  uint64_t tick_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace sluice
