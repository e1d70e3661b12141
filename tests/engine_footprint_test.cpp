// The engine reports what it allocates (model/deepseek41/engine_footprint.h), and admission plans with
// those figures: a fresh sequence's vectors hold exactly the reported bytes, the loader's weight
// buffers exactly the reported weights, and the plan's lines are the engine's figures.
// (The scratch bound is measured by counting the heap: tests/heap/eval_heap_test.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "runtime/admission.h"
#include "synth/generate.h"
#include "synth/vocab.h"

#include "test_util.h"

namespace sluice {
namespace {

using test::TempDir;

ModelConfig config_named(const std::string& which) {
  if (which == "tiny") return tiny_config();
  std::ifstream f(std::string(SLUICE_TEST_DATA) + "/../../configs/" + which + ".json");
  return config_from_json(nlohmann::json::parse(f));
}

// Bytes the vectors of s have allocated (capacity, not size: what the heap holds).
uint64_t allocated_bytes(const SequenceState& s) {
  uint64_t b = s.window_kv.capacity() * sizeof(uint16_t) + s.engram_tail.capacity() * sizeof(int64_t);
  for (const SourceCache& sc : s.sources)
    b += (sc.kv.capacity() + sc.index_k.capacity()) * sizeof(uint8_t) +
         (sc.carry_k.capacity() + sc.carry_s.capacity()) * sizeof(float);
  return b;
}

class EngineFootprintModel : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineFootprintModel, SequenceStateHoldsExactlyTheReportedBytes) {
  TempDir dir("sluice_engine_footprint");
  const ModelConfig c = config_named(GetParam());
  const std::string path = dir / "m.gguf";
  generate_model(c, synthetic_vocab(c.vocab_size), path, GenerateOptions{3, false});
  const std::unique_ptr<Model> m = load_model(path);
  for (uint32_t ctx : {1u, 2u, 5u, 37u, 64u, 1000u, (uint32_t)c.max_position_embeddings}) {
    EngineOptions eo;
    eo.ctx = ctx;
    const Engine e(*m, eo);
    const SequenceState s = e.new_sequence();
    const EngineFootprint fp = e.footprint();
    EXPECT_EQ(allocated_bytes(s), fp.sequence.total()) << GetParam() << " ctx " << ctx;
    EXPECT_EQ(fp.sequence.total(), sequence_state_bytes(c, ctx).total()) << GetParam() << " ctx " << ctx;
    // Each part on its own, so a drift in one is named.
    uint64_t kv = 0, ik = 0, carry = 0;
    for (const SourceCache& sc : s.sources) {
      kv += sc.kv.size();
      ik += sc.index_k.size();
      carry += (sc.carry_k.size() + sc.carry_s.size()) * sizeof(float);
    }
    EXPECT_EQ(s.window_kv.size() * sizeof(uint16_t), fp.sequence.window) << "ctx " << ctx;
    EXPECT_EQ(kv, fp.sequence.compressed_kv) << "ctx " << ctx;
    EXPECT_EQ(ik, fp.sequence.index_keys) << "ctx " << ctx;
    EXPECT_EQ(carry, fp.sequence.carry) << "ctx " << ctx;
    EXPECT_EQ(s.engram_tail.size() * sizeof(int64_t), fp.sequence.engram_history) << "ctx " << ctx;
    // The rollback point is a checkpoint at a full window: rings, carries and history, none
    // of the compressed rows.
    EXPECT_EQ(fp.rollback, ctx > eo.chunk ? checkpoint_bytes(c, ctx) : 0);
    if (ctx > eo.chunk && ctx >= c.sliding_window) {
      EXPECT_EQ(fp.rollback, fp.sequence.window + fp.sequence.carry + fp.sequence.engram_history) << "ctx " << ctx;
    }
    // A copy (a snapshot) holds the same bytes.
    const SequenceState copy = s;
    EXPECT_EQ(allocated_bytes(copy), fp.sequence.total());
  }
}

TEST_P(EngineFootprintModel, WeightsAreWhatTheLoaderAllocatedAndWhatAdmissionPlans) {
  TempDir dir("sluice_engine_footprint");
  const ModelConfig c = config_named(GetParam());
  const std::string path = dir / "m.gguf";
  generate_model(c, synthetic_vocab(c.vocab_size), path, GenerateOptions{3, false});
  const ModelFootprint mf = footprint_from_gguf(gguf::File::open(path));
  for (bool resident : {false, true}) {
    LoadOptions lo;
    lo.resident_experts = resident;
    const std::unique_ptr<Model> m = load_model(path, lo);
    const uint64_t expected = mf.resident_loaded_bytes + (resident ? mf.routed_loaded_bytes : 0);
    EXPECT_EQ(m->loaded_bytes, expected) << GetParam() << (resident ? " resident experts" : " streamed experts");
    EXPECT_GE(m->loaded_bytes, mf.resident_bytes);
  }

  // The plan's lines are the engine's figures for the same options.
  const std::unique_ptr<Model> m = load_model(path);
  for (uint32_t ctx : {64u, 512u}) {
    PlanOptions po;
    po.ctx = ctx;
    po.chunk = 16;
    po.threads = 1;
    po.budget = BudgetSpec{false, 64ull << 30};
    HostFacts host;
    host.mem.total = host.mem.available = 128ull << 30;
    ModelFootprint all = mf;  // the model above holds its experts: plan them as resident
    all.resident_loaded_bytes += all.routed_loaded_bytes;
    const Plan p = make_plan(all, po, host);
    EngineOptions eo;
    eo.ctx = ctx;
    eo.chunk = 16;
    const EngineFootprint fp = Engine(*m, eo).footprint();
    auto line = [&](const std::string& name) -> uint64_t {
      for (const PlanLine& l : p.mandatory)
        if (l.name == name) return l.bytes;
      ADD_FAILURE() << "no plan line " << name;
      return 0;
    };
    EXPECT_EQ(line("resident weights"), fp.weights) << "ctx " << ctx;
    EXPECT_EQ(line("sequence state"), fp.sequence.total()) << "ctx " << ctx;
    EXPECT_EQ(line("eval rollback point"), fp.rollback) << "ctx " << ctx;
    EXPECT_EQ(line("scratch"), fp.scratch.total()) << "ctx " << ctx;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineFootprintModel, ::testing::Values("tiny", "tiny-alt"),
                         [](const auto& info) { return info.param == "tiny" ? std::string("tiny") : std::string("tiny_alt"); });

}  // namespace
}  // namespace sluice
