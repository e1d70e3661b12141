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

}  // namespace sluice
