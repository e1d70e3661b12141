// The reference forward pass: see reference_forward.h. Section numbers (§) are those of
// shared/spec/deepseek-v41.md, "num §" those of docs/numerics.md.
//
// Conventions: every vector is std::vector<double>. Values at a BF16 rounding point are
// rounded with bf16() (so they are exactly BF16); values the contract keeps in f32 stay double
// (more exact than the engine, which is the point). Every sum is an f64 sum in index order.
#include "reference_forward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "kernels/fp.h"
#include "kernels/types.h"

namespace sluice::reference {
namespace {

using Vec = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("reference: " + what); }

double bf16(double x) { return round_bf16((float)x); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

double dot(const double* a, const double* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ---- hyperparameters (read straight from the deepseek41.* keys, spec §2.2) -----------------

std::vector<uint64_t> uint_array(const gguf::File& f, const std::string& key) {
  const gguf::Value& v = f.get(key);
  if (!v.is_array()) fail(key + " is not an array");
  std::vector<uint64_t> out;
  for (uint64_t x : v.au) out.push_back(x);
  for (int64_t x : v.ai) out.push_back((uint64_t)x);
  return out;
}

Hparams read_hparams(const gguf::File& f) {
  auto u = [&](const char* k) { return (uint32_t)f.get_uint(std::string("deepseek41.") + k); };
  auto r = [&](const char* k) { return f.get_float(std::string("deepseek41.") + k); };
  auto list = [&](const char* k) {
    std::vector<uint32_t> out;
    for (uint64_t x : uint_array(f, std::string("deepseek41.") + k)) out.push_back((uint32_t)x);
    return out;
  };
  Hparams h;
  h.n_vocab = u("vocab_size");
  h.n_embd = u("hidden_size");
  h.n_layer = u("num_hidden_layers");
  h.n_head = u("num_attention_heads");
  h.head_dim = u("head_dim");
  h.rope_dim = u("qk_rope_head_dim");
  h.q_rank = u("q_lora_rank");
  h.o_rank = u("o_lora_rank");
  h.o_groups = u("o_groups");
  h.n_ff = u("moe_intermediate_size");
  h.n_expert = u("n_routed_experts");
  h.n_expert_used = u("num_experts_per_tok");
  h.window = u("sliding_window");
  h.hc = u("hc_mult");
  h.sinkhorn_iters = u("hc_sinkhorn_iters");
  h.idx_heads = u("index_n_heads");
  h.idx_head_dim = u("index_head_dim");
  h.idx_topk = u("index_topk");
  h.cand_layer = u("candidate_source_layer_id");
  h.cand_blocks = u("candidate_topk_blocks");
  h.cand_block_size = u("candidate_block_size");
  h.ratios = list("compress_ratios");
  h.kv_sources = list("kv_source_layer_ids");
  h.index_sources = list("index_source_layer_ids");
  h.rope_theta = r("rope_theta");
  h.compress_theta = r("compress_rope_theta");
  h.yarn_factor = r("rope_scaling.factor");
  h.yarn_beta_fast = r("rope_scaling.beta_fast");
  h.yarn_beta_slow = r("rope_scaling.beta_slow");
  h.yarn_orig_ctx = r("rope_scaling.original_max_position_embeddings");
  h.eps = (float)r("rms_norm_eps");
  h.hc_eps = (float)r("hc_eps");
  h.swiglu_limit = (float)r("swiglu_limit");
  h.route_scale = (float)r("routed_scaling_factor");
  if (u("n_shared_experts") != 1) fail("only one shared expert is supported");
  if (h.ratios.size() != h.n_layer) fail("compress_ratios must have num_hidden_layers entries");

  // Engram: table parameters have their own keys; head count / width / n-gram size are only in
  // the config.json copy.
  h.engram_layers = list("engram.layer_ids");
  if (!h.engram_layers.empty()) {
    nlohmann::json j = nlohmann::json::parse(f.get_string("deepseek41.config"));
    if (j.contains("text_config")) j = j["text_config"];
    h.eg_heads = j.at("engram_n_heads").get<uint32_t>();
    h.eg_head_dim = j.at("engram_head_dim").get<uint32_t>();
    h.eg_orders = j.at("engram_max_ngram_size").get<uint32_t>() - 1;
    h.eg_pad = f.get_uint("deepseek41.engram.pad_id");
    h.eg_token_map = list("engram.token_map");
    h.eg_primes = uint_array(f, "deepseek41.engram.primes");
    h.eg_multipliers = uint_array(f, "deepseek41.engram.multipliers");
    const size_t n = h.engram_layers.size();
    if (h.eg_token_map.size() != h.n_vocab || h.eg_primes.size() != n * h.eg_orders * h.eg_heads ||
        h.eg_multipliers.size() != n * (h.eg_orders + 1))
      fail("Engram token map / primes / multipliers have the wrong length");
  }
  return h;
}

// Layer roles (spec §1 "Rule"): the largest listed layer <= L, or -1.
int latest_at_or_before(const std::vector<uint32_t>& ids, uint32_t L) {
  int best = -1;
  for (uint32_t x : ids)
    if (x <= L) best = std::max(best, (int)x);
  return best;
}
bool contains(const std::vector<uint32_t>& ids, uint32_t L) {
  return std::find(ids.begin(), ids.end(), L) != ids.end();
}

// ---- weights ------------------------------------------------------------------------------

// A tensor dequantized to f32 with the scalar dequantizer, as rows of `cols` (= ne[0]).
struct Mat {
  GgmlType type = GgmlType::F32;
  uint64_t rows = 0, cols = 0;
  std::vector<float> w;
  const float* row(uint64_t r) const { return w.data() + r * cols; }
  double at(uint64_t i) const { return w[i]; }
};

Mat load(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) fail("missing tensor " + name);
  Mat m;
  m.type = t->type;
  m.cols = t->ne[0];
  m.rows = t->n_elements() / m.cols;
  std::vector<uint8_t> raw(t->nbytes);
  f.read_bytes(*t, 0, raw.data(), raw.size());
  m.w.resize(m.rows * m.cols);
  const TypeTraits& tt = type_traits(t->type);
  if (!tt.dequant) fail("no dequantizer for the type of " + name);
  tt.dequant(raw.data(), m.w.data(), (int64_t)m.w.size());
  return m;
}

struct Layer {
  Mat hc_attn_fn, hc_attn_base, hc_attn_scale, attn_norm;
  Mat hc_ffn_fn, hc_ffn_base, hc_ffn_scale, ffn_norm;
  Mat sinks, q_a, q_a_norm, q_b, kv, kv_norm, o_a, o_b;
  Mat router, bias, gate_sh, up_sh, down_sh, gate_ex, up_ex, down_ex;
  Mat comp_kv, comp_gate, comp_norm, idx_k, idx_k_norm;  // KV source
  Mat idx_q_b, idx_proj;                                  // index source
  Mat eg_q_norm, eg_k_norm, eg_kv;                        // Engram before this layer
  const gguf::TensorInfo* eg_table = nullptr;             // read row by row
};

// The tensors every block has (a target layer "blk.L." or a DSpark stage "mtp.S.").
void load_block(const gguf::File& f, const std::string& p, Layer& w) {
  auto get = [&](const char* n) { return load(f, p + n); };
  w.hc_attn_fn = get("hc_attn_fn.weight");
  w.hc_attn_base = get("hc_attn_base.weight");
  w.hc_attn_scale = get("hc_attn_scale.weight");
  w.attn_norm = get("attn_norm.weight");
  w.hc_ffn_fn = get("hc_ffn_fn.weight");
  w.hc_ffn_base = get("hc_ffn_base.weight");
  w.hc_ffn_scale = get("hc_ffn_scale.weight");
  w.ffn_norm = get("ffn_norm.weight");
  w.sinks = get("attn_sinks.weight");
  w.q_a = get("attn_q_a.weight");
  w.q_a_norm = get("attn_q_a_norm.weight");
  w.q_b = get("attn_q_b.weight");
  w.kv = get("attn_kv.weight");
  w.kv_norm = get("attn_kv_a_norm.weight");
  w.o_a = get("attn_output_a.weight");
  w.o_b = get("attn_output_b.weight");
  w.router = get("ffn_gate_inp.weight");
  w.bias = get("exp_probs_b.bias");
  w.gate_sh = get("ffn_gate_shexp.weight");
  w.up_sh = get("ffn_up_shexp.weight");
  w.down_sh = get("ffn_down_shexp.weight");
  w.gate_ex = get("ffn_gate_exps.weight");
  w.up_ex = get("ffn_up_exps.weight");
  w.down_ex = get("ffn_down_exps.weight");
}

// ---- fake-quantization helpers (num §5) --------------------------------------------------------

void require_blocks(size_t n, size_t block) {
  if (n % block != 0) fail(std::to_string(n) + " values are not a whole number of blocks of " + std::to_string(block));
}

// 2^ceil(log2(x)) for x > 0, exactly.
float pow2_ceil(float x) {
  int e = 0;
  const float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? x : std::ldexp(1.0f, e);
}

// Nearest value in a table of non-negative grid values indexed by code; ties go to the even
// code; beyond the last value saturates.
float nearest_on_grid(float x, const float* grid, int n) {
  const double a = std::fabs((double)x);
  int best = 0;
  double best_d = kInf;
  for (int c = 0; c < n; ++c) {
    const double d = std::fabs((double)grid[c] - a);
    if (d < best_d || (d == best_d && c % 2 == 0)) { best = c; best_d = d; }
  }
  return std::copysign(grid[best], x);
}

}  // namespace

// ---- activation quantization for mimic mode (numerics §1-2; quant-formats §3.1, §3.3) -------

// Q8_0 reference rule per 32 values: d = amax/127, q = roundf(x/d) (half away from zero),
// dequantized with the stored fp16 scale.
void q8_0_roundtrip(Vec& x) {
  require_blocks(x.size(), 32);
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs((float)x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const double stored_d = f16_to_f32(f32_to_f16(d));
    for (size_t i = b; i < b + 32; ++i) x[i] = stored_d * std::round((float)x[i] * id);
  }
}

// Q8_K rule per 256 values: iscale = -127/max (max = signed value of the first largest |x|),
// q = min(127, nearest-even(iscale*x)), dequantized with d = 1/iscale.
void q8_k_roundtrip(Vec& x) {
  require_blocks(x.size(), 256);
  for (size_t b = 0; b < x.size(); b += 256) {
    float amax = 0, maxv = 0;
    for (size_t i = b; i < b + 256; ++i)
      if (std::fabs((float)x[i]) > amax) { amax = std::fabs((float)x[i]); maxv = (float)x[i]; }
    if (amax == 0) {
      for (size_t i = b; i < b + 256; ++i) x[i] = 0;
      continue;
    }
    const float iscale = -127.0f / maxv;
    const double d = 1.0f / iscale;
    for (size_t i = b; i < b + 256; ++i)
      x[i] = d * std::min(127.0f, std::nearbyint(iscale * (float)x[i]));
  }
}

float e4m3_round(float x) {
  static const std::vector<float> grid = [] {
    std::vector<float> g;
    for (int c = 0; c <= 0x7e; ++c) g.push_back(e4m3_to_f32((uint8_t)c));  // 0 .. 448
    return g;
  }();
  return nearest_on_grid(x, grid.data(), (int)grid.size());
}

float e2m1_round(float x) {
  static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return nearest_on_grid(x, grid, 8);
}

void fake_quant_fp8(std::vector<double>& v) {
  require_blocks(v.size(), 32);
  for (size_t b = 0; b < v.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs((float)v[i]));
    const float s = pow2_ceil(std::max(amax, 1e-4f) / 448.0f);
    for (size_t i = b; i < b + 32; ++i) {
      const float q = e4m3_round(std::clamp((float)v[i] / s, -448.0f, 448.0f));
      v[i] = bf16(q * s);
    }
  }
}

