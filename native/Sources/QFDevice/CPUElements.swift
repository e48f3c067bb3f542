import QFCodec

/// A value type of dense frames the CPU backend runs: uint8, uint16, uint32, float32.
protocol FrameElement: BitwiseCopyable, Comparable {
  static var dtype: DType { get }
  /// The least value (the maximum of no frames).
  static var least: Self { get }
  /// Eight values from `p`, converted exactly to float64.
  static func load8(_ p: UnsafePointer<Self>) -> SIMD8<Double>
  /// Eight values from `p` as int32 lanes (uint8 and uint16 only: exact there).
  static func load8i(_ p: UnsafePointer<Self>) -> SIMD8<Int32>
  /// The value as float64 (exact for every dtype here).
  var double: Double { get }
  /// The value as an integer (integers only; floats are never asked).
  var int64: Int64 { get }
  /// `max` with NaN winning, like `numpy.max` (integers: plain max).
  static func maximum(_ a: Self, _ b: Self) -> Self
  /// Whether the value is NaN or infinite.
  var isNonFinite: Bool { get }
  /// The largest magnitude of the dtype (integers), for exactness bounds.
  static var magnitude: Double { get }
  /// The value decoded from a packed word (integers only).
  init(packed: UInt32)
}

extension UInt8: FrameElement {
  static var dtype: DType { .uint8 }
  static var least: UInt8 { 0 }
  @inline(__always) static func load8(_ p: UnsafePointer<UInt8>) -> SIMD8<Double> {
    SIMD8<Double>(UnsafeRawPointer(p).loadUnaligned(as: SIMD8<UInt8>.self))
  }
  @inline(__always) static func load8i(_ p: UnsafePointer<UInt8>) -> SIMD8<Int32> {
    SIMD8<Int32>(truncatingIfNeeded: UnsafeRawPointer(p).loadUnaligned(as: SIMD8<UInt8>.self))
  }
  var double: Double { Double(self) }
  var int64: Int64 { Int64(self) }
  @inline(__always) static func maximum(_ a: UInt8, _ b: UInt8) -> UInt8 { Swift.max(a, b) }
  var isNonFinite: Bool { false }
  static var magnitude: Double { 255 }
  init(packed: UInt32) { self = UInt8(truncatingIfNeeded: packed) }
}

extension UInt16: FrameElement {
  static var dtype: DType { .uint16 }
  static var least: UInt16 { 0 }
  @inline(__always) static func load8(_ p: UnsafePointer<UInt16>) -> SIMD8<Double> {
    SIMD8<Double>(UnsafeRawPointer(p).loadUnaligned(as: SIMD8<UInt16>.self))
  }
  @inline(__always) static func load8i(_ p: UnsafePointer<UInt16>) -> SIMD8<Int32> {
    SIMD8<Int32>(truncatingIfNeeded: UnsafeRawPointer(p).loadUnaligned(as: SIMD8<UInt16>.self))
  }
  var double: Double { Double(self) }
  var int64: Int64 { Int64(self) }
  @inline(__always) static func maximum(_ a: UInt16, _ b: UInt16) -> UInt16 { Swift.max(a, b) }
  var isNonFinite: Bool { false }
  static var magnitude: Double { 65535 }
  init(packed: UInt32) { self = UInt16(truncatingIfNeeded: packed) }
}

extension UInt32: FrameElement {
  static var dtype: DType { .uint32 }
  static var least: UInt32 { 0 }
  @inline(__always) static func load8(_ p: UnsafePointer<UInt32>) -> SIMD8<Double> {
    SIMD8<Double>(UnsafeRawPointer(p).loadUnaligned(as: SIMD8<UInt32>.self))
  }
  static func load8i(_ p: UnsafePointer<UInt32>) -> SIMD8<Int32> {
    preconditionFailure("UInt32 frames never take the int32-lane path")
  }
  var double: Double { Double(self) }
  var int64: Int64 { Int64(self) }
  @inline(__always) static func maximum(_ a: UInt32, _ b: UInt32) -> UInt32 { Swift.max(a, b) }
  var isNonFinite: Bool { false }
  static var magnitude: Double { 4_294_967_295 }
  init(packed: UInt32) { self = packed }
}

extension Float: FrameElement {
  static var dtype: DType { .float32 }
  static var least: Float { -.infinity }
  @inline(__always) static func load8(_ p: UnsafePointer<Float>) -> SIMD8<Double> {
    SIMD8<Double>(UnsafeRawPointer(p).loadUnaligned(as: SIMD8<Float>.self))
  }
  static func load8i(_ p: UnsafePointer<Float>) -> SIMD8<Int32> {
    preconditionFailure("Float frames never take the int32-lane path")
  }
  var double: Double { Double(self) }
  var int64: Int64 { Int64(self) }
  @inline(__always) static func maximum(_ a: Float, _ b: Float) -> Float {
    if a.isNaN || b.isNaN { return .nan }
    return Swift.max(a, b)
  }
  var isNonFinite: Bool { !isFinite }
  static var magnitude: Double { Double(Float.greatestFiniteMagnitude) }
  init(packed: UInt32) { self = Float(bitPattern: packed) }
}

/// The bytes of `values` (little-endian hosts).
func bytesOf<T: BitwiseCopyable>(_ values: [T]) -> [UInt8] {
  values.withUnsafeBytes { Array($0) }
}
