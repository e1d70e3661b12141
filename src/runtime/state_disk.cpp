#include "runtime/state_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <tuple>

#include "model/deepseek41/engine_footprint.h"
#include "runtime/state_dir_trust.h"
#include "util/error.h"
#include "util/unique_fd.h"

namespace sluice {
namespace {

constexpr const char* kSuffix = ".sstate";
constexpr uint64_t kBlockSlack = 4096 + 16;  // the allocator's bound per heap block (admission's)

std::string err(int e) { return std::strerror(e); }

bool is_hex32(const std::string& s, size_t at) {
  if (s.size() < at + 32) return false;
  for (size_t i = at; i < at + 32; ++i)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

// A temporary file of a writer: ".<32 hex>.<pid>.tmp". The pid it names, or 0.
long tmp_pid(const std::string& name) {
  if (name.size() < 1 + 32 + 1 + 1 + 4 || name[0] != '.' || !is_hex32(name, 1) || name[33] != '.' ||
      name.compare(name.size() - 4, 4, ".tmp") != 0)
    return 0;
  long pid = 0;
  for (size_t i = 34; i < name.size() - 4; ++i) {
    if (name[i] < '0' || name[i] > '9' || pid > 1'000'000'000) return 0;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

bool our_temporary(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  UniqueFd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (st.st_size == 0) return true;
  char head[sizeof kStateMagic];
  return ::pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && std::memcmp(head, kStateMagic, sizeof head) == 0;
}

}  // namespace

StateShape state_shape(const ModelConfig& c, uint32_t ctx) {
  const SequenceShape sh = sequence_shape(c, ctx);
  StateShape s;
  s.layers = c.num_hidden_layers;
  s.window = sh.window;
  s.head_dim = sh.head_dim;
  s.ctx = ctx;
  s.vocab = c.vocab_size;
  s.engram_tail = sh.engram_history;
  for (const SourceShape& src : sh.sources) s.sources.push_back({src.ratio, src.kv_row_bytes, src.index_row_bytes});
  return s;
}

uint64_t state_queue_charge(const StateShape& s, uint32_t pos, bool with_logits) {
  // The vectors of a snapshot, its tokens and logits, each with the allocator's bound.
  return state_file_bytes(s, pos, with_logits) + (6 + 4 * s.sources.size()) * kBlockSlack;
}

StateDisk::StateDisk(StateDiskOptions o) : opt_(std::move(o)) {
  const std::string& d = opt_.dir;
  if (d.empty()) throw Error("--kv-disk-dir: an empty path");
  if (opt_.budget == 0) throw Error("--kv-disk-budget: must be more than 0 for --kv-disk-dir " + d);
  struct stat st {};
  if (::stat(d.c_str(), &st) != 0) {
    if (errno != ENOENT) throw Error(d + ": " + err(errno));
    if (::mkdir(d.c_str(), 0700) != 0) throw Error(d + ": cannot create the state directory: " + err(errno));
    if (::stat(d.c_str(), &st) != 0) throw Error(d + ": " + err(errno));
  } else if (!S_ISDIR(st.st_mode)) {
    throw Error(d + ": not a directory (--kv-disk-dir)");
  }
  if (const auto why = untrusted_dir_problem(st))
    throw Error(d + ": the state directory is " + *why + ": states read back from it could be forged (--kv-disk-dir)");
  const std::string lock = d + "/.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (lock_fd_ < 0) throw Error(lock + ": cannot open the state directory's lock: " + err(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(lock_fd_);
    throw Error(d + (e == EWOULDBLOCK ? ": in use by another sluice process (its .lock is held)"
                                      : ": cannot lock the state directory: " + err(e)));
  }
  st_.budget = opt_.budget;
  try {
    key_ = state_dir_key(d);
    scan();
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
  thread_ = std::thread([this] { writer(); });
}

StateDisk::~StateDisk() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  ::close(lock_fd_);
}

void StateDisk::say(const std::string& line) const {
  const std::string s = "sluice: state disk: " + line;
  if (opt_.log) opt_.log(s);
  else std::fprintf(stderr, "%s\n", s.c_str());
}

std::string StateDisk::path_of(const Digest128& key) const { return opt_.dir + "/" + digest_hex(key).data() + kSuffix; }

void StateDisk::erase(std::map<Digest128, Entry>::iterator it, bool evicted) {
  st_.bytes -= it->second.bytes;
  if (--lengths_[it->second.pos] == 0) lengths_.erase(it->second.pos);
  index_.erase(it);
  if (evicted) ++st_.evicted;
  st_.entries = index_.size();
}

// Reads every state file's header. Files that are not this model's are counted and left; this
// model's damaged ones are reported and deleted; stale temporaries of dead writers are deleted.
void StateDisk::scan() {
  DIR* dir = ::opendir(opt_.dir.c_str());
  if (!dir) throw Error(opt_.dir + ": cannot read the state directory: " + err(errno));
  struct Found {
    Digest128 key;
    Entry e;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  std::map<StateReject, uint64_t> ignored;
  while (const dirent* de = ::readdir(dir)) {
    const std::string name = de->d_name;
    const std::string path = opt_.dir + "/" + name;
    if (const long pid = tmp_pid(name)) {
      // A dead writer's temporary: removed only when it is what a writer leaves (a regular file,
      // empty or starting with a state file's magic), never a file someone else named so.
      if (::kill((pid_t)pid, 0) != 0 && errno == ESRCH && our_temporary(path)) ::unlink(path.c_str());
      continue;
    }
    Digest128 key;
    if (name.size() != 32 + std::strlen(kSuffix) || name.compare(32, std::string::npos, kSuffix) != 0 ||
        !parse_digest_hex(std::string_view(name).substr(0, 32), &key))
      continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    UniqueFd guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !trusted_state_file(st)) {  // not one only this user could write
      ++ignored[StateReject::NotState];
      ++st_.ignored;
      continue;
    }
    StateFileSummary sum;
    StateCheck c = read_state_summary(fd, opt_.shape, opt_.identity, &sum);
    if (c && sum.key != key) c = StateCheck{StateReject::Tokens, "its key does not match its name"};
    switch (c.reject) {
      case StateReject::None:
        found.push_back({key, Entry{sum.pos, sum.with_logits, sum.bytes, 0},
                         (int64_t)st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec});
        break;
      case StateReject::NotState:
      case StateReject::OtherFormat:
      case StateReject::OtherBuild:
      case StateReject::OtherModel:
      case StateReject::Io:
        ++ignored[c.reject];
        ++st_.ignored;
        break;
      default:
        say(name + ": " + c.why + "; deleted, its state will be recomputed");
        ::unlink(path.c_str());
        ++st_.rejected;
    }
  }
  ::closedir(dir);
  // Least recently used first: the order of their mtimes (stamp() keeps them distinct; on a file
  // system that stores coarser times the shorter prefix is taken as the older, then the key).
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime_ns, a.e.pos, a.key) < std::tie(b.mtime_ns, b.e.pos, b.key);
  });
  for (Found& f : found) {
    last_stamp_ns_ = std::max(last_stamp_ns_, f.mtime_ns);
    f.e.used = ++tick_;
    index_[f.key] = f.e;
    ++lengths_[f.e.pos];
    st_.bytes += f.e.bytes;
  }
  st_.entries = index_.size();
  if (!ignored.empty()) {
    std::string what;
    for (const auto& [r, n] : ignored) what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + state_reject_name(r);
    say(opt_.dir + ": left alone " + std::to_string(st_.ignored) + " file(s) that are not this model's states (" + what + ")");
  }
  // Over the budget (it was lowered since): the least recently used go.
  evict_until(opt_.budget, nullptr);
}

void StateDisk::evict_until(uint64_t bytes, const Digest128* keep) {
  while (st_.bytes > bytes) {
    auto victim = index_.end();
    for (auto it = index_.begin(); it != index_.end(); ++it)
      if ((!keep || it->first != *keep) && (victim == index_.end() || it->second.used < victim->second.used)) victim = it;
    if (victim == index_.end()) return;
    ::unlink(path_of(victim->first).c_str());
    erase(victim, true);
  }
}

uint32_t StateDisk::find(std::span<const TokenId> prompt, uint32_t better_than, uint64_t scope) {
  std::vector<uint32_t> lengths;
  {
    std::lock_guard lk(mu_);
    ++st_.lookups;
    for (const auto& [len, n] : lengths_)
      if (len > better_than && len <= prompt.size() && len <= opt_.shape.ctx) lengths.push_back(len);
  }
  if (lengths.empty()) return 0;
  const std::vector<Digest128> keys = state_keys_at(opt_.identity, prompt, lengths, scope);
  std::lock_guard lk(mu_);
  for (size_t i = keys.size(); i-- > 0;) {
    const auto it = index_.find(keys[i]);
    if (it == index_.end() || it->second.pos != lengths[i]) continue;
    if (lengths[i] == prompt.size() && !it->second.with_logits) continue;
    return lengths[i];
  }
  return 0;
}

bool StateDisk::load(std::span<const TokenId> prompt, uint32_t pos, LoadedState* out, uint64_t scope) {
  const Digest128 key = state_key(opt_.identity, prompt.first(pos), scope);
  const std::string path = path_of(key);
  // O_NONBLOCK: a FIFO or device put in the file's place must not stall the worker in open().
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !trusted_state_file(st)) {
    // Evicted since find(), removed by hand, or replaced by something this server did not
    // write (left where it is): either way not used.
    if (fd >= 0) ::close(fd);
    std::lock_guard lk(mu_);
    if (fd >= 0) say(path + ": not a regular file of this user writable by no one else; not read, its state is recomputed");
    if (auto it = index_.find(key); it != index_.end()) erase(it, false);
    return false;
  }
  UniqueFd guard(fd);
  LoadedState ls;
  StateCheck c = read_state_file(fd, opt_.shape, opt_.identity, key_, &ls, pos, scope);
  if (c && (ls.tokens.size() != pos || !std::equal(ls.tokens.begin(), ls.tokens.end(), prompt.begin())))
    c = StateCheck{StateReject::Tokens, "its tokens are not the prompt's (a key collision)"};
  if (c && ls.snap.pos() > opt_.shape.ctx) c = StateCheck{StateReject::BadShape, "beyond the context"};
  std::lock_guard lk(mu_);
  auto it = index_.find(key);
  if (!c) {
    const bool io = c.reject == StateReject::Io;
    say(path + ": " + c.why + (io ? "; not used this run" : "; deleted") + ", its state is recomputed");
    ++st_.rejected;
    if (!io) ::unlink(path.c_str());
    if (it != index_.end()) erase(it, false);
    return false;
  }
  if (it != index_.end()) it->second.used = ++tick_;
  stamp(fd);  // the LRU order across restarts
  ++st_.hits;
  st_.hit_tokens += pos;
  *out = std::move(ls);
  return true;
}

