#include "runtime/device_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/gpu_budget.h"
#include "backend/vulkan_backend.h"
#include "model/deepseek41/dspark_schema.h"
#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice {

SessionDevice make_session_device(const SessionOptions& opt, const ModelConfig& cfg) {
  SessionDevice d;
  if (opt.backend == "vulkan") {
    GpuOptions go = gpu_options(opt);
    // No more slots than there are experts to hold: the target's, and a drafter's stages (the
    // published count; the support file is read after the backend exists).
    const uint64_t stages = opt.dspark_path.empty() ? 0 : DsparkConfig{}.stages;
    const uint64_t max_slots = (cfg.num_hidden_layers + stages) * (uint64_t)cfg.n_routed_experts;
    go.expert_slots = std::min<uint64_t>(opt.gpu_experts, max_slots);
    if (opt.gpu_experts_auto && opt.gpu_experts == 0 && !opt.gpu_experts_in_place) {
      const std::vector<GpuDevice> devs = vulkan_devices();
      if (opt.gpu_device < devs.size()) {  // else make_vulkan_backend names the missing device
        const GpuExpertsChoice c = auto_gpu_experts(devs[opt.gpu_device], max_slots);
        go.expert_slots = c.slots;
        go.experts_in_place = c.in_place;
        go.experts_auto = "auto: " + c.why;
      }
    }
    d.slots = go.expert_slots;
    d.slots_auto = !go.experts_auto.empty() && go.expert_slots != 0;
    d.backend = make_vulkan_backend(go);
  } else if (opt.backend != "cpu") {
    throw Error("unknown backend '" + opt.backend + "' (cpu or vulkan)");
  }
  return d;
}

void plan_session_device(const Backend& b, uint64_t slots, bool slots_auto, const gguf::File& file,
                         const ModelConfig& cfg, bool stream_experts, PlanOptions& plan) {
  // The device's line: its weight copies can be no more than what the loader prepares (the
  // resident tensors, and the routed ones when they are loaded whole) nor than its budget.
  const ModelFootprint fp = footprint_from_gguf(file);
  // A drafter's dense weights go to the device too: its fixed line (weights but its routed
  // experts, and its activations) bounds them from above.
  const uint64_t loaded =
      fp.resident_bytes + (stream_experts ? 0 : fp.routed_expert_bytes) + plan.dspark_fixed;
  // Copies in device-local memory of a discrete card are the card's (its budget, --gpu-mem),
  // not the host's; on an integrated GPU or a CPU device they are this host's memory.
  // Routed-expert slots (--gpu-experts) come out of the same device budget, after the dense
  // copies; each holds one expert's three slices, every part aligned to 256 bytes (Vulkan's
  // largest storage-buffer offset alignment), so this is at least what the device makes.
  const GpuStats g = gpu_stats(b);
  const uint64_t slot = gpu_expert_slot_bytes(fp.expert_gate_bytes, fp.expert_up_bytes, fp.expert_down_bytes);
  // A device that imports the loaded weights' pages makes no copy of them (counted once, as
  // the resident weights); it still copies experts into its slots.
  const uint64_t dense = g.imports_host_memory ? 0 : loaded;
  const uint64_t copies = g.weights_in_host_memory ? std::min(g.device_budget, dense + slots * slot) : 0;
  // Host: a group of experts' rows, with slots or in place (which maps the host store's own
  // memory: nothing more to count).
  const uint64_t group_scratch = slots || g.experts_in_place ? 2 * kGpuExpertGroupBytes : 0;
  // Where the batch's rows are device memory the host does not map, their mapped mirror is
  // one more staging buffer; on a device whose memory is the host's (the tests' forced
  // case) the rows' buffer is the host's too.
  // Hint-started expert copies (unmapped slots) have a staging buffer of their own.
  const uint64_t staging =
      kGpuStagingBuffers + (g.scratch_on_device && g.weights_in_host_memory ? 1 : 0) + (g.hint_staging ? 1 : 0);
  // Kept attention rows (--gpu-kv): the host's copy of each row's bytes, which a lookup compares,
  // at most as many bytes as the device's slots; and the slots themselves where the device's
  // memory is the host's.
  const uint64_t kv = g.kv_bytes * (g.weights_in_host_memory ? 2 : 1);
  plan.device_bytes = copies + staging * kGpuStagingBytes + group_scratch + kv;
  // The shared expert's [g | u] rows (VulkanBackend::shared_ffn) outlive the op until its
  // deferred batch runs, beside the routed op's own temporaries.
  plan.device_held_bytes = [Fs = (uint64_t)cfg.moe_intermediate_size * std::max<uint32_t>(1, cfg.n_shared_experts)](
                                   uint32_t chunk) { return (uint64_t)chunk * 2 * Fs * sizeof(float); };
  const std::string slot_text =
      slots_auto ? ", routed-expert slots of " + format_bytes(slot) + " as many as it holds after them (auto)"
      : slots ? ", " + std::to_string(slots) + " routed-expert slots x " + format_bytes(slot) + " among them"
      : g.experts_in_place ? ", routed experts in place" : "";
  plan.device_detail = "vulkan: " +
                           (g.weights_in_host_memory
                                ? (g.imports_host_memory && copies == 0
                                       ? std::string(g.experts_in_place ? "weights and routed experts" : "weights") +
                                             " used in place (imported pages, no copies) + "
                                       : std::string(g.imports_host_memory ? "weights used in place, " : "") +
                                             "copies up to " + format_bytes(copies) + " (host memory" + slot_text +
                                             ") + ")
                                : "weights in device memory (budget " + format_bytes(g.device_budget) + ": " +
                                      g.budget_why + slot_text + "); ") +
                           std::to_string(staging) + " x " + format_bytes(kGpuStagingBytes) + " staging" +
                           (group_scratch ? " + " + format_bytes(group_scratch) + " expert-group rows" : "") +
                           (kv ? " + " + format_bytes(kv) + " of kept attention rows" +
                                     (g.weights_in_host_memory ? " (the slots and the host's copies)" : " (the host's copies)")
                               : "");
  // The device's own plan beside the host's: the backend made it already (and refused a
  // budget without room for the mandatory part); this is its account for the plan's reader.
  GpuDeviceNeeds dn;
  dn.scratch = g.scratch_bytes;
  dn.sequence_state = g.kv_bytes;
  dn.host_staging = staging * kGpuStagingBytes;
  dn.dense = loaded;
  dn.dense_in_place = g.imports_host_memory;
  dn.slot_bytes = slot;
  dn.slots = slots;
  dn.slots_auto = slots_auto;
  const GpuDevicePlan dp =
      gpu_device_plan(GpuWeightBudget{g.device_total, g.budget_why}, g.weights_in_host_memory, dn, g.device);
  plan.device_plan_title =
      "device " + g.device + (g.weights_in_host_memory ? " (its memory is the host's: the lines above count it)"
                                                      : " (its own memory, beside the host's budget)");
  plan.device_plan.push_back({"budget", dp.budget, dp.why});
  for (const GpuPlanLine& l : dp.lines) plan.device_plan.push_back({l.name, l.bytes, l.detail});
  plan.device_plan.push_back({"mandatory total", dp.mandatory, ""});
  plan.device_plan.push_back({"unused", dp.unused, ""});
}

}  // namespace sluice
