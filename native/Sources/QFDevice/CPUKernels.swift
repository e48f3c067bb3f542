import Dispatch
import QFCodec

// The CPU backend's kernels: SIMD dot products (eight float64 lanes, two accumulators),
// exact int64 sums where float64 cannot be proven exact, per-pixel sum and max patterns,
// frames split over threads with `DispatchQueue.concurrentPerform`, each thread keeping
// its own patterns (merged in a fixed order, so a result depends only on the thread count).

/// `sum_p x[p] * w[p]` in float64 (SIMD, no fused multiply-add: every platform rounds alike).
@inline(__always)
func dotDouble<T: FrameElement>(_ x: UnsafePointer<T>, _ w: UnsafePointer<Double>, _ k: Int)
  -> Double
{
  var a0 = SIMD8<Double>()
  var a1 = SIMD8<Double>()
  var p = 0
  while p + 16 <= k {
    a0 += T.load8(x + p) * UnsafeRawPointer(w + p).loadUnaligned(as: SIMD8<Double>.self)
    a1 += T.load8(x + p + 8) * UnsafeRawPointer(w + p + 8).loadUnaligned(as: SIMD8<Double>.self)
    p += 16
  }
  var s = (a0 + a1).sum()
  while p < k {
    s += x[p].double * w[p]
    p += 1
  }
  return s
}

/// Four rows at once over pixels `[a, b)`: each frame value is read and converted once.
@inline(__always)
func dot4<T: FrameElement>(
  _ x: UnsafePointer<T>, _ w0: UnsafePointer<Double>, _ w1: UnsafePointer<Double>,
  _ w2: UnsafePointer<Double>, _ w3: UnsafePointer<Double>, _ a: Int, _ b: Int
) -> SIMD4<Double> {
  var s0 = SIMD8<Double>()
  var s1 = SIMD8<Double>()
  var s2 = SIMD8<Double>()
  var s3 = SIMD8<Double>()
  var p = a
  while p + 8 <= b {
    let v = T.load8(x + p)
    s0 += v * UnsafeRawPointer(w0 + p).loadUnaligned(as: SIMD8<Double>.self)
    s1 += v * UnsafeRawPointer(w1 + p).loadUnaligned(as: SIMD8<Double>.self)
    s2 += v * UnsafeRawPointer(w2 + p).loadUnaligned(as: SIMD8<Double>.self)
    s3 += v * UnsafeRawPointer(w3 + p).loadUnaligned(as: SIMD8<Double>.self)
    p += 8
  }
  var out = SIMD4<Double>(s0.sum(), s1.sum(), s2.sum(), s3.sum())
  while p < b {
    let v = x[p].double
    out += SIMD4(v * w0[p], v * w1[p], v * w2[p], v * w3[p])
    p += 1
  }
  return out
}

/// Two rows at once over pixels `[a, b)`.
@inline(__always)
func dot2<T: FrameElement>(
  _ x: UnsafePointer<T>, _ w0: UnsafePointer<Double>, _ w1: UnsafePointer<Double>, _ a: Int,
  _ b: Int
) -> SIMD2<Double> {
  var s0 = SIMD8<Double>()
  var s1 = SIMD8<Double>()
  var p = a
  while p + 8 <= b {
    let v = T.load8(x + p)
    s0 += v * UnsafeRawPointer(w0 + p).loadUnaligned(as: SIMD8<Double>.self)
    s1 += v * UnsafeRawPointer(w1 + p).loadUnaligned(as: SIMD8<Double>.self)
    p += 8
  }
  var out = SIMD2<Double>(s0.sum(), s1.sum())
  while p < b {
    let v = x[p].double
    out += SIMD2(v * w0[p], v * w1[p])
    p += 1
  }
  return out
}

