// Shader loading from the APK's assets on Android, behind QFV_ANDROID_ASSETS.
// The host build compiles the stub branch, so this file is always built.
#include "shaders.hpp"

#if defined(QFV_ANDROID_ASSETS)
#include <android/asset_manager.h>

#include <mutex>

namespace {
std::mutex g_mutex;
AAssetManager *g_manager = nullptr;
} // namespace

extern "C" __attribute__((visibility("default"))) void qfv_android_set_asset_manager(AAssetManager *manager) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_manager = manager;
}

namespace qfv {
bool load_shader_asset(const std::string &name, std::vector<uint32_t> &out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_manager == nullptr) {
    return false;
  }
  std::string path = "shaders/" + name + ".spv";
  AAsset *asset = AAssetManager_open(g_manager, path.c_str(), AASSET_MODE_BUFFER);
  if (asset == nullptr) {
    return false;
  }
  off_t len = AAsset_getLength(asset);
  bool ok = len > 0 && len % 4 == 0;
  if (ok) {
    out.resize(static_cast<size_t>(len) / 4);
    ok = AAsset_read(asset, out.data(), static_cast<size_t>(len)) == len;
  }
  AAsset_close(asset);
  return ok;
}
} // namespace qfv
#else
namespace qfv {
bool load_shader_asset(const std::string & /*name*/, std::vector<uint32_t> & /*out*/) {
  return false; // host build: the embedded SPIR-V is used
}
} // namespace qfv
#endif
