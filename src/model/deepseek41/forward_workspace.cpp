#include "model/deepseek41/forward_workspace.h"

namespace sluice {

std::vector<TensorShape> workspace_shapes(const ModelConfig& c, uint32_t chunk) {
  const size_t H = c.hidden_size, hc = c.hc_mult, hd = c.head_dim, qw = (size_t)c.num_attention_heads * hd;
  const bool comp = !c.kv_source_layer_ids.empty(), index = !c.index_source_layer_ids.empty();
  const bool engram = !c.engram_layer_ids.empty();
  const size_t n = chunk;
  return {
      {Ws::X, "X", n, hc * H},
      {Ws::X2, "X2", n, hc * H},
      {Ws::Xin, "xin", n, H},
      {Ws::Out, "out", n, H},
      {Ws::MixA, "mix_attn", n, hc_mix_width((uint32_t)hc)},
      {Ws::MixF, "mix_ffn", n, hc_mix_width((uint32_t)hc)},
      {Ws::P0, "pre0", n, hc},
      {Ws::Qr, "q_lora", n, c.q_lora_rank},
      {Ws::Q, "q", n, qw},
      {Ws::Kv, "kv", n, hd},
      {Ws::Heads, "attn_heads", n, qw},
      {Ws::Z, "o_lora", n, (size_t)c.o_groups * c.o_lora_rank},
      {Ws::CompK, "comp_k", comp ? n : 0, hd},
      {Ws::CompG, "comp_gate", comp ? n : 0, hd},
      {Ws::Latents, "comp_rows", comp ? n : 0, hd},
      {Ws::IndexK, "index_k", comp ? n : 0, c.index_head_dim},
      {Ws::IndexQ, "index_q", index ? n : 0, (size_t)c.index_n_heads * c.index_head_dim},
      {Ws::IndexW, "index_w", index ? n : 0, c.index_n_heads},
      {Ws::Router, "router", n, c.n_routed_experts},
      {Ws::RouterNext, "router_next", n, c.n_routed_experts},
      {Ws::Shared, "shared", n, H},
      {Ws::Routed, "routed", n, H},
      {Ws::EngramRows, "engram_rows", engram ? n : 0, engram ? (size_t)c.engram_columns() * c.engram_head_dim : 0},
      {Ws::EngramKv, "engram_kv", engram ? n : 0, (hc + 1) * H},
  };
}

uint64_t workspace_bytes(const ModelConfig& c, uint32_t chunk) {
  uint64_t b = 0;
  for (const TensorShape& s : workspace_shapes(c, chunk)) b += s.bytes();
  return b;
}

Workspace::Workspace(const Backend& be, const ModelConfig& c, uint32_t chunk) : t_((size_t)Ws::Count) {
  for (const TensorShape& s : workspace_shapes(c, chunk)) {
    t_[(size_t)s.id] = be.tensor(s.rows, s.width);
    bytes_ += t_[(size_t)s.id].bytes();
  }
}

}  // namespace sluice
