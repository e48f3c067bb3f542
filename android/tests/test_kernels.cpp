// Kernels through the C ABI against a C++ CPU reference on random data, for
// every (representation, dtype), on the 64-bit and the forced two-word integer
// accumulators, with validation layers on where installed.
#include <qfvulkan.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "harness.hpp"

namespace {

std::mt19937_64 rng(20261203);

struct Data {
  qfv_dtype dtype;
  uint64_t n, k;
  std::vector<uint8_t> bytes; // (n, k) in dtype
  double at(uint64_t f, uint64_t p) const {
    uint64_t i = f * k + p;
    switch (dtype) {
    case QFV_UINT8: return bytes[i];
    case QFV_UINT16: {
      uint16_t v;
      std::memcpy(&v, &bytes[2 * i], 2);
      return v;
    }
    case QFV_UINT32: {
      uint32_t v;
      std::memcpy(&v, &bytes[4 * i], 4);
      return v;
    }
    default: {
      float v;
      std::memcpy(&v, &bytes[4 * i], 4);
      return static_cast<double>(v);
    }
    }
  }
  uint32_t bits(uint64_t f, uint64_t p) const {
    uint32_t v = 0;
    uint32_t es = dtype == QFV_UINT8 ? 1 : dtype == QFV_UINT16 ? 2 : 4;
    std::memcpy(&v, &bytes[es * (f * k + p)], es);
    return v;
  }
};

uint32_t esize(qfv_dtype d) {
  return d == QFV_UINT8 ? 1 : d == QFV_UINT16 ? 2 : 4;
}

// occupancy: fraction of non-zero values; vmax: largest value.
Data make(qfv_dtype d, uint64_t n, uint64_t k, double occupancy, uint64_t vmax) {
  Data x{d, n, k, std::vector<uint8_t>(n * k * esize(d), 0)};
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < n * k; ++i) {
    if (u(rng) >= occupancy) continue;
    if (d == QFV_FLOAT32) {
      float v = static_cast<float>((u(rng) - 0.3) * 1000.0);
      std::memcpy(&x.bytes[4 * i], &v, 4);
    } else {
      uint64_t v = 1 + rng() % vmax;
      std::memcpy(&x.bytes[esize(d) * i], &v, esize(d));
    }
  }
  return x;
}

std::vector<double> weights(uint64_t m, uint64_t k, bool integer) {
  std::vector<double> w(m * k);
  std::uniform_real_distribution<double> u(-2, 3);
  for (double &v : w) v = integer ? static_cast<double>(static_cast<int64_t>(rng() % 11) - 4) : u(rng);
  return w;
}

struct Ref {
  std::vector<double> per_frame;
  std::vector<int64_t> isum;
  std::vector<double> fsum;
  std::vector<uint32_t> max;  // bits of the dtype's values
  std::vector<double> absdot; // sum |v w| per (frame, row): scale of the rounding error
};

Ref reference(const Data &x, const std::vector<double> &w, uint64_t m, bool int_exact) {
  Ref r;
  r.per_frame.assign(x.n * m, 0);
  r.absdot.assign(x.n * m, 0);
  for (uint64_t f = 0; f < x.n; ++f) {
    for (uint64_t j = 0; j < m; ++j) {
      if (int_exact) {
        int64_t s = 0;
        for (uint64_t p = 0; p < x.k; ++p)
          s += static_cast<int64_t>(x.bits(f, p)) * static_cast<int64_t>(w[j * x.k + p]);
        r.per_frame[f * m + j] = static_cast<double>(s);
      } else {
        long double s = 0, a = 0;
        for (uint64_t p = 0; p < x.k; ++p) {
          long double t = static_cast<long double>(x.at(f, p)) * static_cast<long double>(w[j * x.k + p]);
          s += t;
          a += std::fabs(t);
        }
        r.per_frame[f * m + j] = static_cast<double>(s);
        r.absdot[f * m + j] = static_cast<double>(a);
      }
    }
  }
  r.isum.assign(x.k, 0);
  r.fsum.assign(x.k, 0);
  bool fl = x.dtype == QFV_FLOAT32;
  r.max.assign(x.k, fl ? 0xFF800000u : 0u);
  for (uint64_t p = 0; p < x.k; ++p) {
    double fs = 0;
    float mx = -std::numeric_limits<float>::infinity();
    for (uint64_t f = 0; f < x.n; ++f) {
      r.isum[p] += static_cast<int64_t>(x.bits(f, p));
      fs += x.at(f, p);
      if (fl) {
        float v = static_cast<float>(x.at(f, p));
        if (!std::isnan(mx) && (std::isnan(v) || v > mx)) mx = v;
      } else {
        r.max[p] = std::max(r.max[p], x.bits(f, p));
      }
    }
    r.fsum[p] = fs;
    if (fl) std::memcpy(&r.max[p], &mx, 4);
  }
  return r;
}

