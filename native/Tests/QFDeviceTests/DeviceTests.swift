import QFCodec
import QFDevice
import Testing

// The CPU backend's kernels against a plain reference on random data: every dtype and
// representation it declares, NaN and infinities, empty chunks, frames whose pixel count is
// no multiple of the SIMD width, thread counts, sums beyond 2**32 and near 2**63.

/// A small seeded generator (repeatable; the seed is in each test).
struct Rand: RandomNumberGenerator {
  var state: UInt64
  init(_ seed: UInt64) { state = seed }
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
}

/// Frames as float64 (exact for every dtype here) plus their dtype.
struct Frames {
  let dtype: DType
  let n: Int
  let k: Int
  var values: [Double]

  func bytes() -> [UInt8] {
    var out: [UInt8] = []
    for v in values {
      switch dtype {
      case .uint8: out.append(UInt8(v))
      case .uint16: withUnsafeBytes(of: UInt16(v).littleEndian) { out += $0 }
      case .uint32: withUnsafeBytes(of: UInt32(v).littleEndian) { out += $0 }
      default: withUnsafeBytes(of: Float(v).bitPattern.littleEndian) { out += $0 }
      }
    }
    return out
  }

  static func random(_ dtype: DType, n: Int, k: Int, sparse: Bool, _ rng: inout Rand) -> Frames {
    let hi: Double =
      dtype == .uint8 ? 255 : dtype == .uint16 ? 65535 : dtype == .uint32 ? 4_294_967_295 : 0
    var v = [Double](repeating: 0, count: n * k)
    for i in v.indices {
      if dtype == .float32 {
        v[i] = Double(Float(Double.random(in: -1000...1000, using: &rng)))
      } else if !sparse || Double.random(in: 0..<1, using: &rng) < 0.15 {
        v[i] = Double(UInt64.random(in: 0...UInt64(sparse ? min(hi, 65535) : hi), using: &rng))
      }
    }
    if !v.isEmpty && dtype != .float32 { v[0] = sparse ? min(hi, 65535) : hi }  // the extreme
    return Frames(dtype: dtype, n: n, k: k, values: v)
  }
}

/// `sum_p |x[p] w[p]|` per (frame, row): the scale of the float tolerances.
func scales(_ f: Frames, _ w: [Double], rows m: Int) -> [Double] {
  var out = [Double](repeating: 0, count: f.n * m)
  for i in 0..<f.n {
    for j in 0..<m {
      for p in 0..<f.k where w[j * f.k + p] != 0 && f.values[i * f.k + p].isFinite {
        out[i * m + j] += abs(f.values[i * f.k + p] * w[j * f.k + p])
      }
    }
  }
  return out
}

/// The reference: plain loops, float64 or exact integers, zero weights skipped.
func reference(_ f: Frames, _ w: [Double], rows m: Int) -> ([Double], [Double], [Double]) {
  var per = [Double](repeating: 0, count: f.n * m)
  for i in 0..<f.n {
    for j in 0..<m {
      var s = 0.0
      for p in 0..<f.k where w[j * f.k + p] != 0 { s += f.values[i * f.k + p] * w[j * f.k + p] }
      per[i * m + j] = s
    }
  }
  var sum = [Double](repeating: 0, count: f.k)
  var mx = [Double](repeating: f.dtype == .float32 ? -.infinity : 0, count: f.k)
  for i in 0..<f.n {
    for p in 0..<f.k {
      let x = f.values[i * f.k + p]
      sum[p] += x
      if x.isNaN || mx[p].isNaN { mx[p] = .nan } else { mx[p] = max(mx[p], x) }
    }
  }
  return (per, sum, mx)
}

/// Payloads written by this test's own encoders (independent of the backend's decoders).
enum Encode {
  static func le<T: FixedWidthInteger>(_ values: [T]) -> [UInt8] {
    values.flatMap { v in withUnsafeBytes(of: v.littleEndian) { Array($0) } }
  }

  static func shape(_ f: Frames) -> ChunkShape {
    ChunkShape(rows: 1, cols: f.n, detectorRows: 1, detectorCols: f.k)
  }

