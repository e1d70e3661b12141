// The Vulkan instance and what a physical device offers (`sluice devices`, and the backend's
// choices). Only the Vulkan backend's files include it (built with SLUICE_HAVE_VULKAN).
#pragma once
#include <vulkan/vulkan.h>

#include <string>
#include <vector>

#include "backend/vulkan_backend.h"

namespace sluice::vk {

std::string result_name(VkResult r);
// Throws Error "vulkan: <what> failed: <result>" unless r is VK_SUCCESS.
void check(VkResult r, const char* what);

// The instance's API version: 1.2 where the loader has it (timeline semaphores, for the
// hint-started copies on a queue of their own), else 1.1; a device below 1.2 still runs, without
// them. A device's 1.2 features count only where the instance asked for 1.2.
uint32_t instance_api();

struct Instance {
  VkInstance h = VK_NULL_HANDLE;
  Instance();
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  std::vector<VkPhysicalDevice> devices() const;
};

// One instance for the process, made on first use and never destroyed: the driver is loaded
// once (a backend or a device listing does not reload it), and it stays mapped until exit, so
// leak reports from inside it name its library (scripts/test suppresses only those).
const Instance& instance();

bool has_extension(VkPhysicalDevice d, const char* name);

// Fills `ext`, one features (or properties) struct with its sType set and no pNext, through
// vkGetPhysicalDeviceFeatures2 (Properties2).
template <class T>
void query_features(VkPhysicalDevice d, T& ext) {
  VkPhysicalDeviceFeatures2 f2{};
  f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  f2.pNext = &ext;
  vkGetPhysicalDeviceFeatures2(d, &f2);
}
template <class T>
void query_properties(VkPhysicalDevice d, T& ext) {
  VkPhysicalDeviceProperties2 p2{};
  p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  p2.pNext = &ext;
  vkGetPhysicalDeviceProperties2(d, &p2);
}

// What device `index` offers, as GpuDevice says it.
GpuDevice describe(VkPhysicalDevice d, uint32_t index);

}  // namespace sluice::vk
