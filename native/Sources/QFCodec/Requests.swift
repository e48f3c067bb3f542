/// Requests of `qf-worker/1`, validated into typed values (docs/protocol.md, "Messages").
///
/// The checks and their order follow the Python reference (`validate_request`, then
/// `parse_put` / `parse_put_weights` / `parse_run_gather`), so the same bytes give the
/// same error code in every implementation.  A request that leaves `Request.parse` is
/// well formed; what depends on the worker's state (handles, budget, the kernels it
/// offers) is the worker's to check.

/// The protocol version this codec speaks.
public let protocolVersion = "qf-worker/1"

/// Every request type, in the order of docs/protocol.md.
public let requestTypes = ["hello", "put", "put_weights", "run", "release", "stats", "ping", "bye"]

/// A `run` request.
public enum RunRequest: Sendable {
  case framePass(chunk: Int64, weights: Int64, wantSum: Bool, wantMax: Bool)
  case gather(chunk: Int64, indices: [Int])

  /// The chunk handle the run is on.
  public var chunk: Int64 {
    switch self {
    case .framePass(let c, _, _, _), .gather(let c, _): return c
    }
  }
}

/// A `put` request: a new handle and its validated payload.
public struct PutRequest: Sendable {
  public let handle: Int64
  public let payload: Payload
  public let scanSlice: ((Int, Int), (Int, Int))
}

/// A request, validated.
public enum Request: Sendable {
  case hello(id: Int64, protocol: String)
  case put(id: Int64, PutRequest)
  case putWeights(id: Int64, handle: Int64, weights: WeightRows)
  case run(id: Int64, RunRequest)
  case release(id: Int64, handles: [Int64])
  case stats(id: Int64)
  case ping(id: Int64)
  case bye(id: Int64)

  /// The request's id.
  public var id: Int64 {
    switch self {
    case .hello(let id, _), .put(let id, _), .putWeights(let id, _, _), .run(let id, _),
      .release(let id, _), .stats(let id), .ping(let id), .bye(let id):
      return id
    }
  }

  /// Validate `message` into a request.
  ///
  /// Errors: `unsupported` for a type that is not a request, an unknown operation or a
  /// representation without a storage schema; `bad_request` for a missing or ill-typed
  /// member, a wrong buffer count or size, or an inconsistent payload.
  public static func parse(_ message: Message) -> Result<Request, ProtocolError> {
    do throws(ProtocolError) {
      return .success(try RequestParser(message).parse())
    } catch {
      return .failure(error)
    }
  }
}

/// The handle a request concerns (for error replies), when it names one.
public func handleOf(_ message: Message) -> Int64? {
  message.header["handle"]?.int ?? message.header["chunk"]?.int
}

struct RequestParser {
  let message: Message
  let h: [String: JSONValue]
  let kind: String

  init(_ message: Message) {
    self.message = message
    self.h = message.header
    self.kind = message.type
  }

  func bad(_ text: String, handle: Int64? = nil) -> ProtocolError {
    .bad("\(kind): \(text)", handle: handle)
  }

  func int(_ key: String, in object: [String: JSONValue]? = nil, minimum: Int64 = 0)
    throws(ProtocolError) -> Int64
  {
    let value = (object ?? h)[key]
    guard let v = value?.int, v >= minimum else {
      throw bad(
        "member '\(key)' must be an integer >= \(minimum), got \(value?.shortDescription ?? "none")"
      )
    }
    return v
  }

  func string(_ key: String, in object: [String: JSONValue]? = nil, choices: [String]? = nil)
    throws(ProtocolError) -> String
  {
    let value = (object ?? h)[key]
    guard let s = value?.string, choices == nil || choices!.contains(s) else {
      let expect = choices.map { "one of \($0)" } ?? "a string"
      throw bad("member '\(key)' must be \(expect), got \(value?.shortDescription ?? "none")")
    }
    return s
  }

  func ints(_ key: String, length: Int? = nil) throws(ProtocolError) -> [Int64] {
    let value = h[key]
    let items = value?.array ?? []
    let values = items.compactMap { $0.int }.filter { $0 >= 0 }
    guard value?.array != nil, values.count == items.count, length == nil || values.count == length
    else {
      let n = length.map { "\($0) " } ?? ""
      throw bad(
        "member '\(key)' must be a list of \(n)non-negative integers, got "
          + (value?.shortDescription ?? "none"))
    }
    return values
  }

