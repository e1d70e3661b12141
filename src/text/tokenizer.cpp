#include "text/tokenizer.h"

#include <algorithm>
#include <limits>

#include "format/gguf.h"
#include "text/pretokenize.h"
#include "text/utf8.h"
#include "util/error.h"

namespace sluice::text {
namespace {

// GPT-2's byte <-> unicode mapping: printable Latin-1 bytes stand for themselves, the other
// 68 bytes are moved, in byte order, to U+0100 and up, so every token is printable text.
bool printable_byte(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteMap {
  uint32_t to_cp[256];
  int16_t to_byte[512];  // code point -> byte, -1 when the code point is not a byte char
  ByteMap() {
    std::fill(std::begin(to_byte), std::end(to_byte), (int16_t)-1);
    uint32_t moved = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      to_cp[b] = printable_byte(b) ? b : 256 + moved++;
      to_byte[to_cp[b]] = (int16_t)b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The raw bytes a byte-level token string stands for. A character outside the byte alphabet
// (not seen in DeepSeek's vocabulary) is kept as its own UTF-8.
std::string unmap_bytes(const std::string& s) {
  const ByteMap& m = byte_map();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t n = decode_utf8(s, i, cp);
    if (n == 0) {  // not UTF-8: keep the byte
      out += s[i++];
      continue;
    }
    if (cp < 512 && m.to_byte[cp] >= 0) out += (char)m.to_byte[cp];
    else out.append(s, i, n);
    i += n;
  }
  return out;
}

uint64_t pair_key(TokenId a, TokenId b) { return ((uint64_t)a << 32) | b; }

bool renders_as_text(TokenType t) {
  return t == TokenType::Normal || t == TokenType::Byte || t == TokenType::UserDefined;
}

// A symbol merged into its left neighbour.
constexpr TokenId kMerged = UINT32_MAX;

struct Sym {
  TokenId id;
  int32_t prev, next;  // positions, -1 at the ends
};
struct Cand {
  uint32_t rank;
  int32_t left;
  TokenId lid, rid, result;
};
// Heap order: lowest rank first, then leftmost.
bool later(const Cand& a, const Cand& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

}  // namespace

Tokenizer::Tokenizer(VocabData v) {
  const size_t n = v.tokens.size();
  if (n == 0) throw Error("vocabulary has no tokens");
  if (n >= (size_t)std::numeric_limits<int32_t>::max())
    throw Error("vocabulary has too many tokens (" + std::to_string(n) + ")");
  if (!v.token_type.empty() && v.token_type.size() != n)
    throw Error("vocabulary has " + std::to_string(n) + " tokens but " +
                std::to_string(v.token_type.size()) + " token types");
  text_ = std::move(v.tokens);
  type_.resize(n, TokenType::Normal);
  bytes_.resize(n);
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!v.token_type.empty()) {
      const int32_t t = v.token_type[i];
      if (t < 1 || t > 6)
        throw Error("token " + std::to_string(i) + " has unknown token type " + std::to_string(t));
      type_[i] = (TokenType)t;
    }
    const TokenType t = type_[i];
    bytes_[i] = (t == TokenType::Normal || t == TokenType::Byte) ? unmap_bytes(text_[i]) : text_[i];
    ids_.emplace(text_[i], (TokenId)i);  // a duplicate string keeps its first id
  }

  const ByteMap& m = byte_map();
  for (uint32_t b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, m.to_cp[b]);
    auto it = ids_.find(s);
    if (it == ids_.end())
      throw Error("vocabulary lacks the byte token \"" + s + "\" for byte " + std::to_string(b) +
                  " (not a byte-level BPE vocabulary)");
    byte_token_[b] = it->second;
  }

