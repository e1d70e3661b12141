// Bounded reads of user-named inputs (run -f FILE, tokenize's stdin). A prompt file can be
// anything the user can name: /dev/zero, a FIFO that never ends, a directory, a 100 GB log. The
// limit is checked before reading (fstat) when the size is known and while reading otherwise,
// so memory never exceeds it; every read is checked and errors name the path and errno text.
#pragma once
#include <cstdint>
#include <istream>
#include <string>

namespace sluice {

// All of `path`, at most `limit` bytes. A directory is an Error; so is more than `limit` bytes:
// "PATH: more than LIMIT bytes (WHY)", where `why` says where the limit comes from.
std::string read_file_bounded(const std::string& path, uint64_t limit, const std::string& why);

// The same for an open descriptor read to its end; `name` stands for it in messages.
std::string read_fd_bounded(int fd, const std::string& name, uint64_t limit, const std::string& why);

// read_file_bounded for an input that must be a regular file (a symbolic link to one is
// followed): a directory, FIFO, device or socket is an Error naming what it is, found before a
// byte is read and without blocking (the open is O_NONBLOCK, so a FIFO with no writer does not
// hang it). For inputs read whole and more than once in spirit, such as perplexity's text.
std::string read_regular_file_bounded(const std::string& path, uint64_t limit, const std::string& why);

// One line of `in` (without its '\n') into `line`, stored only up to `limit` bytes: a longer
// line is consumed to its end without being kept and reported as TooLong, so an endless line
// (`chat < /dev/zero`) costs no memory. End: no more input (a last line without '\n' is a Line).
enum class LineRead { Line, TooLong, End };
LineRead read_line_bounded(std::istream& in, std::string& line, size_t limit);

}  // namespace sluice