bool StateDisk::wants(std::span<const TokenId> prefix, bool with_logits, uint64_t scope) {
  if (prefix.empty() || prefix.size() > opt_.shape.ctx) return false;
  const Digest128 key = state_key(opt_.identity, prefix, scope);
  const uint32_t pos = (uint32_t)prefix.size();
  std::lock_guard lk(mu_);
  if (auto it = index_.find(key); it != index_.end() && (it->second.with_logits || !with_logits)) return false;
  for (const Pending& p : queue_)
    if (p.key == key && (!p.logits.empty() || !with_logits)) return false;
  const uint64_t charge = state_queue_charge(opt_.shape, pos, with_logits);
  if (queue_used_ + charge > opt_.queue_bytes || state_file_bytes(opt_.shape, pos, with_logits) > opt_.budget) {
    ++st_.skipped;
    return false;
  }
  return true;
}

void StateDisk::put(std::vector<TokenId> tokens, SequenceSnapshot snap, std::vector<float> logits, uint64_t scope) {
  Pending p;
  p.key = state_key(opt_.identity, tokens, scope);
  p.scope = scope;
  p.charge = state_queue_charge(opt_.shape, (uint32_t)tokens.size(), !logits.empty());
  p.tokens = std::move(tokens);
  p.snap = std::move(snap);
  p.logits = std::move(logits);
  {
    std::lock_guard lk(mu_);
    if (queue_used_ + p.charge > opt_.queue_bytes) throw Error("state disk: put() without room in the write queue");
    queue_used_ += p.charge;
    ++st_.queued;
    queue_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void StateDisk::flush() {
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return queue_.empty() && !writing_; });
}