void fake_quant_nvfp4(std::vector<double>& v) {
  require_blocks(v.size(), 16);
  for (size_t b = 0; b < v.size(); b += 16) {
    float amax = 0;
    for (size_t i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs((float)v[i]));
    const float s = e4m3_round(std::max(amax, 6.0f * 0x1p-9f) / 6.0f);
    for (size_t i = b; i < b + 16; ++i) v[i] = bf16(e2m1_round((float)v[i] / s) * s);
  }
}

void fake_quant_mxfp4(std::vector<double>& v) {
  require_blocks(v.size(), 32);
  for (size_t b = 0; b < v.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs((float)v[i]));
    const float s = pow2_ceil(std::max(amax, 6.0f * 0x1p-126f) / 6.0f);
    for (size_t i = b; i < b + 32; ++i) v[i] = bf16(e2m1_round((float)v[i] / s) * s);
  }
}

std::vector<double> sinkhorn(const std::vector<double>& logits, int n, int iters, double eps) {
  Vec c = logits;
  auto at = [&](int i, int j) -> double& { return c[(size_t)i * n + j]; };
  auto normalise_rows = [&] {
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += at(i, j);
      for (int j = 0; j < n; ++j) at(i, j) /= s + eps;
    }
  };
  auto normalise_columns = [&] {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += at(i, j);
      for (int i = 0; i < n; ++i) at(i, j) /= s + eps;
    }
  };
  for (int i = 0; i < n; ++i) {  // row softmax, then + eps
    double mx = -kInf, s = 0;
    for (int j = 0; j < n; ++j) mx = std::max(mx, at(i, j));
    for (int j = 0; j < n; ++j) s += std::exp(at(i, j) - mx);
    for (int j = 0; j < n; ++j) at(i, j) = std::exp(at(i, j) - mx) / s + eps;
  }
  normalise_columns();
  for (int k = 1; k < iters; ++k) {
    normalise_rows();
    normalise_columns();
  }
  return c;
}

