// Loops that run one instruction at its peak rate, for benchmarks to measure the arithmetic
// limit of this core in the same run as the kernel they judge (bench/bench_indexer.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice {

// iters x 10 independent vpdpbusd (64 int8 multiply-adds each); returns a value to keep.
// Only on a CPU with AVX-512 VNNI.
uint32_t peak_loop_vnni_avx512(size_t iters);
// iters x 10 independent 16-wide f32 FMAs. Only on a CPU with AVX-512.
float peak_loop_fma_avx512(size_t iters);

}  // namespace sluice
