// The file size limit (RLIMIT_FSIZE, `ulimit -f`). A write that would pass it fails with EFBIG,
// and the kernel also sends SIGXFSZ, whose default action kills the process: no destructor
// runs, so temporary files stay and a server dies on its first large state file. sluice ignores
// SIGXFSZ from the start of main; every writer then sees EFBIG as an error, says it with the
// limit (write_error_text) and removes its temporary file (docs/files.md).
#pragma once
#include <string>

namespace sluice {

// Ignores SIGXFSZ for the whole process (call first thing in main, before any thread starts).
void ignore_file_size_signal();
// Puts back the disposition ignore_file_size_signal found (an ignored signal stays ignored
// across exec). Async-signal-safe: for a child between fork and exec.
void restore_file_size_signal();

// strerror(err); for EFBIG with the limit in force, e.g. "File too large (the file size limit,
// ulimit -f, is 32768 bytes)".
std::string write_error_text(int err);

}  // namespace sluice
