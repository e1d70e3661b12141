#include "backend/gpu_budget.h"

#include <algorithm>

#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice {

GpuWeightBudget gpu_weight_budget(std::span<const GpuHeap> heaps, bool host_memory, uint64_t asked,
                                  const std::string& device_name) {
  const GpuHeap* heap = nullptr;
  for (const GpuHeap& h : heaps)
    if (h.device_local && (!heap || h.bytes > heap->bytes)) heap = &h;
  if (!heap)  // no device-local heap: the weights live in host memory
    for (const GpuHeap& h : heaps)
      if (!heap || h.bytes > heap->bytes) heap = &h;
  if (!heap) throw Error("vulkan: device " + device_name + " lists no memory heap");
  uint64_t available = heap->bytes;
  std::string source = format_bytes(heap->bytes) + (heap->device_local ? " device-local heap" : " heap");
  if (heap->has_budget) {
    available = std::min(heap->bytes, heap->budget > heap->usage ? heap->budget - heap->usage : 0);
    source += ", " + format_bytes(available) + " of it free by VK_EXT_memory_budget (budget " +
              format_bytes(heap->budget) + ", in use " + format_bytes(heap->usage) + ")";
  }
  GpuWeightBudget b;
  if (asked) {
    if (asked > available)
      throw Error("vulkan: --gpu-mem " + format_bytes(asked) + " is more than device " + device_name + " has for it: " +
                  source);
    b.bytes = asked;
    b.why = "--gpu-mem, within " + source;
    return b;
  }
  b.bytes = host_memory ? available / 2 : available / 5 * 4;
  b.why = std::string(host_memory ? "half" : "80%") + " of " + source;
  return b;
}

GpuDevicePlan gpu_device_plan(const GpuWeightBudget& budget, bool host_memory, const GpuDeviceNeeds& n,
                              const std::string& device_name) {
  GpuDevicePlan p;
  p.budget = budget.bytes;
  p.why = budget.why;
  p.host_memory = host_memory;
  p.mandatory = n.scratch + n.sequence_state;
  if (p.mandatory > p.budget)
    throw Error("vulkan: device " + device_name + " cannot hold what it must to run: scratch (the deferred batch's rows) " +
                format_bytes(n.scratch) + " + sequence state (attention rows kept, --gpu-kv) " +
                format_bytes(n.sequence_state) + " = " +
                format_bytes(p.mandatory) + ", more than its budget of " + format_bytes(p.budget) + " (" + budget.why +
                "); give it at least " + format_bytes(p.mandatory) + " with --gpu-mem");
  p.for_weights = p.budget - p.mandatory;
  const uint64_t dense_bytes = n.dense_in_place ? 0 : n.dense;
  p.dense = std::min(dense_bytes, p.for_weights);
  const uint64_t room = p.for_weights - p.dense;
  if (n.slot_bytes && (n.slots || n.slots_auto))
    p.slots = n.slots_auto ? room / n.slot_bytes : std::min(n.slots, room / n.slot_bytes);
  p.unused = room - p.slots * n.slot_bytes;
  const std::string mem = host_memory ? "host memory" : "device memory";
  p.lines.push_back({"scratch", n.scratch,
                     n.scratch ? "the deferred batch's rows in " + mem + "; the host reads what it needs of them through a copy"
                               : std::string("none: the deferred batch's rows are host memory the host maps (the host plan's GPU line)")});
  p.lines.push_back({"sequence state", n.sequence_state,
                     n.sequence_state ? "attention rows kept between steps (--gpu-kv) in " + mem +
                                            "; the host's sequence state stays its own, and its plan's GPU line "
                                            "counts the copy of each kept row's bytes it compares"
                                      : std::string("none: the host's (its plan line); a batch stages the rows it reads")});
  if (n.host_staging)
    p.lines.push_back({"staging", 0,
                       format_bytes(n.host_staging) + " of host-visible buffers (activations in, rows out, uploads): host "
                       "memory, the host plan's GPU line"});
  p.lines.push_back({"dense weights", p.dense,
                     n.dense_in_place ? "the host's pages used in place (" + format_bytes(n.dense) + ", counted once, by the host plan)"
                     : p.dense < n.dense ? "up to this much of the " + format_bytes(n.dense) +
                                               " the dispatches read; the rest run on the CPU"
                                         : "the weights the dispatches read, all of them"});
  if (n.slot_bytes && (n.slots || n.slots_auto))
    p.lines.push_back({"expert slots", p.slots * n.slot_bytes,
                       std::to_string(p.slots) + " x " + format_bytes(n.slot_bytes) + " (" +
                           (n.slots_auto ? std::string("auto: as many as fit")
                                         : std::to_string(n.slots) + " asked" + (p.slots < n.slots ? ", fewer fit" : "")) +
                           ")"});
  return p;
}

}  // namespace sluice
