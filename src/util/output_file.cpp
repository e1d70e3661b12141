#include "util/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/error.h"
#include "util/file_size_limit.h"

namespace sluice {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A name for the temporary file beside target. Uniqueness is only a courtesy: O_EXCL is what
// guarantees the file is a new one, and a clash just means trying the next counter.
std::string temp_name(const std::string& target) {
  static std::atomic<unsigned> counter{0};
  return target + ".sluice-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".tmp";
}

// Syncs the directory entry of a rename. Best effort: the file's data is already synced, and a
// directory that cannot be opened for reading must not turn a finished output into an error.
void sync_dir(const std::string& dir) {
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  (void)::fsync(d);
  ::close(d);
}

}  // namespace

const char* file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "of an unknown file type";
}

void check_output_target(const std::string& target, Existing existing) {
  if (target.empty()) throw Error("output path is empty");
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error("cannot check output " + target + ": " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw Error("refusing to write " + target + ": it is " + file_kind(st.st_mode) +
                ", and sluice only replaces regular files");
  if (existing == Existing::Refuse)
    throw Error("refusing to write " + target + ": it already exists (--force replaces an existing regular file)");
}

AtomicOutputFile::AtomicOutputFile(std::string target, Existing existing)
    : target_(std::move(target)), existing_(existing) {
  check_output_target(target_, existing_);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_ = temp_name(target_);
    // 0666 like any new file: the umask decides, as for the tools a user knows.
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  const int err = errno;
  temp_.clear();
  throw Error("cannot create a temporary file in " + dir_of(target_) + " for " + target_ + ": " + errno_text(err));
}

AtomicOutputFile::~AtomicOutputFile() { abort(); }

void AtomicOutputFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw Error("internal: " + target_ + " written after commit or abort");
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + target_ + ": " + write_error_text(errno));
    }
    p += w;
    n -= (size_t)w;
  }
}

void AtomicOutputFile::commit() {
  if (fd_ < 0) throw Error("internal: " + target_ + " committed twice or after abort");
  try {
    if (::fsync(fd_) != 0) throw Error("cannot write " + target_ + ": fsync: " + write_error_text(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw Error("cannot write " + target_ + ": close: " + write_error_text(errno));
    // The target may have changed since the constructor looked (a link or device put there).
    check_output_target(target_, existing_);
    if (existing_ == Existing::Refuse) {
      // Atomic "create, never replace". File systems without RENAME_NOREPLACE get link(), which
      // also fails when the name exists.
      if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
        if (errno != EINVAL && errno != ENOSYS) throw Error("cannot create " + target_ + ": " + errno_text(errno));
        if (::link(temp_.c_str(), target_.c_str()) != 0)
          throw Error("cannot create " + target_ + ": " + errno_text(errno));
        ::unlink(temp_.c_str());
      }
    } else if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw Error("cannot replace " + target_ + ": " + errno_text(errno));
    }
  } catch (...) {
    abort();
    throw;
  }
  done_ = true;
  sync_dir(dir_of(target_));
}

void AtomicOutputFile::abort() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!done_ && !temp_.empty()) ::unlink(temp_.c_str());  // only the file this object created
  done_ = true;
}

}  // namespace sluice
