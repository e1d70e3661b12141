// libFuzzer target for the state file reader (--kv-disk-dir reads what any earlier process, or
// anyone who can write the directory, left there). The first byte picks how the input becomes a
// file: raw (the bytes are the file), or a valid state file built from a seed in the input and
// then damaged by the rest of it (xor at offsets, a cut), which reaches the payload checks past a
// header a fuzzer would rarely guess. The reader may refuse (a StateCheck with its cause), but
// must never crash, read out of bounds or allocate beyond what the shape and the file size allow;
// a file it accepts must equal what was written (when it was written here and not damaged).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/state_file.h"
#include "util/error.h"

#include "memfd_input.h"

namespace {

sluice::StateShape shape() {
  sluice::StateShape s;
  s.layers = 2, s.window = 4, s.head_dim = 8, s.ctx = 40, s.vocab = 3, s.engram_tail = 3;
  s.sources = {{1, 6, 3}, {4, 6, 3}};
  return s;
}

const sluice::Digest128 kIdentity = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const sluice::SipKey kKey = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};

// A valid state file at a position from the seed byte, its contents from a simple generator.
std::vector<uint8_t> valid_file(uint8_t seed, sluice::SequenceSnapshot* snap_out) {
  const sluice::StateShape s = shape();
  const uint32_t pos = 1 + seed % s.ctx;
  uint32_t x = seed * 2654435761u + 1;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  sluice::SequenceSnapshot& snap = *snap_out;
  snap.ck.pos = pos;
  snap.ck.window_kv.resize((size_t)s.layers * std::min(pos, s.window) * s.head_dim);
  for (auto& v : snap.ck.window_kv) v = (uint16_t)next();
  for (const auto& src : s.sources) {
    snap.ck.carry_k.emplace_back((src.ratio - 1) * s.head_dim, 0.5f);
    snap.ck.carry_s.emplace_back((src.ratio - 1) * s.head_dim, -2.0f);
    snap.kv.emplace_back((pos / src.ratio) * src.kv_row_bytes, (uint8_t)next());
    snap.index_k.emplace_back((pos / src.ratio) * src.index_row_bytes, (uint8_t)next());
  }
  snap.ck.engram_tail.assign(s.engram_tail, (int64_t)next());
  std::vector<sluice::TokenId> tokens(pos);
  for (auto& t : tokens) t = next() % 1000;
  const std::vector<float> logits = seed & 1 ? std::vector<float>{1, 2, 3} : std::vector<float>{};
  const int fd = fuzz::input_fd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  sluice::write_state_file(fd, "fuzz", s, kIdentity, kKey, tokens, snap, logits);
  std::vector<uint8_t> bytes(sluice::state_file_bytes(s, pos, !logits.empty()));
  if (::pread(fd, bytes.data(), bytes.size(), 0) != (ssize_t)bytes.size()) std::abort();
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const sluice::StateShape s = shape();
  sluice::LoadedState out;
  if (data[0] & 1) {
    fuzz::put_file(data + 1, size - 1);
    (void)sluice::read_state_file(fuzz::input_fd(), s, kIdentity, kKey, &out);
    return 0;
  }
  if (size < 2) return 0;
  sluice::SequenceSnapshot written;
  std::vector<uint8_t> file = valid_file(data[1], &written);
  const std::vector<uint8_t> intact = file;
  // The rest: (offset lo, offset hi, xor) triples; a last odd pair cuts the file there.
  size_t i = 2;
  for (; i + 3 <= size; i += 3) {
    const size_t off = ((size_t)data[i] | (size_t)data[i + 1] << 8) % file.size();
    file[off] ^= data[i + 2];
  }
  if (i + 2 == size) {
    const size_t cut = ((size_t)data[i] | (size_t)data[i + 1] << 8) % (file.size() + 1);
    file.resize(cut);
  }
  const bool damaged = file != intact;
  fuzz::put_file(file.data(), file.size());
  const sluice::StateCheck c = sluice::read_state_file(fuzz::input_fd(), s, kIdentity, kKey, &out);
  if (!damaged && (!c || !(out.snap == written))) std::abort();  // an intact file must read back
  if (damaged && c) std::abort();  // every damage is noticed (the MAC covers every byte)
  return 0;
}
