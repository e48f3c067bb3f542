import Foundation
import QFCodec

/// A payload the CPU backend holds: the frame's bytes themselves (no copy).
final class CPUPayload: ResidentPayload {
  let payload: Payload
  var residentBytes: Int { payload.nbytes }

  init(_ payload: Payload) { self.payload = payload }
}

/// The CPU backend in plain Swift: SIMD types and `DispatchQueue.concurrentPerform`.
///
/// It runs on Linux, and on Apple platforms where Metal is missing or not wanted.
/// Integer data with integer weights are exact (int64 semantics; float64 lanes where every
/// partial sum is provably an integer below 2**53); real data or weights sum in float64.
public final class CPUBackend: ComputeBackend {
  /// Threads a pass uses.
  public let threads: Int
  public let info: BackendInfo

  /// The kernels of the CPU backend.
  public static let kernels = Kernel.table(
    dense: [.uint8, .uint16, .uint32, .float32], counted: [.uint8, .uint16, .uint32])

  public init(threads: Int? = nil, autoReason: String? = nil) {
    let cores = ProcessInfo.processInfo.activeProcessorCount
    let threads = Swift.max(1, threads ?? cores)
    self.threads = threads
    #if os(Linux)
      let os = "linux"
    #elseif os(macOS)
      let os = "macos"
    #else
      let os = "apple"
    #endif
    var details: [String: JSONValue] = [
      "threads": .int(Int64(threads)), "os": .string(os),
      "simd": "SIMD8<Double>", "vendor_id": 0,
    ]
    if let autoReason { details["auto"] = .string(autoReason) }
    let memory = Int(clamping: ProcessInfo.processInfo.physicalMemory)
    info = BackendInfo(
      name: "host CPU (\(threads) threads, Swift SIMD)", type: "cpu", backend: "cpu-simd",
      details: details, kernels: CPUBackend.kernels, integerAccumulation: "int64",
      realAccumulation: "float64", maxBufferBytes: Int(Int32.max), maxFramePixels: 1 << 24,
      maxWeights: 4096, defaultBudgetBytes: Swift.max(1 << 26, memory / 2))
  }

  public func heldBytes(for payload: Payload) -> Int { payload.nbytes }

  public func heldBytes(for weights: WeightRows) -> Int {
    CPUWeights.heldBytes(rows: weights.rows, pixels: weights.pixels, int64: true, int32: true)
  }

  public func store(_ payload: Payload) -> Result<any ResidentPayload, ProtocolError> {
    .success(CPUPayload(payload))
  }

  public func store(weights: WeightRows) -> Result<any ResidentWeights, ProtocolError> {
    .success(CPUWeights(weights))
  }

  public func framePass(
    _ chunk: any ResidentPayload, weights: any ResidentWeights, wantSum: Bool, wantMax: Bool
  ) -> Result<FramePassOutput, ProtocolError> {
    guard let w = weights as? CPUWeights else {
      return .failure(ProtocolError(.internal, "weights of another backend"))
    }
    let payload = chunk.payload
    switch payload.dtype {
    case .uint8: return .success(pass(UInt8.self, payload, w, wantSum, wantMax))
    case .uint16: return .success(pass(UInt16.self, payload, w, wantSum, wantMax))
    case .uint32: return .success(pass(UInt32.self, payload, w, wantSum, wantMax))
    case .float32: return .success(pass(Float.self, payload, w, wantSum, wantMax))
    default:
      return .failure(
        ProtocolError(
          .unsupported, "dtype \(payload.dtype.rawValue) is not offered by the CPU backend"))
    }
  }