/// The sums of one row group of a frame into `row` (per_frame of the frame), float64, over
/// the group's runs (or the whole frame): four rows at a time, then two, then one.
@inline(__always)
func groupDots<T: FrameElement>(
  _ x: UnsafePointer<T>, _ group: RowGroup, _ w: UnsafePointer<Double>, _ k: Int,
  into row: UnsafeMutablePointer<Double>
) {
  let rows = group.rows
  let whole = [(0, k)]
  let runs = group.runs ?? whole
  switch rows.count {
  case 4, 3:  // three rows repeat the last (its sum is computed once more and dropped)
    let j3 = rows[rows.count - 1]
    var acc = SIMD4<Double>()
    for (a, b) in runs {
      acc += dot4(x, w + rows[0] * k, w + rows[1] * k, w + rows[2] * k, w + j3 * k, a, b)
    }
    for t in 0..<rows.count { row[rows[t]] = acc[t] }
  case 2:
    var acc = SIMD2<Double>()
    for (a, b) in runs { acc += dot2(x, w + rows[0] * k, w + rows[1] * k, a, b) }
    row[rows[0]] = acc[0]
    row[rows[1]] = acc[1]
  default:
    var acc = 0.0
    for (a, b) in runs { acc += dotDouble(x + a, w + rows[0] * k + a, b - a) }
    row[rows[0]] = acc
  }
}

/// Up to four rows at once over pixels `[a, b)` in int32 lanes (uint8/uint16 data): each
/// product fits int32 (the path's bound), each lane's sum is kept in int64.
@inline(__always)
func dot4i<T: FrameElement>(
  _ x: UnsafePointer<T>, _ w0: UnsafePointer<Int32>, _ w1: UnsafePointer<Int32>,
  _ w2: UnsafePointer<Int32>, _ w3: UnsafePointer<Int32>, _ a: Int, _ b: Int
) -> SIMD4<Int64> {
  var s0 = SIMD8<Int64>()
  var s1 = SIMD8<Int64>()
  var s2 = SIMD8<Int64>()
  var s3 = SIMD8<Int64>()
  var p = a
  while p + 8 <= b {
    let v = T.load8i(x + p)
    s0 &+= SIMD8<Int64>(
      truncatingIfNeeded: v &* UnsafeRawPointer(w0 + p).loadUnaligned(as: SIMD8<Int32>.self))
    s1 &+= SIMD8<Int64>(
      truncatingIfNeeded: v &* UnsafeRawPointer(w1 + p).loadUnaligned(as: SIMD8<Int32>.self))
    s2 &+= SIMD8<Int64>(
      truncatingIfNeeded: v &* UnsafeRawPointer(w2 + p).loadUnaligned(as: SIMD8<Int32>.self))
    s3 &+= SIMD8<Int64>(
      truncatingIfNeeded: v &* UnsafeRawPointer(w3 + p).loadUnaligned(as: SIMD8<Int32>.self))
    p += 8
  }
  var out = SIMD4<Int64>(s0.wrappedSum(), s1.wrappedSum(), s2.wrappedSum(), s3.wrappedSum())
  while p < b {
    let v = x[p].int64
    out &+= SIMD4(v &* Int64(w0[p]), v &* Int64(w1[p]), v &* Int64(w2[p]), v &* Int64(w3[p]))
    p += 1
  }
  return out
}

/// One row over pixels `[a, b)` in int32 lanes.
@inline(__always)
func dot1i<T: FrameElement>(
  _ x: UnsafePointer<T>, _ w0: UnsafePointer<Int32>, _ a: Int, _ b: Int
) -> Int64 {
  var s0 = SIMD8<Int64>()
  var s1 = SIMD8<Int64>()
  var p = a
  while p + 16 <= b {
    s0 &+= SIMD8<Int64>(
      truncatingIfNeeded: T.load8i(x + p)
        &* UnsafeRawPointer(w0 + p).loadUnaligned(as: SIMD8<Int32>.self))
    s1 &+= SIMD8<Int64>(
      truncatingIfNeeded: T.load8i(x + p + 8)
        &* UnsafeRawPointer(w0 + p + 8).loadUnaligned(as: SIMD8<Int32>.self))
    p += 16
  }
  var out = (s0 &+ s1).wrappedSum()
  while p < b {
    out &+= x[p].int64 &* Int64(w0[p])
    p += 1
  }
  return out
}

