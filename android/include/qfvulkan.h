/* qfvulkan.h: plain C ABI of libqfvulkan, the quantem-flow Vulkan compute worker.
 *
 * Every function returns a qfv_status; nothing throws across this boundary.
 * On failure qfv_last_error(session) (or qfv_global_error() for calls without a
 * session) says what was expected, what was given and what to do.  Payloads
 * and weights live on the device behind caller-chosen integer handles.
 * Arrays are C-ordered and little-endian, as in the qf-worker/1 protocol.
 */
#ifndef QFVULKAN_H
#define QFVULKAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define QFV_API __declspec(dllexport)
#else
#define QFV_API __attribute__((visibility("default")))
#endif

/** Opaque session: one Vulkan device, its pipelines and the resident payloads. */
typedef struct qfv_session qfv_session;
/** Opaque handle naming one resident payload or weight table (chosen by the caller). */
typedef int64_t qfv_handle;

typedef enum qfv_status {
  QFV_OK = 0,
  QFV_ERR_BAD_REQUEST = 1,    /* wrong arguments or buffer sizes */
  QFV_ERR_UNKNOWN_HANDLE = 2, /* no payload or weights under that handle */
  QFV_ERR_BUDGET = 3,         /* payload does not fit the memory budget; nothing allocated */
  QFV_ERR_UNSUPPORTED = 4,    /* representation, dtype or operation not offered */
  QFV_ERR_DEVICE = 5,         /* Vulkan failed (no device, lost, out of memory) */
  QFV_ERR_INTERNAL = 6        /* anything else */
} qfv_status;

typedef enum qfv_dtype {
  QFV_UINT8 = 0,
  QFV_UINT16 = 1,
  QFV_UINT32 = 2,
  QFV_FLOAT32 = 3,
  QFV_UINT64 = 4, /* results only (never stored) */
  QFV_INT64 = 5,  /* results only */
  QFV_FLOAT64 = 6 /* results only */
} qfv_dtype;

typedef enum qfv_accumulation {
  QFV_ACC_INT64 = 0,
  QFV_ACC_U32X2 = 1,
  QFV_ACC_FLOAT64 = 2,
  QFV_ACC_FLOAT32 = 3
} qfv_accumulation;

typedef struct qfv_options {
  int device_index;        /* -1: by name, or the first device */
  const char *device_name; /* NULL or exact / unique case-insensitive substring */
  uint64_t budget_bytes;   /* 0: half the memory heap the payloads use */
  int force_u32x2;         /* two-word integer accumulators even with shaderInt64 */
  int force_float32;       /* float32 real accumulators even with shaderFloat64 */
  int validation;          /* enable VK_LAYER_KHRONOS_validation (also env QFV_VALIDATION=1) */
} qfv_options;

typedef struct qfv_info {
  char device_name[256];
  char device_type[16]; /* cpu, integrated_gpu, discrete_gpu, virtual_gpu, other */
  char driver[128];     /* driver name and info */
  uint32_t api_version; /* VK_MAKE_API_VERSION packed */
  uint32_t vendor_id;
  uint32_t device_id;
  qfv_accumulation integer_accumulation; /* QFV_ACC_INT64 or QFV_ACC_U32X2 */
  qfv_accumulation real_accumulation;    /* QFV_ACC_FLOAT64 or QFV_ACC_FLOAT32 */
  uint64_t memory_budget_bytes;
  uint64_t max_buffer_bytes;
  uint64_t max_message_bytes;
  uint64_t max_weights;
  uint64_t max_frame_pixels;
  uint64_t resident_bytes[4]; /* dense, paired, packed, weights */
  uint64_t handles;
  uint64_t validation_messages; /* validation layer errors and warnings seen */
} qfv_info;

typedef struct qfv_pass_result {
  double *per_frame;             /* (n_frames, m) float64, caller-allocated */
  void *pattern_sum;             /* (K,) int64 for integer data, float64 for float data; NULL: not wanted */
  void *pattern_max;             /* (K,) in the data's dtype; NULL: not wanted */
  qfv_accumulation accumulation; /* out: what the per-frame sums used */
} qfv_pass_result;

QFV_API void qfv_default_options(qfv_options *opts);
/** Names of the Vulkan physical devices, one per line, into buf (NUL-terminated). */
QFV_API qfv_status qfv_list_devices(char *buf, size_t cap, int validation);
QFV_API const char *qfv_global_error(void);
QFV_API const char *qfv_status_name(qfv_status status); /* protocol error code */
QFV_API const char *qfv_dtype_name(qfv_dtype dtype);
QFV_API const char *qfv_accumulation_name(qfv_accumulation acc);

QFV_API qfv_status qfv_session_create(const qfv_options *opts, qfv_session **out);
QFV_API void qfv_session_destroy(qfv_session *session);
QFV_API const char *qfv_last_error(const qfv_session *session);
QFV_API qfv_status qfv_session_info(qfv_session *session, qfv_info *info);

/** Dense frames: shape (n_frames, K) flattened from [rows, cols, k_r, k_c]. */
QFV_API qfv_status qfv_put_dense(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n_frames, uint64_t k,
                                 const void *frames, uint64_t nbytes, uint64_t *resident_bytes);
/** Paired CSR: indptr int64 (n_frames + 1), indices index_bytes (2 or 4) each,
 *  counts count_bytes (1, 2 or 4) each; dtype is the logical value dtype. */
QFV_API qfv_status qfv_put_paired(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n_frames,
                                  uint64_t k, const int64_t *indptr, const void *indices, int index_bytes,
                                  const void *counts, int count_bytes, uint64_t n_pairs,
                                  uint64_t *resident_bytes);
/** Packed packed-blockwidth-v1: widths uint8 and offsets int64 per block, data uint32 words
 *  (including the trailing zero word). */
QFV_API qfv_status qfv_put_packed(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n_frames,
                                  uint64_t k, uint64_t block_values, const uint8_t *widths,
                                  const int64_t *offsets, uint64_t n_blocks, const uint32_t *data,
                                  uint64_t n_words, uint64_t *resident_bytes);
/** Weight rows (m, K) float64; *integer_weights says whether all are integers. */
QFV_API qfv_status qfv_put_weights(qfv_session *s, qfv_handle h, uint64_t m, uint64_t k,
                                   const double *weights, uint64_t *resident_bytes, int *integer_weights);
/** Shape of a resident chunk. */
QFV_API qfv_status qfv_chunk_info(qfv_session *s, qfv_handle chunk, uint64_t *n_frames, uint64_t *k,
                                  qfv_dtype *dtype, int *representation /* 0 dense 1 paired 2 packed */);
QFV_API qfv_status qfv_frame_pass(qfv_session *s, qfv_handle chunk, qfv_handle weights,
                                  qfv_pass_result *result);
/** values (n_frames, n_indices) in the chunk's dtype. */
QFV_API qfv_status qfv_gather(qfv_session *s, qfv_handle chunk, const int64_t *indices, uint64_t n_indices,
                              void *values);
/** Frees the handle; *freed = 0 when it was unknown (not an error). */
QFV_API qfv_status qfv_release(qfv_session *s, qfv_handle h, int *freed);

#ifdef __cplusplus
}
#endif
#endif /* QFVULKAN_H */