std::vector<uint64_t> engram_hash(const Hparams& hp, size_t ei, const std::vector<uint64_t>& ids) {
  const uint64_t* mul = hp.eg_multipliers.data() + ei * (hp.eg_orders + 1);
  const uint64_t* primes = hp.eg_primes.data() + ei * hp.eg_orders * hp.eg_heads;
  std::vector<uint64_t> rows(hp.eg_orders * hp.eg_heads);
  uint64_t h = ids[0] * mul[0];
  uint64_t offset = 0;
  for (uint32_t j = 1; j <= hp.eg_orders; ++j) {  // j = 1: 2-gram, 2: 3-gram, ...
    h ^= ids[j] * mul[j];
    for (uint32_t head = 0; head < hp.eg_heads; ++head) {
      const uint32_t c = (j - 1) * hp.eg_heads + head;
      rows[c] = h % primes[c] + offset;
      offset += primes[c];
    }
  }
  return rows;
}

// ---- the model --------------------------------------------------------------------------------

struct Forward::Impl {
  gguf::File file;
  Options opt;
  Hparams hp;
  Mat token_embd, output_norm, output;
  std::vector<Layer> layers;
  std::vector<Vec> freqs;  // per layer: RoPE frequencies

  // The whole history of the sequence.
  uint32_t pos = 0;
  std::vector<int64_t> tail;                         // Engram: previous compressed ids, newest first, -1 = DEAD
  std::vector<std::vector<Vec>> window_kv;           // [layer][position]
  std::map<uint32_t, std::vector<Vec>> comp_k, comp_s;   // KV source: f32 projections per position
  std::map<uint32_t, std::vector<Vec>> comp_kv, index_k;  // KV source: rows per group
  // Per position (reset every step): top-k of each index source, candidate mask.
  std::map<uint32_t, std::vector<int32_t>> topk;
  std::vector<bool> candidates;

  explicit Impl(const std::string& path, Options o) : file(gguf::File::open(path)), opt(o) {
    hp = read_hparams(file);
    token_embd = load(file, "token_embd.weight");
    output_norm = load(file, "output_norm.weight");
    output = load(file, "output.weight");
    for (uint32_t L = 0; L < hp.n_layer; ++L) {
      const std::string p = "blk." + std::to_string(L) + ".";
      auto get = [&](const char* n) { return load(file, p + n); };
      Layer w;
      load_block(file, p, w);
      if (contains(hp.kv_sources, L)) {
        w.comp_kv = get("attn_compressor_kv.weight");
        if (hp.ratios[L] > 1) w.comp_gate = get("attn_compressor_gate.weight");
        w.comp_norm = get("attn_compressor_norm.weight");
        w.idx_k = get("indexer.attn_k.weight");
        w.idx_k_norm = get("indexer.k_norm.weight");
      }
      if (contains(hp.index_sources, L)) {
        w.idx_q_b = get("indexer.attn_q_b.weight");
        w.idx_proj = get("indexer.proj.weight");
      }
      if (contains(hp.engram_layers, L)) {
        w.eg_q_norm = get("engram_q_norm.weight");
        w.eg_k_norm = get("engram_k_norm.weight");
        w.eg_kv = get("engram_kv.weight");
        w.eg_table = file.find_tensor(p + "engram_embd.weight");
        if (!w.eg_table) fail("missing tensor " + p + "engram_embd.weight");
      }
      layers.push_back(std::move(w));
      freqs.push_back(rope_freqs(hp.ratios[L]));
    }
    tail.assign(hp.eg_orders, -1);
    window_kv.resize(hp.n_layer);
  }

  // ---- primitives (§3.0, num §4) ----

  // y = x · W^T for rows [first, first + n) of W: an f64 sum over the (dequantized) weights.
  // Mimic mode first quantizes x the way the engine's lin() does (num §2).
  Vec lin(const Mat& W, Vec x, uint64_t first = 0, uint64_t n = 0) const {
    if (n == 0) n = W.rows;
    if (x.size() != W.cols) fail("linear input size mismatch");
    if (opt.mimic && W.type != GgmlType::F32 && W.type != GgmlType::F16 && W.type != GgmlType::BF16) {
      if (type_traits(W.type).block_elems == 256) q8_k_roundtrip(x);
      else q8_0_roundtrip(x);
    }
    Vec y(n);
    for (uint64_t r = 0; r < n; ++r) {
      const float* w = W.row(first + r);
      double s = 0;
      for (uint64_t i = 0; i < W.cols; ++i) s += (double)w[i] * x[i];
      y[r] = s;
    }
    return y;
  }
  Vec lin_bf16(const Mat& W, const Vec& x, uint64_t first = 0, uint64_t n = 0) const {
    Vec y = lin(W, x, first, n);
    for (double& v : y) v = bf16(v);
    return y;
  }

  Vec rms(const Vec& x, const Mat& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / (double)x.size() + (double)hp.eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = bf16(x[i] * r * w.at(i));
    return y;
  }

