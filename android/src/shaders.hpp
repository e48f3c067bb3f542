// SPIR-V of the compute kernels, compiled by glslc at build time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qfv {
// Code of the kernel `name` (for example "frame_dot.I64", "gather"): embedded
// in the library; on Android (QFV_ANDROID_ASSETS) an asset of the same name
// under shaders/ replaces it when present.
std::vector<uint32_t> shader_code(const std::string &name);
// Android-only asset loader; the host build compiles a stub that returns false.
bool load_shader_asset(const std::string &name, std::vector<uint32_t> &out);
} // namespace qfv