void StateDisk::stamp(int fd) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  last_stamp_ns_ = std::max<int64_t>((int64_t)now.tv_sec * 1'000'000'000 + now.tv_nsec, last_stamp_ns_ + 1);
  const timespec t{(time_t)(last_stamp_ns_ / 1'000'000'000), (long)(last_stamp_ns_ % 1'000'000'000)};
  const timespec both[2] = {t, t};
  ::futimens(fd, both);
}

StateDiskStats StateDisk::stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

void StateDisk::writer() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping with nothing left
    writing_ = true;
    Pending& p = queue_.front();
    lk.unlock();
    write_one(p);
    lk.lock();
    queue_used_ -= p.charge;
    queue_.pop_front();
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
  idle_.notify_all();
}

void StateDisk::write_one(Pending& p) {
  const bool with_logits = !p.logits.empty();
  const uint32_t pos = (uint32_t)p.tokens.size();
  const uint64_t bytes = state_file_bytes(opt_.shape, pos, with_logits);
  const std::string path = path_of(p.key);
  bool replaces = false;
  uint64_t old = 0;  // the file this one replaces (the same prefix without its logits row)
  {
    std::lock_guard lk(mu_);
    if (auto it = index_.find(p.key); it != index_.end()) {
      if (it->second.with_logits || !with_logits) return;  // written meanwhile
      replaces = true;
      old = it->second.bytes;
    }
    // Room first: the least recently used files go (not the one this replaces).
    if (old + opt_.budget >= bytes) evict_until(old + opt_.budget - bytes, &p.key);
    if (st_.bytes - old + bytes > opt_.budget) {
      ++st_.skipped;
      return;
    }
  }
  struct statvfs vfs {};
  if (::statvfs(opt_.dir.c_str(), &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < bytes + opt_.min_free_bytes) {
    std::lock_guard lk(mu_);
    ++st_.skipped;
    return;
  }
  // A name taken by a file that is not one of this model's states is not overwritten.
  struct stat st {};
  if (!replaces && ::lstat(path.c_str(), &st) == 0) {
    std::lock_guard lk(mu_);
    ++st_.skipped;
    return;
  }
  const std::string tmp = opt_.dir + "/." + digest_hex(p.key).data() + "." + std::to_string(::getpid()) + ".tmp";
  // 0600: a state holds what a prompt computed, and is read back only when no one else could write it.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  std::string failure;
  if (fd < 0) {
    failure = tmp + ": cannot create: " + err(errno);
  } else {
    try {
      write_state_file(fd, tmp, opt_.shape, opt_.identity, key_, p.tokens, p.snap, p.logits, p.scope);
      if (::fdatasync(fd) != 0) throw Error(tmp + ": cannot sync: " + err(errno));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (failure.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) failure = path + ": cannot rename into place: " + err(errno);
    if (!failure.empty()) ::unlink(tmp.c_str());
  }
  UniqueFd guard(fd);
  std::lock_guard lk(mu_);
  if (!failure.empty()) {
    if (st_.write_errors++ == 0) say(failure + " (further write errors are counted, not logged)");
    return;
  }
  stamp(fd);  // in the order of the ticks
  if (auto it = index_.find(p.key); it != index_.end()) erase(it, false);
  index_[p.key] = Entry{pos, with_logits, bytes, ++tick_};
  ++lengths_[pos];
  st_.bytes += bytes;
  st_.entries = index_.size();
  ++st_.written;
  st_.written_bytes += bytes;
}

}  // namespace sluice
