#!/usr/bin/env bash
# Build the Swift worker of native/ (qf-swift-worker), or say plainly why it is not built.
#
# usage: bash scripts/build-native.sh [--portable]
#
# - the release worker the `swift` runtime starts: native/.build/release/qf-swift-worker,
#   compiled for this machine's CPU (`-target-cpu native`: AVX2/AVX-512 lanes where the
#   CPU has them; --portable builds for the architecture's baseline instead);
# - the test build: `swift build --build-tests` (debug), and the same tests with
#   AddressSanitizer in native/.build-asan;
# - the libFuzzer target of the frame parser (native/.build-fuzz/qf-fuzz-protocol), where
#   swiftc's -sanitize=fuzzer works.
# Warnings are errors in every build (Package.swift: treatAllWarnings(as: .error)).
# Where `swift` is not installed it prints how to install it and exits 0: the Swift tests
# then skip, naming the same.  Where it is installed, any failure here fails the script.
set -euo pipefail
cd "$(dirname "$0")/../native"

if ! command -v swift >/dev/null 2>&1; then
  echo "install-toolchains: native/ is not built: swift is not installed (Swift 6: https://www.swift.org/install/, or Xcode on macOS)"
  exit 0
fi
# SwiftPM leaves an empty TemporaryDirectory.XXXXXX in $TMPDIR on every run: give it its own
tmp_for_swift="$(mktemp -d)"
trap 'rm -rf "$tmp_for_swift"' EXIT
export TMPDIR="$tmp_for_swift"
cpu=(-Xswiftc -target-cpu -Xswiftc native)
if [ "${1:-}" = "--portable" ]; then cpu=(); fi
echo "install-toolchains: swift build -c release in native/ ($(swift --version 2>/dev/null | head -1))"
swift build -c release --product qf-swift-worker "${cpu[@]}"
echo "install-toolchains: swift build --build-tests in native/ (debug), and with AddressSanitizer"
swift build --build-tests
swift build --build-tests --sanitize=address --scratch-path .build-asan
echo "install-toolchains: the libFuzzer target of the frame parser (native/.build-fuzz)"
mkdir -p .build-fuzz
swiftc -parse-as-library -sanitize=fuzzer,address -O -warnings-as-errors \
  -module-name QFCodec -emit-executable -o .build-fuzz/qf-fuzz-protocol \
  Sources/QFCodec/*.swift Fuzz/FuzzProtocol.swift
