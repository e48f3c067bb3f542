// The C ABI: every entry point catches everything; errors become a status and
// a message retrievable with qfv_last_error / qfv_global_error.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "session.hpp"

struct qfv_session {
  qfv::Session *impl = nullptr;
  std::string error;
};

namespace {
thread_local std::string g_error;

template <typename F> qfv_status guarded(qfv_session *s, F &&f) {
  std::string &err = s ? s->error : g_error;
  try {
    if (s != nullptr && s->impl == nullptr) {
      err = "session is not open";
      return QFV_ERR_BAD_REQUEST;
    }
    f();
    return QFV_OK;
  } catch (const qfv::Error &e) {
    err = e.what();
    return e.code;
  } catch (const std::bad_alloc &) {
    err = "host out of memory";
    return QFV_ERR_INTERNAL;
  } catch (const std::exception &e) {
    err = e.what();
    return QFV_ERR_INTERNAL;
  } catch (...) {
    err = "unknown failure";
    return QFV_ERR_INTERNAL;
  }
}

bool known_dtype(qfv_dtype d) {
  return d >= QFV_UINT8 && d <= QFV_FLOAT64;
}
} // namespace

extern "C" {

void qfv_default_options(qfv_options *o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->device_index = -1;
}

const char *qfv_global_error(void) {
  return g_error.c_str();
}

const char *qfv_status_name(qfv_status s) {
  switch (s) {
  case QFV_OK: return "ok";
  case QFV_ERR_BAD_REQUEST: return "bad_request";
  case QFV_ERR_UNKNOWN_HANDLE: return "unknown_handle";
  case QFV_ERR_BUDGET: return "budget";
  case QFV_ERR_UNSUPPORTED: return "unsupported";
  case QFV_ERR_DEVICE: return "device";
  default: return "internal";
  }
}

const char *qfv_dtype_name(qfv_dtype d) {
  switch (d) {
  case QFV_UINT8: return "uint8";
  case QFV_UINT16: return "uint16";
  case QFV_UINT32: return "uint32";
  case QFV_FLOAT32: return "float32";
  case QFV_UINT64: return "uint64";
  case QFV_INT64: return "int64";
  case QFV_FLOAT64: return "float64";
  default: return "unknown";
  }
}

const char *qfv_accumulation_name(qfv_accumulation a) {
  switch (a) {
  case QFV_ACC_INT64: return "int64";
  case QFV_ACC_U32X2: return "u32x2";
  case QFV_ACC_FLOAT64: return "float64";
  default: return "float32";
  }
}

qfv_status qfv_list_devices(char *buf, size_t cap, int validation) {
  return guarded(nullptr, [&] {
    if (buf == nullptr || cap == 0) throw qfv::Error(QFV_ERR_BAD_REQUEST, "null or empty buffer");
    (void)validation;
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    VkInstance inst = VK_NULL_HANDLE;
    if (vkCreateInstance(&ci, nullptr, &inst) != VK_SUCCESS) {
      throw qfv::Error(QFV_ERR_DEVICE, "vkCreateInstance failed (is a Vulkan driver installed?)");
    }
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(inst, &n, nullptr);
    std::vector<VkPhysicalDevice> devs(n);
    vkEnumeratePhysicalDevices(inst, &n, devs.data());
    std::string out;
    for (uint32_t i = 0; i < n; ++i) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(devs[i], &p);
      VkPhysicalDeviceFeatures f;
      vkGetPhysicalDeviceFeatures(devs[i], &f);
      out += std::to_string(i) + "\t" + p.deviceName + "\tshaderInt64=" + (f.shaderInt64 ? "1" : "0") +
             "\tshaderFloat64=" + (f.shaderFloat64 ? "1" : "0") + "\n";
    }
    vkDestroyInstance(inst, nullptr);
    std::snprintf(buf, cap, "%s", out.c_str());
  });
}

