// ModelConfig: presets, numpy RNG reproduction, Engram derivations, JSON in/out, validation
// and per-layer roles. Expected values come from the spec or from NumPy 1.24 (run offline),
// never from the code under test.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "model/deepseek41/config.h"
#include "model/deepseek41/schema.h"
#include "util/error.h"

namespace sluice {
namespace {

using json = nlohmann::json;

json load_config_file(const std::string& name) {
  std::ifstream f(std::string(SLUICE_TEST_DATA) + "/../../configs/" + name);
  EXPECT_TRUE(f.good()) << name;
  return json::parse(f);
}

// ---- numpy.random.default_rng(seed).integers(0, high, size=n, dtype=int64) ----------------

TEST(ConfigNumpy, EngramLayerOneDrawsMatchSpec) {
  const uint64_t b = 46539438283891ull;  // (INT64_MAX // 99092) // 2
  EXPECT_EQ(numpy_default_rng_integers(10007, b, 4),
            (std::vector<uint64_t>{38316048023122ull, 2419938046656ull, 17979836159674ull, 36993668729195ull}));
}

TEST(ConfigNumpy, EngramLayerFourteenDraws) {
  // First and last from the spec; the middle two from NumPy 1.24.
  EXPECT_EQ(numpy_default_rng_integers(10007 * 14, 46539438283891ull, 4),
            (std::vector<uint64_t>{33858405369630ull, 25755403400457ull, 15460673601360ull, 41309613242795ull}));
}

TEST(ConfigNumpy, OtherRangesAndSeeds) {
  // 32-bit Lemire path (range below 2^32).
  EXPECT_EQ(numpy_default_rng_integers(7, 1000, 5), (std::vector<uint64_t>{944, 625, 684, 897, 578}));
  // Range exactly 2^32: raw 32-bit draws; seed 0 hashes the single entropy word 0.
  EXPECT_EQ(numpy_default_rng_integers(0, 1ull << 32, 4),
            (std::vector<uint64_t>{3653403231ull, 2735729615ull, 2195314465ull, 1158725112ull}));
  // Two-word entropy, 64-bit path.
  EXPECT_EQ(numpy_default_rng_integers((1ull << 40) + 3, 12345678901ull, 3),
            (std::vector<uint64_t>{9551309606ull, 12294535447ull, 5841714942ull}));
  // The full int64 range.
  EXPECT_EQ(numpy_default_rng_integers(123456789, 1ull << 63, 3),
            (std::vector<uint64_t>{255604904563013790ull, 8362831937566009190ull, 8129420665881559388ull}));
  EXPECT_EQ(numpy_default_rng_integers(UINT64_MAX, 3, 6), (std::vector<uint64_t>{1, 2, 2, 2, 1, 0}));
  EXPECT_EQ(numpy_default_rng_integers(5, 1, 3), (std::vector<uint64_t>{0, 0, 0}));
  EXPECT_THROW(numpy_default_rng_integers(5, 0, 3), Error);
}

// ---- published preset ------------------------------------------------------------------------

TEST(ConfigPublished, HyperparametersOfSpecSection1) {
  const ModelConfig c = published_config();
  EXPECT_EQ(c.num_hidden_layers, 40u);
  EXPECT_EQ(c.hidden_size, 5120u);
  EXPECT_EQ(c.vocab_size, 129280u);
  EXPECT_EQ(c.num_attention_heads, 64u);
  EXPECT_EQ(c.head_dim, 512u);
  EXPECT_EQ(c.qk_rope_head_dim, 64u);
  EXPECT_EQ(c.q_lora_rank, 1280u);
  EXPECT_EQ(c.o_lora_rank, 1024u);
  EXPECT_EQ(c.o_groups, 8u);
  EXPECT_EQ(c.moe_intermediate_size, 2304u);
  EXPECT_EQ(c.n_routed_experts, 384u);
  EXPECT_EQ(c.num_experts_per_tok, 6u);
  EXPECT_EQ(c.rms_norm_eps, 1e-20f);
  EXPECT_EQ(c.sliding_window, 128u);
  std::vector<uint32_t> ratios(40, 1);
  ratios[0] = ratios[1] = 0;
  for (int l = 2; l < 20; ++l) ratios[l] = 2;
  EXPECT_EQ(c.compress_ratios, ratios);
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<uint32_t>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layer_ids, (std::vector<uint32_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer_id, 20u);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<uint32_t>{1, 14}));
  EXPECT_EQ(c.engram_orders(), 3u);
  EXPECT_EQ(c.engram_columns(), 24u);
  EXPECT_EQ(c.engram_row_bytes(), 264u);
}

