#include "server.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "codec.hpp"
#include "json.hpp"

namespace qfv {

const char *const kImplementation = "quantem-flow-android 0.1.0 (libqfvulkan, C++17, Vulkan compute)";

namespace {

using json::Value;

struct Reply {
  Value header;
  std::vector<std::vector<uint8_t>> buffers;
};

struct ProtoError {
  std::string code, message;
  Value handle;
};

[[noreturn]] void perr(const std::string &code, const std::string &msg, Value handle = Value()) {
  throw ProtoError{code, msg, std::move(handle)};
}

void write_all(int fd, const std::vector<uint8_t> &bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t r = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw std::runtime_error("cannot write to the bridge: " + std::string(std::strerror(errno)));
    done += static_cast<size_t>(r);
  }
}

const char *const kDtypes[] = {"uint8", "uint16", "uint32", "float32"};
const char *const kNumpyDtypes[] = {"uint8", "uint16", "uint32", "uint64",  "int8",
                                    "int16", "int32",  "int64",  "float32", "float64"};

qfv_dtype parse_dtype(const Value *v, const char *member) {
  if (!v || !v->is_str()) perr("bad_request", std::string("\"") + member + "\" must be a dtype name string");
  for (int i = 0; i < 4; ++i)
    if (v->s == kDtypes[i]) return static_cast<qfv_dtype>(i);
  for (const char *d : kNumpyDtypes)
    if (v->s == d)
      perr("unsupported",
           "dtype " + v->s + " is not offered by this worker (uint8, uint16, uint32, float32)");
  perr("bad_request", std::string("\"") + member + "\" is not a dtype name: " + v->s);
}

int64_t get_int(const Value &h, const char *member, int64_t lo = 0) {
  const Value *v = h.get(member);
  if (!v || !v->is_int() || v->i < lo) {
    perr("bad_request", std::string("\"") + member + "\" must be an integer >= " + std::to_string(lo));
  }
  return v->i;
}

std::vector<int64_t> get_ints(const Value &h, const char *member, size_t n) {
  const Value *v = h.get(member);
  if (!v || v->type != json::Type::array || (n && v->a.size() != n)) {
    perr("bad_request",
         std::string("\"") + member + "\" must be a list of " + std::to_string(n) + " integers");
  }
  std::vector<int64_t> out;
  for (const auto &x : v->a) {
    if (!x.is_int() || x.i < 0)
      perr("bad_request", std::string("\"") + member + "\" must hold non-negative integers");
    out.push_back(x.i);
  }
  return out;
}

bool get_bool(const Value *opts, const char *member) {
  if (!opts) return false;
  const Value *v = opts->get(member);
  if (!v || v->type == json::Type::null) return false;
  if (v->type != json::Type::boolean)
    perr("bad_request", std::string("option \"") + member + "\" must be true or false");
  return v->b;
}

template <typename T> std::vector<T> as_array(const std::vector<uint8_t> &b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

Value shape_of(std::initializer_list<uint64_t> dims) {
  Value s = Value::array();
  for (uint64_t d : dims) s.push(Value(d));
  return s;
}

class Worker {
public:
  explicit Worker(const qfv_options &opts) {
    qfv_status st = qfv_session_create(&opts, &session_);
    if (st != QFV_OK) {
      startup_error_ = std::string("the Vulkan session could not start: ") + qfv_global_error();
      startup_code_ = st == QFV_ERR_BAD_REQUEST ? "bad_request" : "device";
      std::fprintf(stderr, "qf-vulkan-worker: %s\n", startup_error_.c_str());
      session_ = nullptr;
    } else {
      qfv_session_info(session_, &info_);
      std::fprintf(stderr, "qf-vulkan-worker: device %s (%s), integer %s, real %s, budget %llu bytes\n",
                   info_.device_name, info_.device_type, qfv_accumulation_name(info_.integer_accumulation),
                   qfv_accumulation_name(info_.real_accumulation),
                   static_cast<unsigned long long>(info_.memory_budget_bytes));
    }
  }
  ~Worker() { qfv_session_destroy(session_); }
  Worker(const Worker &) = delete;
  Worker &operator=(const Worker &) = delete;

  uint64_t max_message_bytes() const { return session_ ? info_.max_message_bytes : 0; }
  bool done = false;
  int exit_code = 0;

  Reply handle(const Frame &f) {
    const Value &h = f.header;
    const std::string &type = h.get("type")->s;
    Reply r;
    r.header["id"] = id_of(h);
    // the reference's order: the type first (unsupported), then the id (bad_request)
    static const char *const known[] = {"hello",       "ping", "bye",     "put",
                                        "put_weights", "run",  "release", "stats"};
    bool is_known = false;
    for (const char *k : known) is_known = is_known || type == k;
    if (!is_known)
      perr("unsupported", "message type \"" + type + "\" is not spoken by this worker (qf-worker/1)");
    get_int(h, "id"); // every request has an integer id >= 0
    if (type == "hello") return hello(h, r);
    if (type == "ping") {
      r.header["type"] = "ping";
      return r;
    }
    if (type == "bye") {
      r.header["type"] = "bye";
      done = true;
      return r;
    }
    if (!session_) perr(startup_code_, startup_error_);
    if (type == "put") return put(h, f.buffers, r);
    if (type == "put_weights") return put_weights(h, f.buffers, r);
    if (type == "run") return run(h, f.buffers, r);
    if (type == "release") return release(h, r);
    return stats(r);
  }

  static Value id_of(const Value &h) {
    const Value *id = h.get("id");
    return (id && id->is_int()) ? *id : Value();
  }

private:
  void check(qfv_status st, Value handle = Value()) {
    if (st == QFV_OK) return;
    perr(qfv_status_name(st), qfv_last_error(session_), std::move(handle));
  }

  Reply &hello(const Value &h, Reply &r) {
    const Value *proto = h.get("protocol");
    if (!proto || !proto->is_str() || proto->s != "qf-worker/1") {
      done = true;
      exit_code = 2;
      perr("version", "protocol " + (proto && proto->is_str() ? proto->s : std::string("(missing)")) +
                          " is not spoken; this worker speaks qf-worker/1");
    }
    if (!session_) perr(startup_code_, startup_error_);
    r.header["type"] = "hello";
    r.header["protocol"] = "qf-worker/1";
    r.header["runtime"] = "vulkan";
    char api[32];
    std::snprintf(api, sizeof(api), "%u.%u.%u", info_.api_version >> 22, (info_.api_version >> 12) & 0x3FFu,
                  info_.api_version & 0xFFFu);
    r.header["implementation"] = std::string(kImplementation) + " (" + info_.driver + ")";
    Value dev = Value::object();
    dev["name"] = info_.device_name;
    dev["type"] = info_.device_type;
    dev["backend"] = "vulkan";
    dev["api_version"] = api;
    dev["driver"] = info_.driver;
    dev["vendor_id"] = Value(static_cast<uint64_t>(info_.vendor_id));
    dev["device_id"] = Value(static_cast<uint64_t>(info_.device_id));
    r.header["device"] = dev;
    Value lim = Value::object();
    lim["max_message_bytes"] = Value(info_.max_message_bytes);
    lim["max_buffer_bytes"] = Value(info_.max_buffer_bytes);
    lim["max_weights"] = Value(info_.max_weights);
    lim["max_frame_pixels"] = Value(info_.max_frame_pixels);
    r.header["limits"] = lim;
    r.header["memory_budget_bytes"] = Value(info_.memory_budget_bytes);
    Value kernels = Value::array();
    for (const char *op : {"frame_pass", "gather"}) {
      for (const char *rep : {"dense", "paired", "packed"}) {
        for (int d = 0; d < 4; ++d) {
          if (d == 3 && std::strcmp(rep, "dense") != 0) continue;
          Value t = Value::array();
          t.push(op);
          t.push(rep);
          t.push(kDtypes[d]);
          kernels.push(t);
        }
      }
    }
    r.header["kernels"] = kernels;
    Value schemas = Value::array();
    for (const char *s : {"dense-v1", "paired-csr-v1", "packed-blockwidth-v1"}) schemas.push(s);
    r.header["storage_schemas"] = schemas;
    Value acc = Value::object();
    acc["integer"] = qfv_accumulation_name(info_.integer_accumulation);
    acc["real"] = qfv_accumulation_name(info_.real_accumulation);
    r.header["accumulation"] = acc;
    return r;
  }

  Reply &put(const Value &h, const std::vector<std::vector<uint8_t>> &bufs, Reply &r) {
    int64_t handle = get_int(h, "handle", INT64_MIN + 1);
    const Value *rep = h.get("representation");
    const Value *schema = h.get("storage_schema");
    if (!schema || !schema->is_str()) perr("bad_request", "\"storage_schema\" must be a string");
    if (!rep || !rep->is_str()) perr("bad_request", "\"representation\" must be a string");
    const std::string want = rep->s == "dense"    ? "dense-v1"
                             : rep->s == "paired" ? "paired-csr-v1"
                             : rep->s == "packed" ? "packed-blockwidth-v1"
                                                  : "";
    if (schema->s != "dense-v1" && schema->s != "paired-csr-v1" && schema->s != "packed-blockwidth-v1") {
      perr("unsupported",
           "storage schema " + schema->s + " is not offered (dense-v1, paired-csr-v1, packed-blockwidth-v1)");
    }
    if (want.empty())
      perr("unsupported", "representation " + rep->s + " is not offered (dense, paired, packed)");
    if (want != schema->s)
      perr("bad_request", "representation " + rep->s + " is stored as " + want + ", not " + schema->s);
    qfv_dtype dtype = parse_dtype(h.get("dtype"), "dtype");
    std::vector<int64_t> shape = get_ints(h, "shape", 4);
    uint64_t n = static_cast<uint64_t>(shape[0]) * static_cast<uint64_t>(shape[1]);
    uint64_t k = static_cast<uint64_t>(shape[2]) * static_cast<uint64_t>(shape[3]);
    if (shape[0] > (1 << 30) || shape[1] > (1 << 30) || shape[2] > (1 << 30) || shape[3] > (1 << 30)) {
      perr("bad_request", "shape is too large");
    }
    uint64_t resident = 0;
    auto nbufs = [&](size_t want_n) {
      if (bufs.size() != want_n) {
        perr("bad_request",
             schema->s + " takes " + std::to_string(want_n) + " buffers, got " + std::to_string(bufs.size()));
      }
    };
    if (rep->s == "dense") {
      if (dtype != QFV_FLOAT32 && dtype > QFV_UINT32) perr("unsupported", "dense dtype not offered");
      nbufs(1);
      check(qfv_put_dense(session_, handle, dtype, n, k, bufs[0].data(), bufs[0].size(), &resident));
    } else if (rep->s == "paired") {
      if (dtype == QFV_FLOAT32)
        perr("unsupported", "paired payloads hold integer counts: float32 not offered");
      nbufs(3);
      qfv_dtype idt = parse_dtype(h.get("index_dtype"), "index_dtype");
      qfv_dtype cdt = parse_dtype(h.get("count_dtype"), "count_dtype");
      if (idt != QFV_UINT16 && idt != QFV_UINT32) perr("bad_request", "index_dtype must be uint16 or uint32");
      if (cdt == QFV_FLOAT32) perr("bad_request", "count_dtype must be uint8, uint16 or uint32");
      int ib = idt == QFV_UINT16 ? 2 : 4;
      int cb = cdt == QFV_UINT8 ? 1 : cdt == QFV_UINT16 ? 2 : 4;
      if (bufs[0].size() != 8 * (n + 1)) {
        perr("bad_request", "indptr: expected " + std::to_string(8 * (n + 1)) +
                                " bytes (int64 x rows*cols+1), got " + std::to_string(bufs[0].size()));
      }
      std::vector<int64_t> indptr = as_array<int64_t>(bufs[0]);
      int64_t pairs = indptr.back();
      if (pairs < 0 || bufs[1].size() != static_cast<uint64_t>(pairs) * static_cast<uint64_t>(ib) ||
          bufs[2].size() != static_cast<uint64_t>(pairs) * static_cast<uint64_t>(cb)) {
        perr("bad_request", "indices/counts: expected " + std::to_string(pairs) +
                                " pairs (indptr[-1]), got " + std::to_string(bufs[1].size()) + " and " +
                                std::to_string(bufs[2].size()) + " bytes");
      }
      check(qfv_put_paired(session_, handle, dtype, n, k, indptr.data(), bufs[1].data(), ib, bufs[2].data(),
                           cb, static_cast<uint64_t>(pairs), &resident));
    } else {
      if (dtype == QFV_FLOAT32) perr("unsupported", "packed payloads hold integers: float32 not offered");
      nbufs(3);
      int64_t bv = get_int(h, "block_values", 1);
      if (bufs[1].size() % 8 || bufs[2].size() % 4)
        perr("bad_request", "offsets must be int64 and data uint32 words");
      if (bufs[1].size() / 8 != bufs[0].size()) {
        perr("bad_request", "widths and offsets must have one entry per block, got " +
                                std::to_string(bufs[0].size()) + " and " +
                                std::to_string(bufs[1].size() / 8));
      }
      std::vector<int64_t> offsets = as_array<int64_t>(bufs[1]);
      std::vector<uint32_t> data = as_array<uint32_t>(bufs[2]);
      check(qfv_put_packed(session_, handle, dtype, n, k, static_cast<uint64_t>(bv), bufs[0].data(),
                           offsets.data(), bufs[0].size(), data.data(), data.size(), &resident));
    }
    r.header["type"] = "result";
    r.header["handle"] = Value(handle);
    r.header["resident_bytes"] = Value(resident);
    return r;
  }

  Reply &put_weights(const Value &h, const std::vector<std::vector<uint8_t>> &bufs, Reply &r) {
    int64_t handle = get_int(h, "handle", INT64_MIN + 1);
    std::vector<int64_t> shape = get_ints(h, "shape", 2);
    const Value *dt = h.get("dtype");
    if (dt && (!dt->is_str() || dt->s != "float64")) perr("bad_request", "weights travel as float64");
    uint64_t m = static_cast<uint64_t>(shape[0]), k = static_cast<uint64_t>(shape[1]);
    if (bufs.size() != 1 || m > (1u << 20) || k > (1u << 30) || bufs[0].size() != 8 * m * k) {
      perr("bad_request",
           "put_weights takes one float64 buffer of 8*m*K = " + std::to_string(8 * m * k) + " bytes");
    }
    std::vector<double> w = as_array<double>(bufs[0]);
    uint64_t resident = 0;
    int integer = 0;
    check(qfv_put_weights(session_, handle, m, k, w.data(), &resident, &integer));
    r.header["type"] = "result";
    r.header["handle"] = Value(handle);
    r.header["resident_bytes"] = Value(resident);
    r.header["integer_weights"] = Value(integer != 0);
    return r;
  }

  Reply &run(const Value &h, const std::vector<std::vector<uint8_t>> &bufs, Reply &r) {
    const Value *op = h.get("operation");
    if (!op || !op->is_str()) perr("bad_request", "\"operation\" must be a string");
    int64_t chunk = get_int(h, "chunk", INT64_MIN + 1);
    uint64_t n = 0, k = 0;
    qfv_dtype dtype = QFV_UINT8;
    int rep = 0;
    if (op->s != "frame_pass" && op->s != "gather")
      perr("unsupported", "operation " + op->s + " is not offered (frame_pass, gather)");
    check(qfv_chunk_info(session_, chunk, &n, &k, &dtype, &rep), Value(chunk));
    Value outputs = Value::array();
    r.header["type"] = "result";
    if (op->s == "gather") {
      if (bufs.size() != 1 || bufs[0].size() % 8)
        perr("bad_request", "gather takes one int64 buffer of flat pixel indices");
      std::vector<int64_t> idx = as_array<int64_t>(bufs[0]);
      std::vector<uint8_t> vals(n * idx.size() * (dtype == QFV_UINT8 ? 1 : dtype == QFV_UINT16 ? 2 : 4));
      check(qfv_gather(session_, chunk, idx.data(), idx.size(), vals.data()));
      Value o = Value::object();
      o["name"] = "values";
      o["dtype"] = qfv_dtype_name(dtype);
      o["shape"] = shape_of({n, idx.size()});
      outputs.push(o);
      r.buffers.push_back(std::move(vals));
      r.header["outputs"] = outputs;
      return r;
    }
    int64_t wh = get_int(h, "weights", INT64_MIN + 1);
    const Value *opts = h.get("options");
    if (opts && opts->type != json::Type::object && opts->type != json::Type::null)
      perr("bad_request", "\"options\" must be an object");
    bool want_sum = get_bool(opts, "want_sum"), want_max = get_bool(opts, "want_max");
    // The weights' row count comes from a zero-length probe of the stats; ask the library.
    uint64_t m = weights_rows(wh);
    std::vector<uint8_t> per_frame(n * m * 8), psum(want_sum ? k * 8 : 0),
        pmax(want_max ? k * (dtype == QFV_UINT8    ? 1
                             : dtype == QFV_UINT16 ? 2
                                                   : 4)
                      : 0);
    qfv_pass_result res{};
    res.per_frame = reinterpret_cast<double *>(per_frame.data());
    res.pattern_sum = want_sum ? psum.data() : nullptr;
    res.pattern_max = want_max ? pmax.data() : nullptr;
    check(qfv_frame_pass(session_, chunk, wh, &res), Value(wh));
    Value o = Value::object();
    o["name"] = "per_frame";
    o["dtype"] = "float64";
    o["shape"] = shape_of({n, m});
    outputs.push(o);
    r.buffers.push_back(std::move(per_frame));
    if (want_sum) {
      Value s = Value::object();
      s["name"] = "pattern_sum";
      s["dtype"] = dtype == QFV_FLOAT32 ? "float64" : "int64";
      s["shape"] = shape_of({k});
      outputs.push(s);
      r.buffers.push_back(std::move(psum));
    }
    if (want_max) {
      Value s = Value::object();
      s["name"] = "pattern_max";
      s["dtype"] = qfv_dtype_name(dtype);
      s["shape"] = shape_of({k});
      outputs.push(s);
      r.buffers.push_back(std::move(pmax));
    }
    r.header["outputs"] = outputs;
    r.header["accumulation"] = qfv_accumulation_name(res.accumulation);
    return r;
  }

  uint64_t weights_rows(int64_t wh) {
    auto it = weight_rows_.find(wh);
    if (it == weight_rows_.end())
      perr("unknown_handle", "no weights under handle " + std::to_string(wh) + " (put_weights first)",
           Value(wh));
    return it->second;
  }

public:
  void note_weights(int64_t handle, uint64_t m) { weight_rows_[handle] = m; }
  void forget(int64_t handle) { weight_rows_.erase(handle); }

private:
  Reply &release(const Value &h, Reply &r) {
    const Value *hs = h.get("handles");
    if (!hs || hs->type != json::Type::array) perr("bad_request", "\"handles\" must be a list of integers");
    Value released = Value::array();
    for (const auto &x : hs->a) {
      if (!x.is_int()) perr("bad_request", "\"handles\" must be a list of integers");
    }
    for (const auto &x : hs->a) {
      int freed = 0;
      check(qfv_release(session_, x.i, &freed));
      if (freed) {
        released.push(x);
        forget(x.i);
      }
    }
    qfv_session_info(session_, &info_);
    r.header["type"] = "result";
    r.header["released"] = released;
    r.header["resident_bytes"] = Value(info_.resident_bytes[0] + info_.resident_bytes[1] +
                                       info_.resident_bytes[2] + info_.resident_bytes[3]);
    return r;
  }

  Reply &stats(Reply &r) {
    qfv_session_info(session_, &info_);
    r.header["type"] = "stats";
    r.header["handles"] = Value(info_.handles);
    Value rb = Value::object();
    rb["dense"] = Value(info_.resident_bytes[0]);
    rb["paired"] = Value(info_.resident_bytes[1]);
    rb["packed"] = Value(info_.resident_bytes[2]);
    rb["weights"] = Value(info_.resident_bytes[3]);
    r.header["resident_bytes"] = rb;
    r.header["memory_budget_bytes"] = Value(info_.memory_budget_bytes);
    return r;
  }

  qfv_session *session_ = nullptr;
  qfv_info info_{};
  std::string startup_error_, startup_code_ = "device";
  std::map<int64_t, uint64_t> weight_rows_;
};

Value error_header(const Value &id, const std::string &code, const std::string &msg, const Value &handle) {
  Value e = Value::object();
  e["type"] = "error";
  e["id"] = id;
  e["code"] = code;
  e["message"] = msg;
  if (handle.type != json::Type::null) e["handle"] = handle;
  return e;
}

} // namespace

int serve(int in_fd, int out_fd, const qfv_options &opts) {
  Worker w(opts);
  FdSource src(in_fd);
  while (!w.done) {
    Frame f;
    try {
      if (!read_frame(src, f, w.max_message_bytes())) {
        std::fprintf(stderr, "qf-vulkan-worker: end of input: bye\n");
        return 0;
      }
    } catch (const CodecError &e) {
      std::fprintf(stderr, "qf-vulkan-worker: %s: %s\n", e.code.c_str(), e.what());
      write_all(out_fd, encode_message(error_header(e.id, e.code, e.what(), Value()), {}));
      return 2; // the frame boundary is lost (too_large: the body is not skipped)
    }
    Reply r;
    try {
      r = w.handle(f);
      const std::string &type = f.header.get("type")->s;
      if (type == "put_weights") {
        const Value *shape = f.header.get("shape");
        w.note_weights(f.header.get("handle")->i, static_cast<uint64_t>(shape->a[0].i));
      }
    } catch (const ProtoError &e) {
      std::fprintf(stderr, "qf-vulkan-worker: %s: %s\n", e.code.c_str(), e.message.c_str());
      r = Reply{error_header(Worker::id_of(f.header), e.code, e.message, e.handle), {}};
    } catch (const std::exception &e) {
      r = Reply{error_header(Worker::id_of(f.header), "internal", e.what(), Value()), {}};
    }
    write_all(out_fd, encode_message(r.header, r.buffers));
    if (w.done) return w.exit_code;
  }
  return w.exit_code;
}

} // namespace qfv
