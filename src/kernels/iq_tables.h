// Lookup tables of the IQ2 formats (quant-formats.md 4.7 / 4.8). The data is generated from
// tests/data/iq-grid-tables.txt by scripts/gen_iq_tables.py; the tests re-read that file.
#pragma once
#include <cstdint>

namespace sluice {

// Byte j of an entry (its little-endian memory byte j) is the magnitude of element j of an
// 8-element group; every byte is 0x08, 0x19 or 0x2b.
extern const uint64_t iq2xxs_grid[256];
extern const uint64_t iq2xs_grid[512];
// ksigns_iq2xs[i] = i | parity(i) << 7: a 7-bit sign index expands to 8 sign bits with an even
// number of negatives. Bit j set = element j negated (kmask_iq2xs[j] = 1 << j).
extern const uint8_t ksigns_iq2xs[128];
extern const uint8_t kmask_iq2xs[8];
// Derived for the SIMD kernels: byte j of ksigns_mask_iq2xs[i] is 0xff iff element j is negated.
extern const uint64_t ksigns_mask_iq2xs[128];

}  // namespace sluice