/// The exact int32-lane sums of one row group of a frame into `row`: four rows at a time
/// (two or three rows repeat the last; its sum is computed again and dropped), one alone.
@inline(__always)
func groupDotsInt32<T: FrameElement>(
  _ x: UnsafePointer<T>, _ group: RowGroup, _ w: UnsafePointer<Int32>, _ k: Int,
  into row: UnsafeMutablePointer<Double>
) {
  let rows = group.rows
  let runs = group.runs ?? [(0, k)]
  if rows.count == 1 {
    var acc: Int64 = 0
    for (a, b) in runs { acc &+= dot1i(x, w + rows[0] * k, a, b) }
    row[rows[0]] = Double(acc)
    return
  }
  let last = rows.count - 1
  var acc = SIMD4<Int64>()
  for (a, b) in runs {
    acc &+= dot4i(
      x, w + rows[0] * k, w + rows[1] * k, w + rows[Swift.min(2, last)] * k, w + rows[last] * k,
      a, b)
  }
  for t in 0..<rows.count { row[rows[t]] = Double(acc[t]) }
}

/// The same sum over the pixels with `w[p] != 0` only: a NaN or infinite pixel outside the
/// row's support does not enter it (IEEE would make `0 * NaN` NaN).
func supportedDot<T: FrameElement>(_ x: UnsafePointer<T>, _ w: UnsafePointer<Double>, _ k: Int)
  -> Double
{
  var s = 0.0
  for p in 0..<k where w[p] != 0 { s += x[p].double * w[p] }
  return s
}

/// `sum_p x[p] * w[p]` in int64, wrapping like NumPy's int64 (exact while the sum fits).
@inline(__always)
func dotInt64<T: FrameElement>(_ x: UnsafePointer<T>, _ w: UnsafePointer<Int64>, _ k: Int) -> Int64
{
  var s: Int64 = 0
  for p in 0..<k { s &+= x[p].int64 &* w[p] }
  return s
}

/// Per-thread pattern partials, merged in part order.
struct Patterns<T: FrameElement> {
  let k: Int
  let parts: Int
  var intSums: [Int64]
  var realSums: [Double]
  var maxes: [T]

  init(k: Int, parts: Int, integer: Bool, wantSum: Bool, wantMax: Bool) {
    self.k = k
    self.parts = parts
    intSums = [Int64](repeating: 0, count: wantSum && integer ? k * parts : 0)
    realSums = [Double](repeating: 0, count: wantSum && !integer ? k * parts : 0)
    maxes = [T](repeating: T.least, count: wantMax ? k * parts : 0)
  }

  /// The merged sum pattern.
  func sum() -> PatternSum {
    if !intSums.isEmpty || T.dtype.isInteger {
      var out = [Int64](repeating: 0, count: k)
      for part in 0..<parts { for p in 0..<k { out[p] &+= intSums[part * k + p] } }
      return .integer(out)
    }
    var out = [Double](repeating: 0, count: k)
    for part in 0..<parts { for p in 0..<k { out[p] += realSums[part * k + p] } }
    return .real(out)
  }

  /// The merged max pattern, as bytes of the dtype.
  func max() -> [UInt8] {
    var out = [T](repeating: T.least, count: k)
    for part in 0..<parts { for p in 0..<k { out[p] = T.maximum(out[p], maxes[part * k + p]) } }
    return bytesOf(out)
  }
}

