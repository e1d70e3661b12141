// libFuzzer target for the GGUF reader: every input is a candidate file. The reader may refuse
// it (sluice::Error), but must never crash, hang, leak or allocate beyond its Limits.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "util/error.h"

#include "memfd_input.h"

namespace {

void exercise(const sluice::gguf::File& f) {
  for (const auto& kv : f.kvs()) {
    if (f.find(kv.key) != &kv.value) std::abort();
    try {
      (void)f.get_uint(kv.key);
    } catch (const sluice::Error&) {
    }
    try {
      (void)f.get_float(kv.key);
    } catch (const sluice::Error&) {
    }
    (void)kv.value.array_size();
  }
  uint8_t buf[64];
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) std::abort();
    if (t.file_offset + t.nbytes > f.file_size() || t.file_offset % f.alignment() != 0) std::abort();
    uint64_t n = t.nbytes < sizeof buf ? t.nbytes : sizeof buf;
    f.read_bytes(t, t.nbytes - n, buf, n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::put_file(data, size);
  const std::string path = fuzz::input_path();
  try {
    sluice::gguf::File f = sluice::gguf::File::open(path);
    exercise(f);
  } catch (const sluice::Error&) {
  }
  return 0;
}
