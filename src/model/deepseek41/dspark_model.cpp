#include "model/deepseek41/dspark_model.h"

#include "model/tensor_loader.h"
#include "util/error.h"

namespace sluice {

std::unique_ptr<DsparkModel> load_dspark(const std::string& path, const Model& target, const LoadOptions& o) {
  auto dm = std::make_unique<DsparkModel>(gguf::File::open(path));
  DsparkModel& m = *dm;
  const DsparkReport rep = validate_dspark(m.file, &target.config);
  if (!rep.ok()) {
    std::string msg = path + " is not a DSpark support file for this model:";
    for (size_t i = 0; i < rep.errors.size() && i < 5; ++i) msg += "\n  " + rep.errors[i];
    if (rep.errors.size() > 5) msg += "\n  (" + std::to_string(rep.errors.size() - 5) + " more)";
    throw Error(msg);
  }
  m.config = rep.config;
  const DsparkConfig& d = m.config;
  LoadOptions lo = o;
  lo.resident_experts = true;
  TensorLoader ld(m.file, m.buffers, m.loaded_bytes, lo);
  m.stages.resize(d.stages);
  m.experts.layers.resize(d.stages);
  m.experts.layouts.resize(d.stages);
  for (uint32_t s = 0; s < d.stages; ++s) {
    load_block(ld, "mtp." + std::to_string(s) + ".", m.stages[s], m.experts.layers[s], /*read_experts=*/true,
               /*image_bias=*/false);
    m.experts.layouts[s] = m.stages[s].experts;
  }
  const std::string last = "mtp." + std::to_string(d.stages - 1) + ".";
  m.main_proj = ld.weight("mtp.0.main_proj.weight");
  m.main_norm = ld.floats("mtp.0.main_norm.weight");
  m.norm = ld.floats(last + "norm.weight");
  m.markov_w1 = ld.weight(last + "markov_head.markov_w1.weight");
  m.markov_w2 = ld.weight(last + "markov_head.markov_w2.weight");
  m.confidence = ld.weight(last + "confidence_head.proj.weight");
  return dm;
}

}  // namespace sluice
