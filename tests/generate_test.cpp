// The model generator and the tokenizer metadata (src/model/generate.*, src/model/vocab.*).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "kernels/types.h"
#include "model/deepseek41/config.h"
#include "synth/generate.h"
#include "model/deepseek41/schema.h"
#include "synth/vocab.h"
#include "util/error.h"

#include "test_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using sluice::test::TempDir;

namespace {

constexpr const char* kTmpPrefix = "sluice_generate_test";

std::string real_vocab_path() { return std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf"; }

const TensorSpec& spec_named(const std::vector<TensorSpec>& specs, const std::string& name) {
  for (const auto& t : specs)
    if (t.name == name) return t;
  throw Error("no spec " + name);
}

// Decoded values of the first `rows` rows of t as generated with `seed`.
std::vector<float> decoded_rows(const ModelConfig& c, const TensorSpec& t, uint64_t seed, uint64_t rows) {
  const uint64_t rb = tensor_row_bytes(t);
  std::vector<uint8_t> raw(rows * rb);
  generate_rows(c, t, seed, 0, rows, raw.data());
  GgmlType decode = t.type;
  uint64_t per_row = t.ne[0];
  if (t.cls == ByteClass::Engram) {
    decode = GgmlType::ENGRAM_ROW;
    per_row = c.engram_head_dim;
  }
  std::vector<float> out(rows * per_row);
  const TypeTraits& tr = type_traits(decode);
  for (uint64_t r = 0; r < rows; ++r) tr.dequant(raw.data() + r * rb, out.data() + r * per_row, (int64_t)per_row);
  return out;
}

double mean(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s / (double)v.size();
}
double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += (double)x * x;
  return std::sqrt(s / (double)v.size());
}

}  // namespace

TEST(GenerateVocab, ByteTokensFollowGpt2Mapping) {
  // A few fixed points of GPT-2's bytes_to_unicode.
  EXPECT_EQ(gpt2_byte_token('!'), "!");
  EXPECT_EQ(gpt2_byte_token('a'), "a");
  EXPECT_EQ(gpt2_byte_token(' '), "Ġ");   // U+0120
  EXPECT_EQ(gpt2_byte_token('\n'), "Ċ");  // U+010A
  EXPECT_EQ(gpt2_byte_token(0x00), "Ā");  // U+0100
  EXPECT_EQ(gpt2_byte_token(0xAD), "Ń");  // U+0143: the last non-printable byte
  EXPECT_EQ(gpt2_byte_token(0xFF), "ÿ");
  const auto toks = gpt2_byte_tokens();
  ASSERT_EQ(toks.size(), 256u);
  EXPECT_EQ(std::set<std::string>(toks.begin(), toks.end()).size(), 256u);
}

TEST(GenerateVocab, ByteTokensMatchDeepSeekVocabulary) {
  const Vocab real = load_vocab_gguf(real_vocab_path());
  const auto toks = gpt2_byte_tokens();
  ASSERT_GE(real.tokens.size(), 259u);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(real.tokens[3 + i], toks[i]) << "byte token " << i;
}

