// How many bytes of weights a GPU may hold (--gpu-mem B|auto), from its memory heaps and, where the
// driver has VK_EXT_memory_budget, from what the driver says this process may still allocate. No
// Vulkan here: the rule is plain arithmetic on what `sluice devices` lists, so it is tested
// without a device.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

// The device's own plan (docs/backends.md "Where memory goes"). --gpu-mem (or auto) holds, in
// this order: what the device must hold to run at all (the mandatory part: the deferred batch's
// rows where they are the card's, and the attention rows it keeps between steps), then the dense weights the dispatches read (one that does not fit runs on the CPU),
// then routed-expert slots (as many as are left room for, at most those asked). On an
// integrated GPU or a CPU device all of it is the host's memory, which the host plan counts once.
struct GpuDeviceNeeds {
  uint64_t scratch = 0;         // device-local rows of the deferred batch
  // Sequence state in device memory: the attention rows it keeps between steps (--gpu-kv), a
  // cache of the host's sequence state (which stays the host's, in its plan).
  uint64_t sequence_state = 0;
  uint64_t host_staging = 0;    // the staging buffers, always host memory: listed, not charged here
  uint64_t dense = 0;           // the weights the dispatches read, as the loader prepares them
  bool dense_in_place = false;  // imported pages (an integrated GPU): no copy, no device bytes
  uint64_t slot_bytes = 0, slots = 0;  // routed-expert slots asked for (0: none)
  bool slots_auto = false;             // as many as fit
};
struct GpuPlanLine {
  std::string name;
  uint64_t bytes = 0;
  std::string detail;
};
struct GpuDevicePlan {
  uint64_t budget = 0;
  std::string why;
  bool host_memory = false;
  uint64_t mandatory = 0;
  uint64_t for_weights = 0;  // budget - mandatory: the dense weights' and then the slots' room
  uint64_t dense = 0, slots = 0, unused = 0;
  std::vector<GpuPlanLine> lines;  // scratch, sequence state, dense weights, expert slots
};
// Throws Error naming the device, each mandatory item, the budget and how it was chosen when the
// mandatory part does not fit: before anything is allocated.
GpuDevicePlan gpu_device_plan(const GpuWeightBudget& budget, bool host_memory, const GpuDeviceNeeds& n,
                              const std::string& device_name);

}  // namespace sluice