  Vec rope_freqs(uint32_t ratio) const {
    const double r = hp.rope_dim;
    const double theta = ratio == 0 ? hp.rope_theta : hp.compress_theta;
    Vec f(hp.rope_dim / 2);
    for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(theta, -2.0 * (double)i / r);
    if (ratio > 0) {  // YaRN
      auto cd = [&](double x) {
        return r * std::log(hp.yarn_orig_ctx / (2 * std::numbers::pi * x)) / (2 * std::log(theta));
      };
      const double low = std::max(std::floor(cd(hp.yarn_beta_fast)), 0.0);
      const double high = std::min(std::ceil(cd(hp.yarn_beta_slow)), r - 1);
      for (size_t i = 0; i < f.size(); ++i) {
        const double ramp = std::clamp(((double)i - low) / std::max(high - low, 1e-3), 0.0, 1.0);
        f[i] = f[i] / hp.yarn_factor * ramp + f[i] * (1 - ramp);
      }
    }
    return f;
  }

  // RoPE on the last rope_dim values of v[base .. base+dim), interleaved pairs; BF16 output.
  void rope(Vec& v, size_t base, size_t dim, uint32_t L, double position, bool inverse = false) const {
    rope_with(v, base, dim, freqs[L], position, inverse);
  }
  void rope_with(Vec& v, size_t base, size_t dim, const Vec& f, double position, bool inverse = false) const {
    const size_t b = base + dim - hp.rope_dim;
    for (size_t i = 0; i < hp.rope_dim / 2; ++i) {
      const double a = position * f[i];
      const double c = (float)std::cos(a);
      const double s = inverse ? -(double)(float)std::sin(a) : (double)(float)std::sin(a);
      const double re = v[b + 2 * i], im = v[b + 2 * i + 1];
      v[b + 2 * i] = bf16(re * c - im * s);
      v[b + 2 * i + 1] = bf16(re * s + im * c);
    }
  }

  // ---- hyper-connections (§3.2) ----

  struct Mix {
    Vec pre, post, comb;  // comb[i*hc + j]: source stream i -> destination j
  };

