#!/usr/bin/env bash
# Install what the tests need besides Python packages: Debian packages (as root), the
# android/ builds, and the web/ worker's npm packages and build (scripts/build-web.sh).
# Safe to run again; prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  chromium                    # headless page host for the WebGPU worker (SwiftShader)
  mesa-vulkan-drivers         # lavapipe (Vulkan on the CPU)
  libvulkan-dev glslc cmake g++ spirv-tools  # the android/ Vulkan worker's build and shader checks
  vulkan-validationlayers     # validation layers on in the Vulkan worker's tests
  clang-format                # the android/ format check
  clang libclang-rt-14-dev    # libFuzzer + sanitizer runtimes (android/ fuzz target)
  libegl1 libegl-mesa0 libgles2 libgl1-mesa-dri  # EGL + GLES + llvmpipe: Dawn's GLES backend
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-toolchains: need root to install ${missing[*]} (or install them yourself)" >&2
    exit 1
  fi
  echo "install-toolchains: apt-get install ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ -f android/CMakeLists.txt ]; then
  echo "install-toolchains: cmake build of android/ (host build on lavapipe)"
  cmake -S android -B android/build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build android/build -j2
  echo "install-toolchains: android/ with AddressSanitizer + UBSan, and the libFuzzer target"
  cmake -S android -B android/build-sanitize -DCMAKE_BUILD_TYPE=Debug -DQFV_SANITIZE=ON >/dev/null
  cmake --build android/build-sanitize -j2
  CC=clang CXX=clang++ cmake -S android -B android/build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DQFV_FUZZ=ON -DQFV_BUILD_TESTS=OFF -DQFV_BUILD_WORKER=OFF >/dev/null
  cmake --build android/build-fuzz -j2 --target qfv-fuzz-protocol
fi

# native/: the Swift worker (release for this CPU, the tests, ASan, the fuzz target) where
# swift is installed; where it is not, one line says so (the Swift tests then skip).
bash scripts/build-native.sh

# web/: npm ci && npm run build where the npm registry answers; where it cannot be reached,
# one line says so and the set-up goes on (the web/ tests then skip with that reason).
bash scripts/build-web.sh web
