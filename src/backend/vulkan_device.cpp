// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_device.h"

#include <cstring>

#include "backend/vulkan_shaders.h"
#include "util/error.h"

namespace sluice::vk {

std::string result_name(VkResult r) {
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VK_ERROR_INITIALIZATION_FAILED: return "initialization failed";
    case VK_ERROR_DEVICE_LOST: return "device lost";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "no compatible driver";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "extension not present";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "feature not present";
    case VK_ERROR_TOO_MANY_OBJECTS: return "too many objects";
    case VK_ERROR_INVALID_SHADER_NV: return "invalid shader";
    case VK_TIMEOUT: return "timed out";
    default: return "VkResult " + std::to_string((int)r);
  }
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw Error(std::string("vulkan: ") + what + " failed: " + result_name(r));
}

uint32_t instance_api() {
  uint32_t loader = VK_API_VERSION_1_0;
  if (vkEnumerateInstanceVersion(&loader) != VK_SUCCESS) loader = VK_API_VERSION_1_0;
  return loader >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1;
}

Instance::Instance() {
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.pApplicationName = "sluice";
  app.apiVersion = instance_api();
  VkInstanceCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  ci.pApplicationInfo = &app;
  const VkResult r = vkCreateInstance(&ci, nullptr, &h);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw Error("vulkan: no Vulkan driver answered (install the GPU's Vulkan driver, or mesa-vulkan-drivers for "
                "lavapipe on the CPU)");
  check(r, "creating the instance");
}

Instance::~Instance() {
  if (h) vkDestroyInstance(h, nullptr);
}

std::vector<VkPhysicalDevice> Instance::devices() const {
  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(h, &n, nullptr), "listing devices");
  std::vector<VkPhysicalDevice> out(n);
  check(vkEnumeratePhysicalDevices(h, &n, out.data()), "listing devices");
  out.resize(n);
  return out;
}

const Instance& instance() {
  static const Instance* inst = new Instance();
  return *inst;
}

bool has_extension(VkPhysicalDevice d, const char* name) {
  uint32_t n = 0;
  if (vkEnumerateDeviceExtensionProperties(d, nullptr, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> ext(n);
  if (vkEnumerateDeviceExtensionProperties(d, nullptr, &n, ext.data()) != VK_SUCCESS) return false;
  for (uint32_t i = 0; i < n; ++i)
    if (std::strcmp(ext[i].extensionName, name) == 0) return true;
  return false;
}

GpuDevice describe(VkPhysicalDevice d, uint32_t index) {
  VkPhysicalDeviceSubgroupProperties sub{};
  sub.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
  VkPhysicalDeviceDriverProperties drv{};
  drv.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
  const bool have_driver = has_extension(d, VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME);
  sub.pNext = have_driver ? &drv : nullptr;
  VkPhysicalDeviceProperties2 props{};
  props.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  props.pNext = &sub;
  vkGetPhysicalDeviceProperties2(d, &props);
  const VkPhysicalDeviceProperties& p = props.properties;

  GpuDevice g;
  g.index = index;
  g.name = p.deviceName;
  if (have_driver) g.driver = std::string(drv.driverName) + " (" + drv.driverInfo + ")";
  switch (p.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: g.kind = "integrated"; break;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: g.kind = "discrete"; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: g.kind = "virtual"; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: g.kind = "cpu"; break;
    default: g.kind = "other"; break;
  }
  g.uma = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU || p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  g.api_major = VK_API_VERSION_MAJOR(p.apiVersion);
  g.api_minor = VK_API_VERSION_MINOR(p.apiVersion);
  g.subgroup_size = sub.subgroupSize;
  // The subgroup build of the linears (shaders/linear_main.glsl) wants ballots and shuffles in
  // compute shaders, and a 64-invocation workgroup of whole subgroups of at least 8 lanes (a unit
  // of K-quant work per lane, eight per super-block).
  const VkSubgroupFeatureFlags need =
      VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_BALLOT_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  g.subgroup_linears = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                       (sub.supportedOperations & need) == need && sub.subgroupSize >= 8 &&
                       sub.subgroupSize <= kGroup && kGroup % sub.subgroupSize == 0;
  if (has_extension(d, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) {
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dotf{};
    dotf.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR;
    query_features(d, dotf);
    VkPhysicalDeviceShaderIntegerDotProductPropertiesKHR dotp{};
    dotp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES_KHR;
    query_properties(d, dotp);
    g.int_dot = dotf.shaderIntegerDotProduct == VK_TRUE;
    g.int_dot_accelerated = g.int_dot && dotp.integerDotProduct4x8BitPackedSignedAccelerated == VK_TRUE;
  }
  g.host_import = has_extension(d, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  {
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(d, &nq, qf.data());
    for (uint32_t i = 0; i < nq && !g.transfer_queue; ++i)
      if (qf[i].queueCount > 0 && (qf[i].queueFlags & VK_QUEUE_TRANSFER_BIT) &&
          !(qf[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT))) {
        g.transfer_queue = true;
        g.transfer_family = i;
      }
    if (p.apiVersion >= VK_API_VERSION_1_2 && instance_api() >= VK_API_VERSION_1_2) {
      VkPhysicalDeviceTimelineSemaphoreFeatures tl{};
      tl.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES;
      query_features(d, tl);
      g.timeline = tl.timelineSemaphore == VK_TRUE;
    }
  }
  g.max_storage_buffer = p.limits.maxStorageBufferRange;
  g.max_workgroup_memory = p.limits.maxComputeSharedMemorySize;
  // The heaps, and what the driver says this process may still allocate from each where it has
  // VK_EXT_memory_budget (a snapshot: other processes move it).
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{};
  budget.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT;
  VkPhysicalDeviceMemoryProperties2 mem2{};
  mem2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2;
  const bool have_budget = has_extension(d, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  mem2.pNext = have_budget ? &budget : nullptr;
  vkGetPhysicalDeviceMemoryProperties2(d, &mem2);
  const VkPhysicalDeviceMemoryProperties& mem = mem2.memoryProperties;
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i) {
    GpuHeap h;
    h.bytes = mem.memoryHeaps[i].size;
    h.device_local = (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    h.has_budget = have_budget;
    h.budget = have_budget ? budget.heapBudget[i] : 0;
    h.usage = have_budget ? budget.heapUsage[i] : 0;
    g.heaps.push_back(h);
  }
  return g;
}

}  // namespace sluice::vk
#endif