  func bool(_ key: String, in object: [String: JSONValue]) throws(ProtocolError) -> Bool {
    guard let b = object[key]?.bool else {
      throw bad(
        "member '\(key)' must be true or false, got \(object[key]?.shortDescription ?? "none")")
    }
    return b
  }

  func buffers(_ n: Int) throws(ProtocolError) -> [ByteView] {
    guard message.buffers.count == n else {
      throw bad("expected \(n) buffer(s), got \(message.buffers.count)", handle: handleOf(message))
    }
    return message.buffers
  }

  func parse() throws(ProtocolError) -> Request {
    guard requestTypes.contains(kind) else {
      throw ProtocolError(
        .unsupported,
        "message type '\(kind)' is not a request this worker answers; requests: \(requestTypes)")
    }
    let id = try int("id")
    switch kind {
    case "hello":
      return .hello(id: id, protocol: try string("protocol"))
    case "put":
      return .put(id: id, try put())
    case "put_weights":
      let handle = try int("handle")
      let shape = try ints("shape", length: 2)
      _ = try string("dtype", choices: ["float64"])
      let (buffer) = try buffers(1)[0]
      let rows = Int(shape[0])
      let pixels = Int(shape[1])
      let (count, overflow) = rows.multipliedReportingOverflow(by: pixels)
      guard !overflow, buffer.count == count &* 8 else {
        throw bad(
          "buffer weights has \(buffer.count) bytes, expected \(rows) x \(pixels) float64 values")
      }
      return .putWeights(
        id: id, handle: handle, weights: WeightRows(rows: rows, pixels: pixels, values: buffer))
    case "run":
      let op = try string("operation")
      let chunk = try int("chunk")
      switch op {
      case "frame_pass":
        let weights = try int("weights")
        guard let options = h["options"]?.object else {
          throw bad(
            "member 'options' must be an object, got \(h["options"]?.shortDescription ?? "none")")
        }
        let wantSum = try bool("want_sum", in: options)
        let wantMax = try bool("want_max", in: options)
        _ = try buffers(0)
        return .run(
          id: id, .framePass(chunk: chunk, weights: weights, wantSum: wantSum, wantMax: wantMax))
      case "gather":
        let buffer = try buffers(1)[0]
        guard buffer.count % 8 == 0 else {
          throw bad("gather indices buffer of \(buffer.count) bytes is not int64")
        }
        var indices = [Int](repeating: 0, count: buffer.count / 8)
        for i in indices.indices {
          let v = buffer.load(i, as: Int64.self)
          guard v >= 0 else { throw bad("gather indices must be non-negative, got \(v)") }
          indices[i] = Int(v)
        }
        return .run(id: id, .gather(chunk: chunk, indices: indices))
      default:
        throw ProtocolError(
          .unsupported,
          "run: operation '\(op)' is not offered; operations: ['frame_pass', 'gather']",
          handle: chunk)
      }
    case "release":
      return .release(id: id, handles: try ints("handles"))
    case "stats":
      return .stats(id: id)
    case "ping":
      return .ping(id: id)
    default:
      return .bye(id: id)
    }
  }

  // MARK: put