struct Session {
  qfv_session *s = nullptr;
  qfv_info info{};
  explicit Session(int force_u32x2, uint64_t budget = 0, int force_f32 = 0, const char *name = nullptr,
                   int index = -1) {
    qfv_options o;
    qfv_default_options(&o);
    o.force_u32x2 = force_u32x2;
    o.force_float32 = force_f32;
    o.budget_bytes = budget;
    o.device_name = name;
    o.device_index = index;
    qfv_status st = qfv_session_create(&o, &s);
    CHECK_MSG(st == QFV_OK, qfv_global_error());
    if (s) qfv_session_info(s, &info);
  }
  ~Session() {
    if (s) {
      qfv_session_info(s, &info);
      CHECK_MSG(info.validation_messages == 0,
                "validation layer messages: " + std::to_string(info.validation_messages));
      qfv_session_destroy(s);
    }
  }
};

// Paired and packed encodings of integer data.
struct PairedEnc {
  std::vector<int64_t> indptr;
  std::vector<uint8_t> idx, cnt;
  int ib, cb;
};
PairedEnc to_paired(const Data &x, int ib, int cb) {
  PairedEnc e{{0}, {}, {}, ib, cb};
  for (uint64_t f = 0; f < x.n; ++f) {
    for (uint64_t p = 0; p < x.k; ++p) {
      uint32_t v = x.bits(f, p);
      if (!v) continue;
      uint8_t b[4];
      std::memcpy(b, &p, 4);
      e.idx.insert(e.idx.end(), b, b + ib);
      std::memcpy(b, &v, 4);
      e.cnt.insert(e.cnt.end(), b, b + cb);
    }
    e.indptr.push_back(static_cast<int64_t>(e.idx.size() / static_cast<size_t>(ib)));
  }
  return e;
}
struct PackedEnc {
  std::vector<uint8_t> widths;
  std::vector<int64_t> offsets;
  std::vector<uint32_t> data;
};
PackedEnc to_packed(const Data &x, uint64_t bv) {
  PackedEnc e;
  uint64_t nb = (x.k + bv - 1) / bv;
  int64_t o = 0;
  for (uint64_t f = 0; f < x.n; ++f) {
    for (uint64_t j = 0; j < nb; ++j) {
      uint64_t s = j * bv, t = std::min(x.k, s + bv);
      uint32_t orv = 0;
      for (uint64_t p = s; p < t; ++p) orv |= x.bits(f, p);
      uint8_t w = 0;
      while (orv >> w) ++w;
      e.widths.push_back(w);
      e.offsets.push_back(o);
      uint64_t words = ((t - s) * w + 31) / 32;
      e.data.resize(static_cast<size_t>(o) + words, 0);
      for (uint64_t p = s; w != 0 && p < t; ++p) {
        uint64_t b = (p - s) * w;
        uint64_t v = x.bits(f, p);
        uint64_t wi = static_cast<uint64_t>(o) + b / 32;
        e.data[wi] |= static_cast<uint32_t>(v << (b % 32));
        if ((b % 32) + w > 32) e.data[wi + 1] |= static_cast<uint32_t>(v >> (32 - b % 32));
      }
      o += static_cast<int64_t>(words);
    }
  }
  e.data.push_back(0);
  return e;
}

enum class Rep { dense, paired, packed };
const char *rep_name(Rep r) {
  return r == Rep::dense ? "dense" : r == Rep::paired ? "paired" : "packed";
}

