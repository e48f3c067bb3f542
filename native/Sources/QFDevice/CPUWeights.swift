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
  /// `max_j sum_p |w[j, p]|` (integer weights: exact below 2**53).
  let maxAbsRowSum: Double
  /// Non-finite weights per row (a frame missing such a pixel holds 0 there: 0 * inf = NaN).
  let nonfinitePerRow: [Int]

  var residentBytes: Int {
    CPUWeights.heldBytes(rows: rows, pixels: pixels, integer: int64Values != nil)
  }

  /// Bytes held for `rows x pixels` weights (float64 rows, int64 rows if integer, counts).
  static func heldBytes(rows: Int, pixels: Int, integer: Bool) -> Int {
    8 * rows * pixels * (integer ? 2 : 1) + 8 * rows
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
    let limit = Double(JSONValue.maxInteger)
    if integer && values.allSatisfy({ abs($0) <= limit }) {
      int64Values = values.map { Int64($0) }
    } else {
      int64Values = nil
    }
  }
}

/// How a frame pass sums.
enum DotPath {
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
    if magnitude * w.maxAbsRowSum <= 4_503_599_627_370_496 { return .exactDouble }  // 2**52
    return w.int64Values != nil ? .int64 : .real
  }
}