  func put() throws(ProtocolError) -> PutRequest {
    let handle = try int("handle")
    let repName = h["representation"]?.string
    let schema = h["storage_schema"]?.string
    guard let rep = repName.flatMap(Representation.init(rawValue:)), schema == rep.storageSchema
    else {
      throw ProtocolError(
        .unsupported,
        "put: representation \(h["representation"]?.shortDescription ?? "none") with "
          + "storage_schema \(h["storage_schema"]?.shortDescription ?? "none") is not offered; "
          + "offered: dense-v1, paired-csr-v1, packed-blockwidth-v1",
        handle: handle)
    }
    let dtype = DType(rawValue: try string("dtype", choices: DType.allCases.map(\.rawValue)))!
    let s = try ints("shape", length: 4)
    let slice = h["scan_slice"]?.array?.compactMap { $0.array?.compactMap { $0.int } }
    guard let slice, slice.count == 2,
      slice.allSatisfy({ $0.count == 2 && $0[0] >= 0 && $0[0] <= $0[1] }),
      h["scan_slice"]!.array!.allSatisfy({ ($0.array?.count ?? 0) == 2 })
    else {
      throw bad(
        "scan_slice must be [[r0, r1], [c0, c1]] with r0 <= r1, got "
          + (h["scan_slice"]?.shortDescription ?? "none"))
    }
    guard slice[0][1] - slice[0][0] == s[0], slice[1][1] - slice[1][0] == s[1] else {
      throw bad(
        "scan_slice covers \(slice[0][1] - slice[0][0]) x \(slice[1][1] - slice[1][0]) scan "
          + "positions but shape is \(s)", handle: handle)
    }
    // Sizes the arithmetic below can hold: a frame of 2**40 values is beyond any worker.
    guard s.allSatisfy({ $0 < (1 << 31) }) else {
      throw bad("shape \(s) is too large", handle: handle)
    }
    let shape = ChunkShape(
      rows: Int(s[0]), cols: Int(s[1]), detectorRows: Int(s[2]), detectorCols: Int(s[3]))
    guard shape.frames.multipliedReportingOverflow(by: shape.pixels).overflow == false,
      shape.frames * shape.pixels < (1 << 50)
    else { throw bad("shape \(s) is too large", handle: handle) }
    let scanSlice = (
      (Int(slice[0][0]), Int(slice[0][1])), (Int(slice[1][0]), Int(slice[1][1]))
    )
    let payload: Payload
    switch rep {
    case .dense: payload = .dense(try dense(dtype, shape, handle))
    case .paired: payload = .paired(try paired(dtype, shape, handle))
    case .packed: payload = .packed(try packed(dtype, shape, handle))
    }
    return PutRequest(handle: handle, payload: payload, scanSlice: scanSlice)
  }

  func sized(_ view: ByteView, _ name: String, _ dtype: DType, _ count: Int, _ handle: Int64)
    throws(ProtocolError)
  {
    guard view.count == count * dtype.size else {
      throw bad(
        "buffer \(name) has \(view.count) bytes, expected \(count) \(dtype.rawValue) values = "
          + "\(count * dtype.size) bytes", handle: handle)
    }
  }

  func dense(_ dtype: DType, _ shape: ChunkShape, _ handle: Int64) throws(ProtocolError)
    -> DensePayload
  {
    let frames = try buffers(1)[0]
    try sized(frames, "frames", dtype, shape.frames * shape.pixels, handle)
    return DensePayload(dtype: dtype, shape: shape, frames: frames)
  }

