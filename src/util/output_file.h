// The one rule for every file sluice writes for the user (make-model -o, run --dump-logits and
// its .json, run --trace's trace.jsonl, dump-tensor OUT). sluice runs as root on machines that
// hold other people's files, so it must never destroy a path it did not create:
//
//   - the target must be absent, or an existing regular file when the caller passes
//     Existing::Replace (the commands' --force); a symbolic link, directory, device, FIFO or
//     socket is never replaced, forced or not (a link is not followed either);
//   - the bytes go to a temporary file created beside the target (same directory, so the rename
//     stays on one file system) with O_EXCL under a fresh name, so it cannot be anyone else's;
//   - commit() syncs it and renames it over the target: the target is either its old self or
//     the complete new file, never a partial one (kill -9 leaves at most the temporary file,
//     named TARGET.sluice-PID-N.tmp, and never touches TARGET). Without Replace the rename
//     refuses to replace a file that appeared meanwhile (RENAME_NOREPLACE);
//   - on failure (abort() or destruction without commit) only the temporary file is unlinked.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace sluice {

enum class Existing { Refuse, Replace };

// "a symbolic link", "a directory", "a FIFO", ... for messages that refuse a path.
const char* file_kind(mode_t mode);

// Throws Error naming the path unless `target` may be written under the rule above. Lets a
// command refuse before it spends time (loading a model) on output it could not keep.
void check_output_target(const std::string& target, Existing existing);

class AtomicOutputFile {
 public:
  AtomicOutputFile(std::string target, Existing existing);  // checks the target, creates the temp
  ~AtomicOutputFile();                                      // abort() unless committed
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  int fd() const { return fd_; }  // of the temporary file (for ftruncate and the like)
  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_; }

  // All of it or an Error "cannot write TARGET: <errno text>".
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }

  // fsync, close, re-check the target, rename. Throws (and removes the temp) on any failure.
  void commit();
  // Removes the temporary file; the target is untouched. Safe to call twice.
  void abort() noexcept;

 private:
  std::string target_, temp_;
  Existing existing_;
  int fd_ = -1;
  bool done_ = false;
};

}  // namespace sluice