/// Add a frame into integer sum and max partials.
@inline(__always)
func addPattern<T: FrameElement>(
  _ x: UnsafePointer<T>, _ k: Int, intSums: UnsafeMutablePointer<Int64>?,
  realSums: UnsafeMutablePointer<Double>?, maxes: UnsafeMutablePointer<T>?
) {
  if let intSums { for p in 0..<k { intSums[p] &+= x[p].int64 } }
  if let realSums { for p in 0..<k { realSums[p] += x[p].double } }
  if let maxes { for p in 0..<k { maxes[p] = T.maximum(maxes[p], x[p]) } }
}

/// Frames split over `parts` threads: part `i` takes frames `[n*i/parts, n*(i+1)/parts)`.
func partsFor(frames n: Int, threads: Int) -> Int {
  Swift.max(1, Swift.min(threads, n / 2))
}

/// Run `body(part, firstFrame, endFrame)` for every part, on `parts` threads.
func forEachPart(frames n: Int, parts: Int, _ body: (Int, Int, Int) -> Void) {
  if parts == 1 {
    body(0, 0, n)
    return
  }
  // Each part writes only its own rows and partials: the closure is shared, not its data.
  withoutActuallyEscaping(body) { escapable in
    let shared = Unchecked(escapable)
    DispatchQueue.concurrentPerform(iterations: parts) { part in
      shared.value(part, n * part / parts, n * (part + 1) / parts)
    }
  }
}

/// A value handed to other threads whose safety the caller ensures (disjoint writes).
struct Unchecked<T>: @unchecked Sendable {
  let value: T
  init(_ value: T) { self.value = value }
}