qfv_status qfv_session_create(const qfv_options *opts, qfv_session **out) {
  return guarded(nullptr, [&] {
    if (out == nullptr) throw qfv::Error(QFV_ERR_BAD_REQUEST, "null output pointer");
    *out = nullptr;
    qfv_options o;
    qfv_default_options(&o);
    if (opts != nullptr) o = *opts;
    auto *s = new qfv_session();
    try {
      s->impl = new qfv::Session(o);
    } catch (...) {
      delete s;
      throw;
    }
    *out = s;
  });
}

void qfv_session_destroy(qfv_session *s) {
  if (s == nullptr) return;
  try {
    delete s->impl;
  } catch (...) {
  }
  delete s;
}

const char *qfv_last_error(const qfv_session *s) {
  return s ? s->error.c_str() : g_error.c_str();
}

qfv_status qfv_session_info(qfv_session *s, qfv_info *info) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    if (info == nullptr) throw qfv::Error(QFV_ERR_BAD_REQUEST, "null info pointer");
    s->impl->info(*info);
  });
}

qfv_status qfv_put_dense(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k,
                         const void *frames, uint64_t nbytes, uint64_t *resident) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    if (!known_dtype(dtype)) throw qfv::Error(QFV_ERR_UNSUPPORTED, "unknown dtype code");
    uint64_t r = s->impl->put_dense(h, dtype, n, k, frames, nbytes);
    if (resident) *resident = r;
  });
}

qfv_status qfv_put_paired(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k,
                          const int64_t *indptr, const void *indices, int index_bytes, const void *counts,
                          int count_bytes, uint64_t n_pairs, uint64_t *resident) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    if (!known_dtype(dtype)) throw qfv::Error(QFV_ERR_UNSUPPORTED, "unknown dtype code");
    uint64_t r =
        s->impl->put_paired(h, dtype, n, k, indptr, indices, index_bytes, counts, count_bytes, n_pairs);
    if (resident) *resident = r;
  });
}

qfv_status qfv_put_packed(qfv_session *s, qfv_handle h, qfv_dtype dtype, uint64_t n, uint64_t k,
                          uint64_t block_values, const uint8_t *widths, const int64_t *offsets,
                          uint64_t n_blocks, const uint32_t *data, uint64_t n_words, uint64_t *resident) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    if (!known_dtype(dtype)) throw qfv::Error(QFV_ERR_UNSUPPORTED, "unknown dtype code");
    uint64_t r = s->impl->put_packed(h, dtype, n, k, block_values, widths, offsets, n_blocks, data, n_words);
    if (resident) *resident = r;
  });
}

qfv_status qfv_put_weights(qfv_session *s, qfv_handle h, uint64_t m, uint64_t k, const double *w,
                           uint64_t *resident, int *integer_weights) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    bool integer = false;
    uint64_t r = s->impl->put_weights(h, m, k, w, integer);
    if (resident) *resident = r;
    if (integer_weights) *integer_weights = integer ? 1 : 0;
  });
}

qfv_status qfv_chunk_info(qfv_session *s, qfv_handle h, uint64_t *n, uint64_t *k, qfv_dtype *dtype,
                          int *representation) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    const qfv::Chunk &c = s->impl->chunk(h);
    if (n) *n = c.n;
    if (k) *k = c.k;
    if (dtype) *dtype = c.dtype;
    if (representation) *representation = static_cast<int>(c.rep);
  });
}

qfv_status qfv_frame_pass(qfv_session *s, qfv_handle chunk, qfv_handle weights, qfv_pass_result *result) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    if (result == nullptr) throw qfv::Error(QFV_ERR_BAD_REQUEST, "null result pointer");
    s->impl->frame_pass(chunk, weights, *result);
  });
}

qfv_status qfv_gather(qfv_session *s, qfv_handle chunk, const int64_t *indices, uint64_t n, void *values) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] { s->impl->gather(chunk, indices, n, values); });
}

qfv_status qfv_release(qfv_session *s, qfv_handle h, int *freed) {
  if (s == nullptr) return QFV_ERR_BAD_REQUEST;
  return guarded(s, [&] {
    bool f = s->impl->release(h);
    if (freed) *freed = f ? 1 : 0;
  });
}

} // extern "C"
