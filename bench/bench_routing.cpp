// Routing on real text (issue 52, docs/routing.md): decodes TEXTFILE token by token, teacher-forced
// (each step feeds the text's next token, never a generated one), and records every token's routed
// experts per layer and the engine's guess of each next layer's experts. Then, from that trace:
//   - per layer: popularity entropy, the top 10%'s share, reuse distance, overlap with the previous
//     token, and the next-layer guess's recall and precision (runtime/routing_stats.h);
//   - the expert cache at 5..100% of all routed experts under each eviction policy, replayed
//     through the engine's own policy objects (storage/policy_replay.h), with disk bytes per token.
// Each figure is printed beside what uniform independent routing (random weights) gives.
//
// The model runs through a streamed expert store holding every expert, with prefetch on, because
// that is when the engine makes its next-layer guess (forward_moe.cpp); the store's own hit rate is
// not the figure here (it holds everything), the replay is. Past the model's context a fresh
// sequence starts (BOS first) while the trace, and so the cache replay, runs on.
//
// Usage: bench_routing MODEL TEXTFILE [--tokens N] [--json OUT] [-t N]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/routing_stats.h"
#include "storage/expert_geometry.h"
#include "storage/expert_store.h"
#include "storage/policy_replay.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/output_file.h"
#include "util/read_file.h"

using namespace sluice;
using nlohmann::json;

namespace {

constexpr double kFractions[] = {0.05, 0.10, 0.25, 0.50, 0.75, 1.00};
constexpr storage::EvictionKind kPolicies[] = {storage::EvictionKind::LruPerLayer, storage::EvictionKind::LruGlobal,
                                                storage::EvictionKind::LfuPerLayer};

struct Recorded {
  storage::RoutingTrace selected, guessed;  // [token][layer]
};

// The text's tokens (BOS first), at most max_tokens.
std::vector<TokenId> text_tokens(const text::Tokenizer& tok, const std::string& path, uint32_t max_tokens) {
  const std::string text = read_file_bounded(path, 256ull << 20, "the text");
  std::vector<TokenId> ids = tok.encode(text, /*add_bos=*/true, /*parse_special=*/false);
  if (max_tokens && ids.size() > max_tokens) ids.resize(max_tokens);
  if (ids.size() < 2) throw Error(path + ": fewer than 2 tokens");
  return ids;
}

// Teacher-forced decode of `ids`, one token per eval, recording each token's trace.
Recorded record(const Model& m, const std::vector<TokenId>& ids, std::optional<TokenId> bos, int threads) {
  const ModelConfig& c = m.config;
  storage::StoreOptions so;
  so.policy = storage::EvictionKind::LruGlobal;
  so.cache_bytes = UINT64_MAX;
  so.max_slots = c.num_hidden_layers * c.n_routed_experts;  // everything: the replay is the cache figure
  so.prefetch_budget_bytes = expert_slot_bytes(m) * c.num_experts_per_tok * 2;
  auto store = open_expert_store(m, so);
  StreamedExperts src(*store);
  EngineOptions eo;
  eo.threads = threads;
  eo.ctx = std::min<uint32_t>((uint32_t)ids.size(), c.max_position_embeddings);
  eo.chunk = 1;
  eo.experts = &src;
  eo.prefetch = true;
  Engine eng(m, eo);
  SequenceState st = eng.new_sequence();
  std::vector<TokenTrace> tr;
  Recorded r;
  const bool progress = isatty(STDERR_FILENO) != 0;
  uint32_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (pos == eo.ctx) {  // context full: a fresh sequence, as a new request would be (not recorded)
      eng.reset(st);
      pos = 0;
      if (bos) {
        eng.eval(st, std::span<const TokenId>(&*bos, 1), nullptr);
        ++pos;
      }
    }
    ++pos;
    tr.clear();
    eng.eval(st, std::span<const TokenId>(&ids[i], 1), nullptr, &tr);
    r.selected.push_back(std::move(tr.at(0).experts));
    r.guessed.push_back(std::move(tr.at(0).guessed_experts));
    if (progress && (i + 1) % 256 == 0) std::fprintf(stderr, "\r%zu / %zu tokens", i + 1, ids.size());
  }
  if (progress) std::fprintf(stderr, "\r%zu tokens decoded\n", ids.size());
  src.release();
  return r;
}