qfv_status put(Session &S, qfv_handle h, Rep rep, const Data &x, int variant) {
  uint64_t res = 0;
  if (rep == Rep::dense)
    return qfv_put_dense(S.s, h, x.dtype, x.n, x.k, x.bytes.data(), x.bytes.size(), &res);
  if (rep == Rep::paired) {
    int ib = (x.k <= 65536 && variant % 2 == 0) ? 2 : 4;
    int cb = std::max<int>(static_cast<int>(esize(x.dtype)), variant % 3 == 2 ? 4 : 1);
    PairedEnc e = to_paired(x, ib, cb);
    return qfv_put_paired(S.s, h, x.dtype, x.n, x.k, e.indptr.data(), e.idx.data(), ib, e.cnt.data(), cb,
                          static_cast<uint64_t>(e.indptr.back()), &res);
  }
  uint64_t bv = variant % 3 == 0 ? 32 : variant % 3 == 1 ? 64 : 128;
  PackedEnc e = to_packed(x, bv);
  return qfv_put_packed(S.s, h, x.dtype, x.n, x.k, bv, e.widths.data(), e.offsets.data(), e.widths.size(),
                        e.data.data(), e.data.size(), &res);
}

bool close_enough(double got, double want, double scale, double rtol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rtol * std::max(scale, std::fabs(want)) + 1e-300;
}

// One case: put, frame pass, compare, gather, compare, release.
void run_case(Session &S, Rep rep, const Data &x, uint64_t m, bool int_weights, int variant, double rtol) {
  std::string what = std::string(rep_name(rep)) + " " + qfv_dtype_name(x.dtype) +
                     " n=" + std::to_string(x.n) + " k=" + std::to_string(x.k) + " m=" + std::to_string(m) +
                     (int_weights ? " int-w" : " real-w") +
                     " acc=" + qfv_accumulation_name(S.info.integer_accumulation);
  qfv_status st = put(S, 1, rep, x, variant);
  CHECK_MSG(st == QFV_OK, what + ": put: " + qfv_last_error(S.s));
  std::vector<double> w = weights(m, x.k, int_weights);
  int integer = -1;
  uint64_t res = 0;
  st = qfv_put_weights(S.s, 2, m, x.k, w.data(), &res, &integer);
  CHECK_MSG(st == QFV_OK && integer == ((int_weights || m == 0) ? 1 : 0), what + ": put_weights");
  bool exact = (int_weights || m == 0) && x.dtype != QFV_FLOAT32;
  Ref ref = reference(x, w, m, exact);
  std::vector<double> pf(x.n * m, -1);
  std::vector<int64_t> isum(x.k, -1);
  std::vector<double> fsum(x.k, -1);
  std::vector<uint8_t> mx(x.k * esize(x.dtype), 0xAB);
  qfv_pass_result r{};
  r.per_frame = pf.data();
  r.pattern_sum =
      x.dtype == QFV_FLOAT32 ? static_cast<void *>(fsum.data()) : static_cast<void *>(isum.data());
  r.pattern_max = mx.data();
  st = qfv_frame_pass(S.s, 1, 2, &r);
  CHECK_MSG(st == QFV_OK, what + ": frame_pass: " + qfv_last_error(S.s));
  if (exact) {
    CHECK_MSG(r.accumulation == S.info.integer_accumulation, what);
    CHECK_MSG(pf == ref.per_frame, what + ": per_frame not exact");
  } else {
    CHECK_MSG(r.accumulation == S.info.real_accumulation, what);
    for (size_t i = 0; i < pf.size(); ++i) {
      CHECK_MSG(close_enough(pf[i], ref.per_frame[i], ref.absdot[i], rtol),
                what + ": per_frame[" + std::to_string(i) + "] " + std::to_string(pf[i]) + " vs " +
                    std::to_string(ref.per_frame[i]));
    }
  }
  if (x.dtype == QFV_FLOAT32) {
    for (uint64_t p = 0; p < x.k; ++p) {
      CHECK_MSG(close_enough(fsum[p], ref.fsum[p], 0, S.info.real_accumulation == QFV_ACC_FLOAT64 ? 0 : 1e-5),
                what + ": pattern_sum");
    }
  } else {
    CHECK_MSG(isum == ref.isum, what + ": pattern_sum not exact");
  }
  for (uint64_t p = 0; p < x.k; ++p) {
    uint32_t got = 0;
    std::memcpy(&got, &mx[p * esize(x.dtype)], esize(x.dtype));
    CHECK_MSG(got == ref.max[p], what + ": pattern_max at " + std::to_string(p));
  }
  // Gather a few pixels (repeated, unordered, first and last).
  std::vector<int64_t> idx = {static_cast<int64_t>(x.k - 1), 0, static_cast<int64_t>(x.k / 2), 0};
  std::vector<uint8_t> vals(x.n * idx.size() * esize(x.dtype), 0xCD);
  st = qfv_gather(S.s, 1, idx.data(), idx.size(), vals.data());
  CHECK_MSG(st == QFV_OK, what + ": gather: " + qfv_last_error(S.s));
  for (uint64_t f = 0; f < x.n; ++f) {
    for (size_t j = 0; j < idx.size(); ++j) {
      uint32_t got = 0;
      std::memcpy(&got, &vals[(f * idx.size() + j) * esize(x.dtype)], esize(x.dtype));
      CHECK_MSG(got == x.bits(f, static_cast<uint64_t>(idx[j])), what + ": gather");
    }
  }
  int freed = 0;
  CHECK(qfv_release(S.s, 1, &freed) == QFV_OK && freed == 1);
  CHECK(qfv_release(S.s, 2, &freed) == QFV_OK && freed == 1);
  CHECK(qfv_release(S.s, 2, &freed) == QFV_OK && freed == 0);
}