  merges_.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& mg = v.merges[r];
    const size_t sp = mg.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == mg.size() ||
        mg.find(' ', sp + 1) != std::string::npos)
      throw Error("merge " + std::to_string(r) + " \"" + utf8_sanitize(mg) +
                  "\" is not of the form \"left right\"");
    const std::string left = mg.substr(0, sp), right = mg.substr(sp + 1);
    auto l = ids_.find(left), rr = ids_.find(right), res = ids_.find(left + right);
    if (l == ids_.end() || rr == ids_.end() || res == ids_.end())
      throw Error("merge " + std::to_string(r) + " \"" + utf8_sanitize(mg) + "\": " +
                  (l == ids_.end() ? "left part" : rr == ids_.end() ? "right part" : "merged token") +
                  " is not in the vocabulary");
    // A repeated pair keeps its first (highest-priority) rank.
    merges_.emplace(pair_key(l->second, rr->second), Merge{(uint32_t)r, res->second});
  }

  if (v.bos && *v.bos >= n) throw Error("bos token id " + std::to_string(*v.bos) + " out of range");
  if (v.eos && *v.eos >= n) throw Error("eos token id " + std::to_string(*v.eos) + " out of range");
  bos_ = v.bos;
  eos_ = v.eos;
  add_bos_ = v.add_bos;

  // Added tokens, matched before BPE: a byte trie so each text position costs one walk.
  trie_.emplace_back();
  for (size_t i = 0; i < n; ++i) {
    if (type_[i] != TokenType::Control && type_[i] != TokenType::UserDefined) continue;
    const std::string& s = text_[i];
    if (s.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t child = -1;
      for (const auto& [byte, idx] : trie_[node].next)
        if (byte == c) child = idx;
      if (child < 0) {
        child = (int32_t)trie_.size();
        trie_[node].next.emplace_back(c, child);
        trie_.emplace_back();
      }
      node = child;
    }
    if (!trie_[node].token) {
      trie_[node].token = (TokenId)i;
      trie_[node].needs_special = type_[i] == TokenType::Control;
    }
    first_byte_[(unsigned char)s[0]] = true;
  }
}

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  const std::string& path = f.path();
  auto fail = [&](const std::string& key, const std::string& what) -> Error {
    return Error(path + ": " + key + " " + what);
  };
  auto string_key = [&](const char* key) -> const std::string* {
    const gguf::Value* v = f.find(key);
    if (!v) return nullptr;
    if (v->type != gguf::ValueType::STRING) throw fail(key, "is not a string");
    return &v->s;
  };
  auto string_array = [&](const char* key) -> const std::vector<std::string>& {
    const gguf::Value* v = f.find(key);
    if (!v) throw fail(key, "is missing");
    if (!v->is_array() || v->elem != gguf::ValueType::STRING) throw fail(key, "is not a string array");
    return v->as;
  };

  const std::string* model = string_key("tokenizer.ggml.model");
  if (!model) throw fail("tokenizer.ggml.model", "is missing");
  if (*model != "gpt2")
    throw fail("tokenizer.ggml.model", "is \"" + utf8_sanitize(*model) +
                                           "\"; only byte-level BPE (\"gpt2\") is supported");
  const std::string* pre = string_key("tokenizer.ggml.pre");
  if (!pre) throw fail("tokenizer.ggml.pre", "is missing (expected \"deepseek-v3\" or \"joyai-llm\")");
  if (*pre != "deepseek-v3" && *pre != "joyai-llm")
    throw fail("tokenizer.ggml.pre", "is \"" + utf8_sanitize(*pre) +
                                         "\"; only \"deepseek-v3\" / \"joyai-llm\" are supported");

  VocabData v;
  v.tokens = string_array("tokenizer.ggml.tokens");
  v.merges = string_array("tokenizer.ggml.merges");
  if (const gguf::Value* t = f.find("tokenizer.ggml.token_type")) {
    if (!t->is_array()) throw fail("tokenizer.ggml.token_type", "is not an array");
    v.token_type.reserve(t->array_size());
    using VT = gguf::ValueType;
    const VT e = t->elem;
    if (e == VT::I8 || e == VT::I16 || e == VT::I32 || e == VT::I64) {
      for (int64_t x : t->ai) v.token_type.push_back((int32_t)std::clamp<int64_t>(x, -1, 1000));
    } else if (e == VT::U8 || e == VT::U16 || e == VT::U32 || e == VT::U64) {
      for (uint64_t x : t->au) v.token_type.push_back((int32_t)std::min<uint64_t>(x, 1000));
    } else {
      throw fail("tokenizer.ggml.token_type", "is not an integer array");
    }
    if (v.token_type.size() != v.tokens.size())
      throw fail("tokenizer.ggml.token_type", "has " + std::to_string(v.token_type.size()) +
                                                  " entries for " + std::to_string(v.tokens.size()) +
                                                  " tokens");
  }
  auto id_key = [&](const char* key) -> std::optional<TokenId> {
    const gguf::Value* x = f.find(key);
    if (!x) return std::nullopt;
    uint64_t id = 0;
    try {
      id = x->as_uint();
    } catch (const Error&) {
      throw fail(key, "is not a token id");
    }
    if (id >= v.tokens.size())
      throw fail(key, "is " + std::to_string(id) + ", out of range for " +
                          std::to_string(v.tokens.size()) + " tokens");
    return (TokenId)id;
  };
  v.bos = id_key("tokenizer.ggml.bos_token_id");
  v.eos = id_key("tokenizer.ggml.eos_token_id");
  if (const gguf::Value* b = f.find("tokenizer.ggml.add_bos_token")) {
    if (b->type != gguf::ValueType::BOOL) throw fail("tokenizer.ggml.add_bos_token", "is not a bool");
    v.add_bos = b->u != 0;
  }
  try {
    return Tokenizer(std::move(v));
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

void Tokenizer::check_id(TokenId id) const {
  if (id >= (TokenId)n_vocab())
    throw Error("token id " + std::to_string(id) + " is out of range (vocabulary has " +
                std::to_string(n_vocab()) + " tokens)");
}

TokenType Tokenizer::type(TokenId id) const {
  check_id(id);
  return type_[id];
}

const std::string& Tokenizer::token_text(TokenId id) const {
  check_id(id);
  return text_[id];
}

std::optional<TokenId> Tokenizer::find(std::string_view token_text) const {
  auto it = ids_.find(std::string(token_text));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

size_t Tokenizer::match_added(std::string_view text, size_t i, size_t limit, bool parse_special,
                               TokenId* id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t j = i; j < std::min(limit, text.size()); ++j) {
    const unsigned char c = (unsigned char)text[j];
    int32_t child = -1;
    for (const auto& [byte, idx] : trie_[node].next)
      if (byte == c) {
        child = idx;
        break;
      }
    if (child < 0) break;
    node = child;
    const TrieNode& t = trie_[node];
    if (t.token && (parse_special || !t.needs_special)) {
      best = j + 1 - i;
      *id = *t.token;
    }
  }
  return best;
}

void Tokenizer::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_token_[(unsigned char)piece[0]]);
    return;
  }
  std::vector<Sym> syms(n);
  for (size_t k = 0; k < n; ++k)
    syms[k] = {byte_token_[(unsigned char)piece[k]], (int32_t)k - 1, k + 1 < n ? (int32_t)k + 1 : -1};
  std::vector<Cand> heap;
  heap.reserve(n);
  auto consider = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = syms[l].next;
    if (r < 0) return;
    auto it = merges_.find(pair_key(syms[l].id, syms[r].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, l, syms[l].id, syms[r].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t k = 0; k + 1 < n; ++k) consider((int32_t)k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Cand c = heap.back();
    heap.pop_back();
    Sym& left = syms[c.left];
    // Stale entry: one side was merged since (ids only ever grow into longer tokens, so an
    // unchanged id pair at this position is still the same adjacent pair).
    if (left.id != c.lid || left.next < 0 || syms[left.next].id != c.rid) continue;
    Sym& right = syms[left.next];
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.left;
    right.id = kMerged;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t k = 0; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

size_t Tokenizer::added_token_at(std::string_view text, size_t i, size_t limit) const {
  TokenId id = 0;
  return i < text.size() && first_byte_[(unsigned char)text[i]] ? match_added(text, i, limit, true, &id) : 0;
}

bool Tokenizer::is_added(TokenId id) const {
  check_id(id);
  return type_[id] == TokenType::Control || type_[id] == TokenType::UserDefined;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special,
                                       std::span<const TextRange> data) const {
  if (text.size() >= std::numeric_limits<uint32_t>::max())
    throw Error("text of " + std::to_string(text.size()) + " bytes is too long to tokenize");
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_) out.push_back(*bos_);
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  auto plain = [&](std::string_view s) {
    pieces.clear();
    pretokenize(s, pieces);
    for (const auto& [b, e] : pieces) bpe(s.substr(b, e - b), out);
  };
  size_t start = 0;
  size_t next_data = 0;  // the first data range that ends after i
  for (size_t i = 0; i < text.size();) {
    while (next_data < data.size() && data[next_data].end <= i) ++next_data;
    size_t limit = text.size();
    if (next_data < data.size()) {
      if (data[next_data].begin <= i) {  // inside data: BPE text up to its end
        i = data[next_data].end;
        continue;
      }
      limit = data[next_data].begin;
    }
    TokenId id = 0;
    const size_t len = first_byte_[(unsigned char)text[i]] ? match_added(text, i, limit, parse_special, &id) : 0;
    if (len == 0) {
      ++i;
      continue;
    }
    plain(text.substr(start, i - start));
    out.push_back(id);
    i += len;
    start = i;
  }
  plain(text.substr(start));
  return out;
}

std::string_view Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  check_id(id);
  if (!render_special && !renders_as_text(type_[id])) return {};
  return bytes_[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tok_->token_to_piece(id, render_special_);
  std::string out;
  const size_t used = utf8_sanitize_append(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8_sanitize_append(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace sluice::text
