#include "session.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "shaders.hpp"

namespace qfv {

namespace {

std::string vkerr(VkResult r) {
  switch (r) {
  case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
  case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
  case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
  case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
  case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
  case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
  case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
  case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
  default: return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

void check(VkResult r, const char *what) {
  if (r != VK_SUCCESS) {
    throw Error(QFV_ERR_DEVICE, std::string(what) + " failed: " + vkerr(r));
  }
}

[[noreturn]] void bad(const std::string &msg) {
  throw Error(QFV_ERR_BAD_REQUEST, msg);
}

const char *acc_suffix(qfv_accumulation a) {
  switch (a) {
  case QFV_ACC_INT64: return "I64";
  case QFV_ACC_U32X2: return "U32X2";
  case QFV_ACC_FLOAT64: return "F64";
  default: return "F32";
  }
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                             VkDebugUtilsMessageTypeFlagsEXT /*types*/,
                                             const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    auto *s = static_cast<Session *>(user);
    s->validation_messages.fetch_add(1);
    std::fprintf(stderr, "qfvulkan validation: %s\n", data->pMessage ? data->pMessage : "");
  }
  return VK_FALSE;
}

bool layer_available(const char *name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  for (const auto &l : layers) {
    if (std::strcmp(l.layerName, name) == 0) return true;
  }
  return false;
}

std::string lower(std::string s) {
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char *type_name(VkPhysicalDeviceType t) {
  switch (t) {
  case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
  case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated_gpu";
  case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete_gpu";
  case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual_gpu";
  default: return "other";
  }
}

// Frames one pattern dispatch walks in a loop (below gallivm's 65535-iteration cap).
constexpr uint64_t kMaxLoopFrames = 32768;

uint32_t groups_for(uint64_t items) {
  uint64_t g = (items + 63) / 64;
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(g, 65535)));
}

uint32_t u32(uint64_t v, const char *what) {
  if (v > 0xFFFFFFFFull) bad(std::string(what) + " exceeds 2**32 - 1");
  return static_cast<uint32_t>(v);
}

} // namespace

uint32_t dtype_bytes(qfv_dtype d) {
  switch (d) {
  case QFV_UINT8: return 1;
  case QFV_UINT16: return 2;
  case QFV_UINT32:
  case QFV_FLOAT32: return 4;
  default: return 8;
  }
}

bool validation_wanted(const qfv_options &opts) {
  const char *env = std::getenv("QFV_VALIDATION");
  return opts.validation != 0 || (env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0);
}

Session::Session(const qfv_options &opts) {
  try {
    create_instance(validation_wanted(opts));
    pick_device(opts);
    VkPhysicalDeviceFeatures f{};
    vkGetPhysicalDeviceFeatures(physical_, &f);
    has_int64_ = f.shaderInt64 == VK_TRUE;
    has_float64_ = f.shaderFloat64 == VK_TRUE;
    int_acc_ = (has_int64_ && opts.force_u32x2 == 0) ? QFV_ACC_INT64 : QFV_ACC_U32X2;
    real_acc_ = (has_float64_ && opts.force_float32 == 0) ? QFV_ACC_FLOAT64 : QFV_ACC_FLOAT32;
    create_device();
    create_pipelines();
    max_buffer_ = std::min<uint64_t>(props_.limits.maxStorageBufferRange, uint64_t(1) << 31);
    uint64_t room = heap_size_ > kScratchBytes ? heap_size_ - kScratchBytes : 0;
    budget_ = opts.budget_bytes != 0 ? std::min<uint64_t>(opts.budget_bytes, room) : room / 2;
    scratch_ = make_buffer(kScratchBytes);
    dummy_ = make_buffer(16);
  } catch (...) {
    cleanup();
    throw;
  }
}

Session::~Session() {
  cleanup();
}

void Session::cleanup() {
  if (device_ != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device_);
    for (auto &kv : chunks_) free_chunk(kv.second);
    chunks_.clear();
    for (auto &kv : weights_) {
      free_buffer(kv.second.ints);
      free_buffer(kv.second.reals);
      free_buffer(kv.second.bad);
    }
    weights_.clear();
    free_buffer(scratch_);
    free_buffer(dummy_);
    for (auto &kv : pipelines_) vkDestroyPipeline(device_, kv.second, nullptr);
    pipelines_.clear();
    if (pipeline_layout_) vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
    if (fence_) vkDestroyFence(device_, fence_, nullptr);
    if (command_pool_) vkDestroyCommandPool(device_, command_pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
    device_ = VK_NULL_HANDLE;
  }
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
    messenger_ = VK_NULL_HANDLE;
  }
  if (instance_ != VK_NULL_HANDLE) {
    vkDestroyInstance(instance_, nullptr);
    instance_ = VK_NULL_HANDLE;
  }
}

