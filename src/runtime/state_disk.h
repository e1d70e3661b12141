// States on disk (--kv-disk-dir DIR --kv-disk-budget B): the prefix cache's second tier, which
// outlives the process. The Session queues a snapshot at each prompt end and user-turn boundary
// (as for the RAM prefix cache); a writer thread writes it as DIR/<key>.sstate
// (runtime/state_file.h: key = hash of the model's identity and the token prefix) through a
// temporary file and a rename, so a file under its final name is always complete. A request
// whose prompt starts with a prefix held here (and longer than what RAM offers) reads the file,
// checks it whole and restores it. Found again after a restart: opening the directory reads every
// state file's header into the index.
//
// Bounded: the files of this model held in DIR stay within the budget (least recently used
// evicted before a write; a write or a hit stamps the file's mtime, strictly later than any stamp
// before it, so the order survives restarts even where the clock ticks coarser than the uses); the
// snapshots waiting to be written within queue_bytes (a snapshot that does not fit is not
// queued, and counted). Files it does not recognise as this model's states (other names, other
// models, formats or builds) are never touched; one of this model's that fails its checks
// (truncated, flipped bytes) is reported once in the log, deleted and recomputed. One process
// per directory (an flock on DIR/.lock).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/deepseek41/config.h"
#include "runtime/model_identity.h"
#include "runtime/state_file.h"

namespace sluice {

// The shapes of this model's snapshots for a context (what state files must hold).
StateShape state_shape(const ModelConfig& c, uint32_t ctx);
// The largest queue charge one snapshot of a state at pos can have (state_disk's and the plan's).
uint64_t state_queue_charge(const StateShape& s, uint32_t pos, bool with_logits);

struct StateDiskOptions {
  std::string dir;
  uint64_t budget = 0;       // bytes of this model's state files in dir
  uint64_t queue_bytes = 0;  // snapshots waiting to be written (memory; the plan accounts it)
  StateShape shape;
  Digest128 identity{};
  uint64_t min_free_bytes = 64ull << 20;  // a write leaves at least this much free on the disk
  std::function<void(const std::string&)> log;  // one line without '\n'; empty: stderr
};

struct StateDiskStats {
  uint64_t entries = 0, bytes = 0, budget = 0;
  uint64_t lookups = 0, hits = 0, hit_tokens = 0;
  uint64_t queued = 0, written = 0, written_bytes = 0;
  uint64_t skipped = 0;   // not queued (queue full, larger than the budget) or not written (disk full, name taken)
  uint64_t evicted = 0;   // deleted to stay within the budget
  uint64_t rejected = 0;  // this model's files that failed their checks (deleted, recomputed)
  uint64_t ignored = 0;   // files in dir that are not this model's states (left alone)
  uint64_t write_errors = 0;
};

class StateDisk {
 public:
  // Creates dir (not its parents, mode 0700) when it does not exist, refuses one that another
  // user owns or others can write, takes its lock, reads or makes its key and reads the index.
  // Throws Error naming the directory and the cause.
  explicit StateDisk(StateDiskOptions o);
  ~StateDisk();  // writes what is queued, then stops
  StateDisk(const StateDisk&) = delete;
  StateDisk& operator=(const StateDisk&) = delete;

  // The longest prefix of prompt held here that is longer than better_than, fits the context
  // and is shorter than the prompt unless its file has the logits row; 0: none. Counted as a
  // lookup.
  // Every call names the scope of the prompt (state_file.h: state_key): another scope's files
  // are neither found nor replaced.
  uint32_t find(std::span<const TokenId> prompt, uint32_t better_than, uint64_t scope = 0);
  // Reads and checks the state of prompt[0, pos). false: not usable (a damaged file is reported
  // once and deleted; a file evicted meanwhile is just gone; either way it leaves the index, so
  // find() goes on to the next shorter one). true counts a hit.
  bool load(std::span<const TokenId> prompt, uint32_t pos, LoadedState* out, uint64_t scope = 0);
  // Whether a snapshot of this prefix is worth queuing: not held or queued already (with its
  // logits row when with_logits), and it fits the queue and the budget (else counted skipped).
  // When true, the caller puts it next.
  bool wants(std::span<const TokenId> prefix, bool with_logits, uint64_t scope = 0);
  void put(std::vector<TokenId> tokens, SequenceSnapshot snap, std::vector<float> logits, uint64_t scope = 0);
  void flush();  // returns once every queued snapshot is written (or failed)

  StateDiskStats stats() const;
  const std::string& dir() const { return opt_.dir; }

 private:
  struct Entry {
    uint32_t pos = 0;
    bool with_logits = false;
    uint64_t bytes = 0, used = 0;  // used: LRU tick
  };
  struct Pending {
    std::vector<TokenId> tokens;
    SequenceSnapshot snap;
    std::vector<float> logits;
    Digest128 key{};
    uint64_t charge = 0;
    uint64_t scope = 0;
  };
  void scan();
  void writer();
  void write_one(Pending& p);
  void say(const std::string& line) const;
  void erase(std::map<Digest128, Entry>::iterator it, bool evicted);  // under mu_
  // Deletes least recently used files (not `keep`) until this model's files hold at most
  // `bytes` (under mu_).
  void evict_until(uint64_t bytes, const Digest128* keep);
  std::string path_of(const Digest128& key) const;
  // Sets fd's mtime to now, or just after the latest stamp when the clock has not moved past it
  // (under mu_): two uses within one clock tick keep their order across a restart.
  void stamp(int fd);

  StateDiskOptions opt_;
  SipKey key_{};  // signs and verifies the files (runtime/state_dir_trust.h)
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::map<Digest128, Entry> index_;
  std::map<uint32_t, uint32_t> lengths_;  // entries per prefix length
  std::deque<Pending> queue_;             // the front is being written while writing_
  bool writing_ = false, stop_ = false;
  uint64_t queue_used_ = 0, tick_ = 0;
  int64_t last_stamp_ns_ = 0;  // the latest mtime scan() found or stamp() set
  StateDiskStats st_;
  std::thread thread_;
};

}  // namespace sluice