  Mix hc_mixes(const std::vector<Vec>& X, const Mat& fn, const Mat& base, const Mat& scale) const {
    const uint32_t n = hp.hc;
    Vec flat;
    for (const Vec& x : X) flat.insert(flat.end(), x.begin(), x.end());
    double ss = 0;
    for (double v : flat) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / (double)flat.size() + (double)hp.eps);
    Vec m = lin(fn, flat);
    for (double& v : m) v *= r;
    Mix mix;
    for (uint32_t h = 0; h < n; ++h) {
      mix.pre.push_back(sigmoid(m[h] * scale.at(0) + base.at(h)) + hp.hc_eps);
      mix.post.push_back(2 * sigmoid(m[n + h] * scale.at(1) + base.at(n + h)));
    }
    Vec logits(n * n);
    for (uint32_t k = 0; k < n * n; ++k) logits[k] = m[2 * n + k] * scale.at(2) + base.at(2 * n + k);
    mix.comb = sinkhorn(logits, (int)n, (int)hp.sinkhorn_iters, hp.hc_eps);
    return mix;
  }

  Vec hc_pre(const std::vector<Vec>& X, const Vec& w) const {
    Vec y(hp.n_embd);
    for (size_t i = 0; i < y.size(); ++i) {
      double s = 0;
      for (uint32_t h = 0; h < hp.hc; ++h) s += w[h] * X[h][i];
      y[i] = bf16(s);
    }
    return y;
  }

  std::vector<Vec> hc_post(const Vec& F, const std::vector<Vec>& X, const Mix& mix) const {
    std::vector<Vec> Y(hp.hc, Vec(hp.n_embd));
    for (uint32_t j = 0; j < hp.hc; ++j)
      for (size_t e = 0; e < hp.n_embd; ++e) {
        double s = mix.post[j] * F[e];
        for (uint32_t i = 0; i < hp.hc; ++i) s += mix.comb[i * hp.hc + j] * X[i][e];
        Y[j][e] = bf16(s);
      }
    return Y;
  }

  // ---- Engram (§4) ----

  // Row ids of the current token for every Engram layer (§4.3). Text only: never DEAD itself.
  std::vector<std::vector<uint64_t>> engram_rows(uint32_t token) {
    if (hp.engram_layers.empty()) return {};
    std::vector<int64_t> ids = {(int64_t)hp.eg_token_map[token]};
    ids.insert(ids.end(), tail.begin(), tail.end());
    std::vector<uint64_t> padded;
    bool blocked = false;
    for (int64_t id : ids) {
      blocked = blocked || id < 0;
      padded.push_back(blocked ? hp.eg_pad : (uint64_t)id);
    }
    tail.insert(tail.begin(), ids[0]);
    tail.pop_back();
    std::vector<std::vector<uint64_t>> rows;
    for (size_t ei = 0; ei < hp.engram_layers.size(); ++ei) rows.push_back(engram_hash(hp, ei, padded));
    return rows;
  }

  void engram(const Layer& w, std::vector<Vec>& X, const std::vector<uint64_t>& rows) const {
    const uint32_t hd = hp.eg_head_dim, row_bytes = hd + hd / 32;
    Vec E;
    for (uint64_t r : rows) {
      std::vector<uint8_t> raw(row_bytes);
      file.read_bytes(*w.eg_table, r * row_bytes, raw.data(), row_bytes);
      for (uint32_t i = 0; i < hd; ++i) {
        const uint8_t code = raw[i], scale = raw[hd + i / 32];
        if (e4m3_is_nan(code) || e8m0_is_nan(scale)) fail("NaN in Engram row " + std::to_string(r));
        E.push_back(bf16((double)e4m3_to_f32(code) * (double)e8m0_to_f32(scale)));
      }
    }
    const Vec kv = lin_bf16(w.eg_kv, E);  // hc keys then one value, n_embd each
    const size_t n = hp.n_embd;
    for (uint32_t h = 0; h < hp.hc; ++h) {
      const double* key = kv.data() + h * n;
      const double* val = kv.data() + hp.hc * n;
      double d = 0, xx = 0, kk = 0;
      for (size_t i = 0; i < n; ++i) {
        const double wq = (double)(w.eg_q_norm.row(h)[i] * w.eg_k_norm.row(h)[i]);  // f32 product first
        d += X[h][i] * wq * key[i];
        xx += X[h][i] * X[h][i];
        kk += key[i] * key[i];
      }
      d *= 1.0 / std::sqrt(xx / (double)n + (double)hp.eps);
      d *= 1.0 / std::sqrt(kk / (double)n + (double)hp.eps);
      d *= 1.0 / std::sqrt((double)n);
      const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
      const double gate = sigmoid(sign * std::sqrt(std::max(std::fabs(d), 1e-6)));
      for (size_t i = 0; i < n; ++i) X[h][i] = bf16(X[h][i] + gate * val[i]);
    }
  }

  // ---- attention (§3.4) ----

  // Compressor of a KV-source layer: keeps the f32 projections of every position and, when a
  // group of `ratio` positions completes, appends its compressed KV row and index key.
  void compress(uint32_t L, const Vec& x, uint32_t t) {
    const Layer& w = layers[L];
    const uint32_t ratio = hp.ratios[L];
    comp_k[L].push_back(lin(w.comp_kv, x));
    if (ratio > 1) comp_s[L].push_back(lin(w.comp_gate, x));
    if ((t + 1) % ratio != 0) return;
    const uint32_t g = t / ratio, first = g * ratio;
    Vec pooled(hp.head_dim);
    for (size_t c = 0; c < hp.head_dim; ++c) {
      if (ratio == 1) { pooled[c] = comp_k[L][t][c]; continue; }
      double mx = -kInf, den = 0, num = 0;  // per-channel softmax over the group's gate logits
      for (uint32_t j = 0; j < ratio; ++j) mx = std::max(mx, comp_s[L][first + j][c]);
      for (uint32_t j = 0; j < ratio; ++j) den += std::exp(comp_s[L][first + j][c] - mx);
      for (uint32_t j = 0; j < ratio; ++j) num += std::exp(comp_s[L][first + j][c] - mx) / den * comp_k[L][first + j][c];
      pooled[c] = num;
    }
    for (double& v : pooled) v = bf16(v);
    const Vec latent = rms(pooled, w.comp_norm);
    const double pos_c = (double)g * ratio;
    Vec ik = rms(lin_bf16(w.idx_k, latent), w.idx_k_norm);  // index key from the latent before RoPE
    rope(ik, 0, hp.idx_head_dim, L, pos_c);
    fake_quant_mxfp4(ik);
    index_k[L].push_back(ik);
    Vec ckv = latent;
    rope(ckv, 0, hp.head_dim, L, pos_c);
    fake_quant_nvfp4(ckv);
    comp_kv[L].push_back(ckv);
  }

  // Candidate blocks (num §6): mask over the n_vis visible rows.
  std::vector<bool> candidate_blocks(const Vec& score, size_t n_vis) const {
    const size_t B = hp.cand_block_size, nb = (n_vis + B - 1) / B;
    std::vector<std::pair<double, size_t>> blocks;  // (score, block)
    for (size_t k = 0; k < nb; ++k) {
      double m = -kInf;
      for (size_t j = k * B; j < std::min((k + 1) * B, n_vis); ++j) m = std::max(m, score[j]);
      if (k == (n_vis - 1) / B) m = kInf;  // the newest row's block is always kept
      blocks.push_back({m, k});
    }
    std::stable_sort(blocks.begin(), blocks.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<bool> mask(n_vis, false);
    for (size_t i = 0; i < std::min<size_t>(hp.cand_blocks, nb); ++i) {
      if (blocks[i].first == -kInf) continue;
      for (size_t j = blocks[i].second * B; j < std::min((blocks[i].second + 1) * B, n_vis); ++j) mask[j] = true;
    }
    return mask;
  }

  // Lightning indexer of an index-source layer: the selected compressed rows, ascending.
  std::vector<int32_t> indexer(uint32_t L, const Vec& x, const Vec& qr, uint32_t t) {
    const Layer& w = layers[L];
    const uint32_t nh = hp.idx_heads, hd = hp.idx_head_dim;
    Vec iq = lin_bf16(w.idx_q_b, qr);
    for (uint32_t h = 0; h < nh; ++h) rope(iq, h * hd, hd, L, t);
    fake_quant_mxfp4(iq);  // blocks of 32 never straddle two heads
    Vec wt = lin_bf16(w.idx_proj, x);
    for (double& v : wt) v /= std::sqrt((double)hd * nh);
    const uint32_t src = (uint32_t)latest_at_or_before(hp.kv_sources, L);
    const size_t n_vis = (t + 1) / hp.ratios[src];
    if (index_k[src].size() != n_vis) fail("compressed row count disagrees with n_vis");
    Vec score(n_vis);
    for (size_t j = 0; j < n_vis; ++j) {
      double s = 0;
      for (uint32_t h = 0; h < nh; ++h) s += std::max(dot(iq.data() + h * hd, index_k[src][j].data(), hd), 0.0) * wt[h];
      score[j] = s;
    }
    if (L == hp.cand_layer) candidates = candidate_blocks(score, n_vis);
    if (L > hp.cand_layer)
      for (size_t j = 0; j < n_vis; ++j)
        if (j >= candidates.size() || !candidates[j]) score[j] = -kInf;
    std::vector<int32_t> order;
    for (size_t j = 0; j < n_vis; ++j)
      if (score[j] != -kInf) order.push_back((int32_t)j);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
    if (order.size() > hp.idx_topk) order.resize(hp.idx_topk);
    std::sort(order.begin(), order.end());
    return order;
  }

  Vec attention(uint32_t L, const Vec& x, uint32_t t, TokenResult& out) {
    const Layer& w = layers[L];
    const uint32_t nh = hp.n_head, hd = hp.head_dim;
    // Queries.
    const Vec qr = rms(lin_bf16(w.q_a, x), w.q_a_norm);
    Vec q = lin_bf16(w.q_b, qr);
    for (uint32_t h = 0; h < nh; ++h) rope(q, h * hd, hd, L, t);
    // This token's window KV.
    Vec kv = rms(lin_bf16(w.kv, x), w.kv_norm);
    rope(kv, 0, hd, L, t);
    fake_quant_fp8(kv);
    window_kv[L].push_back(kv);
    // Compressed KV and sparse selection.
    if (contains(hp.kv_sources, L)) compress(L, x, t);
    if (contains(hp.index_sources, L)) {
      topk[L] = indexer(L, x, qr, t);
      out.selected_rows[L] = topk[L];
    }
    // The rows this query attends to: window rows ascending, then selected compressed rows.
    std::vector<const Vec*> rows;
    for (uint32_t p = t + 1 > hp.window ? t + 1 - hp.window : 0; p <= t; ++p) rows.push_back(&window_kv[L][p]);
    if (hp.ratios[L] > 0) {
      const uint32_t kv_src = (uint32_t)latest_at_or_before(hp.kv_sources, L);
      const uint32_t topk_src = (uint32_t)latest_at_or_before(hp.index_sources, L);
      for (int32_t g : topk.at(topk_src)) rows.push_back(&comp_kv[kv_src].at((size_t)g));
    }
    // Sparse attention with a sink per head.
    Vec o(nh * hd);
    for (uint32_t h = 0; h < nh; ++h) {
      const double* qh = q.data() + h * hd;
      Vec s;
      for (const Vec* r : rows) s.push_back(dot(qh, r->data(), hd) / std::sqrt((double)hd));
      const double m = *std::max_element(s.begin(), s.end());
      double den = std::exp((double)w.sinks.at(h) - m);
      Vec num(hd, 0.0);
      for (size_t r = 0; r < rows.size(); ++r) {
        const double p = std::exp(s[r] - m);
        den += p;  // the denominator takes p in f32, the numerator its BF16 rounding
        const double p_bf16 = bf16(p);
        for (uint32_t i = 0; i < hd; ++i) num[i] += p_bf16 * (*rows[r])[i];
      }
      for (uint32_t i = 0; i < hd; ++i) o[h * hd + i] = bf16(num[i] / den);
      rope(o, h * hd, hd, L, t, /*inverse=*/true);
    }
    // Grouped low-rank output projection.
    const size_t group_in = (size_t)nh / hp.o_groups * hd;
    Vec z;
    for (uint32_t g = 0; g < hp.o_groups; ++g) {
      const Vec og(o.begin() + g * group_in, o.begin() + (g + 1) * group_in);
      const Vec zg = lin_bf16(w.o_a, og, (uint64_t)g * hp.o_rank, hp.o_rank);
      z.insert(z.end(), zg.begin(), zg.end());
    }
    return lin_bf16(w.o_b, z);
  }

  // ---- MoE (§3.6, num §7) ----

  // SwiGLU of one expert: rows [first, first + n_ff) of gate/up, rows [first_down, +n_embd) of down.
  Vec expert(const Mat& gate, const Mat& up, const Mat& down, uint64_t first, uint64_t first_down,
             const Vec& x, double weight) const {
    const Vec g = lin_bf16(gate, x, first, hp.n_ff), u = lin_bf16(up, x, first, hp.n_ff);
    const double lim = hp.swiglu_limit;
    Vec h(hp.n_ff);
    for (size_t i = 0; i < h.size(); ++i) h[i] = bf16(silu(std::min(g[i], lim)) * std::clamp(u[i], -lim, lim) * weight);
    return lin_bf16(down, h, first_down, hp.n_embd);
  }

  // Router: selection by s + bias (stable sort: ties to the lower id), weights from s alone.
  // wk: the f64 weights the experts are run with; r.weights are their f32 roundings.
  Routing route(uint32_t L, const Vec& x, std::vector<double>* wk = nullptr) const {
    return route_with(layers.at(L), hp.n_expert, hp.n_expert_used, x, wk);
  }
  Routing route_with(const Layer& w, uint32_t n_expert, uint32_t n_used, const Vec& x, std::vector<double>* wk) const {
    const Vec logit = lin(w.router, x);
    Vec s(n_expert);
    Routing r;
    for (size_t e = 0; e < s.size(); ++e) {
      s[e] = std::sqrt(softplus(logit[e]));
      r.biased.push_back(s[e] + w.bias.at(e));
    }
    std::vector<uint32_t> sel(n_expert);
    for (uint32_t e = 0; e < n_expert; ++e) sel[e] = e;
    std::stable_sort(sel.begin(), sel.end(), [&](uint32_t a, uint32_t b) { return r.biased[a] > r.biased[b]; });
    sel.resize(n_used);
    double sum = 0;
    for (uint32_t e : sel) sum += s[e];
    for (uint32_t e : sel) {
      const double k = s[e] / (sum + 1e-20) * hp.route_scale;
      r.experts.push_back(e);
      r.weights.push_back((float)k);
      if (wk) wk->push_back(k);
    }
    return r;
  }

  Vec moe(uint32_t L, const Vec& x, TokenResult& out) const {
    return moe_with(layers[L], hp.n_expert, hp.n_expert_used, x, out.experts[L], out.expert_weights[L]);
  }
  Vec moe_with(const Layer& w, uint32_t n_expert, uint32_t n_used, const Vec& x, std::vector<uint32_t>& experts,
               std::vector<float>& weights) const {
    std::vector<double> wk;
    Routing rt = route_with(w, n_expert, n_used, x, &wk);
    std::vector<size_t> ascending(rt.experts.size());  // positions in rt, by ascending expert id
    for (size_t j = 0; j < ascending.size(); ++j) ascending[j] = j;
    std::sort(ascending.begin(), ascending.end(), [&](size_t a, size_t b) { return rt.experts[a] < rt.experts[b]; });
    Vec routed(hp.n_embd, 0.0);
    for (size_t j : ascending) {
      const uint32_t e = rt.experts[j];
      const Vec y = expert(w.gate_ex, w.up_ex, w.down_ex, (uint64_t)e * hp.n_ff, (uint64_t)e * hp.n_embd, x, wk[j]);
      for (size_t i = 0; i < routed.size(); ++i) routed[i] += y[i];
    }
    experts = std::move(rt.experts);
    weights = std::move(rt.weights);
    const Vec sh = expert(w.gate_sh, w.up_sh, w.down_sh, 0, 0, x, 1.0);
    Vec y(hp.n_embd);
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16(routed[i] + sh[i]);
    return y;
  }

  // ---- one position (§3.1, §3.3, §3.7) ----

  TokenResult step(uint32_t token) {
    if (token >= hp.n_vocab) fail("token id out of range");
    const uint32_t t = pos;
    TokenResult out;
    out.experts.resize(hp.n_layer);
    out.expert_weights.resize(hp.n_layer);
    out.selected_rows.resize(hp.n_layer);
    out.engram_rows = engram_rows(token);
    topk.clear();
    candidates.clear();

    Vec e(token_embd.row(token), token_embd.row(token) + hp.n_embd);
    for (double& v : e) v = bf16(v);
    std::vector<Vec> X(hp.hc, e);
    Vec P(hp.hc, 0.0);
    P[0] = 1;
    out.captured.resize(hp.n_layer);
    for (uint32_t L = 0; L < hp.n_layer; ++L) {
      const Layer& w = layers[L];
      // DSpark's capture (spec 6.3 step 1): bf16 of the plain mean of the streams entering L.
      for (size_t i = 0; i < hp.n_embd; ++i) {
        double sum = 0;
        for (uint32_t h = 0; h < hp.hc; ++h) sum += X[h][i];
        out.captured[L].push_back((float)bf16(sum / hp.hc));
      }
      for (size_t ei = 0; ei < hp.engram_layers.size(); ++ei)
        if (hp.engram_layers[ei] == L) engram(w, X, out.engram_rows[ei]);
      const Mix A = hc_mixes(X, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale);
      const Vec a_in = rms(hc_pre(X, P), w.attn_norm);  // collapses with the incoming pre-weights
      const Vec a_out = attention(L, a_in, t, out);
      const std::vector<Vec> X1 = hc_post(a_out, X, A);
      const Mix F = hc_mixes(X1, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale);
      const Vec f_in = rms(hc_pre(X1, A.pre), w.ffn_norm);
      const Vec f_out = moe(L, f_in, out);
      X = hc_post(f_out, X1, F);
      P = F.pre;
    }
    const Vec h = rms(hc_pre(X, P), output_norm);
    const Vec logits = lin(output, h);
    out.logits.assign(logits.begin(), logits.end());
    ++pos;
    return out;
  }
};

