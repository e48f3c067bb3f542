// A C++17 stand-in for the Metal names the MSL kernels use, for a syntax and name check on
// Linux (tests/native/test_native_suite.py).  It is not Metal: it cannot say that the MSL
// compiles for a GPU, only that the source is well-formed C++ with these names.
#include <cmath>
#include <cstdint>
#define kernel
#define device
#define constant
#define threadgroup
typedef unsigned int uint; typedef unsigned short ushort; typedef unsigned char uchar;
namespace metal {
  inline uint mulhi(uint a, uint b) { return (uint)(((unsigned long long)a * b) >> 32); }
  template <class T, class U> T as_type(U u) { T t; __builtin_memcpy(&t, &u, sizeof t); return t; }
  using std::isnan; using std::isfinite;
  inline float max(float a, float b) { return a > b ? a : b; }
  inline uint max(uint a, uint b) { return a > b ? a : b; }
  enum class mem_flags { mem_threadgroup };
  inline void threadgroup_barrier(mem_flags) {}
  struct atomic_uint { uint v; };
  enum memory_order { memory_order_relaxed };
  inline uint atomic_fetch_add_explicit(atomic_uint* a, uint v, memory_order) { uint o = a->v; a->v += v; return o; }
  inline uint atomic_fetch_max_explicit(atomic_uint* a, uint v, memory_order) { uint o = a->v; if (v > o) a->v = v; return o; }
}
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