void sweep(int force_u32x2) {
  Session S(force_u32x2);
  if (!S.s) return;
  CHECK(S.info.integer_accumulation == (force_u32x2 ? QFV_ACC_U32X2 : QFV_ACC_INT64));
  const std::pair<uint64_t, uint64_t> shapes[] = {{3, 5}, {16, 9}, {33, 31}};
  const uint64_t frames[] = {0, 1, 2, 5, 7};
  const uint64_t rows[] = {0, 1, 2, 5, 11};
  int variant = 0;
  int cases = 0;
  for (Rep rep : {Rep::dense, Rep::paired, Rep::packed}) {
    for (qfv_dtype d : {QFV_UINT8, QFV_UINT16, QFV_UINT32, QFV_FLOAT32}) {
      if (d == QFV_FLOAT32 && rep != Rep::dense) continue;
      for (auto sh : shapes) {
        uint64_t n = frames[variant % 5];
        uint64_t m = rows[(variant / 2) % 5];
        uint64_t vmax = d == QFV_UINT8    ? 255
                        : d == QFV_UINT16 ? 65535
                                          : (rep == Rep::packed ? 65535 : 4294967295u);
        Data x = make(d, n, sh.first * sh.second, variant % 2 ? 0.05 : 0.6, vmax);
        for (bool iw : {true, false}) {
          run_case(S, rep, x, m, iw, variant, 1e-12);
          ++cases;
        }
        ++variant;
      }
    }
  }
  std::fprintf(stderr, "  %d cases on %s\n", cases, qfv_accumulation_name(S.info.integer_accumulation));
}

} // namespace

TEST(device_and_accumulation_choice) {
  Session S(0);
  if (!S.s) return;
  std::fprintf(stderr, "  device %s (%s), integer %s, real %s, budget %llu\n", S.info.device_name,
               S.info.device_type, qfv_accumulation_name(S.info.integer_accumulation),
               qfv_accumulation_name(S.info.real_accumulation),
               static_cast<unsigned long long>(S.info.memory_budget_bytes));
  CHECK(S.info.memory_budget_bytes > 0 && S.info.max_buffer_bytes > 0);
  Session F(1, 0, 1);
  CHECK(F.info.integer_accumulation == QFV_ACC_U32X2 && F.info.real_accumulation == QFV_ACC_FLOAT32);
}

TEST(device_selection) {
  char list[4096];
  CHECK(qfv_list_devices(list, sizeof(list), 0) == QFV_OK && std::strlen(list) > 0);
  { Session byindex(0, 0, 0, nullptr, 0); }
  qfv_session *s = nullptr;
  qfv_options o;
  qfv_default_options(&o);
  o.device_index = 99;
  CHECK(qfv_session_create(&o, &s) == QFV_ERR_BAD_REQUEST && s == nullptr);
  CHECK(std::strstr(qfv_global_error(), "out of range") != nullptr);
  o.device_index = -1;
  o.device_name = "no-such-device";
  CHECK(qfv_session_create(&o, &s) == QFV_ERR_BAD_REQUEST && s == nullptr);
  // The first device by a case-insensitive part of its name.
  std::string first = std::string(list).substr(std::string(list).find('\t') + 1);
  first = first.substr(0, first.find('\t'));
  std::string part = first.substr(0, std::min<size_t>(5, first.size()));
  for (char &c : part) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Session byname(0, 0, 0, part.c_str());
  CHECK(std::string(byname.info.device_name) == first);
}

