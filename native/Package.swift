// swift-tools-version:6.2
// quantem-flow's Swift worker: a qf-worker/1 worker (docs/protocol.md) with Metal kernels on
// Apple GPUs and a SIMD CPU backend everywhere.  Only the toolchain's own modules are used.
//
// Layers, one module each, each importing only those before it:
//   QFCodec   framing, canonical JSON, request validation into typed payloads
//   QFDevice  the ComputeBackend protocol: CPUBackend (Swift SIMD + Dispatch, any platform)
//             and MetalBackend (#if canImport(Metal): MSL compiled from source at start-up)
//   QFWorker  transport-independent: handle table, budget, exactly one reply per request
//   qf-swift-worker  the thin executable: QFWorker on stdin/stdout
import PackageDescription

let strict: [SwiftSetting] = [.treatAllWarnings(as: .error)]

let package = Package(
  name: "QuantemFlowWorker",
  platforms: [.macOS(.v13), .iOS(.v16)],
  products: [
    .library(name: "QuantemFlowWorker", targets: ["QFCodec", "QFDevice", "QFWorker"]),
    .executable(name: "qf-swift-worker", targets: ["QFSwiftWorkerCLI"]),
  ],
  targets: [
    .target(name: "QFCodec", swiftSettings: strict),
    .target(name: "QFDevice", dependencies: ["QFCodec"], swiftSettings: strict),
    .target(name: "QFWorker", dependencies: ["QFCodec", "QFDevice"], swiftSettings: strict),
    .executableTarget(
      name: "QFSwiftWorkerCLI", dependencies: ["QFWorker", "QFCodec", "QFDevice"],
      swiftSettings: strict),
    .testTarget(name: "QFCodecTests", dependencies: ["QFCodec"], swiftSettings: strict),
    .testTarget(
      name: "QFDeviceTests", dependencies: ["QFDevice", "QFCodec"], swiftSettings: strict),
    .testTarget(
      name: "QFWorkerTests", dependencies: ["QFWorker", "QFDevice", "QFCodec"],
      swiftSettings: strict),
  ],
  swiftLanguageModes: [.v6]
)
