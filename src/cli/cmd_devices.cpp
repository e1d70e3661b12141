#include "cli/cmd_devices.h"

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/vulkan_backend.h"
#include "runtime/meminfo.h"

namespace sluice::cli {

CLI::App* setup_devices(CLI::App& app, DevicesOptions& o) {
  CLI::App* sub = app.add_subcommand("devices", "list the Vulkan devices (--backend vulkan --device N)");
  sub->add_flag("--json", o.json, "one JSON object per device");
  return sub;
}

// Exit 1 with the reason when Vulkan is not built in or no driver answers; an empty list is not
// an error (the machine has a driver but no device).
int run_devices(const DevicesOptions& o) {
  const std::vector<GpuDevice> devs = vulkan_devices();
  if (devs.empty() && !o.json) std::printf("no Vulkan device\n");
  for (const GpuDevice& d : devs) {
    if (o.json) {
      nlohmann::json j;
      j["index"] = d.index;
      j["name"] = d.name;
      j["driver"] = d.driver;
      j["kind"] = d.kind;
      j["api"] = std::to_string(d.api_major) + "." + std::to_string(d.api_minor);
      j["uma"] = d.uma;
      j["subgroup_size"] = d.subgroup_size;
      j["subgroup_linears"] = d.subgroup_linears;
      j["linears_auto"] = auto_subgroup_linears(d) ? "subgroup" : "plain";
      j["integer_dot_product"] = d.int_dot;
      j["integer_dot_product_accelerated"] = d.int_dot_accelerated;
      j["int_dot_auto"] = auto_int_dot(d);
      j["host_import"] = d.host_import;
      j["transfer_queue"] = d.transfer_queue;  // a queue family for transfers only
      j["timeline_semaphores"] = d.timeline;
      j["max_storage_buffer"] = d.max_storage_buffer;
      j["max_workgroup_memory"] = d.max_workgroup_memory;
      nlohmann::json heaps = nlohmann::json::array();
      for (const GpuHeap& h : d.heaps) {
        nlohmann::json hj = {{"bytes", h.bytes}, {"device_local", h.device_local}};
        if (h.has_budget) hj["budget"] = h.budget, hj["usage"] = h.usage;  // VK_EXT_memory_budget
        heaps.push_back(hj);
      }
      j["heaps"] = heaps;
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    std::printf("%u: %s (%s, Vulkan %u.%u%s)\n", d.index, d.name.c_str(), d.kind.c_str(), d.api_major, d.api_minor,
                d.uma ? ", memory shared with the host" : "");
    if (!d.driver.empty()) std::printf("   driver: %s\n", d.driver.c_str());
    std::string heaps;
    for (const GpuHeap& h : d.heaps)
      heaps += (heaps.empty() ? "" : ", ") + format_bytes(h.bytes) + (h.device_local ? " device-local" : " host") +
               (h.has_budget ? " (budget " + format_bytes(h.budget) + ", in use " + format_bytes(h.usage) + ")" : "");
    std::printf("   memory heaps: %s\n", heaps.c_str());
    std::printf("   subgroup %u (%s), integer dot product %s, largest storage binding %s, workgroup memory %s, "
                "imports host memory %s, transfer queue %s\n",
                d.subgroup_size,
                auto_subgroup_linears(d) ? "linears a subgroup per output"
                : d.subgroup_linears     ? "linears an invocation per output on a CPU device; --gpu-linears subgroup can"
                                         : "linears an invocation per output",
                d.int_dot_accelerated ? "yes, accelerated (linears use it)"
                : d.int_dot           ? "yes, not accelerated (--gpu-int-dot on uses it)"
                                      : "no",
                format_bytes(d.max_storage_buffer).c_str(),
                format_bytes(d.max_workgroup_memory).c_str(), d.host_import ? "yes" : "no",
                d.transfer_queue && d.timeline ? "yes (expert copies overlap compute)"
                : d.transfer_queue             ? "yes, unused (no timeline semaphores)"
                                               : "no");
  }
  return 0;
}

}  // namespace sluice::cli