void Session::create_instance(bool validation) {
  const char *layer = "VK_LAYER_KHRONOS_validation";
  bool use_layer = validation && layer_available(layer);
  if (validation && !use_layer) {
    std::fprintf(stderr,
                 "qfvulkan: validation asked for but %s is not installed "
                 "(Debian: apt-get install vulkan-validationlayers)\n",
                 layer);
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "qfvulkan";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  const char *ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
  VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  mi.messageSeverity =
      VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  mi.messageType =
      VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT;
  mi.pfnUserCallback = on_validation;
  mi.pUserData = this;
  if (use_layer) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = &layer;
    ci.enabledExtensionCount = 1;
    ci.ppEnabledExtensionNames = &ext;
    ci.pNext = &mi;
  }
  check(vkCreateInstance(&ci, nullptr, &instance_), "vkCreateInstance");
  if (use_layer) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create) check(create(instance_, &mi, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
  }
}

void Session::pick_device(const qfv_options &opts) {
  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devs(n);
  check(vkEnumeratePhysicalDevices(instance_, &n, devs.data()), "vkEnumeratePhysicalDevices");
  if (n == 0) {
    throw Error(QFV_ERR_DEVICE, "no Vulkan device found (on Debian: apt-get install "
                                "mesa-vulkan-drivers for the lavapipe CPU device)");
  }
  std::vector<std::string> names;
  for (auto d : devs) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(d, &p);
    names.emplace_back(p.deviceName);
  }
  int pick = -1;
  if (opts.device_name != nullptr && opts.device_name[0] != '\0') {
    std::string want = lower(opts.device_name);
    std::vector<int> hits;
    for (uint32_t i = 0; i < n; ++i) {
      if (lower(names[i]) == want) {
        hits = {static_cast<int>(i)};
        break;
      }
      if (lower(names[i]).find(want) != std::string::npos) hits.push_back(static_cast<int>(i));
    }
    std::string all;
    for (uint32_t i = 0; i < n; ++i) all += (i ? ", " : "") + std::to_string(i) + ": " + names[i];
    if (hits.size() != 1) {
      throw Error(QFV_ERR_BAD_REQUEST, std::string("device name '") + opts.device_name + "' matches " +
                                           std::to_string(hits.size()) +
                                           " devices; give an exact name or an index among " + all);
    }
    pick = hits[0];
  } else if (opts.device_index >= 0) {
    if (static_cast<uint32_t>(opts.device_index) >= n) {
      throw Error(QFV_ERR_BAD_REQUEST, "device index " + std::to_string(opts.device_index) +
                                           " out of range: " + std::to_string(n) + " device(s)");
    }
    pick = opts.device_index;
  } else {
    pick = 0;
  }
  physical_ = devs[static_cast<size_t>(pick)];
  vkGetPhysicalDeviceProperties(physical_, &props_);
  if (props_.apiVersion >= VK_API_VERSION_1_2) {
    VkPhysicalDeviceDriverProperties dp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &dp;
    vkGetPhysicalDeviceProperties2(physical_, &p2);
    driver_ = std::string(dp.driverName) + " " + dp.driverInfo;
  }
}

void Session::create_device() {
  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
  bool found = false;
  for (uint32_t i = 0; i < nq && !found; ++i) {
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      queue_family_ = i;
      found = true;
    }
  }
  if (!found) throw Error(QFV_ERR_DEVICE, std::string(props_.deviceName) + " has no compute queue");
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  VkPhysicalDeviceFeatures feats{};
  feats.shaderInt64 = int_acc_ == QFV_ACC_INT64 ? VK_TRUE : VK_FALSE;
  feats.shaderFloat64 = real_acc_ == QFV_ACC_FLOAT64 ? VK_TRUE : VK_FALSE;
  VkDeviceCreateInfo ci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  ci.queueCreateInfoCount = 1;
  ci.pQueueCreateInfos = &qi;
  ci.pEnabledFeatures = &feats;
  check(vkCreateDevice(physical_, &ci, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(physical_, &mp);
  // Payloads are written and results read through mapped memory: prefer memory
  // that is device-local and host-visible (unified memory: Android GPUs,
  // lavapipe), else host-visible coherent memory.
  const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int best = -1;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    VkMemoryPropertyFlags fl = mp.memoryTypes[i].propertyFlags;
    if ((fl & hv) != hv) continue;
    if (best < 0 || ((fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) &&
                     !(mp.memoryTypes[best].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT))) {
      best = static_cast<int>(i);
    }
  }
  if (best < 0) throw Error(QFV_ERR_DEVICE, "no host-visible coherent memory type");
  memory_type_ = static_cast<uint32_t>(best);
  heap_size_ = mp.memoryHeaps[mp.memoryTypes[memory_type_].heapIndex].size;

  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pi, nullptr, &command_pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = command_pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device_, &ai, &command_buffer_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(device_, &fi, nullptr, &fence_), "vkCreateFence");
}

