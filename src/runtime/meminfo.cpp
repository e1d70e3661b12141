#include "runtime/meminfo.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "util/error.h"

namespace sluice {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

bool read_text(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

std::string read_text_or_throw(const std::string& path) {
  std::string s;
  if (!read_text(path, s)) throw Error(path + ": cannot read: " + std::strerror(errno));
  return s;
}

// "Key:   1234 kB" lines; returns the value in bytes when `line` starts with `key` + ':'.
bool kb_field(std::string_view line, std::string_view key, uint64_t& out) {
  if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') return false;
  std::string_view rest = line.substr(key.size() + 1);
  size_t i = 0;
  while (i < rest.size() && (rest[i] == ' ' || rest[i] == '\t')) ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < rest.size() && std::isdigit((unsigned char)rest[i]); ++i, ++digits) v = v * 10 + (uint64_t)(rest[i] - '0');
  if (digits == 0) return false;
  // /proc reports kB meaning KiB; a value without a unit is a page/count field we do not use.
  out = rest.find("kB") != std::string_view::npos ? v * 1024 : v;
  return true;
}

template <typename F>
void for_each_line(std::string_view text, F f) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    f(text.substr(start, end - start));
    start = end + 1;
  }
}

bool read_u64_file(const std::string& path, uint64_t& out) {
  std::string s;
  if (!read_text(path, s)) return false;
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.pop_back();
  if (s.empty() || s == "max") return false;
  uint64_t v = 0;
  for (char c : s) {
    if (!std::isdigit((unsigned char)c)) return false;
    v = v * 10 + (uint64_t)(c - '0');
  }
  out = v;
  return true;
}

uint64_t stat_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

}  // namespace

uint64_t parse_bytes(std::string_view text, std::string_view what) {
  const std::string w(what);
  const std::string s(text);
  auto bad = [&](const std::string& why) {
    return Error(w + ": '" + s + "' is not a byte size (" + why +
                 "; examples: 4096, 512M, 116GiB, 8 GiB, 500MB)");
  };
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t num_begin = i;
  while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.')) ++i;
  const std::string num = s.substr(num_begin, i - num_begin);
  if (num.empty() || num == "." || std::count(num.begin(), num.end(), '.') > 1) throw bad("no number");
  while (i < s.size() && s[i] == ' ') ++i;
  std::string unit = lower(std::string_view(s).substr(i));
  while (!unit.empty() && unit.back() == ' ') unit.pop_back();

  static const struct { const char* name; long double mult; } units[] = {
      {"", 1}, {"b", 1},
      {"k", 1024.0L}, {"kib", 1024.0L}, {"kb", 1e3L},
      {"m", 1024.0L * 1024}, {"mib", 1024.0L * 1024}, {"mb", 1e6L},
      {"g", 1024.0L * 1024 * 1024}, {"gib", 1024.0L * 1024 * 1024}, {"gb", 1e9L},
      {"t", 1024.0L * 1024 * 1024 * 1024}, {"tib", 1024.0L * 1024 * 1024 * 1024}, {"tb", 1e12L},
  };
  long double mult = -1;
  for (const auto& u : units)
    if (unit == u.name) mult = u.mult;
  if (mult < 0) throw bad("unknown unit '" + unit + "'");

  // Integers are exact; a fraction goes through long double (64-bit mantissa covers 2^64).
  uint64_t result = 0;
  if (num.find('.') == std::string::npos) {
    uint64_t v = 0;
    for (char c : num) {
      if (v > (UINT64_MAX - 9) / 10) throw bad("too large");
      v = v * 10 + (uint64_t)(c - '0');
    }
    const uint64_t m = (uint64_t)mult;
    if (m != 0 && v > UINT64_MAX / m) throw bad("too large");
    result = v * m;
  } else {
    const long double v = std::strtold(num.c_str(), nullptr) * mult;
    if (!(v < 18446744073709551615.0L)) throw bad("too large");
    result = (uint64_t)std::floor(v);
  }
  return result;
}

