#include "backend/vulkan_backend.h"

#include "util/error.h"
#include "util/format_bytes.h"

#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"
#endif

namespace sluice {

#if SLUICE_HAVE_VULKAN

// The backend's construction, its device objects and pipelines, buffers and weights, and its
// stats; the class is in vulkan_backend_impl.h, its other members by job in vulkan_linears.cpp,
// vulkan_batch.cpp, vulkan_row_ops.cpp, vulkan_attention.cpp and vulkan_experts.cpp.
namespace vk_backend {

VulkanBackend::VulkanBackend(const GpuOptions& o) : CpuBackend(resolved(o.threads)), fault_(o.fault), fault_before_(o.fault_before_submit), fault_shader_(o.fault_shader) {
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
  for (uint32_t i = 0; i < mem_.memoryTypeCount && local_type_ == UINT32_MAX; ++i)
    if (mem_.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) local_type_ = i;
  st_.weights_in_host_memory = info_.uma || local_type_ == UINT32_MAX;
  const GpuWeightBudget wb = gpu_weight_budget(info_.heaps, st_.weights_in_host_memory, o.weight_budget, info_.name);
  io_limit_ = std::min<uint64_t>(info_.max_storage_buffer, o.io_staging_bytes ? o.io_staging_bytes : kGpuStagingBytes);
  // A card with memory of its own keeps the batch's rows there (the shaders chain through them
  // many times a layer; PCIe or BAR reads of host memory would carry every one) and copies out
  // only what the host reads. Its bytes come first out of the device's budget.
  scratch_local_ = local_type_ != UINT32_MAX && (!st_.weights_in_host_memory || o.scratch_on_device);
  GpuDeviceNeeds needs;
  needs.scratch = scratch_local_ ? io_limit_ : 0;
  // The attention rows it keeps (--gpu-kv; auto: some where the batch's rows are the card's, so
  // a step's rows need not cross again) are the sequence state it holds.
  kv_bytes_ = o.kv_auto ? (scratch_local_ ? std::min<uint64_t>({kGpuKvAutoBytes, wb.bytes / 8, max_range_}) : 0) : o.kv_bytes;
  if (kv_bytes_ > max_range_)  // one binding holds them all
    throw Error("vulkan: --gpu-kv " + format_bytes(kv_bytes_) + " is more than device " + info_.name +
                " binds at once (" + format_bytes(max_range_) + ")");
  needs.sequence_state = kv_bytes_;
  const GpuDevicePlan dp = gpu_device_plan(wb, st_.weights_in_host_memory, needs, info_.name);  // throws: no room
  budget_ = dp.for_weights;
  st_.device_total = wb.bytes;
  st_.device = info_.name;
  st_.device_budget = budget_;
  st_.budget_why = wb.why;
  st_.scratch_on_device = scratch_local_;
  st_.scratch_bytes = needs.scratch;
  st_.kv_bytes = kv_bytes_;
  force_staging_ = o.force_staging;
  host_quantize_ = o.host_quantize;
  slots_wanted_ = o.expert_slots;
  split_ = ExpertSplit(std::clamp(o.cpu_experts, 0.0, 1.0), o.cpu_experts_auto);
  indexer_ = o.indexer;
  st_.gemm_tile = kGemmTile;
  // Timestamps measure the device's part of the expert split (auto); without them the wall
  // time of a submission the CPU did not overlap stands in.
  ts_bits_ = qf[family_].timestampValidBits;
  {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(phys_, &props);
    offset_align_ = props.limits.minStorageBufferOffsetAlignment;
    if (props.limits.maxPerStageDescriptorStorageBuffers < kBindings)
      throw Error("vulkan: device " + info_.name + " lets a shader bind " +
                  std::to_string(props.limits.maxPerStageDescriptorStorageBuffers) + " storage buffers; sluice's take " +
                  std::to_string(kBindings));
    ts_period_ns_ = props.limits.timestampPeriod;
    max_groups_x_ = props.limits.maxComputeWorkGroupCount[0];
    if (o.max_groups_x) max_groups_x_ = std::min(max_groups_x_, o.max_groups_x);
  }
  gemm_ = o.gemm;
  if (o.linears == GpuLinears::Subgroup && !info_.subgroup_linears)
    throw Error("vulkan: device " + info_.name + " cannot run the linears a subgroup per output (it needs ballots "
                "and shuffles in compute shaders and subgroups of 8 to 64 lanes; it has " +
                std::to_string(info_.subgroup_size) + "); use --gpu-linears plain or auto");
  subgroup_ = o.linears == GpuLinears::Subgroup || (o.linears == GpuLinears::Auto && auto_subgroup_linears(info_));
  st_.subgroup_linears = subgroup_;
  if (o.int_dot == GpuIntDot::On && !info_.int_dot)
    throw Error("vulkan: device " + info_.name + " has no integer dot product (VK_KHR_shader_integer_dot_product "
                "with its shaderIntegerDotProduct feature); use --gpu-int-dot off or auto");
  int_dot_ = o.int_dot == GpuIntDot::On || (o.int_dot == GpuIntDot::Auto && auto_int_dot(info_));
  st_.int_dot = int_dot_;
  st_.subgroup_size = info_.subgroup_size;
  staging_bytes_ = o.staging_bytes ? o.staging_bytes : kGpuStagingBytes;

  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qci[2]{};
  qci[0].sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  qci[0].queueFamilyIndex = family_;
  qci[0].queueCount = 1;
  qci[0].pQueuePriorities = &prio;
  // Timeline semaphores (Vulkan 1.2): the hint-started copies signal one, and a submission
  // that touches a slot they fill waits for its value. With them, the copies go on a queue
  // family of their own where the device has one for transfers only (a discrete card's DMA
  // engines), so they overlap the compute queue's work; else on the compute queue.
  VkPhysicalDeviceTimelineSemaphoreFeatures tl{};
  tl.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES;
  timeline_ok_ = info_.timeline && !o.no_timeline;  // describe() asked the device
  xfer_family_ = timeline_ok_ && info_.transfer_queue ? info_.transfer_family : family_;
  qci[1] = qci[0];
  qci[1].queueFamilyIndex = xfer_family_;
  st_.timeline_semaphores = timeline_ok_;
  st_.transfer_queue = xfer_family_ != family_;
  // The float linear shader computes the CPU's fused fma exactly with doubles (linear_float.comp).
  VkPhysicalDeviceFeatures have{};
  vkGetPhysicalDeviceFeatures(phys_, &have);
  float64_ = have.shaderFloat64 == VK_TRUE;
  VkPhysicalDeviceFeatures enable{};
  enable.shaderFloat64 = have.shaderFloat64;
  // On an integrated GPU or CPU device the weights' own pages can be the device's
  // (VK_EXT_external_memory_host): no copy, and the host's plan counts them once.
  import_ = info_.uma && info_.host_import && !o.no_import && !o.force_staging;
  in_place_ = o.experts_in_place;
  if (in_place_) {
    if (o.expert_slots) throw Error("vulkan: routed experts go either in slots or in place, not both");
    if (o.cpu_experts > 0 || o.cpu_experts_auto)
      throw Error("vulkan: --cpu-experts shares out slot misses, and in-place experts are never copied");
    if (!import_)
      throw Error("vulkan: --gpu-experts in-place runs experts from the host's memory, which " + info_.name +
                  (!info_.uma ? " cannot use in place: it is a " + info_.kind + " device with memory of its own (use --gpu-experts N)"
                   : !info_.host_import ? " cannot import: the driver lacks VK_EXT_external_memory_host"
                                        : " is told not to import here (staging or no-import forced)"));
  }
  st_.experts_in_place = in_place_;
  st_.hint_staging = prefetches_experts();
  st_.experts_auto = o.experts_auto;
  std::vector<const char*> exts;
  if (import_) exts.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  VkDeviceCreateInfo dci{};
  dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  dci.queueCreateInfoCount = xfer_family_ != family_ ? 2 : 1;
  dci.pQueueCreateInfos = qci;
  // The feature structs the device is created with, each linked in front of the last.
  void* chain = nullptr;
  tl.timelineSemaphore = timeline_ok_ ? VK_TRUE : VK_FALSE;
  if (timeline_ok_) {
    tl.pNext = chain;
    chain = &tl;
  }
  // The integer dot product's builds declare SPV_KHR_integer_dot_product, which the device
  // takes with its extension (promoted to Vulkan 1.3, where naming it is still valid).
  VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot{};
  dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR;
  if (int_dot_) {
    exts.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    dot.shaderIntegerDotProduct = VK_TRUE;
    dot.pNext = chain;
    chain = &dot;
  }
  dci.pNext = chain;
  dci.pEnabledFeatures = &enable;
  dci.enabledExtensionCount = (uint32_t)exts.size();
  dci.ppEnabledExtensionNames = exts.empty() ? nullptr : exts.data();
  check(vkCreateDevice(phys_, &dci, nullptr, &dev_), "creating the device");
  if (import_) {
    host_ptr_props_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(dev_, "vkGetMemoryHostPointerPropertiesEXT"));
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp{};
    hp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT;
    vk::query_properties(phys_, hp);
    import_align_ = std::max<VkDeviceSize>(hp.minImportedHostPointerAlignment, 4);
    import_ = host_ptr_props_ != nullptr;
    if (!import_ && in_place_) {
      destroy();
      throw Error("vulkan: --gpu-experts in-place: " + info_.name + " gives no vkGetMemoryHostPointerPropertiesEXT");
    }
  }
  st_.imports_host_memory = import_;
  try {
    init_objects();
  } catch (...) {
    destroy();
    throw;
  }
}

void VulkanBackend::prepare_weight(Weight& w) const {
  CpuBackend::prepare_weight(w);  // the CPU path stays ready: other ops and fallbacks use it
  uint32_t kind = 0;
  const VkPipeline pipe = pipeline_for(w.type, kind);
  const uint64_t bytes = w.rows * w.row_bytes;
  const std::lock_guard<std::mutex> lk(mu_);
  if (!pipe || !w.data || bytes == 0 || bytes > max_range_ ||
      st_.bytes_on_device + st_.bytes_imported + bytes > budget_) {
    ++st_.weights_on_host;
    return;
  }
  if (import_) {
    // The weight's own pages, or the CPU: the plan counted no copy (imports_host_memory).
    GpuWeight g;
    if (!import_pages(w.data, bytes, g)) {
      ++st_.weights_on_host;
      ++st_.imports_refused;
      return;
    }
    g.kind = kind;
    g.pipe = pipe;
    g.imported = true;
    w.device = &weights_.emplace_back(g);
    ++st_.weights_on_device;
    ++st_.weights_imported;
    st_.bytes_imported += bytes;
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
  g.pipe = pipe;
  w.device = &g;
  ++st_.weights_on_device;
  st_.bytes_on_device += bytes;
}

void VulkanBackend::prepare_weight_for(Weight& w, WeightUse use) const {
  if (use == WeightUse::Linear || (use == WeightUse::HcMix && hc_mix_ != VK_NULL_HANDLE))
    prepare_weight(w);
  else
    CpuBackend::prepare_weight(w);
}

GpuStats VulkanBackend::stats() const {
  const std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

void VulkanBackend::release_imports() const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();  // its dispatches may read the imports
  vkDeviceWaitIdle(dev_);
  for (GpuWeight& g : weights_)
    if (g.imported) {
      free_buffer(g.b);
      g.imported = false;
    }
  release_expert_chunks();
  in_place_released_ = true;  // the sources' memory may go now: later routed calls run on the CPU
}

GpuCopyBandwidth VulkanBackend::copy_bandwidth(uint64_t bytes, int passes) const {
  GpuCopyBandwidth r;
  r.bytes = bytes = std::max<uint64_t>(bytes, 4096);
  r.passes = passes = std::max(passes, 1);
  std::vector<uint8_t> src(bytes), dst(bytes);
  for (uint64_t i = 0; i < bytes; i += 4096) src[i] = (uint8_t)(i >> 12);
  using clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> copy, plain;
  const std::lock_guard<std::mutex> lk(mu_);
  Buffer b = make_weight_buffer(bytes);
  try {
    r.staged = b.map == nullptr;
    for (int i = 0; i <= passes; ++i) {  // pass 0 untimed: first touch of the pages
      const auto t0 = clock::now();
      upload(b, src.data(), bytes);
      const auto t1 = clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      const auto t2 = clock::now();
      if (i == 0) continue;
      copy.push_back((double)bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
      plain.push_back((double)bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
    }
  } catch (...) {
    free_buffer(b);
    throw;
  }
  free_buffer(b);
  if (r.staged) st_.staged_uploads -= (uint64_t)passes + 1;  // not weights
  r.median_gbps = median(copy);
  r.min_gbps = *std::min_element(copy.begin(), copy.end());
  r.max_gbps = *std::max_element(copy.begin(), copy.end());
  r.memcpy_gbps = median(plain);
  return r;
}

bool VulkanBackend::import_pages(const uint8_t* data, uint64_t bytes, GpuWeight& g) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data), a = (uintptr_t)import_align_;
  const uintptr_t base = p / a * a, end = (p + bytes + a - 1) / a * a;
  const VkDeviceSize len = end - base;
  if (len > max_range_ || (p - base) % 4 != 0) return false;  // the shaders read words
  void* host = reinterpret_cast<void*>(base);
  VkMemoryHostPointerPropertiesEXT hp{};
  hp.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT;
  if (host_ptr_props_(dev_, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &hp) != VK_SUCCESS) return false;
  VkExternalMemoryBufferCreateInfo eb{};
  eb.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO;
  eb.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  VkBufferCreateInfo bi{};
  bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bi.pNext = &eb;
  bi.size = len;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  Buffer out;
  if (vkCreateBuffer(dev_, &bi, nullptr, &out.buf) != VK_SUCCESS) return false;
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev_, out.buf, &req);
  uint32_t type = UINT32_MAX;
  for (uint32_t i = 0; i < mem_.memoryTypeCount && type == UINT32_MAX; ++i)
    if (req.memoryTypeBits & hp.memoryTypeBits & (1u << i)) type = i;
  VkImportMemoryHostPointerInfoEXT imp{};
  imp.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT;
  imp.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  imp.pHostPointer = host;
  VkMemoryAllocateInfo ai{};
  ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  ai.pNext = &imp;
  ai.allocationSize = len;
  ai.memoryTypeIndex = type;
  if (type == UINT32_MAX || req.size > len || vkAllocateMemory(dev_, &ai, nullptr, &out.mem) != VK_SUCCESS ||
      vkBindBufferMemory(dev_, out.buf, out.mem, 0) != VK_SUCCESS) {
    free_buffer(out);
    return false;
  }
  out.size = len;
  g.b = out;
  g.w_off = (uint32_t)(p - base);
  return true;
}

VkPipeline VulkanBackend::pipeline_for(GgmlType type, uint32_t& kind) const {
  switch (type) {
    case GgmlType::F32: kind = 0; return float_;
    case GgmlType::F16: kind = 1; return float_;
    case GgmlType::BF16: kind = 2; return float_;
    default: break;
  }
  for (size_t i = 0; i < kQuantShaderCount; ++i)
    if (kQuantShaders[i].type == type) return quant_[i];
  return VK_NULL_HANDLE;
}

void VulkanBackend::init_objects() {
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
  if (xfer_family_ != family_) {
    vkGetDeviceQueue(dev_, xfer_family_, 0, &xfer_queue_);
    pci.queueFamilyIndex = xfer_family_;
    check(vkCreateCommandPool(dev_, &pci, nullptr, &xfer_pool_), "creating a command pool");
    cai.commandPool = xfer_pool_;
  } else {
    xfer_queue_ = queue_;
  }
  cai.commandBufferCount = 2;
  check(vkAllocateCommandBuffers(dev_, &cai, hint_cmd_), "allocating a command buffer");
  if (timeline_ok_) {
    VkSemaphoreTypeCreateInfo ty{};
    ty.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
    ty.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo sci{};
    sci.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
    sci.pNext = &ty;
    check(vkCreateSemaphore(dev_, &sci, nullptr, &timeline_), "creating a semaphore");
  }
  VkFenceCreateInfo fci{};
  fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
  check(vkCreateFence(dev_, &fci, nullptr, &fence_), "creating a fence");
  check(vkCreateFence(dev_, &fci, nullptr, &hint_fence_), "creating a fence");
  if (ts_bits_ != 0 && ts_period_ns_ > 0) {
    VkQueryPoolCreateInfo qp{};
    qp.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    qp.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qp.queryCount = 2;
    if (vkCreateQueryPool(dev_, &qp, nullptr, &timestamps_) != VK_SUCCESS) timestamps_ = VK_NULL_HANDLE;
  }

  VkDescriptorSetLayoutBinding b[kBindings]{};
  for (uint32_t i = 0; i < kBindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo dl{};
  dl.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
  dl.bindingCount = kBindings;
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
  // A set per dispatch of one submission (a group of experts' projections).
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSets * kBindings};
  VkDescriptorPoolCreateInfo dp{};
  dp.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
  dp.maxSets = kSets;
  dp.poolSizeCount = 1;
  dp.pPoolSizes = &ps;
  check(vkCreateDescriptorPool(dev_, &dp, nullptr, &desc_pool_), "creating a descriptor pool");
  VkDescriptorSetAllocateInfo da{};
  da.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
  da.descriptorPool = desc_pool_;
  const std::vector<VkDescriptorSetLayout> layouts(kSets, set_layout_);
  da.descriptorSetCount = kSets;
  da.pSetLayouts = layouts.data();
  check(vkAllocateDescriptorSets(dev_, &da, sets_), "allocating descriptor sets");
  for (size_t i = 0; i < kQuantShaderCount; ++i) {
    const QuantShader& q = kQuantShaders[i];
    const LinearBuilds& b = int_dot_ ? q.dot : q.scalar;
    quant_[i] = pipeline(subgroup_ ? b.sg : b.plain, q.name);
    if (subgroup_) quant_tiled_[i] = pipeline(b.sgt, q.name);
    // A format whose GEMM tile does not fit the device's workgroup memory keeps the build above.
    if (gemm_ && gemm_shared_bytes(q.type) <= info_.max_workgroup_memory) {
      quant_mm_[i] = pipeline(b.mm, q.name);
      ++st_.gemm_formats;
    }
  }
  if (float64_) float_ = pipeline(kOpShaders.linear_float, "linear_float");
  if (float64_ && gemm_) {
    float_mm_ = pipeline(kOpShaders.linear_float_mm, "linear_float_mm");
    st_.gemm_formats += 3;  // F32, F16, BF16
  }
  // The activation quantizers divide exactly with doubles (quantize_common.glsl); without them
  // the host quantizes.
  if (float64_ && !host_quantize_) {
    quantize_q8_0_ = pipeline(kOpShaders.quantize_q8_0, "quantize_q8_0");
    quantize_q8_k_ = pipeline(kOpShaders.quantize_q8_k, "quantize_q8_k");
    rms_norm_ = pipeline(kOpShaders.rms_norm, "rms_norm");
    swiglu_ = pipeline(kOpShaders.swiglu, "swiglu");
    exp_ = pipeline(kOpShaders.exp_f32, "exp_f32");
    hc_pre_ = pipeline(kOpShaders.hc_pre, "hc_pre");
    hc_post_ = pipeline(kOpShaders.hc_post, "hc_post");
    hc_mix_ = pipeline(kOpShaders.hc_mix, "hc_mix");
    rope_ = pipeline(kOpShaders.rope, "rope");
    engram_gate_ = pipeline(kOpShaders.engram_gate, "engram_gate");
    compress_ = pipeline(kOpShaders.compress_pool, "compress_pool");
    add_round_ = pipeline(kOpShaders.add_round, "add_round");
    routed_sum_ = pipeline(kOpShaders.routed_sum, "routed_sum");
    fake_quant_ = pipeline(kOpShaders.fake_quant, "fake_quant");
    index_scores_ = pipeline(kOpShaders.index_scores, "index_scores");
    // Its scores live in workgroup memory (attention.comp kMaxRows floats).
    if (info_.max_workgroup_memory >= kAttentionRows * sizeof(float) + 16)
      attention_ = pipeline(kOpShaders.attention, "attention");
    // exp_f32's constants (kernels/exp_f32.h), which the shaders' exp reads (exp_f32.glsl).
    const std::span<const double> ec = exp_f32_constants();
    exp_consts_ = make_buffer(ec.size_bytes());
    std::memcpy(exp_consts_.map, ec.data(), ec.size_bytes());
  }
  if (kv_bytes_ && attention_)
    kv_ = local_type_ != UINT32_MAX ? make_buffer(kv_bytes_, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false)
                                    : make_buffer(kv_bytes_);
  // The IQ2 grids, read by linear_iq2_xxs / linear_iq2_xs (shaders/linear_common.glsl Tables).
  tables_ = make_buffer(sizeof iq2xxs_grid + sizeof iq2xs_grid);
  std::memcpy(tables_.map, iq2xxs_grid, sizeof iq2xxs_grid);
  std::memcpy(static_cast<uint8_t*>(tables_.map) + sizeof iq2xxs_grid, iq2xs_grid, sizeof iq2xs_grid);
}

VkPipeline VulkanBackend::pipeline(Spirv spv, const char* what) {
  VkShaderModuleCreateInfo sm{};
  sm.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
  sm.codeSize = spv.bytes;
  sm.pCode = spv.code;
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
  r = fault_shader_ && fault_shader_(what) ? VK_ERROR_OUT_OF_DEVICE_MEMORY
                                           : vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
  vkDestroyShaderModule(dev_, mod, nullptr);
  if (r != VK_SUCCESS) throw Error(std::string("vulkan: the driver could not build shader ") + what + ": " + result_name(r));
  return p;
}

Buffer VulkanBackend::make_weight_buffer(VkDeviceSize bytes) const {
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

void VulkanBackend::upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const {
  if (b.map) {
    std::memcpy(static_cast<uint8_t*>(b.map) + at, src, bytes);
    return;
  }
  if (!pending_.empty()) flush_uploads();  // the staging buffer holds their bytes
  ensure(stage_, std::min<uint64_t>(bytes, staging_bytes_));
  for (uint64_t off = 0; off < bytes; off += staging_bytes_) {
    const uint64_t n = std::min<uint64_t>(staging_bytes_, bytes - off);
    std::memcpy(stage_.map, src + off, n);
    VkBufferCopy region{0, at + off, n};
    submit([&] { vkCmdCopyBuffer(cmd_, stage_.buf, b.buf, 1, &region); }, "uploading a weight");
  }
  ++st_.staged_uploads;
}

Buffer VulkanBackend::make_buffer(VkDeviceSize bytes, VkMemoryPropertyFlags flags, bool map) const {
  Buffer out;
  // Whole words: the shaders read bytes out of uint words, and a word past the binding's end
  // would be out of bounds (a 34-byte Q8_0 row's last two codes share its last word).
  out.size = std::max<VkDeviceSize>((bytes + 3) / 4 * 4, 16);
  VkBufferCreateInfo bi{};
  bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bi.size = out.size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  // Two queue families (the hint copies' transfer queue): every buffer is theirs together.
  const uint32_t families[2] = {family_, xfer_family_};
  const bool two = xfer_family_ != family_ && xfer_family_ != UINT32_MAX;
  bi.sharingMode = two ? VK_SHARING_MODE_CONCURRENT : VK_SHARING_MODE_EXCLUSIVE;
  if (two) {
    bi.queueFamilyIndexCount = 2;
    bi.pQueueFamilyIndices = families;
  }
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

void VulkanBackend::free_buffer(Buffer& b) const {
  if (b.map) vkUnmapMemory(dev_, b.mem);
  if (b.buf) vkDestroyBuffer(dev_, b.buf, nullptr);
  if (b.mem) vkFreeMemory(dev_, b.mem, nullptr);
  b = Buffer{};
}

void VulkanBackend::ensure(Buffer& b, VkDeviceSize bytes) const {
  if (b.size >= bytes) return;
  free_buffer(b);
  b = make_buffer(bytes);
}

VkDeviceSize VulkanBackend::aligned(VkDeviceSize b) const {
  const VkDeviceSize a = offset_align();
  return (b + a - 1) / a * a;
}

void VulkanBackend::ensure_io() const {
  ensure(act_, io_limit_);
  ensure_out();
}

void VulkanBackend::ensure_out() const {
  if (out_.size >= io_limit_) return;
  free_buffer(out_);
  if (!scratch_local_) {
    out_ = make_buffer(io_limit_);
    return;
  }
  out_ = make_buffer(io_limit_, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false);
  ensure(back_, io_limit_);
}

void VulkanBackend::put_rows(const void* src, size_t bytes) const {
  if (out_.map) std::memcpy(out_.map, src, bytes);
  else upload(out_, 0, static_cast<const uint8_t*>(src), bytes);
}

void VulkanBackend::destroy() {
  if (!dev_) return;
  vkDeviceWaitIdle(dev_);
  for (GpuWeight& g : weights_) free_buffer(g.b);
  for (Buffer& b : slabs_) free_buffer(b);
  release_expert_chunks();
  free_buffer(act_);
  free_buffer(out_);
  free_buffer(back_);
  free_buffer(stage_);
  free_buffer(hint_stage_);
  free_buffer(tables_);
  free_buffer(exp_consts_);
  free_buffer(kv_);
  for (VkPipeline& q : quant_)
    if (q) vkDestroyPipeline(dev_, q, nullptr);
  for (VkPipeline& q : quant_tiled_)
    if (q) vkDestroyPipeline(dev_, q, nullptr);
  for (VkPipeline& q : quant_mm_)
    if (q) vkDestroyPipeline(dev_, q, nullptr);
  for (VkPipeline p : {float_, float_mm_, quantize_q8_0_, quantize_q8_k_, rms_norm_, swiglu_, exp_, hc_pre_, hc_post_, hc_mix_, rope_, attention_, engram_gate_, fake_quant_, compress_, add_round_, routed_sum_, index_scores_})
    if (p) vkDestroyPipeline(dev_, p, nullptr);
  if (desc_pool_) vkDestroyDescriptorPool(dev_, desc_pool_, nullptr);
  if (layout_) vkDestroyPipelineLayout(dev_, layout_, nullptr);
  if (set_layout_) vkDestroyDescriptorSetLayout(dev_, set_layout_, nullptr);
  if (fence_) vkDestroyFence(dev_, fence_, nullptr);
  if (hint_fence_) vkDestroyFence(dev_, hint_fence_, nullptr);
  if (timeline_) vkDestroySemaphore(dev_, timeline_, nullptr);
  if (xfer_pool_) vkDestroyCommandPool(dev_, xfer_pool_, nullptr);
  if (timestamps_) vkDestroyQueryPool(dev_, timestamps_, nullptr);
  if (cmd_pool_) vkDestroyCommandPool(dev_, cmd_pool_, nullptr);
  vkDestroyDevice(dev_, nullptr);
  dev_ = VK_NULL_HANDLE;
}

}  // namespace vk_backend

using vk::describe;
using vk::instance;
using vk_backend::VulkanBackend;

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

void release_gpu_imports(const Backend& b) {
  if (const auto* v = dynamic_cast<const VulkanBackend*>(&b)) v->release_imports();
}

void gpu_swiglu(const Backend& b, float* gu, size_t n, size_t width, float limit, const float* wk) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_swiglu: not a Vulkan backend");
  v->swiglu_alone(gu, n, width, limit, wk);
}

void gpu_exp(const Backend& b, float* x, size_t n) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_exp: not a Vulkan backend");
  v->exp_alone(x, n);
}