  static func message(
    _ rep: Representation, _ f: Frames, _ extra: [String: JSONValue], _ buffers: [[UInt8]]
  ) -> Payload {
    var h: [String: JSONValue] = [
      "type": "put", "id": 1, "handle": 1, "representation": .string(rep.rawValue),
      "storage_schema": .string(rep.storageSchema), "dtype": .string(f.dtype.rawValue),
      "shape": [1, .int(Int64(f.n)), 1, .int(Int64(f.k))],
      "scan_slice": [[0, 1], [0, .int(Int64(f.n))]],
    ]
    for (k, v) in extra { h[k] = v }
    guard
      case .success(.put(_, let put)) = Request.parse(
        Message(h, buffers: buffers.map { ByteView($0) }))
    else {
      fatalError("the test's own payload did not validate")
    }
    return put.payload
  }

  static func dense(_ f: Frames) -> Payload { message(.dense, f, [:], [f.bytes()]) }

  static func paired(_ f: Frames, wideIndex: Bool, countBytes: Int) -> Payload {
    var indptr: [Int64] = [0]
    var idx: [UInt32] = []
    var cnt: [UInt32] = []
    for i in 0..<f.n {
      for p in 0..<f.k where f.values[i * f.k + p] != 0 {
        idx.append(UInt32(p))
        cnt.append(UInt32(f.values[i * f.k + p]))
      }
      indptr.append(Int64(idx.count))
    }
    let indices = wideIndex ? le(idx) : le(idx.map { UInt16($0) })
    let counts =
      countBytes == 1
      ? cnt.map { UInt8($0) } : countBytes == 2 ? le(cnt.map { UInt16($0) }) : le(cnt)
    return message(
      .paired, f,
      [
        "index_dtype": wideIndex ? "uint32" : "uint16",
        "count_dtype": .string(["", "uint8", "uint16", "", "uint32"][countBytes]),
      ],
      [le(indptr), indices, counts])
  }

  static func packed(_ f: Frames, blockValues bv: Int) -> Payload {
    let nb = (f.k + bv - 1) / bv
    var widths: [UInt8] = []
    var offsets: [Int64] = []
    var words: [UInt32] = []
    for i in 0..<f.n {
      for b in 0..<nb {
        let vals = (b * bv..<min(f.k, (b + 1) * bv)).map { UInt32(f.values[i * f.k + $0]) }
        let width = vals.map { 32 - $0.leadingZeroBitCount }.max() ?? 0
        widths.append(UInt8(width))
        offsets.append(Int64(words.count))
        var bits: [Bool] = []
        for v in vals { for t in 0..<width { bits.append((v >> UInt32(t)) & 1 == 1) } }
        for w0 in stride(from: 0, to: bits.count, by: 32) {
          var word: UInt32 = 0
          for t in w0..<min(bits.count, w0 + 32) where bits[t] { word |= 1 << UInt32(t - w0) }
          words.append(word)
        }
      }
    }
    words.append(0)
    return message(.packed, f, ["block_values": .int(Int64(bv))], [widths, le(offsets), le(words)])
  }
}

func weightsView(_ w: [Double], rows: Int, pixels: Int) -> WeightRows {
  WeightRows(rows: rows, pixels: pixels, values: ByteView(values: w))
}

func values(_ bytes: [UInt8], _ dtype: DType) -> [Double] {
  bytes.withUnsafeBytes { raw in
    (0..<(bytes.count / dtype.size)).map { i -> Double in
      switch dtype {
      case .uint8: return Double(raw[i])
      case .uint16: return Double(raw.loadUnaligned(fromByteOffset: 2 * i, as: UInt16.self))
      case .uint32: return Double(raw.loadUnaligned(fromByteOffset: 4 * i, as: UInt32.self))
      default: return Double(raw.loadUnaligned(fromByteOffset: 4 * i, as: Float.self))
      }
    }
  }
}

func same(_ a: Double, _ b: Double) -> Bool { a == b || (a.isNaN && b.isNaN) }

