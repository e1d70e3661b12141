// The CPU backend's memory, linear and per-row ops and the hyper-connection mixes.
#include "backend/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu_linear.h"
#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"
#include "util/error.h"

namespace sluice {

CpuBackend::CpuBackend(int threads) : pool_(std::max(1, threads)), dot_bf16_(dot_for(type_traits(GgmlType::BF16))),
      unpack_fp4_(fp4_unpack_for(active_isa())), index_scores_(index_scores_for(active_isa())) {}

void prepare_cpu_weight(Weight& w) {
  if (!w.traits) w.traits = &type_traits(w.type);
  w.dot = dot_for(*w.traits);
  w.gemm = gemm_for(*w.traits);
  w.gemm_min = (uint32_t)gemm_min_tokens(*w.traits, active_isa());
}

void CpuBackend::prepare_weight(Weight& w) const { prepare_cpu_weight(w); }

Tensor CpuBackend::tensor(size_t n, size_t width) const {
  const size_t count = n * width;
  // Value-initialized: zero-filled, as the forward pass's accumulators need.
  return Tensor(std::shared_ptr<float[]>(new float[std::max<size_t>(count, 1)]()), n, width);
}

void CpuBackend::linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const {
  if (x.width != W.cols) throw Error("linear: " + std::to_string(x.width) + " inputs for a weight of " + std::to_string(W.cols) + " columns");
  lin(pool_, W, x.p, x.stride, x.n, y.p, y.stride, round, row0, y.width);
}

void CpuBackend::embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const {
  const size_t H = table.cols;
  std::vector<float> e(H);
  for (size_t i = 0; i < tokens.size(); ++i) {
    table.traits->dequant(table.row(tokens[i]), e.data(), (int64_t)H);
    for (size_t k = 0; k < H; ++k) e[k] = round_bf16(e[k]);
    for (uint32_t h = 0; h < copies; ++h) std::copy(e.begin(), e.end(), X.row(i) + (size_t)h * H);
  }
}

void CpuBackend::rms_norm(Mat x, const float* w, float eps) const {
  for (size_t i = 0; i < x.n; ++i) sluice::rms_norm(x.row(i), w, x.row(i), x.width, eps);
}

void CpuBackend::rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const {
  const std::span<const double> freqs(t.freqs, t.pairs);  // no copy per call
  const size_t heads = x.width / head_dim;
  for (size_t i = 0; i < x.n; ++i) {
    const RopeAngles a = rope_angles(freqs, pos[i]);
    for (size_t h = 0; h < heads; ++h) rope_apply(x.row(i) + h * head_dim, head_dim, a, inverse);
  }
}

void CpuBackend::fake_quant(Mat x, FakeQuant kind) const {
  for (size_t i = 0; i < x.n; ++i) {
    switch (kind) {
      case FakeQuant::Fp8Window: fake_quant_fp8_window(x.row(i), x.width); break;
      case FakeQuant::Nvfp4: fake_quant_nvfp4(x.row(i), x.width); break;
      case FakeQuant::Mxfp4: fake_quant_mxfp4(x.row(i), x.width); break;
    }
  }
}

void CpuBackend::store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const {
  for (size_t i = 0; i < x.n; ++i)
    for (size_t k = 0; k < x.width; ++k) dst[i * dst_stride + k] = f32_to_bf16(x.row(i)[k]);
}

void CpuBackend::store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const {
  const size_t rb = fp4_row_bytes(grid, x.width);
  for (size_t i = 0; i < x.n; ++i) fp4_pack_row(grid, x.row(i), x.width, dst + i * rb);
}

void CpuBackend::add_round(CMat a, CMat b, Mat out) const {
  for (size_t i = 0; i < out.n; ++i)
    for (size_t k = 0; k < out.width; ++k) out.row(i)[k] = round_bf16(a.row(i)[k] + b.row(i)[k]);
}

void CpuBackend::fill_rows(Mat x, std::span<const float> row) const {
  for (size_t i = 0; i < x.n; ++i) std::copy(row.begin(), row.end(), x.row(i));
}

void CpuBackend::gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const {
  if (dst.width != src.width || dst.n != rows.size()) throw Error("gather_rows: shapes differ");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= src.n) throw Error("gather_rows: row " + std::to_string(rows[i]) + " of " + std::to_string(src.n));
    std::copy(src.row(rows[i]), src.row(rows[i]) + src.width, dst.row(i));
  }
}

