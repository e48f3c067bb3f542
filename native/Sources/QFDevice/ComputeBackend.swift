import QFCodec

/// One kernel a backend runs: `(operation, representation, dtype)`, as `hello` declares it.
public struct Kernel: Hashable, Sendable, Comparable {
  public let operation: String
  public let representation: Representation
  public let dtype: DType

  public init(_ operation: String, _ representation: Representation, _ dtype: DType) {
    self.operation = operation
    self.representation = representation
    self.dtype = dtype
  }

  public static func < (a: Kernel, b: Kernel) -> Bool {
    (a.operation, a.representation.rawValue, a.dtype.rawValue)
      < (b.operation, b.representation.rawValue, b.dtype.rawValue)
  }

  /// `frame_pass` and `gather` on dense `dense` dtypes and paired/packed `counted` dtypes.
  public static func table(dense: [DType], counted: [DType]) -> [Kernel] {
    var out: [Kernel] = []
    for op in ["frame_pass", "gather"] {
      out += dense.map { Kernel(op, .dense, $0) }
      for rep in [Representation.paired, .packed] { out += counted.map { Kernel(op, rep, $0) } }
    }
    return out.sorted()
  }
}

/// What a backend is and offers: the `device`, `kernels`, `accumulation` and `limits` of
/// `hello` come from here, so the worker declares exactly what its backend runs.
public struct BackendInfo: Sendable {
  /// The device's name (`"Apple M2 Max"`, `"host CPU (8 threads)"`).
  public var name: String
  /// `"gpu"` or `"cpu"`.
  public var type: String
  /// `"metal"` or `"cpu-simd"`.
  public var backend: String
  /// More `device` members of `hello` (strings and integers).
  public var details: [String: JSONValue]
  /// The kernels this backend runs.
  public var kernels: [Kernel]
  /// How integer data with integer weights are summed: `"int64"` or `"u32x2"`.
  public var integerAccumulation: String
  /// How real data or real weights are summed: `"float64"` or `"float32"`.
  public var realAccumulation: String
  /// Largest single buffer the backend allocates.
  public var maxBufferBytes: Int
  /// Largest frame, in pixels.
  public var maxFramePixels: Int
  /// Most weight rows of one `put_weights`.
  public var maxWeights: Int
  /// The payload budget when none is given: half the memory payloads live in.
  public var defaultBudgetBytes: Int

  /// Whether `kernel` is offered.
  public func offers(_ operation: String, _ representation: Representation, _ dtype: DType) -> Bool
  {
    kernels.contains(Kernel(operation, representation, dtype))
  }
}

/// A payload held by a backend (host memory for the CPU, a shared `MTLBuffer` on Metal).
public protocol ResidentPayload: AnyObject {
  /// The payload as it arrived (views into its frame).
  var payload: Payload { get }
  /// Bytes the backend holds for it.
  var residentBytes: Int { get }
}

/// Weight rows held by a backend for every chunk of a pass.
public protocol ResidentWeights: AnyObject {
  var rows: Int { get }
  var pixels: Int { get }
  /// Every weight is a finite integer (the exact integer path may be used).
  var integer: Bool { get }
  /// Bytes the backend holds for them.
  var residentBytes: Int { get }
}

/// The pattern sum of a frame pass: int64 for integer data, float64 for real data.
public enum PatternSum: Sendable {
  case integer([Int64])
  case real([Double])
}

/// What a frame pass returns (docs/protocol.md, "run").
public struct FramePassOutput: Sendable {
  /// `(n_frames, m)` row-major: the dot product of every frame with every weight row.
  public var perFrame: [Double]
  /// The per-pixel sum over frames, when asked.
  public var patternSum: PatternSum?
  /// The per-pixel maximum over frames in the data's dtype (little-endian bytes), when asked.
  public var patternMax: [UInt8]?
  /// The accumulation used: `int64`, `u32x2`, `float64` or `float32`.
  public var accumulation: String

  public init(
    perFrame: [Double], patternSum: PatternSum?, patternMax: [UInt8]?, accumulation: String
  ) {
    self.perFrame = perFrame
    self.patternSum = patternSum
    self.patternMax = patternMax
    self.accumulation = accumulation
  }
}

/// A compute backend: where payloads live and kernels run.  Every failure is returned as a
/// `ProtocolError` (`device` for a device failure, `internal` for anything else).
public protocol ComputeBackend: AnyObject {
  /// What this backend is and runs.
  var info: BackendInfo { get }

  /// Bytes `store(payload)` would hold (the worker admits them before anything is allocated).
  func heldBytes(for payload: Payload) -> Int

  /// Bytes `store(weights:)` would hold.
  func heldBytes(for weights: WeightRows) -> Int

  /// Hold `payload` (the codec validated it; the worker checked the budget and kernels).
  func store(_ payload: Payload) -> Result<any ResidentPayload, ProtocolError>

  /// Hold weight rows for the passes to come.
  func store(weights: WeightRows) -> Result<any ResidentWeights, ProtocolError>

  /// `per_frame`, and the sum and max patterns when asked, of one chunk.
  func framePass(
    _ chunk: any ResidentPayload, weights: any ResidentWeights, wantSum: Bool, wantMax: Bool
  ) -> Result<FramePassOutput, ProtocolError>

  /// The values of flat pixels `indices` of every frame: `(n_frames, indices.count)` in the
  /// data's dtype (little-endian bytes).
  func gather(_ chunk: any ResidentPayload, indices: [Int]) -> Result<[UInt8], ProtocolError>
}

/// Which backend to use.
public enum BackendChoice: String, Sendable, CaseIterable {
  /// Metal where this build and machine have it, else the CPU.
  case auto
  case cpu
  case metal
}

/// Whether this build can use Metal (an Apple platform with a Metal device).
public var metalAvailable: (Bool, String) {
  #if canImport(Metal)
    return MetalBackend.probe()
  #else
    return (false, "this build has no Metal (Metal exists on Apple platforms only)")
  #endif
}

/// Make the backend `choice` names.  An explicit `metal` where Metal is missing is an
/// error naming why: there is no silent fallback.  `auto` records which it chose in `info`.
public func makeBackend(_ choice: BackendChoice, threads: Int? = nil) -> Result<
  any ComputeBackend, ProtocolError
> {
  switch choice {
  case .cpu:
    return .success(CPUBackend(threads: threads))
  case .metal, .auto:
    #if canImport(Metal)
      let (ok, why) = MetalBackend.probe()
      if ok { return MetalBackend.make().map { $0 as any ComputeBackend } }
      if choice == .metal {
        return .failure(ProtocolError(.device, "Metal was asked for but is not available: \(why)"))
      }
      return .success(CPUBackend(threads: threads, autoReason: "Metal not available: \(why)"))
    #else
      if choice == .metal {
        return .failure(
          ProtocolError(
            .device,
            "Metal was asked for but this build has no Metal (it exists on Apple platforms "
              + "only); use --device cpu or auto"))
      }
      return .success(
        CPUBackend(threads: threads, autoReason: "Metal not available: not an Apple platform"))
    #endif
  }
}