json layer_json(const std::vector<LayerRouting>& ls, const UniformRouting& u, uint32_t n_expert) {
  json layers = json::array();
  uint64_t guessed = 0, selected = 0, hits = 0;
  std::printf("\nper layer (uniform independent routing: H/Hmax 1, top10 %.1f%%, reuse mean %.1f, overlap %.1f%%; a guess\n"
              "of top_k experts at random: recall = precision %.1f%%. The guess is the next layer's own router on this\n"
              "layer's FFN input, so it scores well wherever that input changes little between layers, random\n"
              "weights included: compare it with the random twin's figure, not with chance. The mean reuse distance\n"
              "is about n_expert / top_k for any routing (Kac's lemma); the median shows locality)\n",
              100 * u.top10_share, u.reuse_mean, 100 * u.overlap, 100 * u.overlap);
  std::printf("%5s %9s %7s %7s %9s %9s %8s %9s %9s\n", "layer", "H bits", "H/Hmax", "top10", "reuse", "reuse_med",
              "overlap", "g.recall", "g.prec");
  for (size_t L = 0; L < ls.size(); ++L) {
    const LayerRouting& r = ls[L];
    std::printf("%5zu %9.3f %7.3f %6.1f%% %9.2f %9.1f %7.1f%% ", L, r.entropy_bits, r.entropy_norm,
                100 * r.top10_share, r.reuse_mean, r.reuse_median, 100 * r.prev_overlap);
    if (r.guessed) std::printf("%8.1f%% %8.1f%%\n", 100 * r.guess_recall(), 100 * r.guess_precision());
    else std::printf("%9s %9s\n", "-", "-");
    guessed += r.guessed;
    selected += r.selected_with_guess;
    hits += r.guess_hits;
    layers.push_back({{"layer", L}, {"selections", r.selections}, {"entropy_bits", r.entropy_bits},
                      {"entropy_norm", r.entropy_norm}, {"top10_share", r.top10_share},
                      {"reuse_mean", r.reuse_mean}, {"reuse_median", r.reuse_median}, {"reuses", r.reuses},
                      {"prev_overlap", r.prev_overlap},
                      {"guess_recall", r.guessed ? json(r.guess_recall()) : json(nullptr)},
                      {"guess_precision", r.guessed ? json(r.guess_precision()) : json(nullptr)}});
  }
  const double recall = selected ? (double)hits / selected : 0, precision = guessed ? (double)hits / guessed : 0;
  std::printf("next-layer guess overall: recall %.1f%%, precision %.1f%% (random guess: %.1f%% each; in decode the two are\n"
              "equal, since the guess and the selection are top_k experts each)\n",
              100 * recall, 100 * precision, 100 * u.overlap);
  return json{{"layers", layers},
              {"top10_experts", top_decile_count(n_expert)},
              {"prefetch_guess", {{"recall", recall}, {"precision", precision}, {"random_guess", u.overlap},
                                  {"guessed", guessed}, {"selected", selected}, {"hits", hits}}}};
}