/// A backend under test: the CPU backend everywhere, and Metal where this build and machine
/// have it (an Apple platform with a Metal device).
struct Target: CustomTestStringConvertible, Sendable {
  let name: String
  let make: @Sendable (Int) -> any ComputeBackend
  var testDescription: String { name }
}

let targets: [Target] = {
  var out = [Target(name: "cpu") { CPUBackend(threads: $0) }]
  #if canImport(Metal)
    if case .success = makeBackend(.metal) {
      out.append(Target(name: "metal") { _ in try! makeBackend(.metal).get() })
    }
  #endif
  return out
}()

struct Case: CustomTestStringConvertible, Sendable {
  let target: Target
  let rep: Representation
  let dtype: DType
  var testDescription: String { "\(target.name) \(rep.rawValue) \(dtype.rawValue)" }
}

let cases: [Case] = targets.flatMap { t in
  CPUBackend.kernels.filter { $0.operation == "frame_pass" }.map {
    Case(target: t, rep: $0.representation, dtype: $0.dtype)
  }
}

/// Within the tolerance of the accumulation used: exact for integer paths, the conformance
/// suite's bounds for float64 (1e-12) and float32 ((K + 2) u) relative to `sum|x w|`.
func close(_ got: Double, _ want: Double, scale: Double, accumulation: String, terms: Int) -> Bool {
  if same(got, want) { return true }
  switch accumulation {
  case "float64": return abs(got - want) <= 1e-12 * scale
  case "float32": return abs(got - want) <= Double(terms + 2) * 0x1p-24 * scale
  default: return false
  }
}

@Suite("CPU backend kernels")
struct KernelTests {
  func payload(_ c: Case, _ f: Frames, variant: Int) -> Payload {
    switch c.rep {
    case .dense: return Encode.dense(f)
    case .paired:
      return Encode.paired(
        f, wideIndex: variant % 2 == 1 || f.k > 65536,
        countBytes: c.dtype == .uint32 ? 4 : [c.dtype.size, 4][variant % 2])
    case .packed: return Encode.packed(f, blockValues: [32, 64, 96][variant % 3])
    }
  }

