// The independent reference forward (tests/reference_forward.*) on its own and against the
// engine (src/model/deepseek41/forward.h). See docs/numerics.md section 9 for the bounds and the figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "format/gguf.h"
#include "kernels/fp.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "reference_forward.h"

namespace {

namespace ref = sluice::reference;

std::string repo_root() { return std::string(SLUICE_TEST_DATA) + "/../.."; }

// Writes (once per process) a model with the CLI and returns its path; removed at exit.
struct TempModels {
  std::map<std::string, std::string> paths;
  ~TempModels() {
    for (const auto& [name, path] : paths) std::filesystem::remove(path);
  }
};

const std::string& model_path(const std::string& which) {
  static TempModels made;
  auto it = made.paths.find(which);
  if (it != made.paths.end()) return it->second;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sluice_fwdref_" + which + "_" + std::to_string(::getpid()) + ".gguf")).string();
  std::string cmd = std::string(SLUICE_BINARY) + " make-model -o " + path + " --seed 1 ";
  cmd += which == "tiny" ? "--preset tiny" : "--config " + repo_root() + "/configs/" + which + ".json";
  cmd += " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return made.paths[which] = path;
}

// Deterministic pseudo-random prompt (splitmix64).
std::vector<uint32_t> prompt(size_t n, uint32_t vocab, uint64_t seed) {
  std::vector<uint32_t> t;
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    t.push_back((uint32_t)(z % vocab));
  }
  return t;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// ---- pieces -----------------------------------------------------------------------------------

TEST(ForwardReferencePieces, SinkhornIsDoublyStochastic) {
  const std::vector<double> logits = {0.3, -1.2, 2.0, 0.1, 1.5, 0.0, -0.7, 0.4,
                                      -2.0, 0.9, 0.2, 1.1, 0.6, -0.3, 0.8, -1.5};
  const std::vector<double> c = ref::sinkhorn(logits, 4, 20, 1e-6);
  for (int i = 0; i < 4; ++i) {
    double row = 0, col = 0;
    for (int j = 0; j < 4; ++j) {
      row += c[i * 4 + j];
      col += c[j * 4 + i];
      EXPECT_GT(c[i * 4 + j], 0.0);
    }
    EXPECT_NEAR(row, 1.0, 1e-5);
    EXPECT_NEAR(col, 1.0, 1e-5);  // columns are normalised last: exact up to eps
  }
  // One iteration = row softmax (+eps) then one column normalisation, by hand for column 0.
  const std::vector<double> one = ref::sinkhorn(logits, 4, 1, 0.0);
  double col0 = 0;
  std::vector<double> soft(4);
  for (int i = 0; i < 4; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(logits[i * 4 + j]);
    soft[i] = std::exp(logits[i * 4]) / s;
    col0 += soft[i];
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(one[i * 4], soft[i] / col0, 1e-12);
}

TEST(ForwardReferencePieces, E4M3AndE2M1Rounding) {
  EXPECT_EQ(ref::e4m3_round(1.0f), 1.0f);
  EXPECT_EQ(ref::e4m3_round(1.0625f), 1.0f);    // tie between 1 (0x38) and 1.125 (0x39): even code
  EXPECT_EQ(ref::e4m3_round(1.1875f), 1.25f);   // tie between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(ref::e4m3_round(500.0f), 448.0f);   // saturates
  EXPECT_EQ(ref::e4m3_round(-0x1p-10f), -0.0f); // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(ref::e4m3_round(0x3p-10f), 0x1p-8f); // 1.5 subnormal steps: to 2 steps (even code 2)
  EXPECT_EQ(ref::e2m1_round(0.25f), 0.0f);
  EXPECT_EQ(ref::e2m1_round(0.75f), 1.0f);
  EXPECT_EQ(ref::e2m1_round(1.25f), 1.0f);
  EXPECT_EQ(ref::e2m1_round(1.75f), 2.0f);
  EXPECT_EQ(ref::e2m1_round(2.5f), 2.0f);
  EXPECT_EQ(ref::e2m1_round(3.5f), 4.0f);
  EXPECT_EQ(ref::e2m1_round(-5.0f), -4.0f);
  EXPECT_EQ(ref::e2m1_round(7.0f), 6.0f);
}

TEST(ForwardReferencePieces, FakeQuantGrids) {
  // MXFP4: amax 3 -> scale 2^ceil(log2(0.5)) = 0.5; values become multiples on the E2M1 grid.
  std::vector<double> v(32, 0.0);
  v[0] = 3.0;
  v[1] = 0.3;    // 0.6 in scale units -> 0.5 -> 0.25
  v[2] = -1.1;   // -2.2 -> -2 -> -1
  ref::fake_quant_mxfp4(v);
  EXPECT_EQ(v[0], 3.0);
  EXPECT_EQ(v[1], 0.25);
  EXPECT_EQ(v[2], -1.0);
  // NVFP4 block of 16: amax 6 -> scale e4m3(1) = 1.
  std::vector<double> n(16, 0.0);
  n[0] = 6.0;
  n[1] = 2.6;  // -> 3
  n[2] = 0.7;  // -> 0.5
  ref::fake_quant_nvfp4(n);
  EXPECT_EQ(n[0], 6.0);
  EXPECT_EQ(n[1], 3.0);
  EXPECT_EQ(n[2], 0.5);
  // FP8: amax 448 -> scale 1; 100.5 -> e4m3 grid step 8 above 64: 104 (nearest of 96, 104).
  std::vector<double> f(32, 0.0);
  f[0] = 448.0;
  f[1] = 100.5;
  ref::fake_quant_fp8(f);
  EXPECT_EQ(f[0], 448.0);
  EXPECT_EQ(f[1], 104.0);
}

TEST(ForwardReferencePieces, MimicActivationQuantizers) {
  // Q8_0 reference rule: amax 127 gives d = 1 (exact in fp16); roundf goes half away from zero.
  std::vector<double> a(32, 0.0);
  a[0] = 127;
  a[1] = 63.5;
  a[2] = -0.5;
  a[3] = 0.49;
  a[4] = -126.5;
  ref::q8_0_roundtrip(a);
  EXPECT_EQ(a[0], 127.0);
  EXPECT_EQ(a[1], 64.0);
  EXPECT_EQ(a[2], -1.0);
  EXPECT_EQ(a[3], 0.0);
  EXPECT_EQ(a[4], -127.0);
  // The stored scale is fp16(amax/127): dequantized values use it, not the float d.
  std::vector<double> b(32, 0.0);
  b[0] = 1.0;
  b[1] = 0.3;  // 0.3 * 127 = 38.1 -> 38
  ref::q8_0_roundtrip(b);
  const double d16 = sluice::f16_to_f32(sluice::f32_to_f16(1.0f / 127.0f));
  EXPECT_EQ(b[0], 127 * d16);
  EXPECT_EQ(b[1], 38 * d16);
  // Q8_K: max = -254 (first of the largest magnitudes), iscale = -127/max = 0.5, d = 2;
  // nearest-even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  std::vector<double> k(256, 0.0);
  k[0] = 1;
  k[1] = 3;
  k[2] = -254;
  k[3] = 254;
  k[4] = 5;
  ref::q8_k_roundtrip(k);
  EXPECT_EQ(k[0], 0.0);
  EXPECT_EQ(k[1], 4.0);
  EXPECT_EQ(k[2], -254.0);
  EXPECT_EQ(k[3], 254.0);
  EXPECT_EQ(k[4], 4.0);
}

// ---- the reference on its own (tiny model) ----------------------------------------------------

TEST(ForwardReferenceAlone, FiniteLogitsAndCausality) {
  const std::string& path = model_path("tiny");
  ref::Forward a(path);
  const ref::Hparams& hp = a.hparams();
  const std::vector<uint32_t> toks = prompt(24, hp.n_vocab, 7);
  std::vector<ref::TokenResult> run;
  for (uint32_t t : toks) run.push_back(a.step(t));
  for (const auto& r : run) {
    ASSERT_EQ(r.logits.size(), hp.n_vocab);
    for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
    for (uint32_t L = 0; L < hp.n_layer; ++L) ASSERT_EQ(r.experts[L].size(), hp.n_expert_used);
  }
  // A fresh run of the first token alone gives the same first position (nothing looks ahead).
  ref::Forward b(path);
  const ref::TokenResult first = b.step(toks[0]);
  EXPECT_EQ(first.logits, run[0].logits);
  EXPECT_EQ(first.experts, run[0].experts);
  // Different histories give different logits at the same position (the context is used).
  ref::Forward c(path);
  c.step((toks[0] + 1) % hp.n_vocab);
  const ref::TokenResult second = c.step(toks[1]);
  EXPECT_NE(second.logits, run[1].logits);
}

// The sparse selection's shape: ascending unique visible rows; top-k of all visible rows for
// index sources, of the candidate pool for candidate consumers.
TEST(ForwardReferenceAlone, SelectionShapes) {
  ref::Forward f(model_path("tiny"));
  const ref::Hparams& hp = f.hparams();
  const std::vector<uint32_t> toks = prompt(40, hp.n_vocab, 3);
  for (uint32_t t = 0; t < toks.size(); ++t) {
    const ref::TokenResult r = f.step(toks[t]);
    for (uint32_t L = 0; L < hp.n_layer; ++L) {
      const auto& sel = r.selected_rows[L];
      const bool index_source =
          std::find(hp.index_sources.begin(), hp.index_sources.end(), L) != hp.index_sources.end();
      if (!index_source) {
        EXPECT_TRUE(sel.empty());
        continue;
      }
      uint32_t src = 0;  // the KV source: largest kv_source_layer_ids entry <= L
      for (uint32_t k : hp.kv_sources)
        if (k <= L) src = k;
      const uint32_t n_vis = (t + 1) / hp.ratios[src];
      for (size_t i = 0; i < sel.size(); ++i) {
        EXPECT_LT((uint32_t)sel[i], n_vis);
        if (i > 0) {
          EXPECT_LT(sel[i - 1], sel[i]);
        }
      }
      const uint32_t blocks = (n_vis + hp.cand_block_size - 1) / hp.cand_block_size;
      if (L <= hp.cand_layer || blocks >= hp.cand_blocks) {
        EXPECT_EQ(sel.size(), std::min<size_t>(hp.idx_topk, n_vis)) << "layer " << L << " position " << t;
      }
      if (L > hp.cand_layer) {  // confined to cand_blocks blocks, one of them the newest row's
        std::vector<int32_t> used;
        for (int32_t g : sel) used.push_back(g / (int32_t)hp.cand_block_size);
        used.erase(std::unique(used.begin(), used.end()), used.end());
        EXPECT_LE(used.size(), hp.cand_blocks);
      }
    }
  }
}

TEST(ForwardReferenceAlone, EngramRowsByHand) {
  const std::string& path = model_path("tiny");
  ref::Forward f(path);
  const ref::Hparams& hp = f.hparams();
  ASSERT_FALSE(hp.engram_layers.empty());
  const uint32_t heads = hp.eg_heads, orders = hp.eg_orders;
  ASSERT_EQ(orders, 3u);
  const std::vector<uint32_t> toks = {5, 300, 17, 42, 9};
  std::vector<std::vector<std::vector<uint64_t>>> got;
  for (uint32_t t : toks) got.push_back(f.step(t).engram_rows);
  auto cid = [&](uint32_t tok) { return (uint64_t)hp.eg_token_map[tok]; };
  const uint64_t pad = hp.eg_pad;
  for (size_t ei = 0; ei < hp.engram_layers.size(); ++ei) {
    const uint64_t* M = hp.eg_multipliers.data() + ei * 4;
    const uint64_t* p = hp.eg_primes.data() + ei * 3 * heads;
    uint64_t off2 = 0, off3 = 0, off4 = 0;  // column offsets: sums of the previous primes
    for (uint32_t c = 0; c < heads; ++c) off3 += p[c];
    off4 = off3;
    for (uint32_t c = heads; c < 2 * heads; ++c) off4 += p[c];
    // Position 0: every lookback is DEAD -> pad.
    const uint64_t h2_0 = (cid(5) * M[0]) ^ (pad * M[1]);
    const uint64_t h3_0 = h2_0 ^ (pad * M[2]);
    const uint64_t h4_0 = h3_0 ^ (pad * M[3]);
    // Position 4: tokens 9 | 42, 17, 300.
    const uint64_t h2_4 = (cid(9) * M[0]) ^ (cid(42) * M[1]);
    const uint64_t h3_4 = h2_4 ^ (cid(17) * M[2]);
    const uint64_t h4_4 = h3_4 ^ (cid(300) * M[3]);
    // Position 1: 300 | 5, DEAD, DEAD -> the 3- and 4-gram use pad.
    const uint64_t h3_1 = (cid(300) * M[0]) ^ (cid(5) * M[1]) ^ (pad * M[2]);
    uint64_t o2 = off2;
    for (uint32_t h = 0; h < heads; ++h) {
      EXPECT_EQ(got[0][ei][h], h2_0 % p[h] + o2);
      EXPECT_EQ(got[4][ei][h], h2_4 % p[h] + o2);
      o2 += p[h];
    }
    uint64_t o3 = off3, o4 = off4;
    for (uint32_t h = 0; h < heads; ++h) {
      EXPECT_EQ(got[4][ei][heads + h], h3_4 % p[heads + h] + o3);
      EXPECT_EQ(got[1][ei][heads + h], h3_1 % p[heads + h] + o3);
      EXPECT_EQ(got[0][ei][heads + h], h3_0 % p[heads + h] + o3);
      EXPECT_EQ(got[0][ei][2 * heads + h], h4_0 % p[2 * heads + h] + o4);
      EXPECT_EQ(got[4][ei][2 * heads + h], h4_4 % p[2 * heads + h] + o4);
      o3 += p[heads + h];
      o4 += p[2 * heads + h];
    }
  }
}

// ---- against the engine --------------------------------------------------------------------

struct Figures {
  size_t positions = 0;
  size_t prefix = 0;             // positions before the first differing discrete choice
  size_t expert_diff = 0;        // positions where some layer routes to other experts
  size_t select_diff = 0;        // positions where some index layer selects other rows
  size_t first_diff = SIZE_MAX;  // first such position
  double max_rel = 0, mean_rel = 0, median_rel = 0;  // logits relative L2, all positions
  double max_rel_prefix = 0, mean_rel_prefix = 0;    // the same over that prefix
  size_t agree = 0;              // positions whose own discrete choices all agree
  double max_rel_agree = 0, mean_rel_agree = 0;
  std::vector<bool> clean_at;    // per position: choices agree, logits within 1e-5, cached rows equal
  std::vector<bool> agree_at;    // per position: its discrete choices agree
  std::vector<double> rel_at;    // per position: logits relative L2
  double max_weight_diff_clean = 0;  // routing weights at clean positions, absolute
  size_t cache_values = 0, cache_mismatch = 0;  // cached KV / index-key values compared, differing
};

std::vector<uint32_t> sorted(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Counts values of a reference row that differ from the engine's BF16 row, then (resync)
// replaces the reference's row by the engine's.
// Returns the number of differing values.
size_t compare_row(std::vector<double>* mine, const uint16_t* engine, size_t n, bool resync, Figures& fig) {
  EXPECT_NE(mine, nullptr);
  if (!mine) return n;
  EXPECT_EQ(mine->size(), n);
  size_t differ = 0;
  for (size_t i = 0; i < n && i < mine->size(); ++i) {
    const double e = sluice::bf16_to_f32(engine[i]);
    differ += (*mine)[i] != e;
    if (resync) (*mine)[i] = e;
  }
  fig.cache_values += n;
  fig.cache_mismatch += differ;
  return differ;
}

// Runs the engine and the reference over the same prompt and compares logits, Engram rows,
// routed experts, selected compressed rows and (engine state) cached rows.
// resync: the engine evaluates one token per eval() and after each position the reference's new
// cached rows are replaced by the engine's, so each position compares one step of both from the
// same history; otherwise the engine runs the prompt in one eval() (default chunking) and both
// run free.
Figures compare_with_engine(const std::string& which, bool mimic, bool resync, size_t n) {
  const std::string& path = model_path(which);
  const std::unique_ptr<sluice::Model> model = sluice::load_model(path);
  const sluice::Engine engine(*model, sluice::EngineOptions{});
  sluice::SequenceState state = engine.new_sequence();
  ref::Forward reference(path, ref::Options{mimic});
  const ref::Hparams& hp = reference.hparams();
  const uint32_t V = hp.n_vocab;
  const std::vector<uint32_t> toks = prompt(n, V, 2024);
  std::vector<float> logits(n * V);
  std::vector<sluice::TokenTrace> trace;
  if (!resync) engine.eval(state, toks, logits.data(), &trace);
  Figures fig;
  fig.positions = n;
  std::vector<double> rels;
  for (size_t t = 0; t < n; ++t) {
    if (resync) engine.eval(state, std::span(&toks[t], 1), logits.data() + t * V, &trace);
    const ref::TokenResult r = reference.step(toks[t]);
    if (trace.size() <= t) {
      ADD_FAILURE() << "engine trace too short";
      break;
    }
    const sluice::TokenTrace& e = trace[t];
    // Engram row ids depend only on the tokens: identical in every mode.
    EXPECT_EQ(e.engram_rows, r.engram_rows) << which << " position " << t;
    bool experts_same = e.experts.size() == r.experts.size();
    for (size_t L = 0; experts_same && L < r.experts.size(); ++L)
      experts_same = sorted(e.experts[L]) == sorted(r.experts[L]);
    const bool select_same = e.selected_rows == r.selected_rows;
    fig.expert_diff += !experts_same;
    fig.select_diff += !select_same;
    if ((!experts_same || !select_same) && fig.first_diff == SIZE_MAX) fig.first_diff = t;
    const std::vector<float> el(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    const double rel = rel_l2(el, r.logits);
    rels.push_back(rel);
    fig.rel_at.push_back(rel);
    fig.agree_at.push_back(experts_same && select_same);
    fig.max_rel = std::max(fig.max_rel, rel);
    fig.mean_rel += rel / (double)n;
    if (fig.first_diff == SIZE_MAX) {
      ++fig.prefix;
      fig.max_rel_prefix = std::max(fig.max_rel_prefix, rel);
      fig.mean_rel_prefix += rel;
    }
    if (experts_same && select_same) {
      ++fig.agree;
      fig.max_rel_agree = std::max(fig.max_rel_agree, rel);
      fig.mean_rel_agree += rel;
    }
    size_t cache_differ = 0;
    if (resync) {  // the state holds exactly the rows up to position t
      for (uint32_t L = 0; L < hp.n_layer; ++L)
        cache_differ += compare_row(
            reference.window_row(L, (uint32_t)t),
            state.window_kv.data() + ((size_t)L * state.window + t % state.window) * state.head_dim,
            hp.head_dim, true, fig);
      for (const sluice::SourceCache& src : state.sources) {
        if ((t + 1) % src.ratio != 0) continue;
        const uint32_t g = (uint32_t)(t / src.ratio);
        // The state holds them packed (kernels/fp4_rows.h); unpacked they are the BF16 bits.
        std::vector<uint16_t> kv(hp.head_dim), ik(hp.idx_head_dim);
        sluice::fp4_unpack_row(sluice::kKvGrid, src.kv.data() + (size_t)g * sluice::fp4_row_bytes(sluice::kKvGrid, hp.head_dim),
                               hp.head_dim, kv.data());
        sluice::fp4_unpack_row(sluice::kIndexGrid,
                               src.index_k.data() + (size_t)g * sluice::fp4_row_bytes(sluice::kIndexGrid, hp.idx_head_dim),
                               hp.idx_head_dim, ik.data());
        cache_differ += compare_row(reference.compressed_row(src.layer, g), kv.data(), hp.head_dim, true, fig);
        cache_differ += compare_row(reference.index_key(src.layer, g), ik.data(), hp.idx_head_dim, true, fig);
      }
    }
    const bool clean = experts_same && select_same && rel <= 1e-5 && cache_differ == 0;
    fig.clean_at.push_back(clean);
    if (clean)
      for (size_t L = 0; L < r.experts.size(); ++L)
        for (size_t k = 0; k < r.experts[L].size(); ++k) {
          // Same experts; the order may differ only between equal scores.
          const auto it = std::find(e.experts[L].begin(), e.experts[L].end(), r.experts[L][k]);
          const size_t j = (size_t)(it - e.experts[L].begin());
          fig.max_weight_diff_clean = std::max(
              fig.max_weight_diff_clean, (double)std::fabs(e.expert_weights[L][j] - r.expert_weights[L][k]));
        }
  }
  if (fig.prefix) fig.mean_rel_prefix /= (double)fig.prefix;
  if (fig.agree) fig.mean_rel_agree /= (double)fig.agree;
  const size_t n_clean = (size_t)std::count(fig.clean_at.begin(), fig.clean_at.end(), true);
  std::sort(rels.begin(), rels.end());
  if (!rels.empty()) fig.median_rel = rels[rels.size() / 2];
  std::printf("[numerics] %s, %s, %s, %zu positions: logits rel L2 max %.3g mean %.3g median %.3g; "
              "positions whose choices agree %zu: max %.3g mean %.3g; prefix before the first differing "
              "choice %zu: max %.3g mean %.3g; positions with other experts %zu, other selected rows %zu; "
              "clean positions (everything equal, logits within 1e-5) %zu, their max routing-weight diff %.3g; "
              "cached values differing %zu of %zu\n",
              which.c_str(), mimic ? "mimic" : "exact", resync ? "resync" : "free-running", n,
              fig.max_rel, fig.mean_rel, fig.median_rel, fig.agree, fig.max_rel_agree, fig.mean_rel_agree,
              fig.prefix, fig.max_rel_prefix, fig.mean_rel_prefix, fig.expert_diff, fig.select_diff, n_clean,
              fig.max_weight_diff_clean, fig.cache_mismatch, fig.cache_values);
  return fig;
}

// Prompt length: long enough that the sparse paths choose. tiny: window 8, top-8 of up to 80
// ratio-2 rows (layer 2) and of a 16-row candidate pool out of up to 160 ratio-1 rows (layer 6);
// tiny-alt: window 5, top-6 of up to 80 ratio-2 rows (layer 3) and of a 6-row pool (layer 7).
constexpr size_t kPromptLength = 160;

// Bound on the logits' relative L2 error that activation quantization alone explains, for a
// position whose discrete choices (experts, selected rows) agree (docs/numerics.md section 9):
// a Q8_0/Q8_K activation element is off by at most amax/254 of its block, i.e. a relative L2
// error of crest/440 for a block whose max is `crest` times its rms: ~0.5% for RMS-normed
// activations (crest 2-2.5, Q8_0), ~0.7% for Q8_K blocks of 256 and up to ~2% for the SwiGLU
// products entering the down projections (crest 6-10). Random linear maps carry a relative error
// through unchanged; chains add in quadrature, so a sublayer output is off by ~1-2.5%; each
// sublayer contributes about 40% of the residual stream it updates, and the 2 * n_layer
// sublayers add in quadrature (~3% at the last layer); the FP8/FP4 fake-quantization grids
// turn an input error e into ~sqrt(e * step) on the elements that cross a grid midpoint, which
// about doubles it. Expected ~5%; the bound leaves a factor 3.
constexpr double kQuantBound = 0.15;

// Mimic mode, each position compared from the same history: at most positions engine and
// reference agree bit for bit in every cached row and choice and to f32 accumulation precision
// in the logits. The others are rounding-flip events: a value within ~1e-6 of a BF16 (or
// FP8/FP4/Q8) rounding midpoint rounds differently under the two accumulation orders, and
// the coarse grids downstream amplify it. Structural errors would touch every position.
TEST(ForwardReference, MimicMatchesEngine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "reference runs in f64 loops over two models: checked in the optimized build "
                  "(ForwardReference.RouterDecisionsIdenticalGivenEngineInputs runs here)";
#endif
  for (const char* which : {"tiny", "tiny-alt"}) {
    SCOPED_TRACE(which);
    const Figures f = compare_with_engine(which, true, true, kPromptLength);
    // Every quarter of the prompt has at least a quarter of clean positions (measured:
    // 81% of tiny's positions, 59% of tiny-alt's).
    for (size_t q = 0; q < 4; ++q) {
      const auto b = f.clean_at.begin() + (long)(q * kPromptLength / 4);
      EXPECT_GE(std::count(b, b + (long)(kPromptLength / 4), true), (long)(kPromptLength / 16)) << "quarter " << q;
    }
    // Flip events change a choice at few positions (measured 6-14%).
    EXPECT_LE(std::max(f.expert_diff, f.select_diff), kPromptLength / 4);
    // Routing weights at clean positions differ only by absorbed flips upstream (measured < 1e-4).
    EXPECT_LE(f.max_weight_diff_clean, 1e-3);
    // Positions whose choices agree stay within what quantization error could explain.
    EXPECT_LE(f.max_rel_agree, kQuantBound);
  }
}

// Long enough for tiny's positions to run well past original_max_position_embeddings (256: the
// YaRN-scaled frequencies of the compressed layers meet angles beyond the original context) and
// for every compressed stream to outgrow what a query may attend: 640 ratio-1 rows against a
// candidate pool of 4 blocks x 4 rows and a top-8, 320 ratio-2 rows against a top-8.
constexpr size_t kLongPrompt = 640;

// Mimic mode from the same history, at those positions: the same per-position figures as at the
// start of the sequence (clean positions in every quarter past 320, choices that agree within
// the quantization bound). The engine state is one token per eval; the prompt's first 320
// positions only build the history. Slow (the reference is plain f64 loops): optimized build only.
TEST(ForwardReference, MimicMatchesEnginePastOriginalContextAndCandidatePool) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "long reference run: checked in the optimized build";
#endif
  const std::string which = "tiny";
  {
    const std::unique_ptr<sluice::Model> m = sluice::load_model(model_path(which));
    const sluice::ModelConfig& c = sluice::model_config(*m);
    ASSERT_LE(c.rope_scaling.original_max_position_embeddings, 320u / 1.25);
    ASSERT_LT(c.candidate_topk_blocks * c.candidate_block_size, 320u / 16);
  }
  const Figures f = compare_with_engine(which, true, true, kLongPrompt);
  ASSERT_EQ(f.clean_at.size(), kLongPrompt);
  const size_t from = 320, q = (kLongPrompt - from) / 4;
  for (size_t k = 0; k < 4; ++k) {
    const auto b = f.clean_at.begin() + (long)(from + k * q);
    EXPECT_GE(std::count(b, b + (long)q, true), (long)(q / 4)) << "quarter " << k << " past position " << from;
  }
  double max_agree = 0;
  size_t agree = 0;
  for (size_t t = from; t < kLongPrompt; ++t)
    if (f.agree_at[t]) {
      ++agree;
      max_agree = std::max(max_agree, f.rel_at[t]);
    }
  EXPECT_GE(agree, (kLongPrompt - from) / 2);
  EXPECT_LE(max_agree, kQuantBound);
}

// Exact reference (unquantized activations), each position compared from the same history:
// where the discrete choices agree, the logits differ by the activation quantization error.
TEST(ForwardReference, ExactWithinQuantizationBound) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "reference runs in f64 loops: checked in the optimized build "
                  "(MimicMatchesEngine runs under the sanitizer)";
#endif
  for (const char* which : {"tiny", "tiny-alt"}) {
    SCOPED_TRACE(which);
    const Figures f = compare_with_engine(which, false, true, kPromptLength);
    EXPECT_GE(f.agree, 5u);  // the bound below is exercised (measured 19 and 29 positions)
    EXPECT_LE(f.max_rel_agree, kQuantBound);
  }
}

// Both run free over the whole prompt (the engine in one eval() call with its default chunks):
// figures for docs/numerics.md. Once a choice differs the two sequences follow different
// histories, so only the prefix before it is bounded.
TEST(ForwardReference, FreeRunningFigures) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "figures for docs/numerics.md from long reference runs: checked in the "
                  "optimized build";
#endif
  for (const char* which : {"tiny", "tiny-alt"})
    for (const bool mimic : {true, false}) {
      SCOPED_TRACE(std::string(which) + (mimic ? " mimic" : " exact"));
      const Figures f = compare_with_engine(which, mimic, false, kPromptLength);
      EXPECT_GE(f.prefix, 1u);
      EXPECT_LE(f.max_rel_prefix, kQuantBound);
    }
}

// Teacher forcing for the router: the two free-running forwards drift apart through rounding
// flips, so their expert ids are compared where both routers see the same input. The engine
// records each layer's FFN input f_in (EngineOptions::trace_ffn_inputs); the reference's own
// router (its weights, f64 math) runs on exactly that vector and must pick the same experts in
// the same order (descending biased score, ties to the lower id) with the same weights.
TEST(ForwardReference, RouterDecisionsIdenticalGivenEngineInputs) {
  for (const char* which : {"tiny", "tiny-alt"}) {
    SCOPED_TRACE(which);
    const std::string& path = model_path(which);
    const std::unique_ptr<sluice::Model> model = sluice::load_model(path);
    sluice::EngineOptions eo;
    eo.trace_ffn_inputs = true;
    const sluice::Engine engine(*model, eo);
    sluice::SequenceState state = engine.new_sequence();
    const ref::Forward reference(path, ref::Options{true});
    const ref::Hparams& hp = reference.hparams();
    const std::vector<uint32_t> toks = prompt(kPromptLength, hp.n_vocab, 2024);
    std::vector<float> logits(toks.size() * (size_t)hp.n_vocab);
    std::vector<sluice::TokenTrace> trace;
    engine.eval(state, toks, logits.data(), &trace);
    ASSERT_EQ(trace.size(), toks.size());
    {  // The capture is a copy: without it the engine computes exactly the same.
      const sluice::Engine plain(*model, sluice::EngineOptions{});
      sluice::SequenceState s2 = plain.new_sequence();
      std::vector<float> logits2(logits.size());
      std::vector<sluice::TokenTrace> trace2;
      plain.eval(s2, toks, logits2.data(), &trace2);
      EXPECT_EQ(logits, logits2);
      ASSERT_EQ(trace2.size(), trace.size());
      for (size_t t = 0; t < trace.size(); ++t) {
        EXPECT_TRUE(trace2[t].ffn_inputs.empty());
        EXPECT_EQ(trace2[t].experts, trace[t].experts);
        EXPECT_EQ(trace2[t].expert_weights, trace[t].expert_weights);
      }
    }

    size_t decisions = 0, differing = 0, engram_checked = 0;
    double max_weight_rel = 0, min_gap_rel = INFINITY;  // smallest k-th/(k+1)-th score gap seen
    for (size_t t = 0; t < toks.size(); ++t) {
      const sluice::TokenTrace& e = trace[t];
      ASSERT_EQ(e.ffn_inputs.size(), hp.n_layer) << "position " << t;
      ASSERT_EQ(e.experts.size(), hp.n_layer);
      for (uint32_t L = 0; L < hp.n_layer; ++L) {
        ASSERT_EQ(e.ffn_inputs[L].size(), hp.n_embd) << "position " << t << " layer " << L;
        const std::vector<double> f_in(e.ffn_inputs[L].begin(), e.ffn_inputs[L].end());
        const ref::Routing r = reference.route(L, f_in);
        ASSERT_EQ(r.experts.size(), hp.n_expert_used);
        ++decisions;
        // The decision margin: the last selected score over the best unselected one.
        std::vector<double> sorted_scores = r.biased;
        std::sort(sorted_scores.begin(), sorted_scores.end(), std::greater<>());
        const double kth = sorted_scores[hp.n_expert_used - 1];
        const double next = hp.n_expert_used < hp.n_expert ? sorted_scores[hp.n_expert_used] : -INFINITY;
        const double gap_rel = (kth - next) / std::fabs(kth);
        min_gap_rel = std::min(min_gap_rel, gap_rel);
        if (e.experts[L] != r.experts) {
          ++differing;
          ADD_FAILURE() << which << " position " << t << " layer " << L
                        << ": engine and reference route the same f_in differently; top-k boundary gap "
                        << (kth - next) << " (relative " << gap_rel << ")";
          continue;
        }
        ASSERT_EQ(e.expert_weights[L].size(), r.weights.size());
        for (size_t k = 0; k < r.weights.size(); ++k) {
          const double rel = std::fabs((double)e.expert_weights[L][k] - r.weights[k]) / std::fabs((double)r.weights[k]);
          max_weight_rel = std::max(max_weight_rel, rel);
          EXPECT_LE(rel, 1e-5) << which << " position " << t << " layer " << L << " expert " << r.experts[k];
        }
      }
      // Engram row ids from the reference's own hash (they depend on the tokens only).
      for (size_t ei = 0; ei < hp.engram_layers.size(); ++ei) {
        std::vector<uint64_t> ids;  // current token, then previous ones newest first, padded
        for (uint32_t j = 0; j <= hp.eg_orders; ++j)
          ids.push_back(t >= j ? (uint64_t)hp.eg_token_map.at(toks[t - j]) : hp.eg_pad);
        EXPECT_EQ(e.engram_rows.at(ei), ref::engram_hash(hp, ei, ids)) << which << " position " << t;
        ++engram_checked;
      }
    }
    EXPECT_EQ(differing, 0u);
    EXPECT_EQ(decisions, (size_t)kPromptLength * hp.n_layer);
    EXPECT_GT(engram_checked, 0u);
    std::printf("[router] %s, %zu positions x %u layers: %zu routing decisions compared on the engine's "
                "f_in, %zu differ; max routing-weight relative diff %.3g; smallest top-k boundary gap %.3g "
                "(relative); %zu Engram row-id lists compared\n",
                which, toks.size(), hp.n_layer, decisions, differing, max_weight_rel, min_gap_rel,
                engram_checked);
  }
}

}  // namespace