TEST(ConfigPublished, EngramPrimesAndRows) {
  const ModelConfig c = published_config();
  // Spec 4.3 lists all 48.
  const std::vector<uint64_t> primes = {
      16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183, 16000189, 16000207, 16000211, 16000253,
      16000277, 16000289, 16000307, 16000321, 16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463,
      16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627, 16000667, 16000669, 16000693, 16000697,
      16000711, 16000729, 16000759, 16000769, 16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
  EXPECT_EQ(c.engram_primes, primes);
  EXPECT_EQ(c.engram_rows(0), 384006168u);
  EXPECT_EQ(c.engram_rows(1), 384016682u);
  EXPECT_THROW(c.engram_rows(2), Error);
}

TEST(ConfigPublished, EngramMultipliers) {
  const ModelConfig c = published_config();
  const std::vector<uint64_t> draws = {38316048023122ull, 2419938046656ull, 17979836159674ull, 36993668729195ull,
                                       33858405369630ull, 25755403400457ull, 15460673601360ull, 41309613242795ull};
  ASSERT_EQ(c.engram_multipliers.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(c.engram_multipliers[i], draws[i] * 2 + 1) << i;
}

TEST(ConfigPublished, SyntheticTokenMap) {
  const ModelConfig c = published_config();
  ASSERT_EQ(c.engram_token_map.size(), 129280u);
  std::vector<bool> seen(99092, false);
  for (uint32_t id = 0; id < 129280; ++id) {
    ASSERT_LT(c.engram_token_map[id], 99092u);
    if (id < 99092) {
      ASSERT_EQ(c.engram_token_map[id], id);
    }
    seen[c.engram_token_map[id]] = true;
  }
  for (bool s : seen) ASSERT_TRUE(s);
  EXPECT_EQ(c.engram_pad_compressed(), 2u);
  EXPECT_EQ(synthetic_engram_token_map(129280, 99092), c.engram_token_map);
}

// The table of spec section 1 ("Derived per-layer roles"), transcribed row by row.
TEST(ConfigPublished, RolesMatchSpecTable) {
  const auto roles = layer_roles(published_config());
  ASSERT_EQ(roles.size(), 40u);
  struct Row {
    int first, last;
    uint32_t ratio;
    int kv, topk;  // -1 = none; -2 = own layer
  };
  const Row table[] = {{0, 1, 0, -1, -1},  {2, 2, 2, -2, -2},   {3, 7, 2, 2, 2},     {8, 8, 2, -2, -2},
                       {9, 13, 2, 8, 8},   {14, 14, 2, -2, -2}, {15, 19, 2, 14, 14}, {20, 20, 1, -2, -2},
                       {21, 23, 1, 20, 20}, {24, 24, 1, 20, -2}, {25, 27, 1, 20, 24}, {28, 28, 1, 20, -2},
                       {29, 31, 1, 20, 28}, {32, 32, 1, 20, -2}, {33, 35, 1, 20, 32}, {36, 36, 1, 20, -2},
                       {37, 39, 1, 20, 36}};
  int covered = 0;
  for (const Row& r : table)
    for (int l = r.first; l <= r.last; ++l, ++covered) {
      EXPECT_EQ(roles[l].ratio, r.ratio) << l;
      EXPECT_EQ(roles[l].kv_source, r.kv == -2 ? l : r.kv) << l;
      EXPECT_EQ(roles[l].topk_source, r.topk == -2 ? l : r.topk) << l;
      EXPECT_EQ(roles[l].is_kv_source, l == 2 || l == 8 || l == 14 || l == 20) << l;
      EXPECT_EQ(roles[l].is_index_source, r.topk == -2) << l;
      EXPECT_EQ(roles[l].is_candidate_source, l == 20) << l;
      EXPECT_EQ(roles[l].is_candidate_consumer, l == 24 || l == 28 || l == 32 || l == 36) << l;
      EXPECT_EQ(roles[l].engram_index, l == 1 ? 0 : l == 14 ? 1 : -1) << l;
    }
  EXPECT_EQ(covered, 40);
}

// ---- tiny presets ----------------------------------------------------------------------------

// Every role of the V4.1 layer plan, as a predicate over (config, roles, layer).
void expect_every_role(const ModelConfig& c, const std::string& what) {
  const auto roles = layer_roles(c);
  using Pred = std::function<bool(uint32_t)>;
  auto R = [&](uint32_t l) -> const LayerRole& { return roles[l]; };
  const std::vector<std::pair<std::string, Pred>> want = {
      {"window-only layer", [&](uint32_t l) { return R(l).ratio == 0 && R(l).kv_source < 0 && R(l).topk_source < 0; }},
      {"ratio-2 KV + index source", [&](uint32_t l) { return R(l).ratio == 2 && R(l).is_kv_source && R(l).is_index_source; }},
      {"ratio-2 reuse", [&](uint32_t l) { return R(l).ratio == 2 && !R(l).is_kv_source && !R(l).is_index_source && R(l).kv_source >= 0; }},
      {"ratio-1 KV source = candidate source",
       [&](uint32_t l) { return R(l).ratio == 1 && R(l).is_kv_source && R(l).is_index_source && R(l).is_candidate_source; }},
      {"ratio-1 reuse of the candidate source",
       [&](uint32_t l) { return R(l).ratio == 1 && !R(l).is_index_source && R(l).topk_source == (int)c.candidate_source_layer_id; }},
      {"candidate consumer (re-index)",
       [&](uint32_t l) { return R(l).is_candidate_consumer && !R(l).is_kv_source && R(l).topk_source == (int)l; }},
      {"reuse after a re-index",
       [&](uint32_t l) { return !R(l).is_index_source && R(l).topk_source >= 0 && R(R(l).topk_source).is_candidate_consumer; }},
      {"Engram before a KV source", [&](uint32_t l) { return R(l).engram_index >= 0 && R(l).is_kv_source; }},
      {"Engram before a window-only or reuse layer", [&](uint32_t l) { return R(l).engram_index >= 0 && !R(l).is_kv_source; }},
  };
  for (const auto& [name, pred] : want) {
    bool found = false;
    for (uint32_t l = 0; l < c.num_hidden_layers; ++l) found |= pred(l);
    EXPECT_TRUE(found) << what << " lacks a " << name;
  }
  EXPECT_GE(c.engram_layer_ids.size(), 2u) << what;
}

TEST(ConfigTiny, EveryRolePresent) { expect_every_role(tiny_config(), "tiny"); }

TEST(ConfigTiny, RolesByLayer) {
  const auto r = layer_roles(tiny_config());
  ASSERT_EQ(r.size(), 8u);
  const int kv[] = {-1, -1, 2, 2, 4, 4, 4, 4};
  const int topk[] = {-1, -1, 2, 2, 4, 4, 6, 6};
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(r[l].kv_source, kv[l]) << l;
    EXPECT_EQ(r[l].topk_source, topk[l]) << l;
    EXPECT_EQ(r[l].is_candidate_consumer, l == 6) << l;
    EXPECT_EQ(r[l].engram_index, l == 1 ? 0 : l == 4 ? 1 : -1) << l;
  }
}

TEST(ConfigTiny, DimsSuitQuantizedKernels) {
  const ModelConfig c = tiny_config();
  EXPECT_EQ(c.hidden_size % 256, 0u);
  EXPECT_EQ(c.moe_intermediate_size % 256, 0u);
  EXPECT_GE(c.index_head_dim, c.qk_rope_head_dim);
  EXPECT_LT(c.index_topk, 64u);  // the sparse selection must actually select in short tests
  EXPECT_LE(c.engram_compressed_vocab_size, c.vocab_size);
  EXPECT_LT(c.rope_scaling.original_max_position_embeddings, c.max_position_embeddings);
}

TEST(ConfigTiny, EngramTablesFromNumpyAndPrimes) {
  const ModelConfig c = tiny_config();
  // The first 12 primes above 1999.
  EXPECT_EQ(c.engram_primes, (std::vector<uint64_t>{2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063, 2069, 2081, 2083, 2087}));
  EXPECT_EQ(c.engram_rows(0), 12126u);
  EXPECT_EQ(c.engram_rows(1), 12436u);
  // numpy.random.default_rng(10007 * L).integers(0, (INT64_MAX // 384) // 2, 4) * 2 + 1, L = 1, 4.
  EXPECT_EQ(c.engram_multipliers,
            (std::vector<uint64_t>{19775072034933939ull, 1248940108954747ull, 9279468357992093ull, 19092586571424545ull,
                                   21227420795207501ull, 1300012726952735ull, 19006427355547079ull, 4891341875574655ull}));
  EXPECT_EQ(c.engram_pad_compressed(), 2u);
}

TEST(ConfigTiny, FileEqualsPreset) { EXPECT_EQ(config_from_json(load_config_file("tiny.json")), tiny_config()); }

TEST(ConfigTinyAlt, ValidWithEveryRoleAndOwnTables) {
  const ModelConfig c = config_from_json(load_config_file("tiny-alt.json"));
  expect_every_role(c, "tiny-alt");
  EXPECT_EQ(c.num_hidden_layers, 10u);
  EXPECT_EQ(c.num_experts_per_tok, 2u);
  EXPECT_EQ(c.engram_orders(), 2u);
  EXPECT_EQ(c.engram_layer_ids.size(), 3u);
  EXPECT_EQ(c.types.routed_gate_up, GgmlType::IQ2_XS);
  EXPECT_EQ(c.types.routed_down, GgmlType::Q3_K);
  EXPECT_EQ(c.types.output, GgmlType::Q6_K);
  EXPECT_EQ(c.types.attn, GgmlType::Q8_0);  // not in the file: the published default
  // Primes continue across three layers: the first 18 above 999.
  EXPECT_EQ(c.engram_primes, (std::vector<uint64_t>{1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069,
                                                    1087, 1091, 1093, 1097, 1103, 1109}));
  // NumPy, C = 300, layers 0, 5, 8, max_ngram 3.
  EXPECT_EQ(c.engram_multipliers,
            (std::vector<uint64_t>{19583115384628457ull, 8294477438815419ull, 1259713516414993ull, 12023708753102701ull,
                                   10223288576125669ull, 6727215894138331ull, 28003718177158255ull, 18302966225333387ull,
                                   14478408260533065ull}));
  // vocab == C: the synthetic map is the identity.
  for (uint32_t i = 0; i < c.vocab_size; ++i) ASSERT_EQ(c.engram_token_map[i], i);
}

TEST(ConfigPublishedFile, MatchesPresetAfterTruncation) {
  const json j = load_config_file("published.json");
  EXPECT_EQ(j.at("compress_ratios").size(), 43u);  // the DSpark blocks are listed too
  EXPECT_EQ(config_from_json(j), published_config());
}

// ---- JSON in/out -----------------------------------------------------------------------------

TEST(ConfigJson, RoundTripPresets) {
  for (const ModelConfig& c : {published_config(), tiny_config(), config_from_json(load_config_file("tiny-alt.json"))}) {
    const json j = config_to_json(c);
    EXPECT_FALSE(j.contains("engram_token_map"));  // derivable tables are not written
    EXPECT_FALSE(j.contains("engram_primes"));
    EXPECT_EQ(config_from_json(j), c);
    EXPECT_EQ(config_from_json(json::parse(j.dump())), c);
  }
}

TEST(ConfigJson, CompactSortedDump) {
  const std::string s = config_to_json(tiny_config()).dump();
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_LT(s.find("\"bos_token_id\""), s.find("\"candidate_block_size\""));
  EXPECT_LT(s.find("\"vocab_size\""), std::string::npos);
  EXPECT_NE(s.find("\"rms_norm_eps\":1e-20"), std::string::npos);  // shortest float form
}

TEST(ConfigJson, ExplicitTablesRoundTrip) {
  ModelConfig c = tiny_config();
  for (uint32_t i = 0; i < c.vocab_size; ++i) c.engram_token_map[i] = (c.vocab_size - 1 - i) % c.engram_compressed_vocab_size;
  c.engram_primes[3] = 2141;
  c.engram_multipliers[5] = 12345;
  finalize(c);
  const json j = config_to_json(c);
  ASSERT_TRUE(j.contains("engram_token_map"));
  ASSERT_TRUE(j.contains("engram_primes"));
  ASSERT_TRUE(j.contains("engram_multipliers"));
  EXPECT_EQ(j["engram_num_embeddings"][0].get<uint64_t>(), 12126u - 2027u + 2141u);
  EXPECT_EQ(config_from_json(j), c);
  EXPECT_EQ(config_from_json(j).engram_pad_compressed(), (c.vocab_size - 3) % c.engram_compressed_vocab_size);
  // Without the tables the rows stated by engram_num_embeddings no longer match the derived
  // primes, which is an error; without both, the derived tables come back.
  json no_tables = config_to_json(c, false);
  EXPECT_THROW(config_from_json(no_tables), Error);
  no_tables.erase("engram_num_embeddings");
  EXPECT_EQ(config_from_json(no_tables).engram_primes, tiny_config().engram_primes);
}

TEST(ConfigJson, MissingKeysArePublishedValues) { EXPECT_EQ(config_from_json(json::object()), published_config()); }

TEST(ConfigJson, TextConfigNestingAndUnknownKeys) {
  json inner = config_to_json(tiny_config());
  inner["some_future_key"] = {{"a", 1}};
  json outer = {{"architectures", {"DeepseekV41ForCausalLM"}}, {"vision_config", {{"hidden_size", 1152}}}, {"text_config", inner}};
  EXPECT_EQ(config_from_json(outer), tiny_config());
}

TEST(ConfigJson, TensorTypesExtension) {
  json j = config_to_json(tiny_config());
  j["sluice_tensor_types"] = {{"routed_gate_up", "Q4_K"}, {"routed_down", "Q6_K"}, {"attn", "Q8_0"}};
  const ModelConfig c = config_from_json(j);
  EXPECT_EQ(c.types.routed_gate_up, GgmlType::Q4_K);
  EXPECT_EQ(c.types.routed_down, GgmlType::Q6_K);
  const json back = config_to_json(c);
  EXPECT_EQ(back["sluice_tensor_types"], (json{{"routed_gate_up", "Q4_K"}, {"routed_down", "Q6_K"}}));
  EXPECT_EQ(config_from_json(back), c);
}

void expect_error_naming(const json& j, const std::string& key) {
  try {
    config_from_json(j);
    ADD_FAILURE() << "accepted a config with a bad " << key;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << "message: " << e.what();
  }
}

TEST(ConfigJson, BadValuesNameTheKey) {
  const json base = config_to_json(tiny_config());
  auto with = [&](const char* k, json v) {
    json j = base;
    j[k] = std::move(v);
    return j;
  };
  expect_error_naming(with("hidden_size", "wide"), "hidden_size");
  expect_error_naming(with("hidden_size", -256), "hidden_size");
  expect_error_naming(with("head_dim", 64.5), "head_dim");
  expect_error_naming(with("num_hidden_layers", 1ull << 33), "num_hidden_layers");
  expect_error_naming(with("kv_source_layer_ids", "2,4"), "kv_source_layer_ids");
  expect_error_naming(with("norm_topk_prob", 1), "norm_topk_prob");
  expect_error_naming(with("scoring_func", 3), "scoring_func");
  expect_error_naming(with("rope_scaling", {{"type", "linear"}}), "rope_scaling.type");
  expect_error_naming(with("sluice_tensor_types", {{"routed_gate_up", "Q9_Z"}}), "sluice_tensor_types.routed_gate_up");
  expect_error_naming(with("sluice_tensor_types", {{"experts", "Q4_K"}}), "sluice_tensor_types.experts");
  expect_error_naming(with("engram_num_embeddings", {12126, 12437}), "engram_num_embeddings");
}

// ---- finalize() validation -------------------------------------------------------------------

void expect_invalid(const std::function<void(ModelConfig&)>& edit, const std::string& key) {
  ModelConfig c = tiny_config();
  c.engram_token_map.clear();
  c.engram_primes.clear();
  c.engram_multipliers.clear();
  edit(c);
  try {
    finalize(c);
    ADD_FAILURE() << "finalize accepted a config with a bad " << key;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << "message: " << e.what();
  }
}

TEST(ConfigValidate, RoleLists) {
  expect_invalid([](ModelConfig& c) { c.kv_source_layer_ids = {4, 2}; }, "kv_source_layer_ids");
  expect_invalid([](ModelConfig& c) { c.kv_source_layer_ids = {2, 2, 4}; }, "kv_source_layer_ids");
  expect_invalid([](ModelConfig& c) { c.index_source_layer_ids = {2, 4, 6, 8}; }, "index_source_layer_ids");
  expect_invalid([](ModelConfig& c) { c.engram_layer_ids = {1, 9}; }, "engram_layer_ids");
  expect_invalid([](ModelConfig& c) { c.kv_source_layer_ids = {1, 2, 4}; }, "kv_source_layer_ids");       // ratio 0 source
  expect_invalid([](ModelConfig& c) { c.kv_source_layer_ids = {4}; }, "kv_source_layer_ids");             // layer 2 has none
  expect_invalid([](ModelConfig& c) { c.index_source_layer_ids = {1, 2, 4, 6}; }, "index_source_layer_ids");  // ratio 0
  expect_invalid([](ModelConfig& c) { c.index_source_layer_ids = {2, 6}; }, "index_source_layer_ids");   // 4 selects via 2
  expect_invalid([](ModelConfig& c) { c.candidate_source_layer_id = 5; }, "candidate_source_layer_id");
  expect_invalid([](ModelConfig& c) { c.candidate_source_layer_id = 2; }, "kv_source_layer_ids");       // 4, 6 read another KV
  expect_invalid([](ModelConfig& c) { c.compress_ratios = {0, 0, 2, 2, 1, 1, 1}; }, "compress_ratios");
  expect_invalid([](ModelConfig& c) { c.compress_ratios[3] = 3; }, "compress_ratios");
  expect_invalid([](ModelConfig& c) { c.compress_ratios[3] = 1; }, "compress_ratios");  // ratio differs from its source
}

TEST(ConfigValidate, Dimensions) {
  expect_invalid([](ModelConfig& c) { c.head_dim = 8; }, "head_dim");
  expect_invalid([](ModelConfig& c) { c.qk_rope_head_dim = 15; }, "qk_rope_head_dim");
  expect_invalid([](ModelConfig& c) { c.index_head_dim = 8; }, "index_head_dim");
  expect_invalid([](ModelConfig& c) { c.o_groups = 3; }, "o_groups");
  expect_invalid([](ModelConfig& c) { c.num_key_value_heads = 2; }, "num_key_value_heads");
  expect_invalid([](ModelConfig& c) { c.num_experts_per_tok = 17; }, "num_experts_per_tok");
  expect_invalid([](ModelConfig& c) { c.n_shared_experts = 0; }, "n_shared_experts");
  expect_invalid([](ModelConfig& c) { c.hidden_size = 0; }, "hidden_size");
  expect_invalid([](ModelConfig& c) { c.rope_theta = 10000.5; }, "rope_theta");
  expect_invalid([](ModelConfig& c) { c.rms_norm_eps = 0; }, "rms_norm_eps");
  expect_invalid([](ModelConfig& c) { c.hidden_act = "gelu"; }, "hidden_act");
  expect_invalid([](ModelConfig& c) { c.eos_token_id = 512; }, "eos_token_id");
}

TEST(ConfigValidate, TypesMustFitRows) {
  expect_invalid([](ModelConfig& c) { c.hidden_size = 224; }, "sluice_tensor_types.routed_gate_up");  // IQ2_XXS: 256-blocks
  expect_invalid([](ModelConfig& c) { c.moe_intermediate_size = 128; }, "sluice_tensor_types.routed_down");  // Q2_K
  expect_invalid([](ModelConfig& c) { c.q_lora_rank = 48; }, "sluice_tensor_types.attn");  // attn_q_b rows, Q8_0
  expect_invalid([](ModelConfig& c) { c.types.output = GgmlType::ENGRAM_ROW; }, "sluice_tensor_types.output");
  // A dim that fits its type passes.
  ModelConfig ok = tiny_config();
  ok.types.routed_gate_up = GgmlType::Q8_0;
  ok.hidden_size = 288;
  ok.types.token_embd = GgmlType::F16;
  ok.types.routed_down = GgmlType::Q2_K;
  ok.types.shared_expert = GgmlType::Q8_0;
  ok.engram_token_map.clear();
  ok.engram_primes.clear();
  ok.engram_multipliers.clear();
  EXPECT_NO_THROW(finalize(ok));
}

TEST(ConfigValidate, EngramTables) {
  expect_invalid([](ModelConfig& c) { c.engram_head_dim = 48; }, "engram_head_dim");
  expect_invalid([](ModelConfig& c) { c.engram_max_ngram_size = 1; }, "engram_max_ngram_size");
  expect_invalid([](ModelConfig& c) { c.engram_compressed_vocab_size = 513; }, "engram_compressed_vocab_size");
  expect_invalid([](ModelConfig& c) { c.engram_token_map.assign(511, 0); }, "engram_token_map");
  expect_invalid([](ModelConfig& c) { c.engram_token_map.assign(512, 384); }, "engram_token_map");
  expect_invalid([](ModelConfig& c) { c.engram_primes.assign(11, 2003); }, "engram_primes");
  expect_invalid([](ModelConfig& c) { c.engram_primes.assign(12, 1); }, "engram_primes");
  expect_invalid([](ModelConfig& c) { c.engram_multipliers.assign(8, 4); }, "engram_multipliers");
  expect_invalid([](ModelConfig& c) { c.engram_multipliers.assign(7, 5); }, "engram_multipliers");
  expect_invalid([](ModelConfig& c) { c.engram_multipliers.assign(8, (1ull << 62) + 1); }, "engram_multipliers");
}

TEST(ConfigValidate, FinalizeIsIdempotent) {
  ModelConfig c = tiny_config();
  finalize(c);
  EXPECT_EQ(c, tiny_config());
  ModelConfig p = published_config();
  finalize(p);
  EXPECT_EQ(p, published_config());
}

TEST(ConfigTypes, FieldsByName) {
  TensorTypes t;
  EXPECT_EQ(tensor_type_fields().size(), 8u);
  for (const auto& f : tensor_type_fields()) tensor_type_field(t, f) = GgmlType::Q6_K;
  EXPECT_EQ(t.router, GgmlType::Q6_K);
  EXPECT_EQ(t.token_embd, GgmlType::Q6_K);
  EXPECT_THROW(tensor_type_field(t, "nope"), Error);
}

}  // namespace
}  // namespace sluice
