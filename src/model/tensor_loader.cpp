#include "model/tensor_loader.h"

namespace sluice {

void load_block(TensorLoader& ld, const std::string& b, LayerWeights& w, ResidentExperts::Layer& resident,
                bool read_experts, bool image_bias) {
  w.hc_attn_fn = ld.weight(b + "hc_attn_fn.weight", WeightUse::HcMix);
  w.hc_ffn_fn = ld.weight(b + "hc_ffn_fn.weight", WeightUse::HcMix);
  w.hc_attn_base = ld.floats(b + "hc_attn_base.weight");
  w.hc_attn_scale = ld.floats(b + "hc_attn_scale.weight");
  w.hc_ffn_base = ld.floats(b + "hc_ffn_base.weight");
  w.hc_ffn_scale = ld.floats(b + "hc_ffn_scale.weight");
  w.attn_norm = ld.floats(b + "attn_norm.weight");
  w.ffn_norm = ld.floats(b + "ffn_norm.weight");
  w.attn_sinks = ld.floats(b + "attn_sinks.weight");
  w.q_a = ld.weight(b + "attn_q_a.weight");
  w.q_a_norm = ld.floats(b + "attn_q_a_norm.weight");
  w.q_b = ld.weight(b + "attn_q_b.weight");
  w.kv = ld.weight(b + "attn_kv.weight");
  w.kv_norm = ld.floats(b + "attn_kv_a_norm.weight");
  w.out_a = ld.weight(b + "attn_output_a.weight");
  w.out_b = ld.weight(b + "attn_output_b.weight");
  w.gate_inp = ld.weight(b + "ffn_gate_inp.weight");
  w.exp_bias = ld.floats(b + "exp_probs_b.bias");
  if (image_bias) w.exp_bias_vl = ld.floats(b + "exp_probs_b_vl.bias");
  w.gate_sh = ld.weight(b + "ffn_gate_shexp.weight");
  w.up_sh = ld.weight(b + "ffn_up_shexp.weight");
  w.down_sh = ld.weight(b + "ffn_down_shexp.weight");

  static const std::vector<uint32_t> kNone;
  load_routed_experts(ld, b, w.experts, resident, read_experts ? nullptr : &kNone);
}

void load_routed_experts(TensorLoader& ld, const std::string& b, ExpertLayout& lay, ResidentExperts::Layer& resident,
                         const std::vector<uint32_t>* read) {
  Weight* w[3] = {&lay.gate, &lay.up, &lay.down};
  uint64_t* bytes[3] = {&lay.gate_bytes, &lay.up_bytes, &lay.down_bytes};
  const uint8_t** res[3] = {&resident.gate, &resident.up, &resident.down};
  for (int i = 0; i < 3; ++i) {
    const gguf::TensorInfo& t = ld.info(b + kRoutedExpertTensors[i]);
    *w[i] = ld.view(t, nullptr);
    w[i]->rows = t.ne[1];  // one expert
    *bytes[i] = t.ne[1] * w[i]->row_bytes;
    if (!read) *res[i] = ld.read(t);
    else if (!read->empty()) *res[i] = ld.read_experts(t, *bytes[i], *read);
    if (*res[i]) resident.count = (uint32_t)(read ? read->size() : t.ne[2]);
  }
}

}  // namespace sluice