/// The fused frame pass over frames that `frameAt` produces (dense: in place; packed:
/// decoded into the thread's scratch frame).
func frameRowsPass<T: FrameElement>(
  _: T.Type, frames n: Int, pixels k: Int, weights w: CPUWeights, wantSum: Bool, wantMax: Bool,
  threads: Int, frameAt: (Int, UnsafeMutablePointer<T>) -> UnsafePointer<T>
) -> FramePassOutput {
  let m = w.rows
  let path = DotPath.choose(T.dtype, magnitude: T.magnitude, w)
  let parts = partsFor(frames: n, threads: threads)
  var perFrame = [Double](repeating: 0, count: n * m)
  var patterns = Patterns<T>(
    k: k, parts: parts, integer: T.dtype.isInteger, wantSum: wantSum, wantMax: wantMax)
  let repairNonFinite = !T.dtype.isInteger
  perFrame.withUnsafeMutableBufferPointer { out in
    patterns.intSums.withUnsafeMutableBufferPointer { intSums in
      patterns.realSums.withUnsafeMutableBufferPointer { realSums in
        patterns.maxes.withUnsafeMutableBufferPointer { maxes in
          w.values.withUnsafeBufferPointer { wd in
            (w.int64Values ?? []).withUnsafeBufferPointer { wi in
              (w.int32Values ?? []).withUnsafeBufferPointer { w32 in
                forEachPart(frames: n, parts: parts) { part, f0, f1 in
                  let scratch = UnsafeMutablePointer<T>.allocate(capacity: Swift.max(k, 1))
                  defer { scratch.deallocate() }
                  let iSum = intSums.isEmpty ? nil : intSums.baseAddress! + part * k
                  let rSum = realSums.isEmpty ? nil : realSums.baseAddress! + part * k
                  let mx = maxes.isEmpty ? nil : maxes.baseAddress! + part * k
                  for f in f0..<f1 {
                    let x = frameAt(f, scratch)
                    let row = out.baseAddress! + f * m
                    if path == .int64 {
                      for j in 0..<m { row[j] = Double(dotInt64(x, wi.baseAddress! + j * k, k)) }
                    } else if path == .int32Lanes {
                      for group in w.groups {
                        groupDotsInt32(x, group, w32.baseAddress!, k, into: row)
                      }
                    } else {
                      for group in w.groups {
                        groupDots(x, group, wd.baseAddress!, k, into: row)
                        // zero weights inside the group's pixels multiplied them too
                        if repairNonFinite {
                          for j in group.rows where !row[j].isFinite {
                            row[j] = supportedDot(x, wd.baseAddress! + j * k, k)
                          }
                        }
                      }
                    }
                    addPattern(x, k, intSums: iSum, realSums: rSum, maxes: mx)
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return FramePassOutput(
    perFrame: perFrame,
    patternSum: wantSum ? patterns.sum() : nil,
    patternMax: wantMax ? patterns.max() : nil,
    accumulation: path.accumulation)
}

// MARK: - packed

/// Decode frame `f` of a packed payload into `out` (`K` values).
@inline(__always)
func decodePackedFrame<T: FrameElement>(
  _ f: Int, k: Int, blockValues bv: Int, blocksPerFrame nb: Int,
  widths: UnsafePointer<UInt8>, offsets: UnsafePointer<Int64>, data: UnsafePointer<UInt32>,
  into out: UnsafeMutablePointer<T>
) {
  let lastCount = k - (nb - 1) * bv
  for b in 0..<nb {
    let i = f * nb + b
    let width = Int(widths[i])
    let count = b == nb - 1 ? lastCount : bv
    let dst = out + b * bv
    if width == 0 {
      for t in 0..<count { dst[t] = T(packed: 0) }
      continue
    }
    let words = data + Int(offsets[i])
    let mask = (UInt64(1) << UInt64(width)) - 1
    for t in 0..<count {
      let q = t * width
      let lo = UInt64(words[q >> 5])
      let hi = UInt64(words[(q >> 5) + 1])
      dst[t] = T(packed: UInt32(truncatingIfNeeded: ((lo | hi << 32) >> UInt64(q & 31)) & mask))
    }
  }
}

/// One value of a packed payload: frame `f`, pixel `p`.
@inline(__always)
func packedValue(
  _ f: Int, _ p: Int, blockValues bv: Int, blocksPerFrame nb: Int,
  widths: UnsafePointer<UInt8>, offsets: UnsafePointer<Int64>, data: UnsafePointer<UInt32>
) -> UInt32 {
  let i = f * nb + p / bv
  let width = Int(widths[i])
  if width == 0 { return 0 }
  let q = (p % bv) * width
  let words = data + Int(offsets[i])
  let x = UInt64(words[q >> 5]) | UInt64(words[(q >> 5) + 1]) << 32
  return UInt32(truncatingIfNeeded: (x >> UInt64(q & 31)) & ((UInt64(1) << UInt64(width)) - 1))
}

// MARK: - paired

/// Loads of a paired payload's index and count buffers, whatever their dtypes.
struct PairedViews {
  let indptr: UnsafeRawPointer
  let indices: UnsafeRawPointer
  let indexWide: Bool
  let counts: UnsafeRawPointer
  let countSize: Int

  @inline(__always) func start(_ f: Int) -> Int {
    Int(indptr.loadUnaligned(fromByteOffset: 8 * f, as: Int64.self))
  }

  @inline(__always) func index(_ q: Int) -> Int {
    indexWide
      ? Int(indices.loadUnaligned(fromByteOffset: 4 * q, as: UInt32.self))
      : Int(indices.loadUnaligned(fromByteOffset: 2 * q, as: UInt16.self))
  }

  @inline(__always) func count(_ q: Int) -> UInt64 {
    switch countSize {
    case 1: return UInt64(counts.load(fromByteOffset: q, as: UInt8.self))
    case 2: return UInt64(counts.loadUnaligned(fromByteOffset: 2 * q, as: UInt16.self))
    case 4: return UInt64(counts.loadUnaligned(fromByteOffset: 4 * q, as: UInt32.self))
    default: return counts.loadUnaligned(fromByteOffset: 8 * q, as: UInt64.self)
    }
  }

  /// The count at pixel `p` of frame `f` (0 where the frame has no event): binary search.
  func value(frame f: Int, pixel p: Int) -> UInt64 {
    var lo = start(f)
    var hi = start(f + 1)
    while lo < hi {
      let mid = (lo + hi) / 2
      let v = index(mid)
      if v == p { return count(mid) }
      if v < p { lo = mid + 1 } else { hi = mid }
    }
    return 0
  }
}

/// The frame pass over paired events: O(events x rows), each event read once.
func pairedFramePass<T: FrameElement>(
  _: T.Type, _ v: PairedViews, frames n: Int, pixels k: Int, weights w: CPUWeights,
  wantSum: Bool, wantMax: Bool, threads: Int
) -> FramePassOutput {
  let m = w.rows
  let exact = w.int64Values != nil
  let parts = partsFor(frames: n, threads: threads)
  var perFrame = [Double](repeating: 0, count: n * m)
  var patterns = Patterns<T>(k: k, parts: parts, integer: true, wantSum: wantSum, wantMax: wantMax)
  if n > 0 { patterns.maxes = [T](repeating: T(packed: 0), count: patterns.maxes.count) }
  let anyNonFinite = w.nonfinitePerRow.contains { $0 > 0 }
  let td = exact ? [] : w.transposed  // made here, before the threads
  let ti = exact ? w.transposedInt64 : []
  perFrame.withUnsafeMutableBufferPointer { out in
    patterns.intSums.withUnsafeMutableBufferPointer { sums in
      patterns.maxes.withUnsafeMutableBufferPointer { maxes in
        td.withUnsafeBufferPointer { wd in
          ti.withUnsafeBufferPointer { wi in
            forEachPart(frames: n, parts: parts) { part, f0, f1 in
              let sum = sums.isEmpty ? nil : sums.baseAddress! + part * k
              let mx = maxes.isEmpty ? nil : maxes.baseAddress! + part * k
              let accI = UnsafeMutablePointer<Int64>.allocate(capacity: Swift.max(m, 1))
              let accD = UnsafeMutablePointer<Double>.allocate(capacity: Swift.max(m, 1))
              let hits = UnsafeMutablePointer<Int>.allocate(capacity: Swift.max(m, 1))
              defer {
                accI.deallocate()
                accD.deallocate()
                hits.deallocate()
              }
              for f in f0..<f1 {
                accI.initialize(repeating: 0, count: m)
                accD.initialize(repeating: 0, count: m)
                hits.initialize(repeating: 0, count: m)
                for q in v.start(f)..<v.start(f + 1) {
                  let p = v.index(q)
                  let c = v.count(q)
                  if exact {
                    let ci = Int64(truncatingIfNeeded: c)
                    let wp = wi.baseAddress! + p * m
                    for j in 0..<m { accI[j] &+= ci &* wp[j] }
                  } else {
                    let cd = Double(c)
                    let wp = wd.baseAddress! + p * m
                    for j in 0..<m { accD[j] += cd * wp[j] }
                    if anyNonFinite { for j in 0..<m where !wp[j].isFinite { hits[j] += 1 } }
                  }
                  sum?[p] &+= Int64(truncatingIfNeeded: c)
                  if let mx { mx[p] = T.maximum(mx[p], T(packed: UInt32(truncatingIfNeeded: c))) }
                }
                for j in 0..<m {
                  // a pixel the frame misses holds 0, and 0 * inf is NaN, as in a dense pass
                  out[f * m + j] =
                    exact ? Double(accI[j]) : hits[j] < w.nonfinitePerRow[j] ? .nan : accD[j]
                }
              }
            }
          }
        }
      }
    }
  }
  return FramePassOutput(
    perFrame: perFrame,
    patternSum: wantSum ? patterns.sum() : nil,
    patternMax: wantMax ? patterns.max() : nil,
    accumulation: exact ? "int64" : "float64")
}
