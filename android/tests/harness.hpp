// A minimal test harness (no dependency): TEST(name) { CHECK(...); }.
#pragma once
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace harness {
struct Test {
  const char *name;
  std::function<void()> fn;
};
inline std::vector<Test> &tests() {
  static std::vector<Test> t;
  return t;
}
inline int &failures() {
  static int f = 0;
  return f;
}
inline long &checks() {
  static long c = 0;
  return c;
}
struct Reg {
  Reg(const char *n, std::function<void()> f) { tests().push_back({n, std::move(f)}); }
};
inline int run_all() {
  int failed_tests = 0;
  for (auto &t : tests()) {
    int before = failures();
    std::fprintf(stderr, "[ RUN  ] %s\n", t.name);
    t.fn();
    bool ok = failures() == before;
    failed_tests += ok ? 0 : 1;
    std::fprintf(stderr, "[ %s ] %s\n", ok ? " OK " : "FAIL", t.name);
  }
  std::fprintf(stderr, "%zu tests, %d failed, %ld checks\n", tests().size(), failed_tests, checks());
  return failed_tests ? 1 : 0;
}
} // namespace harness

#define TEST(name)                                                                                           \
  static void name();                                                                                        \
  static harness::Reg reg_##name(#name, name);                                                               \
  static void name()
#define CHECK_MSG(cond, msg)                                                                                 \
  do {                                                                                                       \
    ++harness::checks();                                                                                     \
    if (!(cond)) {                                                                                           \
      ++harness::failures();                                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed %s\n", __FILE__, __LINE__, #cond,                        \
                   std::string(msg).c_str());                                                                \
    }                                                                                                        \
  } while (0)
#define CHECK(cond) CHECK_MSG(cond, "")
