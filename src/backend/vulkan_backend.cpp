#include "backend/vulkan_backend.h"

#include "util/error.h"

#if SLUICE_HAVE_VULKAN
#include <vulkan/vulkan.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "backend/cpu_backend.h"
#include "backend/cpu_linear.h"
#include "backend/swiglu.h"
#endif

namespace sluice {

#if SLUICE_HAVE_VULKAN

namespace {

// SPIR-V compiled from src/backend/shaders at build time (glslc -mfmt=num).
const uint32_t kLinearQ8_0[] = {
#include "linear_q8_0.spv.inc"
};
const uint32_t kLinearFloat[] = {
#include "linear_float.spv.inc"
};

constexpr uint32_t kGroup = 64;  // local_size_x of the linear shaders
// A dispatch that has not finished after this long means the device is gone or hung.
constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;

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

struct Instance {
  VkInstance h = VK_NULL_HANDLE;
  Instance() {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "sluice";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    const VkResult r = vkCreateInstance(&ci, nullptr, &h);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
      throw Error("vulkan: no Vulkan driver answered (install the GPU's Vulkan driver, or mesa-vulkan-drivers for "
                  "lavapipe on the CPU)");
    check(r, "creating the instance");
  }
  ~Instance() {
    if (h) vkDestroyInstance(h, nullptr);
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  std::vector<VkPhysicalDevice> devices() const {
    uint32_t n = 0;
    check(vkEnumeratePhysicalDevices(h, &n, nullptr), "listing devices");
    std::vector<VkPhysicalDevice> out(n);
    check(vkEnumeratePhysicalDevices(h, &n, out.data()), "listing devices");
    out.resize(n);
    return out;
  }
};

// One instance for the process, made on first use and never destroyed: the driver is loaded
// once (a backend or a device listing does not reload it), and it stays mapped until exit, so
// leak reports from inside it name its library (scripts/test suppresses only those).
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
  g.int_dot = has_extension(d, "VK_KHR_shader_integer_dot_product");
  g.max_storage_buffer = p.limits.maxStorageBufferRange;
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(d, &mem);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
    g.heaps.push_back({mem.memoryHeaps[i].size, (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  return g;
}

struct Push {
  uint32_t rows, cols, n, row0, w_row_bytes, a_stride, kind, round_out;
};

// A storage buffer and its memory; `map` is set while the host can write it directly (the
// staging buffers, and weights in device-local memory that is host-visible).
struct Buffer {
  VkBuffer buf = VK_NULL_HANDLE;
  VkDeviceMemory mem = VK_NULL_HANDLE;
  void* map = nullptr;
  VkDeviceSize size = 0;
};

// What prepare_weight leaves in Weight::device.
struct GpuWeight {
  Buffer b;
  uint32_t kind = 0;  // linear_float's kind; unused for Q8_0
  bool q8_0 = false;
};

class VulkanBackend final : public CpuBackend {
 public:
  explicit VulkanBackend(const GpuOptions& o) : CpuBackend(resolved(o.threads)), fault_(o.fault) {
    const std::vector<VkPhysicalDevice> devs = instance().devices();
    if (devs.empty()) throw Error("vulkan: the driver lists no device");
    if (o.device >= devs.size())
      throw Error("vulkan: no device " + std::to_string(o.device) + " (there " +
                  (devs.size() == 1 ? std::string("is 1 device: 0") : "are " + std::to_string(devs.size()) +
                                                                         " devices: 0.." + std::to_string(devs.size() - 1)) +
                  "; `sluice devices` lists them)");
    phys_ = devs[o.device];
    info_ = describe(phys_, o.device);
    max_range_ = info_.max_storage_buffer;

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, qf.data());
    family_ = UINT32_MAX;
    for (uint32_t i = 0; i < nq && family_ == UINT32_MAX; ++i)
      if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family_ = i;
    if (family_ == UINT32_MAX) throw Error("vulkan: device " + info_.name + " has no compute queue");

    vkGetPhysicalDeviceMemoryProperties(phys_, &mem_);
    // The staging buffers need host-visible, coherent memory (make_buffer); a device without it
    // is refused here rather than at the first linear().
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    bool have_host = false;
    for (uint32_t i = 0; i < mem_.memoryTypeCount; ++i) have_host |= (mem_.memoryTypes[i].propertyFlags & host) == host;
    if (!have_host) throw Error("vulkan: device " + info_.name + " has no host-visible coherent memory");
    uint64_t largest_local = 0, largest = 0;
    for (const GpuHeap& h : info_.heaps) {
      if (h.device_local) largest_local = std::max(largest_local, h.bytes);
      largest = std::max(largest, h.bytes);
    }
    if (largest_local == 0) largest_local = largest;  // no device-local heap: weights in host memory
    for (uint32_t i = 0; i < mem_.memoryTypeCount && local_type_ == UINT32_MAX; ++i)
      if (mem_.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) local_type_ = i;
    st_.weights_in_host_memory = info_.uma || local_type_ == UINT32_MAX;
    budget_ = o.weight_budget ? o.weight_budget : st_.weights_in_host_memory ? largest_local / 2 : largest_local / 5 * 4;
    st_.device_budget = budget_;
    force_staging_ = o.force_staging;
    staging_bytes_ = o.staging_bytes ? o.staging_bytes : kGpuStagingBytes;

    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qci{};
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    // The float linear shader computes the CPU's fused fma exactly with doubles (linear_float.comp).
    VkPhysicalDeviceFeatures have{};
    vkGetPhysicalDeviceFeatures(phys_, &have);
    float64_ = have.shaderFloat64 == VK_TRUE;
    VkPhysicalDeviceFeatures enable{};
    enable.shaderFloat64 = have.shaderFloat64;
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.pEnabledFeatures = &enable;
    check(vkCreateDevice(phys_, &dci, nullptr, &dev_), "creating the device");
    try {
      init_objects();
    } catch (...) {
      destroy();
      throw;
    }
  }

  ~VulkanBackend() override { destroy(); }

  std::string_view name() const override { return "vulkan"; }

  void prepare_weight(Weight& w) const override {
    CpuBackend::prepare_weight(w);  // the CPU path stays ready: other ops and fallbacks use it
    // The types with a shader; the float formats' needs shaderFloat64 (linear_float.comp).
    uint32_t kind = 0;
    bool q8 = false, shader = true;
    switch (w.type) {
      case GgmlType::Q8_0: q8 = true; break;
      case GgmlType::F32: kind = 0; shader = float64_; break;
      case GgmlType::F16: kind = 1; shader = float64_; break;
      case GgmlType::BF16: kind = 2; shader = float64_; break;
      default: shader = false; break;
    }
    const uint64_t bytes = w.rows * w.row_bytes;
    const std::lock_guard<std::mutex> lk(mu_);
    if (!shader || !w.data || bytes == 0 || bytes > max_range_ || st_.bytes_on_device + bytes > budget_) {
      ++st_.weights_on_host;
      return;
    }
    GpuWeight& g = weights_.emplace_back();
    try {
      g.b = make_weight_buffer(bytes);
      upload(g.b, w.data, bytes);
    } catch (...) {
      free_buffer(g.b);
      weights_.pop_back();
      throw;
    }
    g.kind = kind;
    g.q8_0 = q8;
    w.device = &g;
    ++st_.weights_on_device;
    st_.bytes_on_device += bytes;
  }

  void linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const override {
    const uint64_t limit = std::min<uint64_t>(max_range_, kGpuStagingBytes);
    if (!W.device || x.n == 0 || y.width == 0 || (uint64_t)y.width * sizeof(float) > limit ||
        activation_bytes(W.act(), (int64_t)W.cols) > limit) {
      const std::lock_guard<std::mutex> lk(mu_);
      ++st_.linear_on_host;
      return CpuBackend::linear(W, x, y, round, row0);
    }
    if (x.width != W.cols) throw Error("linear: " + std::to_string(x.width) + " inputs for a weight of " + std::to_string(W.cols) + " columns");
    if (row0 + y.width > W.rows) throw Error("linear: rows " + std::to_string(row0) + ".." + std::to_string(row0 + y.width) + " of a weight of " + std::to_string(W.rows));
    const GpuWeight& g = *static_cast<const GpuWeight*>(W.device);
    const ActRows acts = quantize_rows(W.act(), x.p, x.stride, x.n, W.cols);
    const std::lock_guard<std::mutex> lk(mu_);
    // Tokens go in groups whose activations and outputs each fit the staging buffers.
    const uint64_t out_row = (uint64_t)y.width * sizeof(float);
    const uint64_t per_group = std::max<uint64_t>(1, std::min(limit / out_row, limit / acts.stride));
    for (size_t t0 = 0; t0 < x.n; t0 += per_group) {
      const size_t n = (size_t)std::min<uint64_t>(per_group, x.n - t0);
      ensure(act_, (VkDeviceSize)n * acts.stride);
      ensure(out_, (VkDeviceSize)n * out_row);
      std::memcpy(act_.map, acts.row(t0), n * acts.stride);
      const Push push{(uint32_t)y.width, (uint32_t)W.cols, (uint32_t)n, (uint32_t)row0, (uint32_t)W.row_bytes,
                      (uint32_t)acts.stride, g.kind, round ? 1u : 0u};
      dispatch(g.q8_0 ? q8_0_ : float_, g.b, push, (uint32_t)((y.width + kGroup - 1) / kGroup), (uint32_t)n);
      const float* out = static_cast<const float*>(out_.map);
      for (size_t t = 0; t < n; ++t) std::memcpy(y.row(t0 + t), out + t * y.width, out_row);
    }
    ++st_.linear_on_device;
  }

  // The shared expert's three projections through linear() (on the device where their weights
  // are), the SwiGLU between them on the host: the CPU backend's shared_ffn, operation for
  // operation.
  void shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                  Mat out) const override {
    const size_t n = x.n, F = gate.rows;
    std::vector<float> g(n * F), u(n * F);
    linear(gate, x, Mat{g.data(), n, F, F}, true, 0);
    linear(up, x, Mat{u.data(), n, F, F}, true, 0);
    for (size_t k = 0; k < g.size(); ++k) g[k] = swiglu(g[k], u[k], limit, 1.0f);
    linear(down, CMat{g.data(), n, F, F}, out, true, 0);
  }

  GpuStats stats() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return st_;
  }

