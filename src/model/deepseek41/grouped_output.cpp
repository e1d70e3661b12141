#include "model/deepseek41/grouped_output.h"

#include <vector>

namespace sluice {

void grouped_output(const Backend& be, const ModelConfig& c, const LayerWeights& w, CMat o, Mat z, Mat out) {
  const uint32_t og = c.o_groups, olr = c.o_lora_rank;
  const size_t gin = o.width / og;
  std::vector<LinearCall> groups;
  for (uint32_t g = 0; g < og; ++g)
    groups.push_back({&w.out_a, o.cols(g * gin, gin), z.cols((size_t)g * olr, olr), true, (uint64_t)g * olr});
  be.linears(groups);
  be.linear(w.out_b, z, out, true);
}

}  // namespace sluice