MemInfo parse_meminfo(std::string_view text) {
  MemInfo m;
  bool have_total = false;
  for_each_line(text, [&](std::string_view line) {
    if (kb_field(line, "MemTotal", m.total)) have_total = true;
    else if (kb_field(line, "MemAvailable", m.available)) m.has_available = true;
    else if (kb_field(line, "MemFree", m.free)) {}
    else if (kb_field(line, "SwapTotal", m.swap_total)) {}
    else if (kb_field(line, "SwapFree", m.swap_free)) {}
  });
  if (!have_total) throw Error("meminfo: no MemTotal line");
  // Kernels before 3.14 lack MemAvailable: MemFree is the conservative stand-in.
  if (!m.has_available) m.available = m.free;
  return m;
}

MemInfo read_meminfo(const std::string& path) {
  try {
    return parse_meminfo(read_text_or_throw(path));
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw Error(path + ": " + what);
  }
}

std::vector<SwapArea> parse_swaps(std::string_view text) {
  std::vector<SwapArea> out;
  bool header = true;
  for_each_line(text, [&](std::string_view line) {
    if (header) {  // "Filename Type Size Used Priority"
      header = false;
      return;
    }
    std::istringstream in{std::string(line)};
    SwapArea a;
    uint64_t size_kb = 0, used_kb = 0;
    if (in >> a.name >> a.type >> size_kb >> used_kb >> a.priority) {
      a.size = size_kb * 1024;
      a.used = used_kb * 1024;
      out.push_back(std::move(a));
    }
  });
  return out;
}

std::vector<SwapArea> read_swaps(const std::string& path) {
  std::string s;
  if (!read_text(path, s)) return {};
  return parse_swaps(s);
}

ProcMemory parse_proc_status(std::string_view text) {
  ProcMemory p;
  for_each_line(text, [&](std::string_view line) {
    if (!kb_field(line, "VmRSS", p.rss)) kb_field(line, "VmHWM", p.hwm);
  });
  return p;
}

ProcMemory read_self_status() { return parse_proc_status(read_text_or_throw("/proc/self/status")); }

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// Parsing and scanning below allocate nothing: the watchdog runs them every few milliseconds
// over every process on the box, and churn would show up in its own footprint.
namespace {

// Next space-separated field of `text` from `pos`; empty at the end.
std::string_view next_field(std::string_view text, size_t& pos) {
  while (pos < text.size() && std::isspace((unsigned char)text[pos])) ++pos;
  const size_t start = pos;
  while (pos < text.size() && !std::isspace((unsigned char)text[pos])) ++pos;
  return text.substr(start, pos - start);
}

bool to_int(std::string_view f, long long& out) {
  if (f.empty()) return false;
  bool neg = false;
  size_t i = 0;
  if (f[0] == '-') neg = true, i = 1;
  if (i == f.size()) return false;
  unsigned long long v = 0;
  for (; i < f.size(); ++i) {
    if (!std::isdigit((unsigned char)f[i]) || v > (ULLONG_MAX - 9) / 10) return false;
    v = v * 10 + (unsigned long long)(f[i] - '0');
  }
  if (v > (unsigned long long)LLONG_MAX) return false;
  out = neg ? -(long long)v : (long long)v;
  return true;
}

// Reads a small /proc file into buf (NUL-terminated); returns its length or -1.
ssize_t read_small(const char* path, char* buf, size_t cap) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t n = 0;
  while (n + 1 < cap) {
    const ssize_t r = ::read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  ::close(fd);
  buf[n] = 0;
  return (ssize_t)n;
}

}  // namespace

