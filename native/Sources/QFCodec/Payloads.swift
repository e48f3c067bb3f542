/// The payloads a worker holds, as the codec validated them (docs/protocol.md, "put").
///
/// Every payload that leaves the codec is consistent: buffer sizes agree with the shape and
/// dtypes, paired indices lie in the frame and are sorted and unique within each frame,
/// packed offsets are the running sums of the block sizes.  Kernels may index them without
/// further checks.

/// The dtype names of the protocol (NumPy's).
public enum DType: String, Sendable, CaseIterable, Comparable {
  case uint8, uint16, uint32, uint64, int8, int16, int32, int64, float32, float64

  /// Bytes per value.
  public var size: Int {
    switch self {
    case .uint8, .int8: return 1
    case .uint16, .int16: return 2
    case .uint32, .int32, .float32: return 4
    case .uint64, .int64, .float64: return 8
    }
  }

  /// Whether values are integers.
  public var isInteger: Bool { self != .float32 && self != .float64 }

  /// The largest value of an unsigned integer dtype (`nil` for others).
  public var unsignedMax: UInt64? {
    switch self {
    case .uint8: return UInt64(UInt8.max)
    case .uint16: return UInt64(UInt16.max)
    case .uint32: return UInt64(UInt32.max)
    case .uint64: return UInt64.max
    default: return nil
    }
  }

  public static func < (a: DType, b: DType) -> Bool { a.rawValue < b.rawValue }
}

/// The representations a worker may hold, with their storage schemas.
public enum Representation: String, Sendable, CaseIterable {
  case dense, paired, packed

  /// The storage schema of the representation.
  public var storageSchema: String {
    switch self {
    case .dense: return "dense-v1"
    case .paired: return "paired-csr-v1"
    case .packed: return "packed-blockwidth-v1"
    }
  }
}

/// `(rows, cols, k_r, k_c)` and the derived frame counts.
public struct ChunkShape: Sendable, Equatable {
  public let rows: Int, cols: Int, detectorRows: Int, detectorCols: Int

  public init(rows: Int, cols: Int, detectorRows: Int, detectorCols: Int) {
    self.rows = rows
    self.cols = cols
    self.detectorRows = detectorRows
    self.detectorCols = detectorCols
  }

  /// Frames: `rows * cols`.
  public var frames: Int { rows * cols }
  /// Pixels of a frame: `k_r * k_c`.
  public var pixels: Int { detectorRows * detectorCols }
  /// The shape as a header list.
  public var json: JSONValue {
    .array([rows, cols, detectorRows, detectorCols].map { .int(Int64($0)) })
  }
}

/// `dense-v1`: `frames` holds `n * K` values of `dtype`.
public struct DensePayload: Sendable {
  public let dtype: DType
  public let shape: ChunkShape
  public let frames: ByteView
}

/// `paired-csr-v1`: per frame, (pixel index, count) pairs in CSR order.
public struct PairedPayload: Sendable {
  public let dtype: DType
  public let shape: ChunkShape
  /// int64, `n + 1` entries from 0 to the number of pairs, non-decreasing.
  public let indptr: ByteView
  /// `indexType` (uint16 or uint32), sorted and unique within a frame, `< K`.
  public let indices: ByteView
  public let indexType: DType
  /// `countType` (uint8, uint16 or uint32), each within `dtype`.
  public let counts: ByteView
  public let countType: DType

  /// Number of (index, count) pairs.
  public var pairs: Int { indices.count / indexType.size }
}

/// `packed-blockwidth-v1`: blocks of `blockValues` values, each block `widths[i]` bits a
/// value starting at word `offsets[i]` of `data` (plus one trailing zero word).
public struct PackedPayload: Sendable {
  public let dtype: DType
  public let shape: ChunkShape
  public let blockValues: Int
  /// uint8, one per block.
  public let widths: ByteView
  /// int64, one per block: the running sums of the blocks' words.
  public let offsets: ByteView
  /// uint32 words.
  public let data: ByteView

  /// Blocks per frame: `ceil(K / blockValues)`.
  public var blocksPerFrame: Int { (shape.pixels + blockValues - 1) / blockValues }
}

/// One chunk's payload.
public enum Payload: Sendable {
  case dense(DensePayload)
  case paired(PairedPayload)
  case packed(PackedPayload)

  public var representation: Representation {
    switch self {
    case .dense: return .dense
    case .paired: return .paired
    case .packed: return .packed
    }
  }

  public var dtype: DType {
    switch self {
    case .dense(let p): return p.dtype
    case .paired(let p): return p.dtype
    case .packed(let p): return p.dtype
    }
  }

  public var shape: ChunkShape {
    switch self {
    case .dense(let p): return p.shape
    case .paired(let p): return p.shape
    case .packed(let p): return p.shape
    }
  }

  /// Bytes of the payload's buffers (what a worker holds for it).
  public var nbytes: Int {
    switch self {
    case .dense(let p): return p.frames.count
    case .paired(let p): return p.indptr.count + p.indices.count + p.counts.count
    case .packed(let p): return p.widths.count + p.offsets.count + p.data.count
    }
  }
}

/// `(m, K)` float64 weight rows of a pass.
public struct WeightRows: Sendable {
  public let rows: Int
  public let pixels: Int
  /// float64, `rows * pixels` values.
  public let values: ByteView

  public init(rows: Int, pixels: Int, values: ByteView) {
    self.rows = rows
    self.pixels = pixels
    self.values = values
  }
}