Forward::Forward(const std::string& path, Options o) : impl_(std::make_unique<Impl>(path, o)) {}
Forward::~Forward() = default;
const Hparams& Forward::hparams() const { return impl_->hp; }
uint32_t Forward::position() const { return impl_->pos; }
TokenResult Forward::step(uint32_t token) { return impl_->step(token); }
Routing Forward::route(uint32_t layer, const std::vector<double>& f_in) const {
  if (layer >= impl_->hp.n_layer) throw std::runtime_error("reference: layer out of range");
  if (f_in.size() != impl_->hp.n_embd) throw std::runtime_error("reference: f_in size mismatch");
  return impl_->route(layer, f_in);
}

namespace {
std::vector<double>* row_of(std::vector<Vec>& rows, uint32_t i) { return i < rows.size() ? &rows[i] : nullptr; }
}  // namespace
std::vector<double>* Forward::window_row(uint32_t layer, uint32_t position) {
  return layer < impl_->window_kv.size() ? row_of(impl_->window_kv[layer], position) : nullptr;
}
std::vector<double>* Forward::compressed_row(uint32_t layer, uint32_t group) {
  auto it = impl_->comp_kv.find(layer);
  return it == impl_->comp_kv.end() ? nullptr : row_of(it->second, group);
}
std::vector<double>* Forward::index_key(uint32_t layer, uint32_t group) {
  auto it = impl_->index_k.find(layer);
  return it == impl_->index_k.end() ? nullptr : row_of(it->second, group);
}