  @Test("frame pass against the reference", arguments: cases)
  func framePass(_ c: Case) throws {
    var rng = Rand(UInt64(c.dtype.size * 31 + c.rep.rawValue.count))
    for (variant, (n, k, m, threads)) in [
      (0, 5, 3, 1), (1, 7, 2, 2), (7, 37, 4, 2), (13, 130, 5, 3), (33, 16, 1, 4), (3, 1, 2, 2),
      (9, 300, 0, 2),
    ].enumerated() {
      let backend = c.target.make(threads)
      let f = Frames.random(c.dtype, n: n, k: k, sparse: c.rep != .dense, &rng)
      let stored = try backend.store(payload(c, f, variant: variant)).get()
      for kind in ["binary", "integer", "real"] {
        var w = [Double](repeating: 0, count: m * k)
        for i in w.indices {
          switch kind {
          case "binary": w[i] = Double.random(in: 0..<1, using: &rng) < 0.4 ? 1 : 0
          case "integer": w[i] = Double(Int.random(in: -50...50, using: &rng))
          default: w[i] = Double.random(in: -3...3, using: &rng)
          }
        }
        let weights = try backend.store(weights: weightsView(w, rows: m, pixels: k)).get()
        let out = try backend.framePass(stored, weights: weights, wantSum: true, wantMax: true)
          .get()
        let (per, sum, mx) = reference(f, w, rows: m)
        let scale = scales(f, w, rows: m)
        let info = backend.info
        let exact = c.dtype != .float32 && (kind != "real" || m == 0)  // no rows: integer
        let acc = exact ? info.integerAccumulation : info.realAccumulation
        #expect(out.accumulation == acc, "\(c) \(kind)")
        for i in per.indices {
          #expect(
            close(out.perFrame[i], per[i], scale: scale[i], accumulation: acc, terms: k),
            "\(c) n=\(n) k=\(k) \(kind) per_frame[\(i)] \(out.perFrame[i]) vs \(per[i])")
        }
        switch out.patternSum {
        case .integer(let s)?:
          #expect(c.dtype != .float32)
          #expect(s.map(Double.init) == sum, "\(c) pattern_sum")
        case .real(let s)?:
          #expect(c.dtype == .float32)
          for p in 0..<k {
            let scale = (0..<n).reduce(0.0) { $0 + abs(f.values[$1 * k + p]) }
            #expect(
              close(s[p], sum[p], scale: scale, accumulation: info.realAccumulation, terms: n),
              "\(c) pattern_sum")
          }
        case nil: Issue.record("no pattern_sum")
        }
        let gotMax = values(out.patternMax!, c.dtype)
        #expect(zip(gotMax, mx).allSatisfy(same), "\(c) n=\(n) k=\(k) pattern_max")
      }
    }
  }

  @Test("gather returns the chosen pixels exactly", arguments: cases)
  func gather(_ c: Case) throws {
    var rng = Rand(99)
    let backend = c.target.make(2)
    for (variant, (n, k)) in [(0, 3), (4, 70), (11, 33)].enumerated() {
      let f = Frames.random(c.dtype, n: n, k: k, sparse: c.rep != .dense, &rng)
      let stored = try backend.store(payload(c, f, variant: variant)).get()
      for idx in [[0, k - 1], [], Array(0..<k), [k / 2, 0, k / 2]] {
        let got = values(try backend.gather(stored, indices: idx).get(), c.dtype)
        let want = (0..<n).flatMap { i in idx.map { f.values[i * k + $0] } }
        #expect(got.count == want.count && zip(got, want).allSatisfy(same), "\(c) \(idx.count) px")
      }
    }
  }

  @Test(arguments: targets)
  func nanAndInfinityOutsideARowsSupportLeaveItFinite(_ target: Target) throws {
    let backend = target.make(2)
    let k = 40
    var f = Frames(dtype: .float32, n: 6, k: k, values: (0..<240).map { Double($0 % 17) })
    f.values[0 * k + 3] = .nan
    f.values[2 * k + 5] = .infinity
    f.values[4 * k + 6] = -.infinity
    f.values[5 * k + 5] = .infinity
    f.values[5 * k + 6] = -.infinity
    var w = [Double](repeating: 1, count: 4 * k)
    for j in 0..<4 {
      w[j * k + 3] = 0
      w[j * k + 5] = 0
      w[j * k + 6] = 0
    }
    w[1 * k + 3] = 0.5  // row 1 holds the NaN pixel
    w[2 * k + 5] = -2  // row 2 holds the +inf pixel, negative weight
    w[3 * k + 5] = 1
    w[3 * k + 6] = 1  // row 3 holds +inf and -inf
    let stored = try backend.store(Encode.dense(f)).get()
    let weights = try backend.store(weights: weightsView(w, rows: 4, pixels: k)).get()
    let out = try backend.framePass(stored, weights: weights, wantSum: true, wantMax: true).get()
    let per = out.perFrame
    for i in 0..<6 { #expect(per[i * 4].isFinite, "row 0 frame \(i)") }
    #expect(per[0 * 4 + 1].isNaN)
    #expect(per[2 * 4 + 2] == -.infinity)
    #expect(per[2 * 4 + 3] == .infinity && per[4 * 4 + 3] == -.infinity && per[5 * 4 + 3].isNaN)
    let (ref, _, mx) = reference(f, w, rows: 4)
    let scale = scales(f, w, rows: 4)
    for i in per.indices {
      #expect(close(per[i], ref[i], scale: scale[i], accumulation: out.accumulation, terms: k))
    }
    #expect(zip(values(out.patternMax!, .float32), mx).allSatisfy(same))
    guard case .real(let s)? = out.patternSum else {
      Issue.record("no real sum")
      return
    }
    #expect(s[3].isNaN && s[5] == .infinity && s[6] == -.infinity && s[0].isFinite)
  }

  @Test("an empty chunk gives empty rows, zero sums and the least value", arguments: cases)
  func emptyChunk(_ c: Case) throws {
    let backend = c.target.make(2)
    let f = Frames(dtype: c.dtype, n: 0, k: 9, values: [])
    let stored = try backend.store(payload(c, f, variant: 0)).get()
    let weights = try backend.store(
      weights: weightsView([Double](repeating: 1, count: 27), rows: 3, pixels: 9)
    ).get()
    let out = try backend.framePass(stored, weights: weights, wantSum: true, wantMax: true).get()
    #expect(out.perFrame.isEmpty)
    let least: Double = c.dtype == .float32 ? -.infinity : 0
    #expect(values(out.patternMax!, c.dtype) == [Double](repeating: least, count: 9))
    switch out.patternSum {
    case .integer(let s)?: #expect(s == [Int64](repeating: 0, count: 9))
    case .real(let s)?: #expect(s == [Double](repeating: 0, count: 9))
    case nil: Issue.record("no pattern_sum")
    }
    #expect(try backend.gather(stored, indices: [0, 8]).get().isEmpty)
  }

  @Test(arguments: targets)
  func integerSumsBeyond32BitsAreExact(_ target: Target) throws {
    // 5000 frames of uint32 maxima: pattern sums near 2**44, per-frame sums near 2**62
    let n = 5000
    let backend = target.make(2)
    let f = Frames(
      dtype: .uint32, n: n, k: 3, values: [Double](repeating: 4_294_967_295, count: 3 * n))
    let stored = try backend.store(Encode.dense(f)).get()
    let big = Double(1 << 29)
    let weights = try backend.store(
      weights: weightsView([big, big, 1, 1, 0, 0], rows: 2, pixels: 3)
    ).get()
    let out = try backend.framePass(stored, weights: weights, wantSum: true, wantMax: false).get()
    #expect(out.accumulation == backend.info.integerAccumulation)
    let exact = Int64(4_294_967_295) * Int64(1 << 30) + 4_294_967_295  // 2 * 2**29 * x + x
    #expect(exact > Int64(1) << 61)  // far beyond float64's exact integers
    #expect(out.perFrame[0] == Double(exact))  // float64 of the exact int64 sum
    #expect(out.perFrame[1] == 4_294_967_295)
    guard case .integer(let s)? = out.patternSum else {
      Issue.record("no integer sum")
      return
    }
    #expect(s == [Int64](repeating: 4_294_967_295 * Int64(n), count: 3))
  }

  @Test func theThreadCountDoesNotChangeIntegerResults() throws {
    var rng = Rand(5)
    let f = Frames.random(.uint16, n: 64, k: 257, sparse: false, &rng)
    let w = (0..<(3 * 257)).map { _ in Double(Int.random(in: -9...9, using: &rng)) }
    var outs: [FramePassOutput] = []
    for threads in [1, 2, 3, 8] {
      let backend = CPUBackend(threads: threads)
      let stored = try backend.store(Encode.dense(f)).get()
      let weights = try backend.store(weights: weightsView(w, rows: 3, pixels: 257)).get()
      outs.append(
        try backend.framePass(stored, weights: weights, wantSum: true, wantMax: true).get())
    }
    for o in outs.dropFirst() {
      #expect(o.perFrame == outs[0].perFrame && o.patternMax == outs[0].patternMax)
    }
  }

  @Test func theHelloDeclaresWhatTheBackendRuns() {
    let info = CPUBackend(threads: 2).info
    #expect(info.backend == "cpu-simd" && info.type == "cpu")
    #expect(info.integerAccumulation == "int64" && info.realAccumulation == "float64")
    #expect(Set(info.kernels.map(\.dtype)) == [.uint8, .uint16, .uint32, .float32])
    #expect(!info.offers("frame_pass", .paired, .float32))
    #if !canImport(Metal)
      guard case .failure(let e) = makeBackend(.metal) else {
        Issue.record("Metal made on a platform without it")
        return
      }
      #expect(e.code == .device && e.message.contains("Apple"))
      guard case .success(let auto) = makeBackend(.auto) else {
        Issue.record("no auto")
        return
      }
      #expect(auto.info.backend == "cpu-simd")
      #expect(auto.info.details["auto"]?.string?.contains("Metal not available") == true)
    #endif
  }
}
