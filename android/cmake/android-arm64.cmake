# Toolchain file for libqfvulkan on Android arm64-v8a with the NDK (r25 or later).
#
#   export ANDROID_NDK_HOME=/path/to/android-ndk-r26d
#   cmake -S android -B android/build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
#         -DCMAKE_TOOLCHAIN_FILE=android/cmake/android-arm64.cmake
#   cmake --build android/build-arm64 -j2
#
# NOT EXERCISED on this project's machines: the NDK is not installable there
# (no reachable registry carries it), so this path is written to the NDK's
# documented interface and has never been run here.
#
# It wraps the NDK's own toolchain file with the settings this library needs:
# 64-bit ARM, API level 28 (Android 9, the first with Vulkan 1.1 guaranteed
# on devices that ship Vulkan), libc++ shared.  The NDK's glslc
# (shader-tools/<host>/glslc) compiles the shaders; QFV_ANDROID_ASSETS turns
# on AAssetManager loading (src/android_assets.cpp), tests are not built.
if(NOT DEFINED ANDROID_NDK)
  if(DEFINED ENV{ANDROID_NDK_HOME})
    set(ANDROID_NDK "$ENV{ANDROID_NDK_HOME}")
  elseif(DEFINED ENV{ANDROID_NDK_ROOT})
    set(ANDROID_NDK "$ENV{ANDROID_NDK_ROOT}")
  else()
    message(FATAL_ERROR "Set ANDROID_NDK_HOME (or -DANDROID_NDK=...) to the NDK directory")
  endif()
endif()
set(ANDROID_ABI arm64-v8a CACHE STRING "")
set(ANDROID_PLATFORM android-28 CACHE STRING "")
set(ANDROID_STL c++_shared CACHE STRING "")
include("${ANDROID_NDK}/build/cmake/android.toolchain.cmake")