 private:
  static int resolved(int threads) { return threads > 0 ? threads : std::max(1, (int)std::thread::hardware_concurrency()); }

  void init_objects() {
    vkGetDeviceQueue(dev_, family_, 0, &queue_);
    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = family_;
    check(vkCreateCommandPool(dev_, &pci, nullptr, &cmd_pool_), "creating a command pool");
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = cmd_pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(dev_, &cai, &cmd_), "allocating a command buffer");
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check(vkCreateFence(dev_, &fci, nullptr, &fence_), "creating a fence");

    VkDescriptorSetLayoutBinding b[3]{};
    for (uint32_t i = 0; i < 3; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dl{};
    dl.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    dl.bindingCount = 3;
    dl.pBindings = b;
    check(vkCreateDescriptorSetLayout(dev_, &dl, nullptr, &set_layout_), "creating a descriptor set layout");
    VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push)};
    VkPipelineLayoutCreateInfo pl{};
    pl.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pl.setLayoutCount = 1;
    pl.pSetLayouts = &set_layout_;
    pl.pushConstantRangeCount = 1;
    pl.pPushConstantRanges = &pr;
    check(vkCreatePipelineLayout(dev_, &pl, nullptr, &layout_), "creating a pipeline layout");
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 3};
    VkDescriptorPoolCreateInfo dp{};
    dp.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dp.maxSets = 1;
    dp.poolSizeCount = 1;
    dp.pPoolSizes = &ps;
    check(vkCreateDescriptorPool(dev_, &dp, nullptr, &desc_pool_), "creating a descriptor pool");
    VkDescriptorSetAllocateInfo da{};
    da.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    da.descriptorPool = desc_pool_;
    da.descriptorSetCount = 1;
    da.pSetLayouts = &set_layout_;
    check(vkAllocateDescriptorSets(dev_, &da, &set_), "allocating a descriptor set");
    q8_0_ = pipeline(kLinearQ8_0, sizeof kLinearQ8_0, "linear_q8_0");
    if (float64_) float_ = pipeline(kLinearFloat, sizeof kLinearFloat, "linear_float");
  }

  VkPipeline pipeline(const uint32_t* code, size_t bytes, const char* what) {
    VkShaderModuleCreateInfo sm{};
    sm.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    sm.codeSize = bytes;
    sm.pCode = code;
    VkShaderModule mod = VK_NULL_HANDLE;
    VkResult r = vkCreateShaderModule(dev_, &sm, nullptr, &mod);
    if (r != VK_SUCCESS) throw Error(std::string("vulkan: the driver refused shader ") + what + ": " + result_name(r));
    VkComputePipelineCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = mod;
    ci.stage.pName = "main";
    ci.layout = layout_;
    VkPipeline p = VK_NULL_HANDLE;
    r = vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
    vkDestroyShaderModule(dev_, mod, nullptr);
    if (r != VK_SUCCESS) throw Error(std::string("vulkan: the driver could not build shader ") + what + ": " + result_name(r));
    return p;
  }

  // A weight's buffer in device-local memory: mapped when that memory is host-visible (UMA,
  // lavapipe, resizable BAR), else filled through the staging copy (upload()).
  Buffer make_weight_buffer(VkDeviceSize bytes) const {
    if (local_type_ == UINT32_MAX) return make_buffer(bytes);
    const VkMemoryPropertyFlags mapped = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                         VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if (!force_staging_) {
      try {
        return make_buffer(bytes, mapped, true);
      } catch (const Error&) {
        // No such type, or its heap is full (a 256 MiB BAR window): the unmapped kind below.
      }
    }
    return make_buffer(bytes, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false);
  }

  // Copies bytes into b: directly when it is mapped, else in chunks through the staging buffer
  // with one transfer each (mu_ held or not yet shared).
  void upload(Buffer& b, const uint8_t* src, uint64_t bytes) const {
    if (b.map) {
      std::memcpy(b.map, src, bytes);
      return;
    }
    ensure(stage_, std::min<uint64_t>(bytes, staging_bytes_));
    for (uint64_t off = 0; off < bytes; off += staging_bytes_) {
      const uint64_t n = std::min<uint64_t>(staging_bytes_, bytes - off);
      std::memcpy(stage_.map, src + off, n);
      VkBufferCopy region{0, off, n};
      submit([&] { vkCmdCopyBuffer(cmd_, stage_.buf, b.buf, 1, &region); }, "uploading a weight");
    }
    ++st_.staged_uploads;
  }

  Buffer make_buffer(VkDeviceSize bytes) const {
    return make_buffer(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, true);
  }

  // A storage buffer in the first memory type with all of `flags` (mapped when `map`).
  Buffer make_buffer(VkDeviceSize bytes, VkMemoryPropertyFlags flags, bool map) const {
    Buffer out;
    // Whole words: the shaders read bytes out of uint words, and a word past the binding's end
    // would be out of bounds (a 34-byte Q8_0 row's last two codes share its last word).
    out.size = std::max<VkDeviceSize>((bytes + 3) / 4 * 4, 16);
    VkBufferCreateInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = out.size;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev_, &bi, nullptr, &out.buf), "creating a buffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev_, out.buf, &req);
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mem_.memoryTypeCount && type == UINT32_MAX; ++i)
      if ((req.memoryTypeBits & (1u << i)) && (mem_.memoryTypes[i].propertyFlags & flags) == flags) type = i;
    if (type == UINT32_MAX) {
      vkDestroyBuffer(dev_, out.buf, nullptr);
      throw Error("vulkan: no memory type for a storage buffer with flags " + std::to_string(flags));
    }
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = type;
    VkResult r = vkAllocateMemory(dev_, &ai, nullptr, &out.mem);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(dev_, out.buf, out.mem, 0);
    if (r == VK_SUCCESS && map) r = vkMapMemory(dev_, out.mem, 0, VK_WHOLE_SIZE, 0, &out.map);
    if (r != VK_SUCCESS) {
      free_buffer(out);
      throw Error("vulkan: allocating " + std::to_string(bytes) + " bytes failed: " + result_name(r));
    }
    if (out.map) std::memset(out.map, 0, out.size);
    return out;
  }

  void free_buffer(Buffer& b) const {
    if (b.map) vkUnmapMemory(dev_, b.mem);
    if (b.buf) vkDestroyBuffer(dev_, b.buf, nullptr);
    if (b.mem) vkFreeMemory(dev_, b.mem, nullptr);
    b = Buffer{};
  }

  // Grows b to hold `bytes` (never shrinks: it is reused by every call).
  void ensure(Buffer& b, VkDeviceSize bytes) const {
    if (b.size >= bytes) return;
    free_buffer(b);
    b = make_buffer(bytes);
  }

  // Runs one linear dispatch to completion (mu_ held). A failure leaves y untouched: the caller
  // copies the output only after the fence signalled.
  void dispatch(VkPipeline p, const Buffer& weights, const Push& push, uint32_t gx, uint32_t gy) const {
    VkDescriptorBufferInfo bi[3] = {{weights.buf, 0, VK_WHOLE_SIZE}, {act_.buf, 0, VK_WHOLE_SIZE}, {out_.buf, 0, VK_WHOLE_SIZE}};
    VkWriteDescriptorSet wr[3]{};
    for (uint32_t i = 0; i < 3; ++i) {
      wr[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      wr[i].dstSet = set_;
      wr[i].dstBinding = i;
      wr[i].descriptorCount = 1;
      wr[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      wr[i].pBufferInfo = &bi[i];
    }
    vkUpdateDescriptorSets(dev_, 3, wr, 0, nullptr);
    submit(
        [&] {
          vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p);
          vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &set_, 0, nullptr);
          vkCmdPushConstants(cmd_, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, &push);
          vkCmdDispatch(cmd_, gx, gy, 1);
        },
        "a linear dispatch");
  }

  // Records `cmds` into the command buffer, submits it and waits (mu_ held). The barrier at the
  // end makes transfers and shader writes visible to the host and to the next submission.
  template <class Record>
  void submit(Record&& cmds, const char* what) const {
    check(vkResetCommandBuffer(cmd_, 0), "resetting the command buffer");
    VkCommandBufferBeginInfo begin{};
    begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(cmd_, &begin), "recording commands");
    cmds();
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT;
    vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0,
                         nullptr);
    check(vkEndCommandBuffer(cmd_), "recording commands");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd_;
    check(vkQueueSubmit(queue_, 1, &si, fence_), what);
    VkResult r = vkWaitForFences(dev_, 1, &fence_, VK_TRUE, kFenceTimeoutNs);
    if (r == VK_SUCCESS) {
      check(vkResetFences(dev_, 1, &fence_), "resetting a fence");
      if (fault_ && fault_()) r = VK_ERROR_DEVICE_LOST;
    }
    if (r != VK_SUCCESS)
      throw Error(std::string("vulkan: ") + what + " on " + info_.name + " did not finish: " + result_name(r) +
                  " (the sequence is left as it was)");
  }

  void destroy() {
    if (!dev_) return;
    vkDeviceWaitIdle(dev_);
    for (GpuWeight& g : weights_) free_buffer(g.b);
    free_buffer(act_);
    free_buffer(out_);
    free_buffer(stage_);
    if (q8_0_) vkDestroyPipeline(dev_, q8_0_, nullptr);
    if (float_) vkDestroyPipeline(dev_, float_, nullptr);
    if (desc_pool_) vkDestroyDescriptorPool(dev_, desc_pool_, nullptr);
    if (layout_) vkDestroyPipelineLayout(dev_, layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(dev_, set_layout_, nullptr);
    if (fence_) vkDestroyFence(dev_, fence_, nullptr);
    if (cmd_pool_) vkDestroyCommandPool(dev_, cmd_pool_, nullptr);
    vkDestroyDevice(dev_, nullptr);
    dev_ = VK_NULL_HANDLE;
  }

  std::function<bool()> fault_;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  GpuDevice info_;
  VkPhysicalDeviceMemoryProperties mem_{};
  uint32_t family_ = UINT32_MAX, local_type_ = UINT32_MAX;
  bool force_staging_ = false;
  uint64_t staging_bytes_ = kGpuStagingBytes;
  uint64_t max_range_ = 0, budget_ = 0;
  bool float64_ = false;  // shaderFloat64: the float formats' shader can run
  VkDevice dev_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkDescriptorPool desc_pool_ = VK_NULL_HANDLE;
  VkDescriptorSet set_ = VK_NULL_HANDLE;
  VkPipeline q8_0_ = VK_NULL_HANDLE, float_ = VK_NULL_HANDLE;

  // One queue, one command buffer and one descriptor set: linear() calls take turns (the forward
  // pass issues ops from one thread; the lock keeps a second engine on the backend safe).
  mutable std::mutex mu_;
  mutable std::deque<GpuWeight> weights_;  // stable addresses: Weight::device points here
  mutable Buffer act_, out_, stage_;
  mutable GpuStats st_;
};

}  // namespace

bool vulkan_built() { return true; }

std::vector<GpuDevice> vulkan_devices() {
  std::vector<GpuDevice> out;
  const std::vector<VkPhysicalDevice> devs = instance().devices();
  for (uint32_t i = 0; i < devs.size(); ++i) out.push_back(describe(devs[i], i));
  return out;
}

std::unique_ptr<Backend> make_vulkan_backend(const GpuOptions& o) { return std::make_unique<VulkanBackend>(o); }

GpuStats gpu_stats(const Backend& b) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  return v ? v->stats() : GpuStats{};
}

#else  // no Vulkan in this build

namespace {
[[noreturn]] void not_built() {
  throw Error("this sluice was built without the Vulkan backend (install libvulkan-dev and glslc, then rebuild; "
              "scripts/setup does)");
}
}  // namespace

bool vulkan_built() { return false; }
std::vector<GpuDevice> vulkan_devices() { not_built(); }
std::unique_ptr<Backend> make_vulkan_backend(const GpuOptions&) { not_built(); }
GpuStats gpu_stats(const Backend&) { return {}; }

#endif

}  // namespace sluice