// Every policy at every cache size over the trace; miss bytes from the file's expert windows.
json cache_json(const Model& m, const Recorded& r) {
  const ModelConfig& c = m.config;
  const uint32_t NL = c.num_hidden_layers, E = c.n_routed_experts;
  const storage::ExpertGeometry g = storage::expert_geometry(m.file, NL, E);
  const auto bytes = [&g](uint32_t l, uint32_t e) { return g.load_bytes(l, e); };
  const double tokens = (double)r.selected.size();
  json rows = json::array();
  std::printf("\nexpert cache replay over %zu tokens (%u experts; a miss reads the expert's aligned windows)\n",
              r.selected.size(), NL * E);
  std::printf("%6s %6s", "cache", "slots");
  for (storage::EvictionKind k : kPolicies) std::printf(" %14s %9s", std::string(eviction_name(k)).c_str(), "MB/tok");
  std::printf("   uniform independent routing\n");
  for (double f : kFractions) {
    const uint32_t slots = (uint32_t)std::llround(f * NL * E);
    json row{{"fraction", f}, {"slots", slots}, {"uniform_hit_rate", (double)slots / (NL * E)}};
    std::printf("%5.0f%% %6u", 100 * f, slots);
    for (storage::EvictionKind k : kPolicies) {
      const storage::ReplayResult rr = storage::replay_policy(k, slots, NL, E, r.selected, bytes);
      const std::string name(eviction_name(k));
      if (!rr.feasible) {
        std::printf(" %14s %9s", "n/a", "-");
        row["policies"][name] = {{"feasible", false}};
        continue;
      }
      const double per_tok = (double)rr.miss_bytes / tokens;
      std::printf(" %13.1f%% %9.3f", 100 * rr.hit_rate(), per_tok / 1e6);
      row["policies"][name] = {{"feasible", true}, {"hit_rate", rr.hit_rate()}, {"requests", rr.requests},
                               {"hits", rr.hits}, {"disk_bytes_per_token", per_tok}};
    }
    std::printf("   uniform routing: %.0f%% (steady state)\n", 100.0 * slots / (NL * E));
    rows.push_back(row);
  }
  std::printf("(n/a: a layer's share holds fewer than top_k = %u experts, so the store refuses that cache; the\n"
              "first use of each expert always misses, so even 100%% stays below 100%% over a short text)\n",
              c.num_experts_per_tok);
  return rows;
}

void write_json(const std::string& path, const json& j) {
  AtomicOutputFile out(path, Existing::Replace);
  out.write(j.dump(1) + "\n");
  out.commit();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, text, json_out;
  uint32_t max_tokens = 2048;
  int threads = 1;
  CLI::App app{"routing statistics and expert-cache replay on a text, teacher-forced"};
  app.add_option("MODEL", model, "deepseek41 GGUF")->required();
  app.add_option("TEXTFILE", text, "text to decode (its tokens are fed in order)")->required();
  app.add_option("--tokens", max_tokens, "tokens of the text to decode, BOS included (0: all; default 2048)");
  app.add_option("--json", json_out, "also write the figures as JSON (replaced if present)");
  app.add_option("-t,--threads", threads, "compute threads (default 1)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!json_out.empty()) check_output_target(json_out, Existing::Replace);
    LoadOptions lo;
    lo.resident_experts = false;
    std::unique_ptr<Model> m = load_model(model, lo);
    const ModelConfig& c = m->config;
    const text::Tokenizer tok = text::Tokenizer::from_gguf(m->file);
    const std::vector<TokenId> ids = text_tokens(tok, text, max_tokens);
    std::printf("model %s: %u layers x %u routed experts, top-%u; text %s: %zu tokens, teacher-forced\n",
                model.c_str(), c.num_hidden_layers, c.n_routed_experts, c.num_experts_per_tok, text.c_str(),
                ids.size());
    const Recorded r = record(*m, ids, tok.bos(), threads);
    const UniformRouting u = uniform_routing(c.n_routed_experts, c.num_experts_per_tok);
    const std::vector<LayerRouting> ls = routing_stats(r.selected, r.guessed, c.num_hidden_layers, c.n_routed_experts);
    json j{{"model", model}, {"text", text}, {"tokens", ids.size()}, {"n_layer", c.num_hidden_layers},
           {"n_expert", c.n_routed_experts}, {"top_k", c.num_experts_per_tok},
           {"uniform", {{"top10_share", u.top10_share}, {"reuse_mean", u.reuse_mean}, {"overlap", u.overlap},
                        {"entropy_norm", 1.0}}}};
    j.update(layer_json(ls, u, c.n_routed_experts));
    j["cache"] = cache_json(*m, r);
    if (!json_out.empty()) write_json(json_out, j);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