void CpuBackend::scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const {
  if (dst.width != src.width || src.n != rows.size()) throw Error("scatter_rows: shapes differ");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= dst.n) throw Error("scatter_rows: row " + std::to_string(rows[i]) + " of " + std::to_string(dst.n));
    std::copy(src.row(i), src.row(i) + src.width, dst.row(rows[i]));
  }
}

void CpuBackend::add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const {
  if (out.width != terms.width || terms.n != tokens.size()) throw Error("add_rows: shapes differ");
  for (size_t j = 0; j < tokens.size(); ++j) {
    if (tokens[j] >= out.n) throw Error("add_rows: row " + std::to_string(tokens[j]) + " of " + std::to_string(out.n));
    float* o = out.row(tokens[j]);
    const float* d = terms.row(j);
    for (size_t k = 0; k < out.width; ++k) o[k] += d[k];
  }
}

// spec 3.2: the projections are one linear layer over the flattened streams (f32, no
// rounding), scaled by the f32 rms factor of the streams.
void CpuBackend::hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X,
                        Mat mixes) const {
  const size_t nmix = fn.rows;
  std::vector<float> raw(X.n * nmix);
  lin(pool_, fn, X.p, X.stride, X.n, raw.data(), nmix, /*round=*/false, 0, nmix);
  for (size_t i = 0; i < X.n; ++i) {
    const float r = rms_factor(X.row(i), X.width, p.norm_eps);
    float* mi = raw.data() + i * nmix;
    for (size_t k = 0; k < nmix; ++k) mi[k] = mi[k] * r;
    const HcMix mx = hc_mix_from_projections(mi, base, scale, p.hc, p.sinkhorn_iters, p.hc_eps);
    float* out = mixes.row(i);
    std::copy(mx.pre.begin(), mx.pre.end(), out);
    std::copy(mx.post.begin(), mx.post.end(), out + p.hc);
    std::copy(mx.comb.begin(), mx.comb.end(), out + 2 * p.hc);
  }
}

void CpuBackend::hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const {
  for (size_t i = 0; i < X.n; ++i) {
    float* yi = y.row(i);
    sluice::hc_pre(X.row(i), pre.row(i), p.hc, y.width, yi);
    sluice::rms_norm(yi, norm_w, yi, y.width, p.norm_eps);
  }
}

void CpuBackend::hc_pre(CMat X, CMat pre, HcParams p, Mat y) const {
  for (size_t i = 0; i < X.n; ++i) sluice::hc_pre(X.row(i), pre.row(i), p.hc, y.width, y.row(i));
}

void CpuBackend::hc_mean(CMat X, uint32_t hc, Mat y) const {
  const float inv = 1.0f / (float)hc;  // hc is a power of two in every config: exact
  for (size_t i = 0; i < X.n; ++i) {
    const float* x = X.row(i);
    float* yi = y.row(i);
    for (size_t d = 0; d < y.width; ++d) {
      float sum = 0.0f;
      for (uint32_t h = 0; h < hc; ++h) sum += x[(size_t)h * y.width + d];
      yi[d] = round_bf16(sum * inv);
    }
  }
}

void CpuBackend::hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const {
  HcMix mx;
  for (size_t i = 0; i < X.n; ++i) {
    const float* m = mixes.row(i);
    mx.pre.assign(m, m + hc);
    mx.post.assign(m + hc, m + 2 * hc);
    mx.comb.assign(m + 2 * hc, m + 2 * hc + (size_t)hc * hc);
    sluice::hc_post(F.row(i), X.row(i), mx, hc, F.width, Y.row(i));
  }
}

}  // namespace sluice
