// Internal C++ side of libqfvulkan: one Vulkan device, its kernels and the
// resident payloads.  Errors are qfv::Error exceptions, caught at the C ABI.
#pragma once
#include <qfvulkan.h>
#include <vulkan/vulkan.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace qfv {

struct Error : std::runtime_error {
  qfv_status code;
  Error(qfv_status c, const std::string &msg) : std::runtime_error(msg), code(c) {}
};

struct Buf {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t size = 0;
  void *map = nullptr;
};

enum class Rep { dense = 0, paired = 1, packed = 2 };

struct Chunk {
  Rep rep = Rep::dense;
  qfv_dtype dtype = QFV_UINT16;
  uint64_t n = 0, k = 0;
  uint32_t elem_bytes = 0;                         // dense
  uint32_t index_bytes = 0;                        // paired
  uint32_t count_bytes = 0;                        // paired
  uint64_t n_pairs = 0;                            // paired
  uint64_t block_values = 0, blocks_per_frame = 0; // packed
  Buf a, b, c; // dense: frames; paired: indptr, indices, counts; packed: widths, offsets, data
  uint64_t resident = 0;
};

struct Weights {
  uint64_t m = 0, k = 0;
  bool integer = false; // every weight an integer
  bool int32 = false;   // ... and within int32: the exact integer path is used
  bool nonfinite = false;
  Buf ints, reals, bad; // int32 rows, float64 (or float32) rows, non-finite count per row
  uint64_t resident = 0;
};

struct Push {
  uint32_t n_frames = 0, k = 0, m = 0, elem_bytes = 0, is_float = 0, frame_offset = 0, row0 = 0, rows = 0,
           aux0 = 0, aux1 = 0, aux2 = 0, aux3 = 0, flags = 0, f0 = 0, pad0 = 0, pad1 = 0;
};
static_assert(sizeof(Push) == 64, "push constants are 64 bytes");

struct Dispatch {
  VkPipeline pipeline;
  std::array<VkBuffer, 6> buffers;
  Push push;
  uint32_t groups;
};

class Session {
public:
  explicit Session(const qfv_options &opts);
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  void info(qfv_info &out) const;
  uint64_t put_dense(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, const void *frames,
                     uint64_t nbytes);
  uint64_t put_paired(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, const int64_t *indptr,
                      const void *indices, int index_bytes, const void *counts, int count_bytes,
                      uint64_t n_pairs);
  uint64_t put_packed(qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k, uint64_t block_values,
                      const uint8_t *widths, const int64_t *offsets, uint64_t n_blocks, const uint32_t *data,
                      uint64_t n_words);
  uint64_t put_weights(qfv_handle h, uint64_t m, uint64_t k, const double *w, bool &integer);
  const Chunk &chunk(qfv_handle h) const;
  void frame_pass(qfv_handle chunk, qfv_handle weights, qfv_pass_result &result);
  void gather(qfv_handle chunk, const int64_t *indices, uint64_t n_indices, void *values);
  bool release(qfv_handle h);

  std::string last_error;

private:
  void cleanup();
  void create_instance(bool validation);
  void pick_device(const qfv_options &opts);
  void create_device();
  void create_pipelines();
  Buf make_buffer(uint64_t bytes);
  void free_buffer(Buf &b);
  void free_chunk(Chunk &c);
  void admit(qfv_handle h, uint64_t bytes, const char *what) const;
  void run(const std::vector<Dispatch> &ds);
  VkPipeline pipe(const std::string &name) const;
  static uint64_t accounted(uint64_t bytes) { return ((bytes < 16 ? 16 : bytes) + 255) & ~uint64_t(255); }

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  uint32_t memory_type_ = 0;
  uint64_t heap_size_ = 0;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer command_buffer_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  std::map<std::string, VkPipeline> pipelines_;
  VkPhysicalDeviceProperties props_{};
  std::string driver_;
  bool has_int64_ = false, has_float64_ = false;
  qfv_accumulation int_acc_ = QFV_ACC_U32X2, real_acc_ = QFV_ACC_FLOAT32;
  uint64_t budget_ = 0, max_buffer_ = 0;
  Buf scratch_, dummy_;
  std::map<qfv_handle, Chunk> chunks_;
  std::map<qfv_handle, Weights> weights_;
  std::array<uint64_t, 4> resident_{};

public:
  std::atomic<uint64_t> validation_messages{0};
};

constexpr uint64_t kScratchBytes = 16u << 20; // packed decode buffer (frames of u32)
// One decoded frame fits the scratch, and the frame pass walks a frame in 64-thread
// strides: 2**21 pixels keep that loop at 32768 iterations, below the 65535 after which
// Mesa's gallivm (lavapipe) silently ends a shader loop (a 2048 x 2048 frame came out short).
constexpr uint64_t kMaxFramePixels = 2u << 20;
constexpr uint64_t kMaxWeights = 1024;
uint32_t dtype_bytes(qfv_dtype d);

} // namespace qfv
