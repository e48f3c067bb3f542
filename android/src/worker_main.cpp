// qf-vulkan-worker: the Vulkan runtime of quantem-flow as a child process
// speaking qf-worker/1 on stdin/stdout (logs on stderr only).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "server.hpp"

namespace {
void usage() {
  std::fprintf(stderr, "usage: qf-vulkan-worker [--device INDEX|NAME] [--budget-bytes N] [--force-u32x2]\n"
                       "                        [--force-float32] [--validation] [--list-devices]\n"
                       "Speaks qf-worker/1 on stdin/stdout (see docs/protocol.md); logs go to stderr.\n");
}
} // namespace

int main(int argc, char **argv) {
  qfv_options opts;
  qfv_default_options(&opts);
  std::string device;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "qf-vulkan-worker: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--device") {
      device = value();
    } else if (a == "--budget-bytes") {
      std::string v = value();
      char *end = nullptr;
      unsigned long long b = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || b == 0) {
        std::fprintf(stderr, "qf-vulkan-worker: --budget-bytes takes a positive integer, got %s\n",
                     v.c_str());
        return 64;
      }
      opts.budget_bytes = b;
    } else if (a == "--force-u32x2") {
      opts.force_u32x2 = 1;
    } else if (a == "--force-float32") {
      opts.force_float32 = 1;
    } else if (a == "--validation") {
      opts.validation = 1;
    } else if (a == "--list-devices") {
      list = true;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "qf-vulkan-worker: unknown option %s\n", a.c_str());
      usage();
      return 64;
    }
  }
  if (!device.empty()) {
    bool digits = device.find_first_not_of("0123456789") == std::string::npos;
    if (digits) {
      opts.device_index = std::atoi(device.c_str());
    } else {
      opts.device_name = device.c_str();
    }
  }
  if (list) {
    char buf[8192];
    if (qfv_list_devices(buf, sizeof(buf), opts.validation) != QFV_OK) {
      std::fprintf(stderr, "qf-vulkan-worker: %s\n", qfv_global_error());
      return 1;
    }
    std::fputs(buf, stdout); // --list-devices is not a protocol session
    return 0;
  }
  return qfv::serve(STDIN_FILENO, STDOUT_FILENO, opts);
}
