// The device a session computes on (--backend vulkan) and its lines in the memory plan: the
// host's share of it (weight copies, staging buffers, rows held across ops) and the device's own
// plan (backend/gpu_budget.h). Session and `sluice plan --backend vulkan` share them, so the plan
// command shows what run, chat and serve would hold.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "runtime/admission.h"
#include "runtime/session.h"

namespace sluice {

struct SessionDevice {
  std::unique_ptr<Backend> backend;  // null: the CPU backend (--backend cpu)
  uint64_t slots = 0;                // routed-expert slots asked of the device (capped at the experts there are)
  bool slots_auto = false;           // by --gpu-experts auto: every expert, fewer when the budget holds fewer
};

// Makes the backend opt names. Throws Error for an unknown backend and whatever
// make_vulkan_backend throws (no device, a budget without room for the device's mandatory part).
SessionDevice make_session_device(const SessionOptions& opt, const ModelConfig& cfg);

// Sets plan's device lines (PlanOptions::device_bytes, device_detail, device_held_bytes,
// device_plan_title, device_plan) for backend b made by make_session_device; a drafter's fixed
// line (PlanOptions::dspark_fixed) is already in plan.
void plan_session_device(const Backend& b, uint64_t slots, bool slots_auto, const gguf::File& file,
                         const ModelConfig& cfg, bool stream_experts, PlanOptions& plan);

}  // namespace sluice