TEST(all_representations_int64) {
  sweep(0);
}
TEST(all_representations_u32x2) {
  sweep(1);
}

TEST(float32_accumulation_tolerance) {
  Session S(1, 0, 1);
  if (!S.s) return;
  Data x = make(QFV_FLOAT32, 5, 16 * 9, 0.7, 0);
  run_case(S, Rep::dense, x, 5, false, 0, 1e-5);
  Data y = make(QFV_UINT16, 5, 16 * 9, 0.7, 65535);
  run_case(S, Rep::packed, y, 5, false, 1, 1e-5);
  run_case(S, Rep::paired, y, 5, true, 1, 0); // integer path stays exact
}

TEST(exact_beyond_2_32) {
  for (int force : {0, 1}) {
    Session S(force);
    if (!S.s) continue;
    // uint32 values near 2**32: pattern sums over 5 frames pass 2**34, per-frame
    // sums with weights of +-1000003 reach 2**52, and one product -(2**31 - 1) x ~2**32.
    Data x{QFV_UINT32, 5, 64, std::vector<uint8_t>(5 * 64 * 4)};
    for (uint64_t i = 0; i < 5 * 64; ++i) {
      uint32_t v = 0xFFFFFFFFu - static_cast<uint32_t>(rng() % 1000);
      std::memcpy(&x.bytes[4 * i], &v, 4);
    }
    for (Rep rep : {Rep::dense, Rep::paired}) {
      uint64_t res = 0;
      CHECK(put(S, 10, rep, x, 1) == QFV_OK);
      std::vector<double> w(3 * 64);
      for (uint64_t p = 0; p < 64; ++p) {
        w[p] = 1;
        w[64 + p] = p % 2 ? -1000003.0 : 1000003.0; // products ~2**52 need the high word
        w[128 + p] = 0;
      }
      w[64 + 62] = 0;             // unbalanced: sums of order 4e15
      w[128 + 7] = -2147483647.0; // one product of ~-2**63
      int integer = 0;
      CHECK(qfv_put_weights(S.s, 11, 3, 64, w.data(), &res, &integer) == QFV_OK && integer == 1);
      std::vector<double> pf(15);
      std::vector<int64_t> sum(64);
      qfv_pass_result r{pf.data(), sum.data(), nullptr, QFV_ACC_FLOAT64};
      CHECK(qfv_frame_pass(S.s, 10, 11, &r) == QFV_OK);
      for (uint64_t f = 0; f < 5; ++f) {
        int64_t s[3] = {0, 0, 0};
        for (uint64_t p = 0; p < 64; ++p) {
          for (int j = 0; j < 3; ++j)
            s[j] += static_cast<int64_t>(x.bits(f, p)) * static_cast<int64_t>(w[64 * j + p]);
        }
        for (int j = 0; j < 3; ++j) {
          CHECK_MSG(pf[f * 3 + j] == static_cast<double>(s[j]),
                    std::string(rep_name(rep)) + " per_frame beyond 2**32");
        }
      }
      for (uint64_t p = 0; p < 64; ++p) {
        int64_t s = 0;
        for (uint64_t f = 0; f < 5; ++f) s += x.bits(f, p);
        CHECK(sum[p] == s && s > (int64_t(1) << 34));
      }
      int freed = 0;
      qfv_release(S.s, 10, &freed);
      qfv_release(S.s, 11, &freed);
    }
  }
}

