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
              forEachPart(frames: n, parts: parts) { part, f0, f1 in
                let scratch = UnsafeMutablePointer<T>.allocate(capacity: Swift.max(k, 1))
                defer { scratch.deallocate() }
                let iSum = intSums.isEmpty ? nil : intSums.baseAddress! + part * k
                let rSum = realSums.isEmpty ? nil : realSums.baseAddress! + part * k
                let mx = maxes.isEmpty ? nil : maxes.baseAddress! + part * k
                for f in f0..<f1 {
                  let x = frameAt(f, scratch)
                  let row = out.baseAddress! + f * m
                  for j in 0..<m {
                    if path == .int64 {
                      row[j] = Double(dotInt64(x, wi.baseAddress! + j * k, k))
                    } else {
                      let wj = wd.baseAddress! + j * k
                      var v = dotDouble(x, wj, k)
                      if repairNonFinite && !v.isFinite { v = supportedDot(x, wj, k) }
                      row[j] = v
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

/// The frame pass over paired events: O(events) per weight row.
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
  perFrame.withUnsafeMutableBufferPointer { out in
    patterns.intSums.withUnsafeMutableBufferPointer { sums in
      patterns.maxes.withUnsafeMutableBufferPointer { maxes in
        w.values.withUnsafeBufferPointer { wd in
          (w.int64Values ?? []).withUnsafeBufferPointer { wi in
            forEachPart(frames: n, parts: parts) { part, f0, f1 in
              let sum = sums.isEmpty ? nil : sums.baseAddress! + part * k
              let mx = maxes.isEmpty ? nil : maxes.baseAddress! + part * k
              for f in f0..<f1 {
                let a = v.start(f)
                let e = v.start(f + 1)
                for j in 0..<m {
                  if exact {
                    let wj = wi.baseAddress! + j * k
                    var s: Int64 = 0
                    for q in a..<e { s &+= Int64(truncatingIfNeeded: v.count(q)) &* wj[v.index(q)] }
                    out[f * m + j] = Double(s)
                  } else {
                    let wj = wd.baseAddress! + j * k
                    var s = 0.0
                    var hits = 0
                    for q in a..<e {
                      let p = v.index(q)
                      s += Double(v.count(q)) * wj[p]
                      if anyNonFinite && !wj[p].isFinite { hits += 1 }
                    }
                    // a pixel the frame misses holds 0, and 0 * inf is NaN, as in a dense pass
                    out[f * m + j] = hits < w.nonfinitePerRow[j] ? .nan : s
                  }
                }
                for q in a..<e {
                  let p = v.index(q)
                  let c = v.count(q)
                  sum?[p] &+= Int64(truncatingIfNeeded: c)
                  if let mx { mx[p] = T.maximum(mx[p], T(packed: UInt32(truncatingIfNeeded: c))) }
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