// ---- DSpark drafter (spec 6.3) ---------------------------------------------------------------

struct Drafter::Impl {
  const Forward::Impl& t;
  gguf::File file;
  uint32_t stages = 0, block = 0, noise = 0, rank = 0, n_expert = 0, n_used = 0;
  std::vector<uint32_t> targets;
  std::vector<Layer> st;
  Mat main_proj, main_norm, norm, w1, w2, wc;
  Vec freqs0;                              // window-only layers' RoPE: theta 10000, no YaRN
  std::vector<std::vector<Vec>> entries;   // [stage][position] committed ring entries

  Impl(const Forward::Impl& target, const std::string& path) : t(target), file(gguf::File::open(path)) {
    auto u32 = [&](const char* k) { return (uint32_t)file.get_uint(k); };
    stages = u32("dspark.stage_count");
    block = u32("dspark.block_size");
    noise = u32("dspark.noise_token_id");
    rank = u32("dspark.markov_rank");
    n_expert = u32("dspark.expert_count");
    n_used = u32("dspark.expert_used_count");
    for (uint64_t l : uint_array(file, "dspark.target_layer_ids")) targets.push_back((uint32_t)l);
    for (uint32_t s = 0; s < stages; ++s) {
      Layer w;
      load_block(file, "mtp." + std::to_string(s) + ".", w);
      st.push_back(std::move(w));
    }
    const std::string last = "mtp." + std::to_string(stages - 1) + ".";
    main_proj = load(file, "mtp.0.main_proj.weight");
    main_norm = load(file, "mtp.0.main_norm.weight");
    norm = load(file, last + "norm.weight");
    w1 = load(file, last + "markov_head.markov_w1.weight");
    w2 = load(file, last + "markov_head.markov_w2.weight");
    wc = load(file, last + "confidence_head.proj.weight");
    freqs0 = t.rope_freqs(0);
    entries.resize(stages);
  }

  // Steps 2-3: the ring entry of every stage for the next position.
  void commit(const Vec& hidden) {
    const uint32_t p = (uint32_t)entries[0].size();
    const Vec z = t.rms(t.lin_bf16(main_proj, hidden), main_norm);
    for (uint32_t s = 0; s < stages; ++s) {
      Vec e = t.rms(t.lin_bf16(st[s].kv, z), st[s].kv_norm);
      t.rope_with(e, 0, t.hp.head_dim, freqs0, p);
      fake_quant_fp8(e);
      entries[s].push_back(std::move(e));
    }
  }