TEST(nan_and_inf) {
  Session S(0);
  if (!S.s) return;
  // float32 frames holding NaN and inf: max propagates NaN like numpy.max.
  Data x = make(QFV_FLOAT32, 4, 12, 0.9, 0);
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::memcpy(&x.bytes[4 * (1 * 12 + 3)], &nan, 4); // frame 1, pixel 3
  std::memcpy(&x.bytes[4 * (2 * 12 + 5)], &inf, 4); // frame 2, pixel 5
  float ninf = -inf;
  std::memcpy(&x.bytes[4 * (0 * 12 + 7)], &ninf, 4);
  run_case(S, Rep::dense, x, 2, false, 0, 1e-12);
  // Non-finite weights: 0 * inf = nan for frames that miss the pixel (dense and paired agree).
  Data y = make(QFV_UINT16, 4, 12, 0.3, 9);
  for (uint64_t f = 0; f < 4; ++f) {
    uint16_t v = f == 2 ? 1 : 0;
    std::memcpy(&y.bytes[2 * (f * 12 + 4)], &v, 2); // only frame 2 hits pixel 4
  }
  std::vector<double> w(2 * 12, 1.0);
  w[4] = std::numeric_limits<double>::infinity();
  w[12 + 4] = std::numeric_limits<double>::quiet_NaN();
  Ref ref = reference(y, w, 2, false);
  for (Rep rep : {Rep::dense, Rep::paired, Rep::packed}) {
    CHECK(put(S, 20, rep, y, 0) == QFV_OK);
    uint64_t res = 0;
    int integer = 1;
    CHECK(qfv_put_weights(S.s, 21, 2, 12, w.data(), &res, &integer) == QFV_OK && integer == 0);
    std::vector<double> pf(8);
    qfv_pass_result r{pf.data(), nullptr, nullptr, QFV_ACC_INT64};
    CHECK(qfv_frame_pass(S.s, 20, 21, &r) == QFV_OK);
    for (size_t i = 0; i < 8; ++i) {
      CHECK_MSG(close_enough(pf[i], ref.per_frame[i], ref.absdot[i], 1e-12),
                std::string(rep_name(rep)) + " non-finite weights at " + std::to_string(i) + ": " +
                    std::to_string(pf[i]) + " vs " + std::to_string(ref.per_frame[i]));
    }
    CHECK(std::isinf(pf[2 * 2]) && std::isnan(pf[0]) && std::isnan(pf[2 * 2 + 1]));
    int freed;
    qfv_release(S.s, 20, &freed);
    qfv_release(S.s, 21, &freed);
  }
}

TEST(budget_refuses_before_allocating) {
  Session S(0, 64 * 1024);
  if (!S.s) return;
  CHECK(S.info.memory_budget_bytes == 64 * 1024);
  Data big = make(QFV_UINT16, 10, 64 * 64, 0.5, 100); // 80 KiB
  uint64_t res = 0;
  qfv_status st = qfv_put_dense(S.s, 1, big.dtype, big.n, big.k, big.bytes.data(), big.bytes.size(), &res);
  CHECK(st == QFV_ERR_BUDGET);
  CHECK(std::strstr(qfv_last_error(S.s), "budget") != nullptr);
  CHECK(std::string(qfv_status_name(st)) == "budget");
  qfv_info info;
  qfv_session_info(S.s, &info);
  CHECK(info.handles == 0 && info.resident_bytes[0] == 0);
  Data small = make(QFV_UINT16, 5, 64 * 64, 0.5, 100); // 40 KiB fits
  CHECK(put(S, 1, Rep::dense, small, 0) == QFV_OK);
  CHECK(put(S, 2, Rep::dense, small, 0) == QFV_ERR_BUDGET); // 80 KiB does not fit
  PackedEnc e = to_packed(small, 128);                      // packed is far smaller: admitted
  CHECK(qfv_put_packed(S.s, 3, small.dtype, small.n, small.k, 128, e.widths.data(), e.offsets.data(),
                       e.widths.size(), e.data.data(), e.data.size(), &res) == QFV_OK);
  int freed = 0;
  CHECK(qfv_release(S.s, 1, &freed) == QFV_OK && freed == 1);
  CHECK(put(S, 2, Rep::dense, small, 0) == QFV_OK);
}