void Session::create_pipelines() {
  std::array<VkDescriptorSetLayoutBinding, 6> b{};
  for (uint32_t i = 0; i < 6; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = 6;
  li.pBindings = b.data();
  check(vkCreateDescriptorSetLayout(device_, &li, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push)};
  VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &set_layout_;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &range;
  check(vkCreatePipelineLayout(device_, &pli, nullptr, &pipeline_layout_), "vkCreatePipelineLayout");

  std::vector<std::string> names = {"paired_pattern", "packed_decode", "gather"};
  for (const char *k : {"frame_dot", "pattern", "paired_dot"}) {
    names.push_back(std::string(k) + "." + acc_suffix(int_acc_));
    names.push_back(std::string(k) + "." + acc_suffix(real_acc_));
  }
  for (const auto &name : names) {
    std::vector<uint32_t> code = shader_code(name);
    VkShaderModuleCreateInfo si{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    si.codeSize = code.size() * sizeof(uint32_t);
    si.pCode = code.data();
    VkShaderModule mod = VK_NULL_HANDLE;
    check(vkCreateShaderModule(device_, &si, nullptr, &mod), "vkCreateShaderModule");
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = mod;
    ci.stage.pName = "main";
    ci.layout = pipeline_layout_;
    VkPipeline p = VK_NULL_HANDLE;
    VkResult r = vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
    vkDestroyShaderModule(device_, mod, nullptr);
    check(r, ("vkCreateComputePipelines(" + name + ")").c_str());
    pipelines_[name] = p;
  }
}

VkPipeline Session::pipe(const std::string &name) const {
  auto it = pipelines_.find(name);
  if (it == pipelines_.end()) throw Error(QFV_ERR_INTERNAL, "pipeline " + name + " not created");
  return it->second;
}

Buf Session::make_buffer(uint64_t bytes) {
  Buf b;
  b.size = accounted(bytes);
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = b.size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(device_, &bi, nullptr, &b.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  if (!(req.memoryTypeBits & (1u << memory_type_))) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    throw Error(QFV_ERR_DEVICE, "storage buffers cannot use the chosen memory type");
  }
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = memory_type_;
  VkResult r = vkAllocateMemory(device_, &ai, nullptr, &b.memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    check(r, "vkAllocateMemory");
  }
  check(vkBindBufferMemory(device_, b.buffer, b.memory, 0), "vkBindBufferMemory");
  check(vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.map), "vkMapMemory");
  std::memset(b.map, 0, b.size);
  return b;
}

void Session::free_buffer(Buf &b) {
  if (b.buffer != VK_NULL_HANDLE) vkDestroyBuffer(device_, b.buffer, nullptr);
  if (b.memory != VK_NULL_HANDLE) vkFreeMemory(device_, b.memory, nullptr);
  b = Buf{};
}

void Session::free_chunk(Chunk &c) {
  free_buffer(c.a);
  free_buffer(c.b);
  free_buffer(c.c);
}

void Session::info(qfv_info &out) const {
  std::memset(&out, 0, sizeof(out));
  std::snprintf(out.device_name, sizeof(out.device_name), "%s", props_.deviceName);
  std::snprintf(out.device_type, sizeof(out.device_type), "%s", type_name(props_.deviceType));
  std::snprintf(out.driver, sizeof(out.driver), "%s", driver_.c_str());
  out.api_version = props_.apiVersion;
  out.vendor_id = props_.vendorID;
  out.device_id = props_.deviceID;
  out.integer_accumulation = int_acc_;
  out.real_accumulation = real_acc_;
  out.memory_budget_bytes = budget_;
  out.max_buffer_bytes = max_buffer_;
  out.max_message_bytes = std::min<uint64_t>(4 * max_buffer_, uint64_t(1) << 32);
  out.max_weights = kMaxWeights;
  out.max_frame_pixels = std::min<uint64_t>(kMaxFramePixels, max_buffer_ / 8);
  for (size_t i = 0; i < 4; ++i) out.resident_bytes[i] = resident_[i];
  out.handles = chunks_.size() + weights_.size();
  out.validation_messages = validation_messages.load();
}

void Session::admit(qfv_handle h, uint64_t bytes, const char *what) const {
  if (chunks_.count(h) || weights_.count(h)) {
    bad("handle " + std::to_string(h) + " is already in use; release it or choose a new handle");
  }
  uint64_t held = resident_[0] + resident_[1] + resident_[2] + resident_[3];
  if (held + bytes > budget_) {
    throw Error(QFV_ERR_BUDGET, std::string(what) + " of " + std::to_string(bytes) +
                                    " device bytes refused: " + std::to_string(held) + " of the " +
                                    std::to_string(budget_) +
                                    " byte memory budget are resident; release handles or place the chunk on "
                                    "another worker (nothing was allocated)");
  }
}

namespace {
void check_buffer(uint64_t bytes, uint64_t max, const char *what) {
  if (bytes > max) {
    bad(std::string(what) + " takes " + std::to_string(bytes) + " bytes, over max_buffer_bytes " +
        std::to_string(max) + ": split the chunk");
  }
}
void check_value_dtype(qfv_dtype d, bool allow_float) {
  if (!(d == QFV_UINT8 || d == QFV_UINT16 || d == QFV_UINT32 || (allow_float && d == QFV_FLOAT32))) {
    throw Error(QFV_ERR_UNSUPPORTED, std::string("dtype ") + qfv_dtype_name(d) +
                                         " not offered here (uint8, uint16, uint32" +
                                         (allow_float ? ", float32)" : ")"));
  }
}
void check_k(uint64_t k) {
  if (k == 0 || k > kMaxFramePixels) {
    bad("frame of " + std::to_string(k) + " pixels: expected 1 .. " + std::to_string(kMaxFramePixels));
  }
}
} // namespace

uint64_t Session::put_dense(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, const void *frames,
                            uint64_t nbytes) {
  check_value_dtype(dtype, true);
  check_k(k);
  uint64_t esz = dtype_bytes(dtype);
  if (n > (uint64_t(1) << 40) / k || nbytes != n * k * esz) {
    bad("dense frames: expected " + std::to_string(n) + " x " + std::to_string(k) + " " +
        qfv_dtype_name(dtype) + " values (" + std::to_string(n * k * esz) + " bytes), got " +
        std::to_string(nbytes) + " bytes");
  }
  if (nbytes > 0 && frames == nullptr) bad("dense frames: null data pointer");
  check_buffer(nbytes, max_buffer_, "dense frames");
  uint64_t need = accounted(nbytes);
  admit(h, need, "put");
  Chunk c;
  c.rep = Rep::dense;
  c.dtype = dtype;
  c.n = n;
  c.k = k;
  c.elem_bytes = static_cast<uint32_t>(esz);
  c.a = make_buffer(nbytes);
  if (nbytes) std::memcpy(c.a.map, frames, nbytes);
  c.resident = need;
  chunks_[h] = c;
  resident_[0] += need;
  return need;
}

uint64_t Session::put_paired(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, const int64_t *indptr,
                             const void *indices, int index_bytes, const void *counts, int count_bytes,
                             uint64_t n_pairs) {
  check_value_dtype(dtype, false);
  check_k(k);
  if (index_bytes != 2 && index_bytes != 4) bad("paired index_dtype must be uint16 or uint32");
  if (count_bytes != 1 && count_bytes != 2 && count_bytes != 4) {
    bad("paired count_dtype must be uint8, uint16 or uint32");
  }
  if (index_bytes == 2 && k > 65536)
    bad("paired uint16 indices cannot address " + std::to_string(k) + " pixels");
  if (indptr == nullptr || (n_pairs && (indices == nullptr || counts == nullptr)))
    bad("paired: null pointer");
  check_buffer((n + 1) * 4, max_buffer_, "paired indptr");
  check_buffer(n_pairs * static_cast<uint64_t>(index_bytes), max_buffer_, "paired indices");
  check_buffer(n_pairs * static_cast<uint64_t>(count_bytes), max_buffer_, "paired counts");
  if (indptr[0] != 0 || indptr[n] < 0 || static_cast<uint64_t>(indptr[n]) != n_pairs) {
    bad("paired indptr must run from 0 to the " + std::to_string(n_pairs) + " pairs, got " +
        std::to_string(indptr[0]) + " .. " + std::to_string(indptr[n]));
  }
  const uint64_t vmax = dtype == QFV_UINT8 ? 0xFFu : dtype == QFV_UINT16 ? 0xFFFFu : 0xFFFFFFFFu;
  auto idx = [&](uint64_t q) -> uint64_t {
    if (index_bytes == 2) {
      uint16_t v;
      std::memcpy(&v, static_cast<const uint8_t *>(indices) + 2 * q, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, static_cast<const uint8_t *>(indices) + 4 * q, 4);
    return v;
  };
  auto cnt = [&](uint64_t q) -> uint64_t {
    const uint8_t *p = static_cast<const uint8_t *>(counts) + static_cast<uint64_t>(count_bytes) * q;
    if (count_bytes == 1) return *p;
    if (count_bytes == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  };
  for (uint64_t i = 0; i < n; ++i) {
    if (indptr[i + 1] < indptr[i]) bad("paired indptr decreases at frame " + std::to_string(i));
    uint64_t prev = 0;
    for (uint64_t q = static_cast<uint64_t>(indptr[i]); q < static_cast<uint64_t>(indptr[i + 1]); ++q) {
      uint64_t p = idx(q);
      if (p >= k || (q > static_cast<uint64_t>(indptr[i]) && p <= prev)) {
        bad("paired frame " + std::to_string(i) + ": indices must lie in [0, " + std::to_string(k) +
            ") and be sorted and unique within a frame");
      }
      if (cnt(q) > vmax) bad(std::string("paired count exceeds the value dtype ") + qfv_dtype_name(dtype));
      prev = p;
    }
  }
  uint64_t b1 = n_pairs * static_cast<uint64_t>(index_bytes);
  uint64_t b2 = n_pairs * static_cast<uint64_t>(count_bytes);
  uint64_t need = accounted((n + 1) * 4) + accounted(b1) + accounted(b2);
  admit(h, need, "put");
  Chunk c;
  c.rep = Rep::paired;
  c.dtype = dtype;
  c.n = n;
  c.k = k;
  c.index_bytes = static_cast<uint32_t>(index_bytes);
  c.count_bytes = static_cast<uint32_t>(count_bytes);
  c.n_pairs = n_pairs;
  c.a = make_buffer((n + 1) * 4);
  c.b = make_buffer(b1);
  c.c = make_buffer(b2);
  auto *ip = static_cast<uint32_t *>(c.a.map);
  for (uint64_t i = 0; i <= n; ++i) ip[i] = static_cast<uint32_t>(indptr[i]);
  if (b1) std::memcpy(c.b.map, indices, b1);
  if (b2) std::memcpy(c.c.map, counts, b2);
  c.resident = need;
  chunks_[h] = c;
  resident_[1] += need;
  return need;
}

uint64_t Session::put_packed(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, uint64_t block_values,
                             const uint8_t *widths, const int64_t *offsets, uint64_t n_blocks,
                             const uint32_t *data, uint64_t n_words) {
  check_value_dtype(dtype, false);
  check_k(k);
  if (block_values == 0 || block_values % 32 != 0 || block_values > k + 31 + 65536) {
    bad("packed block_values must be a positive multiple of 32, got " + std::to_string(block_values));
  }
  uint64_t nb = (k + block_values - 1) / block_values;
  if (n_blocks != n * nb) {
    bad("packed widths/offsets: expected " + std::to_string(n * nb) + " blocks (" + std::to_string(nb) +
        " per frame), got " + std::to_string(n_blocks));
  }
  if ((n_blocks && (widths == nullptr || offsets == nullptr)) || (n_words && data == nullptr)) {
    bad("packed: null pointer");
  }
  const uint64_t maxw = dtype == QFV_UINT8 ? 8 : 16;
  uint64_t last = k - (nb - 1) * block_values;
  uint64_t o = 0;
  for (uint64_t i = 0; i < n_blocks; ++i) {
    if (widths[i] > maxw) {
      bad("packed block " + std::to_string(i) + " has width " + std::to_string(widths[i]) + ", over " +
          std::to_string(maxw) + " bits for " + qfv_dtype_name(dtype));
    }
    if (offsets[i] < 0 || static_cast<uint64_t>(offsets[i]) != o) {
      bad("packed offsets[" + std::to_string(i) + "] is " + std::to_string(offsets[i]) + ", expected " +
          std::to_string(o) + " from the widths");
    }
    uint64_t cnt = (i % nb == nb - 1) ? last : block_values;
    o += (cnt * widths[i] + 31) / 32;
  }
  if (n_words != o + 1) {
    bad("packed data: expected " + std::to_string(o + 1) +
        " words (blocks plus the trailing zero "
        "word), got " +
        std::to_string(n_words));
  }
  check_buffer(n_blocks * 4, max_buffer_, "packed offsets");
  check_buffer(n_words * 4, max_buffer_, "packed data");
  uint64_t need = accounted(n_blocks) + accounted(n_blocks * 4) + accounted(n_words * 4);
  admit(h, need, "put");
  Chunk c;
  c.rep = Rep::packed;
  c.dtype = dtype;
  c.n = n;
  c.k = k;
  c.block_values = block_values;
  c.blocks_per_frame = nb;
  c.a = make_buffer(n_blocks);
  c.b = make_buffer(n_blocks * 4);
  c.c = make_buffer(n_words * 4);
  if (n_blocks) std::memcpy(c.a.map, widths, n_blocks);
  auto *op = static_cast<uint32_t *>(c.b.map);
  for (uint64_t i = 0; i < n_blocks; ++i) op[i] = static_cast<uint32_t>(offsets[i]);
  std::memcpy(c.c.map, data, n_words * 4);
  c.resident = need;
  chunks_[h] = c;
  resident_[2] += need;
  return need;
}

uint64_t Session::put_weights(qfv_handle h, uint64_t m, uint64_t k, const double *w, bool &integer) {
  check_k(k);
  if (m > kMaxWeights)
    bad("weights: " + std::to_string(m) + " rows, over max_weights " + std::to_string(kMaxWeights));
  if (m && w == nullptr) bad("weights: null pointer");
  uint64_t count = m * k;
  bool is_int = true, fits = true, nonfinite = false;
  for (uint64_t i = 0; i < count; ++i) {
    double v = w[i];
    if (!std::isfinite(v)) {
      nonfinite = true;
      is_int = false;
    } else if (std::floor(v) != v) {
      is_int = false;
    } else if (std::fabs(v) > 2147483647.0) {
      fits = false;
    }
  }
  fits = fits && is_int;
  uint64_t rsize = real_acc_ == QFV_ACC_FLOAT64 ? 8 : 4;
  check_buffer(count * rsize, max_buffer_, "weights");
  uint64_t need =
      accounted(count * rsize) + (fits ? accounted(count * 4) : 0) + (nonfinite ? accounted(m * 4) : 0);
  admit(h, need, "put_weights");
  Weights wt;
  wt.m = m;
  wt.k = k;
  wt.integer = is_int;
  wt.int32 = fits;
  wt.nonfinite = nonfinite;
  wt.reals = make_buffer(count * rsize);
  if (rsize == 8) {
    if (count) std::memcpy(wt.reals.map, w, count * 8);
  } else {
    auto *f = static_cast<float *>(wt.reals.map);
    for (uint64_t i = 0; i < count; ++i) f[i] = static_cast<float>(w[i]);
  }
  if (fits) {
    wt.ints = make_buffer(count * 4);
    auto *p = static_cast<int32_t *>(wt.ints.map);
    for (uint64_t i = 0; i < count; ++i) p[i] = static_cast<int32_t>(w[i]);
  }
  if (nonfinite) {
    wt.bad = make_buffer(m * 4);
    auto *p = static_cast<uint32_t *>(wt.bad.map);
    for (uint64_t r = 0; r < m; ++r) {
      uint32_t c = 0;
      for (uint64_t j = 0; j < k; ++j) c += std::isfinite(w[r * k + j]) ? 0u : 1u;
      p[r] = c;
    }
  }
  wt.resident = need;
  weights_[h] = wt;
  resident_[3] += need;
  integer = is_int;
  return need;
}

const Chunk &Session::chunk(qfv_handle h) const {
  auto it = chunks_.find(h);
  if (it == chunks_.end()) {
    throw Error(QFV_ERR_UNKNOWN_HANDLE, "no payload under handle " + std::to_string(h) + " (put it first)");
  }
  return it->second;
}

bool Session::release(qfv_handle h) {
  auto c = chunks_.find(h);
  if (c != chunks_.end()) {
    resident_[static_cast<size_t>(c->second.rep)] -= c->second.resident;
    free_chunk(c->second);
    chunks_.erase(c);
    return true;
  }
  auto w = weights_.find(h);
  if (w != weights_.end()) {
    resident_[3] -= w->second.resident;
    free_buffer(w->second.ints);
    free_buffer(w->second.reals);
    free_buffer(w->second.bad);
    weights_.erase(w);
    return true;
  }
  return false;
}

void Session::run(const std::vector<Dispatch> &ds) {
  if (ds.empty()) return;
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, static_cast<uint32_t>(6 * ds.size())};
  VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pi.maxSets = static_cast<uint32_t>(ds.size());
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &ps;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  check(vkCreateDescriptorPool(device_, &pi, nullptr, &pool), "vkCreateDescriptorPool");
  struct PoolGuard {
    VkDevice d;
    VkDescriptorPool p;
    ~PoolGuard() { vkDestroyDescriptorPool(d, p, nullptr); }
  } guard{device_, pool};
  std::vector<VkDescriptorSetLayout> layouts(ds.size(), set_layout_);
  std::vector<VkDescriptorSet> sets(ds.size());
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = pool;
  ai.descriptorSetCount = static_cast<uint32_t>(ds.size());
  ai.pSetLayouts = layouts.data();
  check(vkAllocateDescriptorSets(device_, &ai, sets.data()), "vkAllocateDescriptorSets");
  std::vector<VkDescriptorBufferInfo> infos(6 * ds.size());
  std::vector<VkWriteDescriptorSet> writes(6 * ds.size());
  for (size_t d = 0; d < ds.size(); ++d) {
    for (uint32_t i = 0; i < 6; ++i) {
      VkBuffer b = ds[d].buffers[i] ? ds[d].buffers[i] : dummy_.buffer;
      infos[6 * d + i] = VkDescriptorBufferInfo{b, 0, VK_WHOLE_SIZE};
      VkWriteDescriptorSet &w = writes[6 * d + i];
      w = VkWriteDescriptorSet{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      w.dstSet = sets[d];
      w.dstBinding = i;
      w.descriptorCount = 1;
      w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w.pBufferInfo = &infos[6 * d + i];
    }
  }
  vkUpdateDescriptorSets(device_, static_cast<uint32_t>(writes.size()), writes.data(), 0, nullptr);
  check(vkResetCommandBuffer(command_buffer_, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(command_buffer_, &bi), "vkBeginCommandBuffer");
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  for (size_t d = 0; d < ds.size(); ++d) {
    if (d) {
      vkCmdPipelineBarrier(command_buffer_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    }
    vkCmdBindPipeline(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, ds[d].pipeline);
    vkCmdBindDescriptorSets(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, 1, &sets[d],
                            0, nullptr);
    vkCmdPushConstants(command_buffer_, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push),
                       &ds[d].push);
    vkCmdDispatch(command_buffer_, ds[d].groups, 1, 1);
  }
  VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  hb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(command_buffer_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                       1, &hb, 0, nullptr, 0, nullptr);
  check(vkEndCommandBuffer(command_buffer_), "vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &command_buffer_;
  check(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
  VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
  vkResetFences(device_, 1, &fence_);
  check(r, "vkWaitForFences");
}

void Session::frame_pass(qfv_handle ch, qfv_handle wh, qfv_pass_result &res) {
  const Chunk &c = chunk(ch);
  auto wit = weights_.find(wh);
  if (wit == weights_.end()) {
    throw Error(QFV_ERR_UNKNOWN_HANDLE,
                "no weights under handle " + std::to_string(wh) + " (put_weights first)");
  }
  const Weights &w = wit->second;
  if (c.n * w.m != 0 && res.per_frame == nullptr) bad("frame_pass: null per_frame output");
  if (w.k != c.k) {
    bad("weights have " + std::to_string(w.k) + " pixels per row, the chunk's frames " + std::to_string(c.k));
  }
  const bool int_data = c.dtype != QFV_FLOAT32;
  const bool int_path = int_data && w.int32;
  const qfv_accumulation acc = int_path ? int_acc_ : real_acc_;
  const std::string dot_acc = acc_suffix(acc);
  const std::string pat_acc = acc_suffix(int_data ? int_acc_ : real_acc_);
  const bool want_sum = res.pattern_sum != nullptr, want_max = res.pattern_max != nullptr;
  const uint64_t n = c.n, k = c.k, m = w.m;
  const uint64_t out_es = acc == QFV_ACC_FLOAT32 ? 4 : 8;
  const uint64_t sum_es = (!int_data && real_acc_ == QFV_ACC_FLOAT32) ? 4 : 8;
  std::vector<Buf> temps;
  struct Free {
    Session *s;
    std::vector<Buf> *t;
    ~Free() {
      for (Buf &b : *t) s->free_buffer(b);
    }
  } release_temps{this, &temps};
  check_buffer(n * m * out_es, max_buffer_, "per_frame output");
  temps.push_back(make_buffer(n * m * out_es));
  temps.push_back(make_buffer(want_sum ? k * sum_es : 16));
  temps.push_back(make_buffer(want_max ? k * 4 : 16));
  Buf &out = temps[0], &sum = temps[1], &mx = temps[2];
  if (want_max && c.dtype == QFV_FLOAT32) {
    auto *p = static_cast<uint32_t *>(mx.map);
    for (uint64_t i = 0; i < k; ++i) p[i] = 0xFF800000u; // -inf
  }
  VkBuffer wbuf = int_path ? w.ints.buffer : w.reals.buffer;
  std::vector<Dispatch> ds;
  Push base;
  base.k = static_cast<uint32_t>(k);
  base.m = static_cast<uint32_t>(m);
  base.flags = (want_sum ? 1u : 0u) | (want_max ? 2u : 0u);
  auto dense_pass = [&](VkBuffer frames, uint64_t nf, uint64_t frame_offset, uint32_t esz, bool is_float) {
    for (uint64_t r0 = 0; r0 < m; r0 += 8) {
      Dispatch d{pipe("frame_dot." + dot_acc),
                 {frames, wbuf, out.buffer, nullptr, nullptr, nullptr},
                 base,
                 static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(nf, 1), 65535))};
      d.push.n_frames = static_cast<uint32_t>(nf);
      d.push.elem_bytes = esz;
      d.push.is_float = is_float ? 1u : 0u;
      d.push.frame_offset = static_cast<uint32_t>(frame_offset);
      d.push.row0 = static_cast<uint32_t>(r0);
      d.push.rows = static_cast<uint32_t>(std::min<uint64_t>(8, m - r0));
      ds.push_back(d);
    }
    // The pattern shader loops over frames in one thread per pixel.  Mesa's gallivm
    // (lavapipe, llvmpipe) ends any shader loop after 65535 iterations
    // (LP_MAX_TGSI_LOOP_ITERATIONS) without an error, so long runs of frames are
    // split into dispatches of kMaxLoopFrames that accumulate in order.
    for (uint64_t s0 = 0; (want_sum || want_max) && s0 < nf; s0 += kMaxLoopFrames) {
      Dispatch d{pipe("pattern." + pat_acc),
                 {frames, sum.buffer, mx.buffer, nullptr, nullptr, nullptr},
                 base,
                 groups_for(k)};
      d.push.n_frames = static_cast<uint32_t>(std::min<uint64_t>(kMaxLoopFrames, nf - s0));
      d.push.frame_offset = static_cast<uint32_t>(s0);
      d.push.elem_bytes = esz;
      d.push.is_float = is_float ? 1u : 0u;
      ds.push_back(d);
    }
  };
  if (n > 0) {
    if (c.rep == Rep::dense) {
      dense_pass(c.a.buffer, n, 0, c.elem_bytes, c.dtype == QFV_FLOAT32);
    } else if (c.rep == Rep::paired) {
      for (uint64_t r0 = 0; r0 < m; r0 += 8) {
        Dispatch d{
            pipe("paired_dot." + dot_acc),
            {c.a.buffer, c.b.buffer, c.c.buffer, wbuf, out.buffer, w.nonfinite ? w.bad.buffer : nullptr},
            base,
            static_cast<uint32_t>(std::min<uint64_t>(n, 65535))};
        d.push.n_frames = static_cast<uint32_t>(n);
        d.push.row0 = static_cast<uint32_t>(r0);
        d.push.rows = static_cast<uint32_t>(std::min<uint64_t>(8, m - r0));
        d.push.aux0 = c.index_bytes;
        d.push.aux1 = c.count_bytes;
        d.push.flags = (!int_path && w.nonfinite) ? 4u : 0u;
        ds.push_back(d);
      }
      if ((want_sum || want_max) && c.n_pairs > 0) {
        Dispatch d{pipe("paired_pattern"),
                   {c.b.buffer, c.c.buffer, sum.buffer, mx.buffer, nullptr, nullptr},
                   base,
                   groups_for(c.n_pairs)};
        d.push.aux0 = c.index_bytes;
        d.push.aux1 = c.count_bytes;
        d.push.aux2 = static_cast<uint32_t>(c.n_pairs);
        ds.push_back(d);
      }
    } else {
      uint64_t group = std::max<uint64_t>(1, (kScratchBytes / 4) / k);
      for (uint64_t f0 = 0; f0 < n; f0 += group) {
        uint64_t nf = std::min(group, n - f0);
        Dispatch d{pipe("packed_decode"),
                   {c.a.buffer, c.b.buffer, c.c.buffer, scratch_.buffer, nullptr, nullptr},
                   base,
                   groups_for(nf * k)};
        d.push.n_frames = static_cast<uint32_t>(nf);
        d.push.f0 = static_cast<uint32_t>(f0);
        d.push.aux0 = static_cast<uint32_t>(c.block_values);
        d.push.aux1 = static_cast<uint32_t>(c.blocks_per_frame);
        ds.push_back(d);
        dense_pass(scratch_.buffer, nf, f0, 4, false);
      }
    }
  }
  run(ds);
  // Results.
  if (out_es == 8 && (acc == QFV_ACC_INT64 || acc == QFV_ACC_U32X2)) {
    const auto *p = static_cast<const int64_t *>(out.map);
    for (uint64_t i = 0; i < n * m; ++i) res.per_frame[i] = static_cast<double>(p[i]);
  } else if (out_es == 8) {
    if (n * m != 0) std::memcpy(res.per_frame, out.map, n * m * 8);
  } else {
    const auto *p = static_cast<const float *>(out.map);
    for (uint64_t i = 0; i < n * m; ++i) res.per_frame[i] = static_cast<double>(p[i]);
  }
  res.accumulation = acc;
  if (want_sum) {
    if (int_data) {
      std::memcpy(res.pattern_sum, sum.map, k * 8); // int64 words, little-endian
    } else if (sum_es == 8) {
      std::memcpy(res.pattern_sum, sum.map, k * 8);
    } else {
      const auto *p = static_cast<const float *>(sum.map);
      auto *o = static_cast<double *>(res.pattern_sum);
      for (uint64_t i = 0; i < k; ++i) o[i] = static_cast<double>(p[i]);
    }
  }
  if (want_max) {
    const auto *p = static_cast<const uint32_t *>(mx.map);
    uint32_t es = dtype_bytes(c.dtype);
    auto *o = static_cast<uint8_t *>(res.pattern_max);
    for (uint64_t i = 0; i < k; ++i) std::memcpy(o + i * es, &p[i], es); // little-endian narrowing
  }
}

void Session::gather(qfv_handle ch, const int64_t *indices, uint64_t n_idx, void *values) {
  const Chunk &c = chunk(ch);
  if (n_idx && indices == nullptr) bad("gather: null indices");
  for (uint64_t j = 0; j < n_idx; ++j) {
    if (indices[j] < 0 || static_cast<uint64_t>(indices[j]) >= c.k) {
      bad("gather index " + std::to_string(indices[j]) + " outside the frame's 0 .. " +
          std::to_string(c.k - 1));
    }
  }
  uint64_t total = c.n * n_idx;
  if (total == 0) return;
  check_buffer(total * 4, max_buffer_, "gather output");
  std::vector<Buf> temps;
  struct Free {
    Session *s;
    std::vector<Buf> *t;
    ~Free() {
      for (Buf &b : *t) s->free_buffer(b);
    }
  } release_temps{this, &temps};
  temps.push_back(make_buffer(n_idx * 4));
  temps.push_back(make_buffer(total * 4));
  auto *ip = static_cast<uint32_t *>(temps[0].map);
  for (uint64_t j = 0; j < n_idx; ++j) ip[j] = static_cast<uint32_t>(indices[j]);
  Dispatch d{pipe("gather"),
             {c.a.buffer, c.b.buffer, c.c.buffer, temps[0].buffer, temps[1].buffer, nullptr},
             Push{},
             groups_for(total)};
  d.push.n_frames = static_cast<uint32_t>(c.n);
  d.push.k = static_cast<uint32_t>(c.k);
  d.push.elem_bytes = c.elem_bytes;
  d.push.aux0 = static_cast<uint32_t>(c.rep);
  d.push.aux1 = u32(n_idx, "gather index count");
  if (c.rep == Rep::paired) {
    d.push.aux2 = c.index_bytes;
    d.push.aux3 = c.count_bytes;
  } else if (c.rep == Rep::packed) {
    d.push.aux2 = static_cast<uint32_t>(c.block_values);
    d.push.aux3 = static_cast<uint32_t>(c.blocks_per_frame);
  }
  run({d});
  const auto *p = static_cast<const uint32_t *>(temps[1].map);
  uint32_t es = dtype_bytes(c.dtype);
  auto *o = static_cast<uint8_t *>(values);
  for (uint64_t i = 0; i < total; ++i) std::memcpy(o + i * es, &p[i], es);
}

} // namespace qfv
