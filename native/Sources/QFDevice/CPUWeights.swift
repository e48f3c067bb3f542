import QFCodec

/// Weight rows as the CPU backend keeps them: float64 rows, and int64 rows when every
/// weight is an integer, with the bounds that choose the exact path.
final class CPUWeights: ResidentWeights {
  let rows: Int
  let pixels: Int
  /// `rows * pixels` float64, row-major.
  let values: [Double]
  /// Every weight is a finite integer.
  let integer: Bool
  /// The weights as int64 (integer weights of magnitude <= 2**53 only).
  let int64Values: [Int64]?
  /// The weights as int32 (integer weights within int32 only).
  let int32Values: [Int32]?
  /// `max |w|` (finite weights).
  let maxAbs: Double
  /// `max_j sum_p |w[j, p]|` (integer weights: exact below 2**53).
  let maxAbsRowSum: Double
  /// Non-finite weights per row (a frame missing such a pixel holds 0 there: 0 * inf = NaN).
  let nonfinitePerRow: [Int]
  /// Rows grouped by support: rows whose nonzero weights lie on the same pixels (a CoM
  /// mask and its moments) share one read of each frame value.
  let groups: [RowGroup]
  /// The weights pixel-major (`pixels x rows`): one event of a paired frame reads its rows
  /// contiguously.  Made on the first paired pass (before its threads start), then kept.
  private(set) lazy var transposed: [Double] = {
    var t = [Double](repeating: 0, count: values.count)
    for j in 0..<rows { for p in 0..<pixels { t[p * rows + j] = values[j * pixels + p] } }
    return t
  }()
  /// `transposed` as int64 (integer weights only).
  private(set) lazy var transposedInt64: [Int64] = transposed.map { Int64($0) }

  var residentBytes: Int {
    CPUWeights.heldBytes(
      rows: rows, pixels: pixels, int64: int64Values != nil, int32: int32Values != nil)
  }

  /// Bytes held for `rows x pixels` weights: float64 rows, int64 and int32 rows when the
  /// weights are integers within those types, non-finite counts.
  static func heldBytes(rows: Int, pixels: Int, int64: Bool, int32: Bool) -> Int {
    rows * pixels * (8 + (int64 ? 8 : 0) + (int32 ? 4 : 0)) + 8 * rows
  }

  init(_ w: WeightRows) {
    rows = w.rows
    pixels = w.pixels
    let count = w.rows * w.pixels
    var values = [Double](repeating: 0, count: count)
    w.values.withUnsafeBytes { raw in
      values.withUnsafeMutableBytes { dst in
        if count > 0 { dst.copyMemory(from: raw) }
      }
    }
    var integer = true
    var nonfinite = [Int](repeating: 0, count: w.rows)
    var maxRow = 0.0
    for j in 0..<w.rows {
      var rowSum = 0.0
      for p in 0..<w.pixels {
        let v = values[j * w.pixels + p]
        if !v.isFinite {
          nonfinite[j] += 1
          integer = false
        } else {
          if v.rounded(.towardZero) != v { integer = false }
          rowSum += abs(v)
        }
      }
      maxRow = Swift.max(maxRow, rowSum)
    }
    self.values = values
    self.integer = integer
    self.nonfinitePerRow = nonfinite
    self.maxAbsRowSum = maxRow
    self.groups = RowGroup.group(values, rows: w.rows, pixels: w.pixels)
    let maxAbs = values.reduce(0.0) { $1.isFinite ? Swift.max($0, abs($1)) : $0 }
    self.maxAbs = maxAbs
    int64Values = integer && maxAbs <= Double(JSONValue.maxInteger) ? values.map { Int64($0) } : nil
    int32Values = integer && maxAbs <= Double(Int32.max) ? values.map { Int32($0) } : nil
  }
}

/// How a frame pass sums.
enum DotPath {
  /// int32 products (uint8/uint16 data, `max|x| * max|w| < 2**31`) summed in int64 lanes:
  /// exact, and the fastest where the CPU has no 64-bit vector multiply.
  case int32Lanes
  /// float64 sums of integer products that are provably exact: every product and partial sum
  /// is an integer below 2**53 (`max|x| * max_j sum|w_j| <= 2**52`); identical to int64.
  case exactDouble
  /// int64 sums of integer products (wrapping like NumPy's int64; exact while they fit).
  case int64
  /// float64 sums (real data or real weights).
  case real

  /// The accumulation `result.accumulation` names.
  var accumulation: String { self == .real ? "float64" : "int64" }

  static func choose(_ dtype: DType, magnitude: Double, _ w: CPUWeights) -> DotPath {
    guard dtype.isInteger, w.integer else { return .real }
    if dtype.size <= 2, w.int32Values != nil, magnitude * w.maxAbs <= Double(Int32.max) {
      return .int32Lanes
    }
    if magnitude * w.maxAbsRowSum <= 4_503_599_627_370_496 { return .exactDouble }  // 2**52
    return w.int64Values != nil ? .int64 : .real
  }
}

/// Weight rows read together, and the pixels they are read on.
///
/// Rows whose supports (nonzero weights) nearly coincide, a CoM mask and its two moments,
/// are read together, up to four, over the union of their supports: each frame value is
/// read and converted once for all of them.  The union is kept as runs of pixels, so
/// pixels outside every row's support are never read; a zero weight inside the union
/// multiplies its pixel (an exact 0 for finite data; a non-finite result of real data is
/// recomputed without zero weights).  A support scattered in short runs is read whole.
struct RowGroup {
  /// The rows of the group (one to four), in order.
  let rows: [Int]
  /// `[start, end)` pixel runs of the union of their supports, or nil: the whole frame.
  let runs: [(Int, Int)]?

  /// Runs shorter than this on average make a support scattered (read whole).
  static let shortestMeanRun = 16
  /// A row joins a group when the union grows by at most this fraction of either side.
  static let joinSlack = 0.10

  static func group(_ values: [Double], rows m: Int, pixels k: Int) -> [RowGroup] {
    let words = (k + 63) / 64
    var unions: [[UInt64]] = []
    var counts: [Int] = []
    var members: [[Int]] = []
    for j in 0..<m {
      var bits = [UInt64](repeating: 0, count: words)
      var n = 0
      for p in 0..<k where values[j * k + p] != 0 {
        bits[p >> 6] |= 1 << UInt64(p & 63)
        n += 1
      }
      var joined = false
      for g in members.indices where members[g].count < 4 {
        var union = 0
        for w in 0..<words { union += (unions[g][w] | bits[w]).nonzeroBitCount }
        let limit = (1 + joinSlack) * Double(Swift.min(counts[g], n))
        if Double(union) <= limit || (n == 0 && counts[g] == 0) {
          for w in 0..<words { unions[g][w] |= bits[w] }
          counts[g] = union
          members[g].append(j)
          joined = true
          break
        }
      }
      if !joined {
        unions.append(bits)
        counts.append(n)
        members.append([j])
      }
    }
    return zip(members, unions).map { rows, bits in
      var runs: [(Int, Int)] = []
      var p = 0
      while p < k {
        if bits[p >> 6] & (1 << UInt64(p & 63)) == 0 {
          p += 1
          continue
        }
        let start = p
        while p < k && bits[p >> 6] & (1 << UInt64(p & 63)) != 0 { p += 1 }
        runs.append((start, p))
      }
      let covered = runs.reduce(0) { $0 + $1.1 - $1.0 }
      let scattered = !runs.isEmpty && covered < shortestMeanRun * runs.count
      return RowGroup(rows: rows, runs: scattered ? nil : runs)
    }
  }
}