std::vector<float> gpu_engram_gates(const Backend& b, const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                    const float* q_norm, const float* k_norm, float eps) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_engram_gates: not a Vulkan backend");
  return v->engram_gates_alone(X, kv, n, hc, H, q_norm, k_norm, eps);
}

std::vector<uint32_t> gpu_compress_pool_unrounded(const Backend& b, CMat k, CMat g, uint32_t ratio, uint32_t p0,
                                                  float* carry_k, float* carry_s, Mat latents) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_compress_pool_unrounded: not a Vulkan backend");
  return v->compress_pool_unrounded(k, g, ratio, p0, carry_k, carry_s, latents);
}

std::vector<float> gpu_index_scores(const Backend& b, const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_index_scores: not a Vulkan backend");
  return v->index_scores_alone(a, cand);
}

void gpu_rms_norm(const Backend& b, float* x, size_t n, size_t width, const float* w, float eps) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_rms_norm: not a Vulkan backend");
  v->rms_norm_alone(x, n, width, w, eps);
}

std::vector<uint8_t> gpu_quantize(const Backend& b, ActType a, const float* x, size_t n, size_t cols) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_quantize: not a Vulkan backend");
  return v->quantize_alone(a, x, n, cols);
}

GpuCopyBandwidth measure_gpu_copy(const Backend& b, uint64_t bytes, int passes) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("measure_gpu_copy: not a Vulkan backend");
  return v->copy_bandwidth(bytes, passes);
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
GpuCopyBandwidth measure_gpu_copy(const Backend&, uint64_t, int) { not_built(); }
std::vector<uint8_t> gpu_quantize(const Backend&, ActType, const float*, size_t, size_t) { not_built(); }
void gpu_rms_norm(const Backend&, float*, size_t, size_t, const float*, float) { not_built(); }
void gpu_swiglu(const Backend&, float*, size_t, size_t, float, const float*) { not_built(); }
void gpu_exp(const Backend&, float*, size_t) { not_built(); }
std::vector<float> gpu_engram_gates(const Backend&, const float*, const float*, size_t, uint32_t, size_t, const float*,
                                    const float*, float) {
  not_built();
}
std::vector<uint32_t> gpu_compress_pool_unrounded(const Backend&, CMat, CMat, uint32_t, uint32_t, float*, float*, Mat) {
  not_built();
}
std::vector<float> gpu_index_scores(const Backend&, const IndexSelect&, std::vector<std::vector<uint8_t>>&) { not_built(); }
void release_gpu_imports(const Backend&) {}