  func pass<T: FrameElement>(
    _ t: T.Type, _ payload: Payload, _ w: CPUWeights, _ wantSum: Bool, _ wantMax: Bool
  ) -> FramePassOutput {
    let n = payload.shape.frames
    let k = payload.shape.pixels
    switch payload {
    case .dense(let d):
      return d.frames.withUnsafeBytes { raw in
        let base = typed(raw, T.self)  // 8-byte aligned (Framing)
        return frameRowsPass(
          t, frames: n, pixels: k, weights: w, wantSum: wantSum, wantMax: wantMax,
          threads: threads
        ) { f, _ in UnsafePointer(base + f * k) }
      }
    case .packed(let p):
      return p.widths.withUnsafeBytes { ws in
        p.offsets.withUnsafeBytes { os in
          p.data.withUnsafeBytes { ds in
            let widths = typed(ws, UInt8.self)
            let offsets = typed(os, Int64.self)
            let data = typed(ds, UInt32.self)
            return frameRowsPass(
              t, frames: n, pixels: k, weights: w, wantSum: wantSum, wantMax: wantMax,
              threads: threads
            ) { f, scratch in
              decodePackedFrame(
                f, k: k, blockValues: p.blockValues, blocksPerFrame: p.blocksPerFrame,
                widths: widths, offsets: offsets, data: data, into: scratch)
              return UnsafePointer(scratch)
            }
          }
        }
      }
    case .paired(let p):
      return withPairedViews(p) { v in
        pairedFramePass(
          t, v, frames: n, pixels: k, weights: w, wantSum: wantSum, wantMax: wantMax,
          threads: threads)
      }
    }
  }

  public func gather(_ chunk: any ResidentPayload, indices: [Int]) -> Result<[UInt8], ProtocolError>
  {
    let payload = chunk.payload
    switch payload.dtype {
    case .uint8: return .success(gatherValues(UInt8.self, payload, indices))
    case .uint16: return .success(gatherValues(UInt16.self, payload, indices))
    case .uint32: return .success(gatherValues(UInt32.self, payload, indices))
    case .float32: return .success(gatherValues(Float.self, payload, indices))
    default:
      return .failure(
        ProtocolError(
          .unsupported, "dtype \(payload.dtype.rawValue) is not offered by the CPU backend"))
    }
  }

  func gatherValues<T: FrameElement>(_: T.Type, _ payload: Payload, _ indices: [Int]) -> [UInt8] {
    let n = payload.shape.frames
    let k = payload.shape.pixels
    let c = indices.count
    var out = [T](repeating: T(packed: 0), count: n * c)
    switch payload {
    case .dense(let d):
      d.frames.withUnsafeBytes { raw in
        let base = typed(raw, T.self)
        for f in 0..<n { for (j, p) in indices.enumerated() { out[f * c + j] = base[f * k + p] } }
      }
    case .paired(let p):
      withPairedViews(p) { v in
        for f in 0..<n {
          for (j, px) in indices.enumerated() {
            out[f * c + j] = T(packed: UInt32(truncatingIfNeeded: v.value(frame: f, pixel: px)))
          }
        }
      }
    case .packed(let p):
      p.widths.withUnsafeBytes { ws in
        p.offsets.withUnsafeBytes { os in
          p.data.withUnsafeBytes { ds in
            let widths = typed(ws, UInt8.self)
            let offsets = typed(os, Int64.self)
            let data = typed(ds, UInt32.self)
            for f in 0..<n {
              for (j, px) in indices.enumerated() {
                out[f * c + j] = T(
                  packed: packedValue(
                    f, px, blockValues: p.blockValues, blocksPerFrame: p.blocksPerFrame,
                    widths: widths, offsets: offsets, data: data))
              }
            }
          }
        }
      }
    }
    return bytesOf(out)
  }
}

/// Call `body` with raw views of a paired payload's buffers.
func withPairedViews<R>(_ p: PairedPayload, _ body: (PairedViews) -> R) -> R {
  p.indptr.withUnsafeBytes { ip in
    p.indices.withUnsafeBytes { ix in
      p.counts.withUnsafeBytes { cs in
        body(
          PairedViews(
            indptr: UnsafeRawPointer(typed(ip, UInt8.self)),
            indices: UnsafeRawPointer(typed(ix, UInt8.self)),
            indexWide: p.indexType == .uint32, counts: UnsafeRawPointer(typed(cs, UInt8.self)),
            countSize: p.countType.size))
      }
    }
  }
}

/// The typed start of `raw` (an aligned placeholder for an empty buffer, never read).
@inline(__always)
func typed<T>(_ raw: UnsafeRawBufferPointer, _: T.Type) -> UnsafeMutablePointer<T> {
  guard let base = raw.baseAddress else { return placeholder.assumingMemoryBound(to: T.self) }
  return UnsafeMutableRawPointer(mutating: base).assumingMemoryBound(to: T.self)
}

nonisolated(unsafe) let placeholder = UnsafeMutableRawPointer.allocate(byteCount: 64, alignment: 64)
