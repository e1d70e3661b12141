// The deepseek41 GGUF schema: tensor list and byte totals of the published model (spec 2.3-2.4),
// metadata keys (2.2), and validation of written files (sparse, header only).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/schema.h"
#include "util/error.h"

namespace sluice {
namespace {

const TensorSpec& find_spec(const std::vector<TensorSpec>& v, const std::string& name) {
  for (const auto& t : v)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

bool has_spec(const std::vector<TensorSpec>& v, const std::string& name) {
  return std::any_of(v.begin(), v.end(), [&](const TensorSpec& t) { return t.name == name; });
}

// ---- published figures (spec 2.3 / 2.4), from the config alone --------------------------------

TEST(SchemaPublished, TensorCountAndByteTotals) {
  const auto t = deepseek41_tensors(published_config());
  EXPECT_EQ(t.size(), 1046u);
  const SchemaBytes b = schema_bytes(t);
  EXPECT_EQ(b.routed_expert, 152882380800ull);
  EXPECT_EQ(b.engram, 202758032400ull);
  EXPECT_EQ(b.resident, 10060841408ull);
  EXPECT_EQ(b.aligned_total, 365707853824ull);
  size_t n_routed = 0, n_engram = 0;
  for (const auto& s : t) {
    n_routed += s.cls == ByteClass::RoutedExpert;
    n_engram += s.cls == ByteClass::Engram;
  }
  EXPECT_EQ(n_routed, 120u);
  EXPECT_EQ(n_engram, 2u);
}

TEST(SchemaPublished, PerExpertBytes) {
  const auto t = deepseek41_tensors(published_config());
  const uint64_t gate = find_spec(t, "blk.0.ffn_gate_exps.weight").nbytes() / 384;
  const uint64_t up = find_spec(t, "blk.17.ffn_up_exps.weight").nbytes() / 384;
  const uint64_t down = find_spec(t, "blk.39.ffn_down_exps.weight").nbytes() / 384;
  EXPECT_EQ(gate, 3041280u);
  EXPECT_EQ(up, 3041280u);
  EXPECT_EQ(down, 3870720u);
  EXPECT_EQ(gate + up + down, 9953280u);
  EXPECT_EQ(find_spec(t, "blk.0.ffn_gate_exps.weight").nbytes(), 1167851520ull);
  EXPECT_EQ(find_spec(t, "blk.0.ffn_down_exps.weight").nbytes(), 1486356480ull);
}

TEST(SchemaPublished, ShapesAndTypesOfSpecTable) {
  const auto t = deepseek41_tensors(published_config());
  struct Row {
    const char* name;
    std::vector<uint64_t> ne;
    GgmlType type;
  };
  const Row rows[] = {
      {"token_embd.weight", {5120, 129280}, GgmlType::F16},
      {"output_norm.weight", {5120}, GgmlType::F32},
      {"output.weight", {5120, 129280}, GgmlType::Q8_0},
      {"blk.0.hc_attn_fn.weight", {20480, 24}, GgmlType::F16},
      {"blk.0.hc_attn_base.weight", {24}, GgmlType::F32},
      {"blk.0.hc_attn_scale.weight", {3}, GgmlType::F32},
      {"blk.5.hc_ffn_fn.weight", {20480, 24}, GgmlType::F16},
      {"blk.5.ffn_norm.weight", {5120}, GgmlType::F32},
      {"blk.7.attn_sinks.weight", {64}, GgmlType::F32},
      {"blk.7.attn_q_a.weight", {5120, 1280}, GgmlType::Q8_0},
      {"blk.7.attn_q_a_norm.weight", {1280}, GgmlType::F32},
      {"blk.7.attn_q_b.weight", {1280, 32768}, GgmlType::Q8_0},
      {"blk.7.attn_kv.weight", {5120, 512}, GgmlType::Q8_0},
      {"blk.7.attn_kv_a_norm.weight", {512}, GgmlType::F32},
      {"blk.7.attn_output_a.weight", {4096, 8192}, GgmlType::Q8_0},
      {"blk.7.attn_output_b.weight", {8192, 5120}, GgmlType::Q8_0},
      {"blk.7.ffn_gate_inp.weight", {5120, 384}, GgmlType::F32},
      {"blk.7.exp_probs_b.bias", {384}, GgmlType::F32},
      {"blk.7.exp_probs_b_vl.bias", {384}, GgmlType::F32},
      {"blk.7.ffn_gate_shexp.weight", {5120, 2304}, GgmlType::Q8_0},
      {"blk.7.ffn_down_shexp.weight", {2304, 5120}, GgmlType::Q8_0},
      {"blk.7.ffn_gate_exps.weight", {5120, 2304, 384}, GgmlType::IQ2_XXS},
      {"blk.7.ffn_up_exps.weight", {5120, 2304, 384}, GgmlType::IQ2_XXS},
      {"blk.7.ffn_down_exps.weight", {2304, 5120, 384}, GgmlType::Q2_K},
      {"blk.2.attn_compressor_kv.weight", {5120, 512}, GgmlType::F16},
      {"blk.2.attn_compressor_gate.weight", {5120, 512}, GgmlType::F16},
      {"blk.20.attn_compressor_norm.weight", {512}, GgmlType::F32},
      {"blk.20.indexer.attn_k.weight", {512, 128}, GgmlType::F16},
      {"blk.20.indexer.k_norm.weight", {128}, GgmlType::F32},
      {"blk.36.indexer.attn_q_b.weight", {1280, 4096}, GgmlType::F16},
      {"blk.36.indexer.proj.weight", {5120, 32}, GgmlType::F16},
      {"blk.1.engram_embd.weight", {264, 384006168}, GgmlType::I8},
      {"blk.14.engram_embd.weight", {264, 384016682}, GgmlType::I8},
      {"blk.14.engram_q_norm.weight", {5120, 4}, GgmlType::F32},
      {"blk.14.engram_k_norm.weight", {5120, 4}, GgmlType::F32},
      {"blk.1.engram_kv.weight", {6144, 25600}, GgmlType::F16},
  };
  for (const Row& r : rows) {
    const TensorSpec& s = find_spec(t, r.name);
    EXPECT_EQ(s.ne, r.ne) << r.name;
    EXPECT_EQ(s.type, r.type) << r.name;
  }
  EXPECT_EQ(find_spec(t, "blk.1.engram_embd.weight").cls, ByteClass::Engram);
  EXPECT_EQ(find_spec(t, "blk.1.engram_kv.weight").cls, ByteClass::Resident);
  EXPECT_EQ(find_spec(t, "blk.3.ffn_down_exps.weight").cls, ByteClass::RoutedExpert);
  EXPECT_EQ(find_spec(t, "blk.3.ffn_down_shexp.weight").cls, ByteClass::Resident);
  EXPECT_EQ(find_spec(t, "blk.3.ffn_down_exps.weight").layer, 3);
  EXPECT_EQ(find_spec(t, "output.weight").layer, -1);
}

TEST(SchemaPublished, RoleTensorsOnlyWhereRolesAre) {
  const auto t = deepseek41_tensors(published_config());
  const std::set<int> kv = {2, 8, 14, 20}, idx = {2, 8, 14, 20, 24, 28, 32, 36}, eng = {1, 14};
  for (int l = 0; l < 40; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(has_spec(t, p + "attn_compressor_kv.weight"), kv.count(l) > 0) << l;
    EXPECT_EQ(has_spec(t, p + "attn_compressor_gate.weight"), kv.count(l) > 0 && l < 20) << l;
    EXPECT_EQ(has_spec(t, p + "indexer.attn_k.weight"), kv.count(l) > 0) << l;
    EXPECT_EQ(has_spec(t, p + "indexer.attn_q_b.weight"), idx.count(l) > 0) << l;
    EXPECT_EQ(has_spec(t, p + "engram_kv.weight"), eng.count(l) > 0) << l;
    EXPECT_EQ(has_spec(t, p + "engram_embd.weight"), eng.count(l) > 0) << l;
    EXPECT_TRUE(has_spec(t, p + "ffn_down_exps.weight")) << l;
  }
}

TEST(SchemaPublished, OrderGlobalsLayersEngramLast) {
  const auto t = deepseek41_tensors(published_config());
  ASSERT_EQ(t.size(), 1046u);
  EXPECT_EQ(t[0].name, "token_embd.weight");
  EXPECT_EQ(t[1].name, "output_norm.weight");
  EXPECT_EQ(t[2].name, "output.weight");
  EXPECT_EQ(t[3].name, "blk.0.hc_attn_fn.weight");
  EXPECT_EQ(t[27].name, "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(t[28].name, "blk.1.hc_attn_fn.weight");
  EXPECT_EQ(t[1044].name, "blk.1.engram_embd.weight");
  EXPECT_EQ(t[1045].name, "blk.14.engram_embd.weight");
  int last_layer = -1;
  std::set<std::string> names;
  for (size_t i = 3; i < 1044; ++i) {
    EXPECT_GE(t[i].layer, last_layer) << t[i].name;  // layers never interleave
    last_layer = t[i].layer;
  }
  for (const auto& s : t) EXPECT_TRUE(names.insert(s.name).second) << s.name;
  // Within a KV/index-source layer the role tensors follow the 25 common ones.
  size_t i2 = 0;
  while (t[i2].name != "blk.2.ffn_down_exps.weight") ++i2;
  EXPECT_EQ(t[i2 + 1].name, "blk.2.attn_compressor_kv.weight");
  EXPECT_EQ(t[i2 + 2].name, "blk.2.attn_compressor_gate.weight");
  EXPECT_EQ(t[i2 + 6].name, "blk.2.indexer.attn_q_b.weight");
  EXPECT_EQ(t[i2 + 8].name, "blk.3.hc_attn_fn.weight");
}

TEST(SchemaPublished, WriterLayoutMatchesTotals) {
  // The data section a Writer lays out for the published schema (no file is written).
  const ModelConfig c = published_config();
  gguf::Writer w(kDeepseek41Alignment);
  add_deepseek41_metadata(c, w);
  for (const auto& s : deepseek41_tensors(c)) w.add_tensor(s.name, s.ne, s.type);
  EXPECT_EQ(w.tensors().size(), 1046u);
  EXPECT_EQ(w.file_size() - w.data_offset(), 365707853824ull);
  EXPECT_EQ(w.data_offset() % kDeepseek41Alignment, 0u);
}

TEST(SchemaPublished, QuantizationDescription) {
  EXPECT_EQ(describe_tensor_types(TensorTypes{}), "IQ2_XXS gate/up; Q2_K down; Q8_0 attention/shared/head");
  TensorTypes t;
  t.shared_expert = GgmlType::Q4_K;
  EXPECT_EQ(describe_tensor_types(t), "IQ2_XXS gate/up; Q2_K down; Q8_0 attention; Q4_K shared; Q8_0 head");
}

// ---- metadata keys ---------------------------------------------------------------------------

TEST(SchemaMetadata, FiftyThreeDeepseekKeysWithSpecTypes) {
  const ModelConfig c = published_config();
  const auto kv = deepseek41_metadata(c);
  std::map<std::string, const gguf::Value*> by;
  size_t n41 = 0;
  for (const auto& x : kv) {
    EXPECT_TRUE(by.emplace(x.key, &x.value).second) << "duplicate " << x.key;
    n41 += x.key.rfind("deepseek41.", 0) == 0;
  }
  EXPECT_EQ(n41, 53u);
  EXPECT_EQ(kv.size(), 5u + 53u + 1u);
  EXPECT_EQ(kv[0].key, "general.architecture");
  EXPECT_EQ(kv[0].value.s, "deepseek41");
  EXPECT_EQ(by.at("general.alignment")->type, gguf::ValueType::U32);
  EXPECT_EQ(by.at("general.alignment")->u, 16384u);
  EXPECT_EQ(by.at("general.source.revision")->s.size(), 40u);
  const char* u32_keys[] = {"vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups",
                            "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "max_position_embeddings",
                            "sliding_window", "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer_id",
                            "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "rope_theta",
                            "compress_rope_theta"};
  ASSERT_EQ(std::size(u32_keys), 26u);
  for (const char* k : u32_keys) EXPECT_EQ(by.at(std::string("deepseek41.") + k)->type, gguf::ValueType::U32) << k;
  EXPECT_EQ(by.at("deepseek41.rope_theta")->u, 10000u);
  EXPECT_EQ(by.at("deepseek41.compress_rope_theta")->u, 160000u);
  EXPECT_EQ(by.at("deepseek41.max_position_embeddings")->u, 1048576u);
  for (const char* k : {"rms_norm_eps", "hc_eps", "swiglu_limit", "routed_scaling_factor", "rope_scaling.factor",
                        "rope_scaling.beta_fast", "rope_scaling.beta_slow", "rope_scaling.original_max_position_embeddings"})
    EXPECT_EQ(by.at(std::string("deepseek41.") + k)->type, gguf::ValueType::F32) << k;
  EXPECT_EQ((float)by.at("deepseek41.rms_norm_eps")->f, 1e-20f);
  EXPECT_EQ(by.at("deepseek41.rope_scaling.original_max_position_embeddings")->f, 65536.0);
  EXPECT_EQ(by.at("deepseek41.norm_topk_prob")->type, gguf::ValueType::BOOL);
  auto arr = [&](const char* k, gguf::ValueType elem, size_t n) {
    const gguf::Value* v = by.at(std::string("deepseek41.") + k);
    EXPECT_EQ(v->type, gguf::ValueType::ARRAY) << k;
    EXPECT_EQ(v->elem, elem) << k;
    EXPECT_EQ(v->array_size(), n) << k;
  };
  arr("compress_ratios", gguf::ValueType::U32, 40);
  arr("kv_source_layer_ids", gguf::ValueType::U32, 4);
  arr("index_source_layer_ids", gguf::ValueType::U32, 8);
  arr("engram.layer_ids", gguf::ValueType::U32, 2);
  arr("engram.rows", gguf::ValueType::U32, 2);
  arr("engram.token_map", gguf::ValueType::U32, 129280);
  arr("engram.primes", gguf::ValueType::U32, 48);
  arr("engram.multipliers", gguf::ValueType::U64, 8);
  EXPECT_EQ(by.at("deepseek41.engram.rows")->au, (std::vector<uint64_t>{384006168, 384016682}));
  EXPECT_EQ(by.at("deepseek41.engram.multipliers")->au[0], 38316048023122ull * 2 + 1);
  EXPECT_EQ(by.at("deepseek41.engram.encoding")->s, "e4m3_e8m0_32_row264");
  EXPECT_EQ(by.at("deepseek41.engram.storage")->s, "embedded");
  EXPECT_EQ(by.at("deepseek41.engram.pad_id")->u, 2u);
  EXPECT_EQ(by.at("deepseek41.quantization")->s, "IQ2_XXS gate/up; Q2_K down; Q8_0 attention/shared/head");
  EXPECT_EQ(by.at("deepseek41.calibration")->s, "imatrix");
  EXPECT_EQ(by.at("quantize.imatrix.file")->type, gguf::ValueType::STRING);
  // The config key is the compact sorted JSON and reads back to the same config.
  const std::string& js = by.at("deepseek41.config")->s;
  EXPECT_EQ(js.find('\n'), std::string::npos);
  EXPECT_EQ(js.find("engram_token_map"), std::string::npos);
  EXPECT_EQ(config_from_json(nlohmann::json::parse(js)), c);
}

// ---- written files ---------------------------------------------------------------------------

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("sluice_schema_" + tag + "_" + std::to_string(::getpid()) + ".gguf")).string()) {}
  ~TempFile() { std::filesystem::remove(path); }
};

using KVEdit = std::function<void(std::vector<gguf::KV>&)>;
using TensorEdit = std::function<void(std::vector<TensorSpec>&)>;

// Writes c's schema (sparse: no payload) after applying the edits.
void write_model(const std::string& path, const ModelConfig& c, const KVEdit& kv_edit = {},
                 const TensorEdit& t_edit = {}, uint32_t alignment = kDeepseek41Alignment) {
  std::vector<gguf::KV> kv = deepseek41_metadata(c);
  kv.push_back({"tokenizer.ggml.bos_token_id", gguf::Value::u32(c.bos_token_id)});
  kv.push_back({"tokenizer.ggml.eos_token_id", gguf::Value::u32(c.eos_token_id)});
  if (kv_edit) kv_edit(kv);
  std::vector<TensorSpec> t = deepseek41_tensors(c);
  if (t_edit) t_edit(t);
  gguf::Writer w(alignment);
  for (auto& x : kv) w.add(x.key, x.value);
  for (auto& s : t) w.add_tensor(s.name, s.ne, s.type);
  w.write(path, {}, true);
}

void erase_key(std::vector<gguf::KV>& kv, const std::string& key) {
  kv.erase(std::remove_if(kv.begin(), kv.end(), [&](const gguf::KV& x) { return x.key == key; }), kv.end());
}

gguf::Value& key_value(std::vector<gguf::KV>& kv, const std::string& key) {
  for (auto& x : kv)
    if (x.key == key) return x.value;
  throw std::runtime_error("no key " + key);
}

ModelConfig tiny_alt() {
  std::ifstream f(std::string(SLUICE_TEST_DATA) + "/../../configs/tiny-alt.json");
  return config_from_json(nlohmann::json::parse(f));
}

TEST(SchemaRoundTrip, TinyAndAltValidateAndReadBack) {
  for (const ModelConfig& c : {tiny_config(), tiny_alt()}) {
    TempFile tmp("rt");
    write_model(tmp.path, c);
    const gguf::File f = gguf::File::open(tmp.path);
    const SchemaReport rep = validate_deepseek41(f);
    EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
    std::vector<std::string> dis;
    EXPECT_EQ(config_from_gguf(f, &dis), c);
    EXPECT_TRUE(dis.empty()) << dis.front();
    const SchemaBytes b = schema_bytes(deepseek41_tensors(c));
    EXPECT_EQ(rep.resident_bytes, b.resident);
    EXPECT_EQ(rep.routed_expert_bytes, b.routed_expert);
    EXPECT_EQ(rep.engram_bytes, b.engram);
    EXPECT_EQ(rep.n_layer, c.num_hidden_layers);
    EXPECT_EQ(rep.n_expert, c.n_routed_experts);
    const uint64_t gate = row_bytes(c.types.routed_gate_up, c.hidden_size) * c.moe_intermediate_size;
    const uint64_t down = row_bytes(c.types.routed_down, c.moe_intermediate_size) * c.hidden_size;
    EXPECT_EQ(rep.expert_gate_bytes, gate);
    EXPECT_EQ(rep.expert_up_bytes, gate);
    EXPECT_EQ(rep.expert_down_bytes, down);
    EXPECT_EQ(rep.expert_bytes_per_layer, 2 * gate + down);
    EXPECT_EQ(f.alignment(), 16384u);
    size_t n41 = 0;
    for (const auto& kv : f.kvs()) n41 += kv.key.rfind("deepseek41.", 0) == 0;
    EXPECT_EQ(n41, 53u);
    EXPECT_EQ(f.tensors().back().name, "blk." + std::to_string(c.engram_layer_ids.back()) + ".engram_embd.weight");
  }
}

TEST(SchemaRoundTrip, KeysWinOverConfigJsonAndAreReported) {
  const ModelConfig c = tiny_config();
  TempFile tmp("keys");
  // deepseek41.config claims another sliding window; the key is authoritative.
  write_model(tmp.path, c, [&](std::vector<gguf::KV>& kv) {
    nlohmann::json j = config_to_json(c, false);
    j["sliding_window"] = 16;
    key_value(kv, "deepseek41.config").s = j.dump();
  });
  const gguf::File f = gguf::File::open(tmp.path);
  std::vector<std::string> dis;
  EXPECT_EQ(config_from_gguf(f, &dis).sliding_window, 8u);
  ASSERT_EQ(dis.size(), 1u);
  EXPECT_NE(dis[0].find("sliding_window"), std::string::npos);
  EXPECT_FALSE(validate_deepseek41(f).errors.empty());
}

TEST(SchemaRoundTrip, RealTablesFromKeysAndConfigFallback) {
  // A file whose Engram tables are not the derived ones (a real token map) and whose config
  // JSON lacks most keys: the keys supply both.
  ModelConfig c = tiny_config();
  for (uint32_t i = 0; i < c.vocab_size; ++i) c.engram_token_map[i] = (i * 7) % c.engram_compressed_vocab_size;
  finalize(c);
  TempFile tmp("tables");
  write_model(tmp.path, c, [&](std::vector<gguf::KV>& kv) {
    const nlohmann::json full = config_to_json(c, false);
    nlohmann::json j;
    for (const char* k : {"engram_n_heads", "engram_head_dim", "engram_max_ngram_size", "engram_vocab_size",
                          "engram_pad_token_id", "compress_ratios"})
      j[k] = full[k];
    key_value(kv, "deepseek41.config").s = j.dump();
  });
  const gguf::File f = gguf::File::open(tmp.path);
  EXPECT_EQ(config_from_gguf(f), c);
  const SchemaReport rep = validate_deepseek41(f);
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
}

TEST(SchemaRoundTrip, NoConfigJsonRecoversEngramShape) {
  const ModelConfig c = tiny_alt();
  TempFile tmp("nojson");
  write_model(tmp.path, c, [](std::vector<gguf::KV>& kv) { erase_key(kv, "deepseek41.config"); });
  const gguf::File f = gguf::File::open(tmp.path);
  const ModelConfig back = config_from_gguf(f);
  EXPECT_EQ(back.engram_n_heads, c.engram_n_heads);
  EXPECT_EQ(back.engram_max_ngram_size, c.engram_max_ngram_size);
  EXPECT_EQ(back.engram_head_dim, c.engram_head_dim);
  EXPECT_EQ(back.types, c.types);
  EXPECT_EQ(back.engram_primes, c.engram_primes);
  // Every structural key is there, so the fallback is not needed.
  const SchemaReport rep = validate_deepseek41(f);
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
}

TEST(SchemaRoundTrip, MissingKeysFallBackToConfigJson) {
  const ModelConfig c = tiny_alt();
  TempFile tmp("fallback");
  write_model(tmp.path, c, [](std::vector<gguf::KV>& kv) {
    for (const char* k : {"deepseek41.index_topk", "deepseek41.compress_ratios", "deepseek41.rope_scaling.factor",
                          "deepseek41.swiglu_limit", "deepseek41.quantization", "deepseek41.engram.rows", "quantize.imatrix.file"})
      erase_key(kv, k);
  });
  const gguf::File f = gguf::File::open(tmp.path);
  EXPECT_EQ(config_from_gguf(f), c);
  const SchemaReport rep = validate_deepseek41(f);
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
}

TEST(SchemaRoundTrip, UnparsableConfigValuesOnlyMatterWithoutAKey) {
  const ModelConfig c = tiny_config();
  TempFile tmp("unparsable");
  write_model(tmp.path, c, [&](std::vector<gguf::KV>& kv) {
    nlohmann::json j = config_to_json(c, false);
    j["rope_scaling"]["type"] = "deepseek_yarn";  // deepseek41.rope_scaling.* keys supply it
    j["engram_n_heads"] = "two";                   // no key supplies it
    key_value(kv, "deepseek41.config").s = j.dump();
  });
  const gguf::File f = gguf::File::open(tmp.path);
  std::vector<std::string> dis;
  EXPECT_EQ(config_from_gguf(f, &dis), c);
  ASSERT_EQ(dis.size(), 1u);
  EXPECT_NE(dis[0].find("engram_n_heads"), std::string::npos);
}

void expect_validation_error(const std::string& tag, const std::string& needle, const KVEdit& kv_edit,
                             const TensorEdit& t_edit = {}, uint32_t alignment = kDeepseek41Alignment) {
  TempFile tmp(tag);
  write_model(tmp.path, tiny_config(), kv_edit, t_edit, alignment);
  const gguf::File f = gguf::File::open(tmp.path);
  const SchemaReport rep = validate_deepseek41(f);
  bool found = false;
  for (const auto& e : rep.errors) found |= e.find(needle) != std::string::npos;
  EXPECT_TRUE(found) << tag << ": no error mentions \"" << needle << "\"; got " << rep.errors.size() << " errors"
                     << (rep.errors.empty() ? std::string() : ", first: " + rep.errors[0]);
}

TEST(SchemaValidate, ReportsEachDefect) {
  expect_validation_error("arch", "architecture llama is not supported (sluice runs deepseek41)",
                          [](auto& kv) { key_value(kv, "general.architecture").s = "llama"; });
  expect_validation_error("nokey", "deepseek41.index_topk", [](auto& kv) {
    erase_key(kv, "deepseek41.index_topk");
    erase_key(kv, "deepseek41.config");
  });
  expect_validation_error("nomap", "deepseek41.engram.token_map", [](auto& kv) { erase_key(kv, "deepseek41.engram.token_map"); });
  expect_validation_error("keytype", "deepseek41.hc_eps", [](auto& kv) { key_value(kv, "deepseek41.hc_eps") = gguf::Value::u32(1); });
  expect_validation_error("rows", "deepseek41.engram.rows", [](auto& kv) { key_value(kv, "deepseek41.engram.rows").au[1] += 1; });
  expect_validation_error("pad", "deepseek41.engram.pad_id", [](auto& kv) { key_value(kv, "deepseek41.engram.pad_id").u = 7; });
  expect_validation_error("storage", "deepseek41.engram.storage", [](auto& kv) { key_value(kv, "deepseek41.engram.storage").s = "external"; });
  expect_validation_error("badcfg", "config", [](auto& kv) { key_value(kv, "deepseek41.kv_source_layer_ids").au = {4, 2}; });
  expect_validation_error("missing", "missing tensor blk.3.attn_kv.weight", {}, [](auto& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](const TensorSpec& s) { return s.name == "blk.3.attn_kv.weight"; }), t.end());
  });
  expect_validation_error("extra", "unexpected tensor blk.3.attn_compressor_kv.weight", {}, [](auto& t) {
    t.push_back(TensorSpec{"blk.3.attn_compressor_kv.weight", {256, 64}, GgmlType::F16, ByteClass::Resident, 3, "small_f16"});
  });
  expect_validation_error("shape", "blk.5.attn_sinks.weight has ne [5]", {}, [](auto& t) {
    for (auto& s : t)
      if (s.name == "blk.5.attn_sinks.weight") s.ne = {5};
  });
  expect_validation_error("type", "blk.6.ffn_up_exps.weight has type Q4_K", {}, [](auto& t) {
    for (auto& s : t)
      if (s.name == "blk.6.ffn_up_exps.weight") s.type = GgmlType::Q4_K;
  });
  expect_validation_error("order", "not at the end", {}, [](auto& t) { std::rotate(t.begin(), t.end() - 1, t.end()); });
  expect_validation_error(
      "align", "general.alignment", [](auto& kv) { erase_key(kv, "general.alignment"); }, {}, 32);
}

}  // namespace
}  // namespace sluice
