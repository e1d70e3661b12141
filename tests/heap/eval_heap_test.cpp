// The scratch figure is an upper bound of what eval() really allocates: global operator new and
// delete are replaced with counting ones (which is why this is its own test binary), and the peak
// of live heap bytes during an eval() is compared with EngineFootprint's scratch (+ the undo copy
// for a multi-chunk eval). Bytes are counted as malloc_usable_size, so the allocator's rounding of
// each request is included. The figure must also stay useful: at most 2x the measured peak,
// since admission gives the expert cache whatever the scratch does not take.
#include <malloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/deepseek41/config.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "synth/generate.h"
#include "synth/vocab.h"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};

void note_alloc(void* p) {
  if (!p) return;
  const int64_t now = g_live.fetch_add((int64_t)malloc_usable_size(p), std::memory_order_relaxed) +
                      (int64_t)malloc_usable_size(p);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void note_free(void* p) {
  if (p) g_live.fetch_sub((int64_t)malloc_usable_size(p), std::memory_order_relaxed);
}

void* counted(std::size_t n, std::size_t align) {
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, (std::size_t)a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, (std::size_t)a); }
void operator delete(void* p) noexcept { note_free(p); std::free(p); }
void operator delete[](void* p) noexcept { note_free(p); std::free(p); }
void operator delete(void* p, std::size_t) noexcept { note_free(p); std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { note_free(p); std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { note_free(p); std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { note_free(p); std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { note_free(p); std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { note_free(p); std::free(p); }

namespace sluice {
namespace {

namespace fs = std::filesystem;

ModelConfig config_named(const std::string& which) {
  if (which == "tiny") return tiny_config();
  std::ifstream f(std::string(SLUICE_SOURCE_DIR) + "/configs/" + which + ".json");
  return config_from_json(nlohmann::json::parse(f));
}

struct Loaded {
  ModelConfig config;
  std::unique_ptr<Model> model;
};

const Loaded& model_named(const std::string& which) {
  static std::map<std::string, Loaded> models;
  auto it = models.find(which);
  if (it != models.end()) return it->second;
  const fs::path path = fs::temp_directory_path() / ("sluice-eval-heap-" + std::to_string(::getpid()) + "-" + which + ".gguf");
  Loaded l;
  l.config = config_named(which);
  generate_model(l.config, synthetic_vocab(l.config.vocab_size), path.string(), GenerateOptions{7, false});
  l.model = load_model(path.string());
  fs::remove(path);
  return models.emplace(which, std::move(l)).first->second;
}

std::vector<uint32_t> tokens_for(const ModelConfig& c, size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = (uint32_t)((i * 37 + seed * 11 + 5) % c.vocab_size);
  return t;
}

// Peak live heap above what was live before, while the caller's logits rows are allocated and
// eval() runs (the logits are part of the scratch figure: the Session allocates them per chunk).
uint64_t measured_eval_peak(const Engine& e, SequenceState& s, const std::vector<uint32_t>& toks) {
  const int64_t before = g_live.load();
  g_peak.store(before);
  {
    std::vector<float> logits(toks.size() * e.model().config.vocab_size);
    e.eval(s, toks, logits.data());
  }
  return (uint64_t)(g_peak.load() - before);
}

struct Case {
  const char* model;
  uint32_t chunk, ctx;
};

class EvalHeap : public ::testing::TestWithParam<Case> {};

TEST_P(EvalHeap, ScratchBoundsTheLiveHeapOfAFullChunk) {
  const Case k = GetParam();
  const Loaded& l = model_named(k.model);
  EngineOptions eo;
  eo.threads = 2;
  eo.ctx = k.ctx;
  eo.chunk = k.chunk;
  // The Engine allocates its activation tensors (the workspace part of the scratch) once, when
  // it is made: that heap counts with each eval's own.
  const int64_t before_engine = g_live.load();
  const Engine e(*l.model, eo);
  const uint64_t made = (uint64_t)(g_live.load() - before_engine);
  const EngineFootprint fp = e.footprint();
  EXPECT_GE(made, fp.scratch.workspace);
  const uint64_t scratch = fp.scratch.total();

  // The last full chunk of the context sees the most rows (window, compressed, indexer scores).
  SequenceState s = e.new_sequence();
  const std::vector<uint32_t> head = tokens_for(l.config, k.ctx - k.chunk, 1);
  for (size_t off = 0; off < head.size(); off += k.chunk)  // one chunk per call: no rollback point
    e.eval(s, std::span<const uint32_t>(head).subspan(off, std::min<size_t>(k.chunk, head.size() - off)), nullptr);
  const uint64_t one = made + measured_eval_peak(e, s, tokens_for(l.config, k.chunk, 2));
  EXPECT_LE(one, scratch) << "one chunk: measured " << one << " B, scratch " << scratch << " B";
  EXPECT_LE(scratch, 2 * one) << "one chunk: measured " << one << " B, scratch " << scratch << " B";

  // A prompt filling the context in one call: several chunks and the rollback point.
  SequenceState t = e.new_sequence();
  const uint64_t all = made + measured_eval_peak(e, t, tokens_for(l.config, k.ctx, 3));
  const uint64_t whole = scratch + fp.rollback + (uint64_t)(k.ctx - k.chunk) * l.config.vocab_size * 4;
  // The logits of the earlier chunks are the caller's rows of this call, not scratch.
  EXPECT_LE(all, whole) << "whole context: measured " << all << " B, scratch + rollback + logits " << whole << " B";
  EXPECT_LE(whole, 2 * all) << "whole context: measured " << all << " B, scratch + rollback + logits " << whole << " B";
  std::printf("[ heap ] %s chunk %u ctx %u: one chunk %llu B of scratch %llu B (%.2fx); whole %llu B of %llu B (%.2fx)\n",
              k.model, k.chunk, k.ctx, (unsigned long long)one, (unsigned long long)scratch,
              (double)scratch / (double)one, (unsigned long long)all, (unsigned long long)whole,
              (double)whole / (double)all);
}

INSTANTIATE_TEST_SUITE_P(Models, EvalHeap,
                         ::testing::Values(Case{"tiny", 64, 1024}, Case{"tiny", 128, 256}, Case{"tiny", 128, 2048}, Case{"tiny", 256, 512}, Case{"tiny", 16, 64}, Case{"tiny", 64, 512}, Case{"tiny", 128, 1024},
                                           Case{"tiny-alt", 8, 40}, Case{"tiny-alt", 64, 512},
                                           Case{"tiny-alt", 96, 960}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n + "_chunk" + std::to_string(info.param.chunk) + "_ctx" +
                                  std::to_string(info.param.ctx);
                         });

}  // namespace
}  // namespace sluice