TEST(GenerateVocab, LoadsDeepSeekVocabulary) {
  const Vocab v = load_vocab_gguf(real_vocab_path());
  EXPECT_EQ(v.tokens.size(), 129280u);
  EXPECT_EQ(v.token_type.size(), 129280u);
  EXPECT_EQ(v.merges.size(), 127741u);
  EXPECT_EQ(v.tokens[0], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(v.tokens[1], "<｜end▁of▁sentence｜>");
  EXPECT_EQ(v.token_type[0], 3);
  EXPECT_EQ(v.merges[0], "Ġ t");
}

TEST(GenerateVocab, LoadRejectsMissingFileAndKeys) {
  EXPECT_THROW(load_vocab_gguf("/nonexistent/vocab.gguf"), Error);
  TempDir tmp(kTmpPrefix);
  const std::string p = (tmp.path / "novocab.gguf").string();
  gguf::Writer w;
  w.add("general.architecture", gguf::Value::str("x"));
  w.write(p, [](const gguf::TensorInfo&, const gguf::Writer::Sink&) {});
  try {
    load_vocab_gguf(p);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.tokens"), std::string::npos) << e.what();
  }
}

TEST(GenerateVocab, SyntheticLayout) {
  const Vocab v = synthetic_vocab(512);
  ASSERT_EQ(v.tokens.size(), 512u);
  ASSERT_EQ(v.token_type.size(), 512u);
  EXPECT_EQ(v.tokens[0], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(v.tokens[1], "<｜end▁of▁sentence｜>");
  EXPECT_EQ(v.tokens[2], "<｜▁pad▁｜>");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v.token_type[i], 3);
  EXPECT_EQ(v.tokens[3], "!");
  EXPECT_EQ(v.tokens[3 + 255], gpt2_byte_token(0xAD));
  for (int i = 3; i < 259; ++i) EXPECT_EQ(v.token_type[i], 1);
  const std::vector<std::string> control = {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"};
  for (size_t i = 0; i < control.size(); ++i) {
    EXPECT_EQ(v.tokens[259 + i], control[i]);
    EXPECT_EQ(v.token_type[259 + i], 3);
  }
  EXPECT_EQ(v.tokens.back(), "<｜place▁holder▁no▁" + std::to_string(511 - 264 - v.merges.size()) + "｜>");
  EXPECT_EQ(v.token_type.back(), 3);
  EXPECT_EQ(std::set<std::string>(v.tokens.begin(), v.tokens.end()).size(), v.tokens.size())
      << "token strings must be unique";
  // Every merge joins two present tokens into a present token.
  ASSERT_FALSE(v.merges.empty());
  const std::set<std::string> have(v.tokens.begin(), v.tokens.end());
  for (const auto& m : v.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    const std::string l = m.substr(0, sp), r = m.substr(sp + 1);
    EXPECT_TRUE(have.count(l)) << m;
    EXPECT_TRUE(have.count(r)) << m;
    EXPECT_TRUE(have.count(l + r)) << m;
  }
}

TEST(GenerateVocab, SyntheticSizes) {
  EXPECT_THROW(synthetic_vocab(kSyntheticVocabMin - 1), Error);
  const Vocab smallest = synthetic_vocab(kSyntheticVocabMin);
  EXPECT_EQ(smallest.tokens.size(), kSyntheticVocabMin);
  EXPECT_TRUE(smallest.merges.empty());
  const Vocab some = synthetic_vocab(kSyntheticVocabMin + 3);
  EXPECT_EQ(some.merges.size(), 3u);
  EXPECT_EQ(synthetic_vocab(129280).tokens.size(), 129280u);
}

TEST(GenerateInit, RulesByTensorRole) {
  const ModelConfig c = tiny_config();
  const auto specs = deepseek41_tensors(c);
  const InitRule norm = init_rule(spec_named(specs, "blk.0.attn_norm.weight"));
  EXPECT_EQ(norm.kind, InitKind::Uniform);
  EXPECT_FLOAT_EQ(norm.center, 1.0f);
  const InitRule q_a = init_rule(spec_named(specs, "blk.0.attn_q_a.weight"));
  EXPECT_EQ(q_a.kind, InitKind::Blocks);
  EXPECT_FLOAT_EQ(q_a.scale, 1.0f / std::sqrt((float)c.hidden_size));
  EXPECT_FLOAT_EQ(init_rule(spec_named(specs, "token_embd.weight")).scale, 1.0f);
  EXPECT_FLOAT_EQ(init_rule(spec_named(specs, "blk.0.attn_sinks.weight")).center, 0.0f);
  EXPECT_LT(init_rule(spec_named(specs, "blk.0.attn_sinks.weight")).scale, 0.1f);
  EXPECT_LT(init_rule(spec_named(specs, "blk.0.hc_attn_fn.weight")).scale, q_a.scale);
  for (const auto& t : specs) {
    if (t.cls == ByteClass::Engram) {
      EXPECT_EQ(init_rule(t).kind, InitKind::EngramRows) << t.name;
    }
  }
}

TEST(GenerateRows, DeterministicAndChunkIndependent) {
  const ModelConfig c = tiny_config();
  const auto specs = deepseek41_tensors(c);
  for (const char* name : {"blk.0.ffn_gate_exps.weight", "blk.0.attn_norm.weight", "token_embd.weight"}) {
    const TensorSpec& t = spec_named(specs, name);
    const uint64_t rb = tensor_row_bytes(t), rows = std::min<uint64_t>(tensor_rows(t), 12);
    std::vector<uint8_t> whole(rows * rb), split(rows * rb), again(rows * rb), other(rows * rb);
    generate_rows(c, t, 7, 0, rows, whole.data());
    generate_rows(c, t, 7, 0, rows / 2, split.data());
    generate_rows(c, t, 7, rows / 2, rows - rows / 2, split.data() + rows / 2 * rb);
    generate_rows(c, t, 7, 0, rows, again.data());
    generate_rows(c, t, 8, 0, rows, other.data());
    EXPECT_EQ(whole, split) << name;
    EXPECT_EQ(whole, again) << name;
    EXPECT_NE(whole, other) << name;
  }
  EXPECT_NE(tensor_seed(1, "a"), tensor_seed(1, "b"));
  EXPECT_NE(tensor_seed(1, "a"), tensor_seed(2, "a"));
}

TEST(GenerateRows, EveryTensorDecodesFiniteWithSensibleMagnitude) {
  const ModelConfig c = tiny_config();
  for (const auto& t : deepseek41_tensors(c)) {
    const InitRule rule = init_rule(t);
    const std::vector<float> v = decoded_rows(c, t, 3, std::min<uint64_t>(tensor_rows(t), 8));
    ASSERT_FALSE(v.empty()) << t.name;
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << t.name;
    if (rule.kind == InitKind::Uniform && rule.center == 1.0f) {
      EXPECT_NEAR(mean(v), 1.0, 0.05) << t.name;
      for (float x : v) EXPECT_GT(x, 0.5f) << t.name;
    } else {
      // Within a small factor of the intended rms (quantizers may round small values away).
      const double r = rms(v);
      EXPECT_GT(r, rule.scale * 0.25) << t.name;
      EXPECT_LT(r, rule.scale * 4.0 + 1e-6) << t.name;
    }
  }
}

TEST(GenerateModel, VocabularySizeMustMatch) {
  const ModelConfig c = tiny_config();
  try {
    model_writer(c, synthetic_vocab(c.vocab_size + 1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}

// The published preset with DeepSeek's vocabulary reproduces the published file's size, which
// pins the metadata region (356 x 16 KiB) and the tensor layout.
TEST(GenerateModel, PublishedLayoutHasThePublishedSize) {
  ModelConfig c = published_config();
  finalize(c);
  const gguf::Writer w = model_writer(c, load_vocab_gguf(real_vocab_path()));
  EXPECT_EQ(w.tensors().size(), 1046u);
  EXPECT_EQ(w.data_offset(), 356ull * 16384);
  EXPECT_EQ(w.file_size(), 365713686528ull);
  EXPECT_EQ(w.file_size() - w.data_offset(), 365707853824ull);
}

TEST(GenerateModel, TinyFileMatchesSchema) {
  TempDir tmp(kTmpPrefix);
  const std::string p = (tmp.path / "tiny.gguf").string();
  const ModelConfig c = tiny_config();
  const GenerateResult r = generate_model(c, synthetic_vocab(c.vocab_size), p, GenerateOptions{5, false});
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(fs::file_size(p), r.file_bytes);
  const gguf::File f = gguf::File::open(p);
  EXPECT_EQ(f.file_size(), r.file_bytes);
  EXPECT_EQ(f.alignment(), 16384u);
  EXPECT_EQ(f.data_offset() % 16384, 0u);
  const SchemaReport rep = validate_deepseek41(f);
  EXPECT_TRUE(rep.errors.empty()) << (rep.errors.empty() ? "" : rep.errors.front());

  const auto specs = deepseek41_tensors(c);
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.type, specs[i].type);
    EXPECT_EQ(t.file_offset % 16384, 0u) << t.name;
    // The payload on disk is what generate_rows makes for this seed.
    const uint64_t rb = tensor_row_bytes(specs[i]);
    std::vector<uint8_t> disk(rb), want(rb);
    f.read_bytes(t, 0, disk.data(), rb);
    generate_rows(c, specs[i], 5, 0, 1, want.data());
    EXPECT_EQ(disk, want) << t.name;
  }
  EXPECT_NE(f.tensors().back().name.find("engram_embd"), std::string::npos);

  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "joyai-llm");
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").array_size(), c.vocab_size);
  EXPECT_EQ(f.get("tokenizer.ggml.token_type").elem, gguf::ValueType::I32);
  EXPECT_EQ(f.get("tokenizer.ggml.bos_token_id").type, gguf::ValueType::U32);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 1u);
  EXPECT_EQ(f.get("tokenizer.ggml.add_bos_token").type, gguf::ValueType::BOOL);
  EXPECT_EQ(f.get("tokenizer.ggml.add_bos_token").u, 1u);
  EXPECT_EQ(f.get("tokenizer.ggml.add_eos_token").u, 0u);
  EXPECT_EQ(f.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(f.find("tokenizer.ggml.padding_token_id"), nullptr);
}

TEST(GenerateModel, SparseWritesHolesWithTheSameHeader) {
  TempDir tmp(kTmpPrefix);
  const ModelConfig c = tiny_config();
  const Vocab v = synthetic_vocab(c.vocab_size);
  const std::string dense = (tmp.path / "dense.gguf").string(), sparse = (tmp.path / "sparse.gguf").string();
  generate_model(c, v, dense, GenerateOptions{1, false});
  const GenerateResult r = generate_model(c, v, sparse, GenerateOptions{1, true});
  ASSERT_EQ(fs::file_size(dense), fs::file_size(sparse));
  std::ifstream a(dense, std::ios::binary), b(sparse, std::ios::binary);
  std::vector<char> da((std::istreambuf_iterator<char>(a)), {}), db((std::istreambuf_iterator<char>(b)), {});
  ASSERT_EQ(da.size(), db.size());
  EXPECT_TRUE(std::equal(da.begin(), da.begin() + (long)r.data_offset, db.begin()));
  bool all_zero = true;
  for (size_t i = r.data_offset; i < db.size(); ++i) all_zero &= db[i] == 0;
  EXPECT_TRUE(all_zero);
}

TEST(GenerateModel, FailedWriteLeavesNoFile) {
  TempDir tmp(kTmpPrefix);
  // Q4_0 can be sized but has no random-block generator: the write fails part-way through.
  ModelConfig c = tiny_config();
  c.types.attn = GgmlType::Q4_0;
  const std::string p = (tmp.path / "broken.gguf").string();
  try {
    generate_model(c, synthetic_vocab(c.vocab_size), p, GenerateOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(tmp.path)) << "a failed write must leave nothing behind";
}
