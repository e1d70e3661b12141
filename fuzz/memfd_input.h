// What the file-reading fuzz targets share: one memfd reused for every input (the readers take a
// path or a descriptor; /proc/self/fd/N is a path to it), and writing an input into it.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fuzz {

inline int input_fd() {
  static int fd = [] {
    int f = ::memfd_create("fuzz_input", MFD_CLOEXEC);
    if (f < 0) std::abort();
    return f;
  }();
  return fd;
}

inline std::string input_path() { return "/proc/self/fd/" + std::to_string(input_fd()); }

// The input file becomes data[0, n), then extended to `size` bytes with a hole (size > n).
inline void put_file(const uint8_t* data, size_t n, uint64_t size = 0) {
  const int fd = input_fd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, data + done, n - done, (off_t)done);
    if (w <= 0) std::abort();
    done += (size_t)w;
  }
  if (size > n && ::ftruncate(fd, (off_t)size) != 0) std::abort();
}

}  // namespace fuzz
