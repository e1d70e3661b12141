// The kernel's view of memory, read from /proc and the cgroup filesystem: host totals
// (/proc/meminfo), active swap (/proc/swaps), our own RSS (/proc/self/status), the summed RSS of
// a process group (/proc/PID/stat) and the cgroup limit. Plus byte-size parsing and printing
// for the --mem-budget / --soft / --hard options.
//
// Every reader has a parse_* twin that takes the file's text, so the parsing is testable with
// fixed input; readers throw sluice::Error naming the file when it cannot be read or parsed.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/format_bytes.h"  // format_bytes, printed beside parse_bytes's sizes

namespace sluice {

// "116GiB", "116G", "8 GiB", "1.5M", "500MB", "4096": a byte count. Single letters and the
// *iB forms are binary (K = KiB = 1024), the *B forms decimal (KB = 1000), case-insensitive,
// optional spaces before the unit, fractions allowed ("1.5G", rounded down to whole bytes).
// Throws Error naming `what` on anything else, on negative values and on overflow.
uint64_t parse_bytes(std::string_view text, std::string_view what = "size");

// /proc/meminfo (values are kB there; stored here in bytes).
struct MemInfo {
  uint64_t total = 0;
  uint64_t free = 0;
  uint64_t available = 0;       // MemAvailable (kernels >= 3.14); see has_available
  bool has_available = false;
  uint64_t swap_total = 0;
  uint64_t swap_free = 0;
  // Host-wide use as the watchdog and the docs define it: MemTotal - MemAvailable.
  uint64_t used() const { return total > available ? total - available : 0; }
};
MemInfo parse_meminfo(std::string_view text);  // throws Error when MemTotal is missing
MemInfo read_meminfo(const std::string& path = "/proc/meminfo");

// One active swap area from /proc/swaps (sizes in bytes).
struct SwapArea {
  std::string name, type;
  uint64_t size = 0, used = 0;
  int priority = 0;
};
std::vector<SwapArea> parse_swaps(std::string_view text);
std::vector<SwapArea> read_swaps(const std::string& path = "/proc/swaps");  // empty if unreadable

// VmRSS / VmHWM of /proc/<pid>/status, in bytes.
struct ProcMemory {
  uint64_t rss = 0;   // VmRSS: resident now
  uint64_t hwm = 0;   // VmHWM: peak resident
};
ProcMemory parse_proc_status(std::string_view text);
ProcMemory read_self_status();
// Resets this process's VmHWM to its current RSS (writes 5 to /proc/self/clear_refs), so a later
// peak counts only what came after. False when the kernel refuses (the peak then includes before).
bool reset_peak_rss();

// The fields of /proc/<pid>/stat the watchdog needs. The command name may hold spaces and ')',
// so fields are counted from the last ')'.
struct ProcStat {
  pid_t pid = 0;
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;
  uint64_t rss_pages = 0;  // field 24
};
std::optional<ProcStat> parse_proc_stat(std::string_view text);

// Sum of RSS over every process whose process group is `pgid` (zombies count 0). Processes that
// vanish while /proc is scanned are skipped. This is the measure the watchdog compares with its
// --soft / --hard limits.
struct GroupMemory {
  uint64_t rss = 0;     // bytes
  int processes = 0;    // live members seen
};
GroupMemory process_group_memory(pid_t pgid, const std::string& proc_root = "/proc");

// Our memory cgroup (v2 memory.max / memory.current / memory.stat inactive_file, or v1
// memory.limit_in_bytes / memory.usage_in_bytes / total_inactive_file). `limited` is false when
// there is no cgroup limit or it is larger than 2^60 (v1's "unlimited").
struct CgroupMemory {
  bool limited = false;
  uint64_t limit = 0, usage = 0, inactive_file = 0;
  std::string path;  // the limit file that was read
  // What the cgroup still lets us use: limit - usage + inactive file cache (reclaimable).
  uint64_t headroom() const;
};
CgroupMemory read_cgroup_memory();

}  // namespace sluice