  // Step 5's attention for the block's rows x[j] at positions c+1+j.
  std::vector<Vec> attention(uint32_t s, const std::vector<Vec>& x, uint32_t c) const {
    const Layer& w = st[s];
    const uint32_t nh = t.hp.n_head, hd = t.hp.head_dim, W = t.hp.window;
    std::vector<Vec> q, keys;
    for (uint32_t j = 0; j < block; ++j) {
      const Vec qr = t.rms(t.lin_bf16(w.q_a, x[j]), w.q_a_norm);
      Vec qj = t.lin_bf16(w.q_b, qr);
      for (uint32_t h = 0; h < nh; ++h) t.rope_with(qj, h * hd, hd, freqs0, c + 1 + j);
      q.push_back(std::move(qj));
      Vec k = t.rms(t.lin_bf16(w.kv, x[j]), w.kv_norm);
      t.rope_with(k, 0, hd, freqs0, c + 1 + j);
      fake_quant_fp8(k);
      keys.push_back(std::move(k));
    }
    // Ring slots 0 .. min(W, c+1) - 1: slot k holds the latest committed position p <= c with p mod W == k.
    std::vector<const Vec*> rows;
    for (uint32_t k = 0; k < std::min(W, c + 1); ++k) rows.push_back(&entries[s][c - ((c - k) % W)]);
    for (const Vec& k : keys) rows.push_back(&k);
    std::vector<Vec> out;
    for (uint32_t j = 0; j < block; ++j) {
      Vec o(nh * hd);
      for (uint32_t h = 0; h < nh; ++h) {
        const double* qh = q[j].data() + h * hd;
        Vec sc;
        for (const Vec* r : rows) sc.push_back(dot(qh, r->data(), hd) / std::sqrt((double)hd));
        const double m = *std::max_element(sc.begin(), sc.end());
        double den = std::exp((double)w.sinks.at(h) - m);
        Vec num(hd, 0.0);
        for (size_t r = 0; r < rows.size(); ++r) {
          const double pr = std::exp(sc[r] - m);
          den += pr;
          const double pb = bf16(pr);
          for (uint32_t i = 0; i < hd; ++i) num[i] += pb * (*rows[r])[i];
        }
        for (uint32_t i = 0; i < hd; ++i) o[h * hd + i] = bf16(num[i] / den);
        t.rope_with(o, h * hd, hd, freqs0, c + 1 + j, /*inverse=*/true);
      }
      const size_t group_in = (size_t)nh / t.hp.o_groups * hd;
      Vec z;
      for (uint32_t g = 0; g < t.hp.o_groups; ++g) {
        const Vec og(o.begin() + g * group_in, o.begin() + (g + 1) * group_in);
        const Vec zg = t.lin_bf16(w.o_a, og, (uint64_t)g * t.hp.o_rank, t.hp.o_rank);
        z.insert(z.end(), zg.begin(), zg.end());
      }
      out.push_back(t.lin_bf16(w.o_b, z));
    }
    return out;
  }

  DraftResult propose(uint32_t anchor) const {
    if (entries[0].empty()) fail("nothing committed");
    const uint32_t c = (uint32_t)entries[0].size() - 1, H = t.hp.n_embd;
    DraftResult r;
    r.experts.assign(stages, std::vector<std::vector<uint32_t>>(block));
    // Step 4: rows [anchor, noise, ...], 4 copies of the embedding, P = [1, 0, 0, 0].
    std::vector<std::vector<Vec>> X;
    std::vector<Vec> P;
    for (uint32_t j = 0; j < block; ++j) {
      const uint32_t y = j == 0 ? anchor : noise;
      Vec e(t.token_embd.row(y), t.token_embd.row(y) + H);
      for (double& v : e) v = bf16(v);
      X.push_back(std::vector<Vec>(t.hp.hc, e));
      Vec p0(t.hp.hc, 0.0);
      p0[0] = 1;
      P.push_back(p0);
    }
    // Step 5: the stages, each row's mixes its own; attention over all rows together.
    for (uint32_t s = 0; s < stages; ++s) {
      const Layer& w = st[s];
      std::vector<Forward::Impl::Mix> A;
      std::vector<Vec> a_in;
      for (uint32_t j = 0; j < block; ++j) {
        A.push_back(t.hc_mixes(X[j], w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale));
        a_in.push_back(t.rms(t.hc_pre(X[j], P[j]), w.attn_norm));
      }
      const std::vector<Vec> a_out = attention(s, a_in, c);
      for (uint32_t j = 0; j < block; ++j) {
        const std::vector<Vec> X1 = t.hc_post(a_out[j], X[j], A[j]);
        const Forward::Impl::Mix F = t.hc_mixes(X1, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale);
        const Vec f_in = t.rms(t.hc_pre(X1, A[j].pre), w.ffn_norm);
        std::vector<float> weights;
        const Vec f_out = t.moe_with(w, n_expert, n_used, f_in, r.experts[s][j], weights);
        X[j] = t.hc_post(f_out, X1, F);
        P[j] = F.pre;
      }
    }
    // Steps 6-8, row by row.
    uint32_t prev = anchor;
    for (uint32_t j = 0; j < block; ++j) {
      const Vec h = t.hc_pre(X[j], P[j]);
      const Vec logits = t.lin(t.output, t.rms(h, norm));
      Vec u(w1.row(prev), w1.row(prev) + rank);
      for (double& v : u) v = bf16(v);
      const Vec b = t.lin(w2, u);
      std::vector<float> l(logits.size());
      uint32_t best = 0;
      for (size_t v = 0; v < l.size(); ++v) {
        l[v] = (float)((float)logits[v] + (float)b[v]);
        if (l[v] > l[best]) best = (uint32_t)v;
      }
      Vec hu = h;
      hu.insert(hu.end(), u.begin(), u.end());
      r.confidence.push_back((float)t.lin(wc, hu)[0]);
      r.logits.push_back(std::move(l));
      r.drafts.push_back(best);
      prev = best;
    }
    return r;
  }
};

Drafter::Drafter(const Forward& target, const std::string& support_path)
    : impl_(std::make_unique<Impl>(*target.impl_, support_path)) {}
Drafter::~Drafter() = default;
const std::vector<uint32_t>& Drafter::target_layers() const { return impl_->targets; }
void Drafter::commit(const std::vector<double>& hidden) {
  if (hidden.size() != impl_->targets.size() * impl_->t.hp.n_embd) fail("captured row size mismatch");
  impl_->commit(hidden);
}
std::vector<double>* Drafter::entry(uint32_t stage, uint32_t position) {
  return stage < impl_->entries.size() ? row_of(impl_->entries[stage], position) : nullptr;
}
DraftResult Drafter::propose(uint32_t anchor) const { return impl_->propose(anchor); }

}  // namespace sluice::reference