  func paired(_ dtype: DType, _ shape: ChunkShape, _ handle: Int64) throws(ProtocolError)
    -> PairedPayload
  {
    let indexType = DType(
      rawValue: try string("index_dtype", choices: ["uint16", "uint32"]))!
    let countType = DType(
      rawValue: try string("count_dtype", choices: ["uint8", "uint16", "uint32", "uint64"]))!
    guard dtype.isInteger else {
      throw bad("paired data must have an integer dtype, got \(dtype.rawValue)", handle: handle)
    }
    let b = try buffers(3)
    let n = shape.frames
    let k = shape.pixels
    try sized(b[0], "indptr", .int64, n + 1, handle)
    let pairs = b[1].count / indexType.size
    try sized(b[1], "indices", indexType, pairs, handle)
    try sized(b[2], "counts", countType, pairs, handle)
    // indptr: 0 .. pairs, non-decreasing; indices in the frame, sorted and unique per frame
    let first = b[0].load(0, as: Int64.self)
    let last = b[0].load(n, as: Int64.self)
    guard first == 0, last == Int64(pairs) else {
      throw bad(
        "paired indptr must run from 0 to the \(pairs) pairs, got \(first) .. \(last)",
        handle: handle)
    }
    let countMax = dtype.unsignedMax ?? UInt64(Int64.max)
    try b[0].withUnsafeBytes { (ip) throws(ProtocolError) in
      try b[1].withUnsafeBytes { (ix) throws(ProtocolError) in
        try b[2].withUnsafeBytes { (cs) throws(ProtocolError) in
          var previous = 0
          for f in 0..<n {
            let a = Int(ip.loadUnaligned(fromByteOffset: 8 * f, as: Int64.self))
            let e = Int(ip.loadUnaligned(fromByteOffset: 8 * (f + 1), as: Int64.self))
            guard a >= previous, e >= a, e <= pairs else {
              throw bad("paired indptr must be non-decreasing (frame \(f))", handle: handle)
            }
            previous = a
            var last = -1
            for q in a..<e {
              let p =
                indexType == .uint16
                ? Int(ix.loadUnaligned(fromByteOffset: 2 * q, as: UInt16.self))
                : Int(ix.loadUnaligned(fromByteOffset: 4 * q, as: UInt32.self))
              guard p < k else {
                throw bad("a paired index is \(p) >= \(k) pixels (frame \(f))", handle: handle)
              }
              guard p > last else {
                throw bad(
                  "paired indices must be sorted and unique within a frame (frame \(f) has "
                    + "\(p) after \(last))", handle: handle)
              }
              last = p
              let c: UInt64
              switch countType {
              case .uint8: c = UInt64(cs.load(fromByteOffset: q, as: UInt8.self))
              case .uint16: c = UInt64(cs.loadUnaligned(fromByteOffset: 2 * q, as: UInt16.self))
              case .uint32: c = UInt64(cs.loadUnaligned(fromByteOffset: 4 * q, as: UInt32.self))
              default: c = cs.loadUnaligned(fromByteOffset: 8 * q, as: UInt64.self)
              }
              guard c <= countMax else {
                throw bad(
                  "a paired count is \(c), beyond the value dtype \(dtype.rawValue) (frame \(f))",
                  handle: handle)
              }
            }
          }
        }
      }
    }
    return PairedPayload(
      dtype: dtype, shape: shape, indptr: b[0], indices: b[1], indexType: indexType,
      counts: b[2], countType: countType)
  }

  func packed(_ dtype: DType, _ shape: ChunkShape, _ handle: Int64) throws(ProtocolError)
    -> PackedPayload
  {
    let bv = try int("block_values", minimum: 32)
    guard bv % 32 == 0 else { throw bad("block_values must be a multiple of 32, got \(bv)") }
    guard dtype.isInteger else {
      throw bad("packed data must have an integer dtype, got \(dtype.rawValue)", handle: handle)
    }
    let b = try buffers(3)
    let k = shape.pixels
    guard bv < (1 << 31) else { throw bad("block_values \(bv) is too large", handle: handle) }
    let blockValues = Int(bv)
    let perFrame = k == 0 ? 0 : (k + blockValues - 1) / blockValues
    let blocks = shape.frames * perFrame
    try sized(b[0], "widths", .uint8, blocks, handle)
    try sized(b[1], "offsets", .int64, blocks, handle)
    guard b[2].count % 4 == 0, b[2].count >= 4 else {
      throw bad(
        "packed data must be whole uint32 words plus a trailing zero word, got \(b[2].count) "
          + "bytes", handle: handle)
    }
    let words = b[2].count / 4
    let maxWidth = min(16, dtype.size * 8)
    let lastCount = k - (perFrame - 1) * blockValues
    var end = 0
    try b[0].withUnsafeBytes { (ws) throws(ProtocolError) in
      try b[1].withUnsafeBytes { (os) throws(ProtocolError) in
        for i in 0..<blocks {
          let w = Int(ws[i])
          guard w <= maxWidth else {
            throw bad(
              "packed block \(i) has width \(w), over \(maxWidth) bits for \(dtype.rawValue)",
              handle: handle)
          }
          let o = os.loadUnaligned(fromByteOffset: 8 * i, as: Int64.self)
          guard o == Int64(end) else {
            throw bad(
              "packed offsets[\(i)] is \(o), expected \(end): offsets are not the running sum "
                + "of the block sizes", handle: handle)
          }
          let count = (i % perFrame == perFrame - 1) ? lastCount : blockValues
          end += (count * w + 31) / 32
        }
      }
    }
    guard words == end + 1 else {
      throw bad(
        "packed data: expected \(end + 1) words (the blocks plus the trailing zero word), got "
          + "\(words)", handle: handle)
    }
    return PackedPayload(
      dtype: dtype, shape: shape, blockValues: blockValues, widths: b[0], offsets: b[1],
      data: b[2])
  }
}
