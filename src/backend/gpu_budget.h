// How many bytes of weights a GPU may hold (--gpu-mem B|auto), from its memory heaps and, where the
// driver has VK_EXT_memory_budget, from what the driver says this process may still allocate. No
// Vulkan here: the rule is plain arithmetic on what `sluice devices` lists, so it is tested
// without a device.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace sluice {

struct GpuHeap {
  uint64_t bytes = 0;
  bool device_local = false;
  // VK_EXT_memory_budget, where the driver has it: what this process may allocate from the heap
  // in all (other processes' use already taken off) and what it has allocated so far.
  bool has_budget = false;
  uint64_t budget = 0, usage = 0;
};

struct GpuWeightBudget {
  uint64_t bytes = 0;
  std::string why;  // how it was chosen, for `run`'s summary and the plan
};

// The weight budget. The heap is the largest device-local one (any heap when none is); what is
// available is its driver budget less this process's usage where the driver reports them, else
// its size. `asked` (--gpu-mem; 0: auto) must fit what is available, or Error names both. Auto is
// half of it where the device's memory is the host's (`host_memory`: an integrated GPU or a CPU
// device, whose weights share the pool with everything else) and 80% on a discrete card (room
// for the driver, the staging buffers and the other processes).
GpuWeightBudget gpu_weight_budget(std::span<const GpuHeap> heaps, bool host_memory, uint64_t asked,
                                  const std::string& device_name);

}  // namespace sluice