std::optional<ProcStat> parse_proc_stat(std::string_view text) {
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  ProcStat st;
  long long v = 0;
  size_t pos = 0;
  const std::string_view head = text.substr(0, open);
  if (!to_int(next_field(head, pos), v)) return std::nullopt;
  st.pid = (pid_t)v;
  // Fields from 3 on: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
  // utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss ...
  const std::string_view rest = text.substr(close + 1);
  pos = 0;
  std::string_view f[22];
  for (auto& x : f)
    if ((x = next_field(rest, pos)).empty()) return std::nullopt;
  st.state = f[0][0];
  if (!to_int(f[1], v)) return std::nullopt;
  st.ppid = (pid_t)v;
  if (!to_int(f[2], v)) return std::nullopt;
  st.pgrp = (pid_t)v;
  if (!to_int(f[21], v)) return std::nullopt;  // field 24
  st.rss_pages = v > 0 ? (uint64_t)v : 0;
  return st;
}

GroupMemory process_group_memory(pid_t pgid, const std::string& proc_root) {
  GroupMemory g;
  DIR* d = ::opendir(proc_root.c_str());
  if (!d) throw Error(proc_root + ": cannot list: " + std::strerror(errno));
  static const uint64_t page = (uint64_t)::sysconf(_SC_PAGESIZE);
  char path[PATH_MAX];
  char text[1024];  // /proc/PID/stat is one line of about 300 bytes
  while (const dirent* e = ::readdir(d)) {
    if (!std::isdigit((unsigned char)e->d_name[0])) continue;
    std::snprintf(path, sizeof path, "%s/%s/stat", proc_root.c_str(), e->d_name);
    const ssize_t n = read_small(path, text, sizeof text);
    if (n <= 0) continue;  // exited meanwhile
    const std::optional<ProcStat> st = parse_proc_stat(std::string_view(text, (size_t)n));
    if (!st || st->pgrp != pgid || st->state == 'Z' || st->state == 'X') continue;
    g.rss += st->rss_pages * page;
    ++g.processes;
  }
  ::closedir(d);
  return g;
}

uint64_t CgroupMemory::headroom() const {
  if (!limited) return UINT64_MAX;
  const uint64_t used = usage > inactive_file ? usage - inactive_file : 0;
  return limit > used ? limit - used : 0;
}

CgroupMemory read_cgroup_memory() {
  CgroupMemory cg;
  std::string self;
  if (!read_text("/proc/self/cgroup", self)) return cg;
  std::string v2_path, v1_path;
  bool have_v2 = false, have_v1 = false;
  for_each_line(self, [&](std::string_view line) {
    // "hierarchy-ID:controller-list:path"
    const size_t a = line.find(':'), b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) return;
    const std::string_view id = line.substr(0, a), ctrl = line.substr(a + 1, b - a - 1);
    const std::string path(line.substr(b + 1));
    if (id == "0" && ctrl.empty()) have_v2 = true, v2_path = path;
    std::string_view rest = ctrl;
    while (!rest.empty()) {
      const size_t c = rest.find(',');
      if (rest.substr(0, c) == "memory") have_v1 = true, v1_path = path;
      if (c == std::string_view::npos) break;
      rest = rest.substr(c + 1);
    }
  });
  // Inside a cgroup namespace the mount shows our own cgroup as the root, so the path from
  // /proc/self/cgroup may not exist below the mount: fall back to the mount root.
  auto try_dir = [&](const std::string& base, const std::string& path, const char* limit_file,
                     const char* usage_file, const char* inactive_key) {
    for (const std::string& dir : {base + path, base}) {
      std::string text;
      if (!read_text(dir + "/" + limit_file, text)) continue;
      cg.path = dir + "/" + limit_file;
      uint64_t limit = 0;
      // v2 writes "max", v1 a number near 2^63 for "no limit".
      if (!read_u64_file(cg.path, limit) || limit >= (1ull << 60)) return true;
      cg.limited = true;
      cg.limit = limit;
      read_u64_file(dir + "/" + usage_file, cg.usage);
      std::string stat;
      if (read_text(dir + "/memory.stat", stat)) cg.inactive_file = stat_field(stat, inactive_key);
      return true;
    }
    return false;
  };
  if (have_v1 && try_dir("/sys/fs/cgroup/memory", v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file"))
    return cg;
  if (have_v2) try_dir("/sys/fs/cgroup", v2_path, "memory.max", "memory.current", "inactive_file");
  return cg;
}

}  // namespace sluice