TEST(bad_requests_are_errors) {
  Session S(0);
  if (!S.s) return;
  Data x = make(QFV_UINT16, 3, 20, 0.5, 1000);
  uint64_t res = 0;
  CHECK(qfv_put_dense(S.s, 1, x.dtype, x.n, x.k, x.bytes.data(), x.bytes.size() - 2, &res) ==
        QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_dense(S.s, 1, QFV_FLOAT64, x.n, x.k, x.bytes.data(), x.bytes.size(), &res) ==
        QFV_ERR_UNSUPPORTED);
  CHECK(qfv_put_dense(S.s, 1, x.dtype, x.n, x.k, x.bytes.data(), x.bytes.size(), &res) == QFV_OK);
  CHECK(qfv_put_dense(S.s, 1, x.dtype, x.n, x.k, x.bytes.data(), x.bytes.size(), &res) ==
        QFV_ERR_BAD_REQUEST);
  std::vector<double> w(20, 1.0);
  int integer = 0;
  CHECK(qfv_put_weights(S.s, 2, 1, 20, w.data(), &res, &integer) == QFV_OK);
  CHECK(qfv_put_weights(S.s, 3, 1, 19, w.data(), &res, &integer) == QFV_OK);
  std::vector<double> pf(3);
  qfv_pass_result r{pf.data(), nullptr, nullptr, QFV_ACC_INT64};
  CHECK(qfv_frame_pass(S.s, 9, 2, &r) == QFV_ERR_UNKNOWN_HANDLE);
  CHECK(qfv_frame_pass(S.s, 1, 9, &r) == QFV_ERR_UNKNOWN_HANDLE);
  CHECK(qfv_frame_pass(S.s, 1, 3, &r) == QFV_ERR_BAD_REQUEST); // K mismatch
  int64_t bad_idx[] = {20};
  uint16_t out[3];
  CHECK(qfv_gather(S.s, 1, bad_idx, 1, out) == QFV_ERR_BAD_REQUEST);
  // Paired: unsorted indices, index out of range, indptr not ending at the pair count.
  int64_t indptr[] = {0, 2, 2, 3};
  uint16_t idx[] = {5, 4, 1};
  uint8_t cnt[] = {1, 1, 1};
  CHECK(qfv_put_paired(S.s, 5, QFV_UINT16, 3, 20, indptr, idx, 2, cnt, 1, 3, &res) == QFV_ERR_BAD_REQUEST);
  uint16_t idx2[] = {4, 25, 1};
  CHECK(qfv_put_paired(S.s, 5, QFV_UINT16, 3, 20, indptr, idx2, 2, cnt, 1, 3, &res) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_paired(S.s, 5, QFV_UINT16, 3, 20, indptr, idx, 2, cnt, 1, 2, &res) == QFV_ERR_BAD_REQUEST);
  // Packed: offsets that disagree with the widths, widths over the dtype, missing trailing word.
  PackedEnc e = to_packed(x, 32);
  std::vector<int64_t> off = e.offsets;
  if (off.size() > 1) off[1] += 1;
  CHECK(qfv_put_packed(S.s, 6, x.dtype, x.n, x.k, 32, e.widths.data(), off.data(), e.widths.size(),
                       e.data.data(), e.data.size(), &res) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_packed(S.s, 6, x.dtype, x.n, x.k, 32, e.widths.data(), e.offsets.data(), e.widths.size(),
                       e.data.data(), e.data.size() - 1, &res) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_packed(S.s, 6, x.dtype, x.n, x.k, 48, e.widths.data(), e.offsets.data(), e.widths.size(),
                       e.data.data(), e.data.size(), &res) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_packed(S.s, 6, QFV_FLOAT32, x.n, x.k, 32, e.widths.data(), e.offsets.data(), e.widths.size(),
                       e.data.data(), e.data.size(), &res) == QFV_ERR_UNSUPPORTED);
  // Null arguments never crash.
  CHECK(qfv_frame_pass(S.s, 1, 2, nullptr) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_put_weights(nullptr, 1, 1, 1, nullptr, nullptr, nullptr) == QFV_ERR_BAD_REQUEST);
  CHECK(qfv_session_create(nullptr, nullptr) == QFV_ERR_BAD_REQUEST);
}

TEST(packed_many_groups) {
  // More frames than the 16 MiB decode scratch holds at once: decoded in groups.
  Session S(1);
  if (!S.s) return;
  Data x = make(QFV_UINT16, 70, 256 * 256, 0.02, 3000); // 70 x 64 Ki values: 5 groups of 64 frames
  run_case(S, Rep::packed, x, 5, true, 2, 0);
}

int main() {
  return harness::run_all();
}
