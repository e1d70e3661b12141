// DSpark's verify pass and its cut-back (spec 6.4).
//
// A verify pass evaluates the anchor and up to K drafts in one chunk. Only a prefix of them is
// accepted, and the state must then be the one a plain decode of that prefix reaches, bit for
// bit. What the rejected rows left behind: the window slots they overwrote (slot p mod window
// held position p - window, inside the window of the next queries), compressed rows and index
// keys of groups that closed at a rejected position, the compressor carry, the Engram history.
// The checkpoint of the pass's start has the old window slots and carry; the carry at a
// position inside the pass is made of the pass's own compressor projections (carry row j is
// the projection of the latest token t < position with t mod ratio = j, compress_pool); the
// Engram history is the kept tokens' compressed ids.
#include <algorithm>
#include <cstring>
#include <string>

#include "model/deepseek41/forward_impl.h"
#include "util/error.h"

namespace sluice {

void Engine::eval_verify(SequenceState& s, std::span<const TokenId> tokens, float* logits, float* hidden,
                         VerifyRecord& rec, std::vector<TokenTrace>* trace) const {
  const Impl& im = *impl_;
  if (tokens.empty()) throw Error("engine: a verify pass needs at least one token");
  if (tokens.size() > opt_.chunk || tokens.size() > im.c.sliding_window)
    throw Error("engine: a verify pass of " + std::to_string(tokens.size()) + " tokens exceeds the chunk (" +
                std::to_string(opt_.chunk) + ") or the window (" + std::to_string(im.c.sliding_window) + ")");
  im.check_request(s, tokens, {}, "");
  VerifyRecord r;
  r.before = checkpoint(s);
  r.tokens.assign(tokens.begin(), tokens.end());
  eval_one(s, tokens, {}, logits, trace, BatchItem::Logits::All, hidden, &r);
  rec = std::move(r);
}

void Engine::keep_verified(SequenceState& s, const VerifyRecord& rec, uint32_t n) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.c;
  im.check_state(s);
  const uint32_t p0 = rec.before.pos, end = p0 + (uint32_t)rec.tokens.size(), pos = p0 + n;
  if (s.pos != end || rec.proj_k.size() != s.sources.size() || rec.proj_s.size() != s.sources.size())
    throw Error("engine: the state is not where the verify pass left it");
  if (n > rec.tokens.size())
    throw Error("engine: cannot keep " + std::to_string(n) + " of a verify pass's " + std::to_string(rec.tokens.size()) +
                " tokens");
  const uint32_t W = s.window, hd = s.head_dim, nl = c.num_hidden_layers;
  const uint32_t old_rows = std::min(p0, W);  // ring slots the checkpoint holds
  for (uint32_t L = 0; L < nl; ++L) {
    uint16_t* ring = s.window_kv.data() + (size_t)L * W * hd;
    for (uint32_t p = pos; p < end; ++p) {
      const uint32_t slot = p % W;
      uint16_t* dst = ring + (size_t)slot * hd;
      if (slot < old_rows)
        std::memcpy(dst, rec.before.window_kv.data() + ((size_t)L * old_rows + slot) * hd, hd * sizeof(uint16_t));
      else
        std::fill(dst, dst + hd, uint16_t{0});
    }
  }
  const size_t kb = fp4_row_bytes(kKvGrid, hd), ib = fp4_row_bytes(kIndexGrid, c.index_head_dim);
  for (size_t i = 0; i < s.sources.size(); ++i) {
    SourceCache& sc = s.sources[i];
    const size_t r0 = pos / sc.ratio, r1 = end / sc.ratio;
    std::fill(sc.kv.begin() + (ptrdiff_t)(r0 * kb), sc.kv.begin() + (ptrdiff_t)(r1 * kb), uint8_t{0});
    std::fill(sc.index_k.begin() + (ptrdiff_t)(r0 * ib), sc.index_k.begin() + (ptrdiff_t)(r1 * ib), uint8_t{0});
    if (sc.ratio < 2) continue;
    sc.carry_k = rec.before.carry_k[i];
    sc.carry_s = rec.before.carry_s[i];
    for (uint32_t j = 0; j + 1 < sc.ratio; ++j) {
      if (pos < j + 1) continue;  // no token at group offset j yet: the checkpoint's row (zeros)
      const uint32_t t = pos - 1 - (pos - 1 - j) % sc.ratio;  // latest t < pos with t mod ratio == j
      if (t < p0) continue;                                     // before the pass: the checkpoint's
      std::copy_n(rec.proj_k[i].begin() + (ptrdiff_t)((size_t)(t - p0) * hd), hd, sc.carry_k.begin() + (ptrdiff_t)(j * hd));
      std::copy_n(rec.proj_s[i].begin() + (ptrdiff_t)((size_t)(t - p0) * hd), hd, sc.carry_s.begin() + (ptrdiff_t)(j * hd));
    }
  }
  s.engram_tail = rec.before.engram_tail;
  const size_t N = s.engram_tail.size();
  for (uint32_t k = 0; k < n && N > 0; ++k) {
    for (size_t j = N - 1; j > 0; --j) s.engram_tail[j] = s.engram_tail[j - 1];
    s.engram_tail[0] = engram_compress(c, rec.tokens[k]);
  }
  s.pos = pos;
}

}  // namespace sluice