#endif

bool auto_subgroup_linears(const GpuDevice& d) { return d.subgroup_linears && d.kind != "cpu"; }
bool auto_int_dot(const GpuDevice& d) { return d.int_dot && d.int_dot_accelerated; }

GpuExpertsChoice auto_gpu_experts(const GpuDevice& d, uint64_t max_slots) {
  GpuExpertsChoice c;
  if (d.kind == "cpu") {
    c.why = "a CPU device: the CPU backend runs the routed experts on the same cores";
  } else if (!d.uma) {
    c.slots = max_slots;
    c.why = "a " + d.kind + " device with memory of its own: slots, as many as the device budget holds";
  } else if (d.host_import) {
    c.in_place = true;
    c.why = "an integrated GPU that imports host memory: in place, no copies";
  } else {
    c.why = "an integrated GPU without VK_EXT_external_memory_host: slots would copy what the host store holds";
  }
  return c;
}

std::string gpu_linears_text(const GpuStats& g) {
  return (g.subgroup_linears ? "a subgroup of " + std::to_string(g.subgroup_size) + " per output"
                             : std::string("an invocation per output")) +
         (g.int_dot ? ", the device's integer dot product" : "") +
         (g.gemm_formats ? ", prefill GEMM tiles of " + std::to_string(g.gemm_tile) + " tokens" : std::string(", no GEMM"));
}

}  // namespace sluice
