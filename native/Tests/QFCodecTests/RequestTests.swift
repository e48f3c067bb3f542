import QFCodec
import Testing

/// Requests are validated by the codec: a payload that leaves it is consistent.
@Suite("request validation")
struct RequestTests {
  func put(
    _ rep: String, dtype: String = "uint16", shape: [Int64] = [1, 2, 2, 2],
    extra: [String: JSONValue] = [:], buffers: [[UInt8]]
  ) -> Message {
    var h: [String: JSONValue] = [
      "type": "put", "id": 1, "handle": 3, "representation": .string(rep),
      "storage_schema": .string(Representation(rawValue: rep)?.storageSchema ?? "x"),
      "dtype": .string(dtype), "shape": .array(shape.map { .int($0) }),
      "scan_slice": [[0, .int(shape[0])], [0, .int(shape[1])]],
    ]
    for (k, v) in extra { h[k] = v }
    return Message(h, buffers: buffers.map { ByteView($0) })
  }

  func code(_ m: Message) -> ErrorCode? {
    if case .failure(let e) = Request.parse(m) { return e.code }
    return nil
  }

  func le<T: FixedWidthInteger>(_ values: [T]) -> [UInt8] {
    values.flatMap { v in withUnsafeBytes(of: v.littleEndian) { Array($0) } }
  }

  @Test func aDensePutIsSizedByItsShapeAndDtype() {
    #expect(code(put("dense", buffers: [le([UInt16](repeating: 1, count: 8))])) == nil)
    #expect(code(put("dense", buffers: [le([UInt16](repeating: 1, count: 7))])) == .badRequest)
    #expect(code(put("dense", buffers: [])) == .badRequest)
    #expect(code(put("dense", dtype: "complex64", buffers: [[]])) == .badRequest)
    #expect(code(put("encoded", buffers: [[]])) == .unsupported)
    var m = put("dense", buffers: [le([UInt16](repeating: 1, count: 8))])
    m.header["scan_slice"] = [[0, 2], [0, 2]]
    #expect(code(m) == .badRequest)
  }

  func paired(indptr: [Int64], indices: [UInt16], counts: [UInt8], dtype: String = "uint8")
    -> Message
  {
    put(
      "paired", dtype: dtype,
      extra: ["index_dtype": "uint16", "count_dtype": "uint8"],
      buffers: [le(indptr), le(indices), counts])
  }

  @Test func pairedIndicesLieInTheFrameSortedAndUnique() {
    #expect(code(paired(indptr: [0, 2, 3], indices: [1, 3, 0], counts: [1, 2, 3])) == nil)
    #expect(
      code(paired(indptr: [0, 2, 3], indices: [3, 1, 0], counts: [1, 2, 3])) == .badRequest)
    #expect(
      code(paired(indptr: [0, 2, 3], indices: [1, 1, 0], counts: [1, 2, 3])) == .badRequest)
    #expect(
      code(paired(indptr: [0, 2, 3], indices: [1, 4, 0], counts: [1, 2, 3])) == .badRequest)
    #expect(
      code(paired(indptr: [0, 3, 2], indices: [1, 2, 0], counts: [1, 2, 3])) == .badRequest)
    #expect(
      code(paired(indptr: [1, 2, 3], indices: [1, 2, 0], counts: [1, 2, 3])) == .badRequest)
    #expect(
      code(paired(indptr: [0, 2, 3], indices: [1, 3, 0], counts: [1, 2, 3], dtype: "float32"))
        == .badRequest)
  }

  func packed(widths: [UInt8], offsets: [Int64], words: [UInt32], blockValues: Int64 = 32)
    -> Message
  {
    put(
      "packed", shape: [1, 2, 6, 6], extra: ["block_values": .int(blockValues)],
      buffers: [widths, le(offsets), le(words)])
  }

  @Test func packedOffsetsAreTheRunningSumsOfTheBlocks() {
    // K = 36, 2 blocks a frame (32 + 4 values), 2 frames
    let ok = packed(
      widths: [1, 2, 0, 16], offsets: [0, 1, 2, 2], words: [UInt32](repeating: 0, count: 5))
    #expect(code(ok) == nil)
    #expect(
      code(
        packed(
          widths: [1, 2, 0, 16], offsets: [0, 1, 1, 2], words: [UInt32](repeating: 0, count: 5)))
        == .badRequest)
    #expect(
      code(
        packed(
          widths: [1, 2, 0, 17], offsets: [0, 1, 2, 2], words: [UInt32](repeating: 0, count: 5)))
        == .badRequest)
    #expect(
      code(
        packed(
          widths: [1, 2, 0, 16], offsets: [0, 1, 2, 2], words: [UInt32](repeating: 0, count: 4)))
        == .badRequest)
    #expect(
      code(
        packed(
          widths: [1, 2, 0, 16], offsets: [0, 1, 2, 2], words: [UInt32](repeating: 0, count: 5),
          blockValues: 48)) == .badRequest)
  }

  @Test func runsAndTheRestNameWhatIsWrong() {
    let gather = Message(
      ["type": "run", "id": 2, "operation": "gather", "chunk": 3],
      buffers: [ByteView(le([Int64(4), -1]))])
    #expect(code(gather) == .badRequest)
    let op = Message(["type": "run", "id": 2, "operation": "ssb", "chunk": 3])
    #expect(code(op) == .unsupported)
    let pass = Message([
      "type": "run", "id": 2, "operation": "frame_pass", "chunk": 3, "weights": 4,
      "options": ["want_sum": 1, "want_max": false],
    ])
    #expect(code(pass) == .badRequest)
    #expect(code(Message(["type": "result", "id": 1])) == .unsupported)
    #expect(code(Message(["type": "ping", "id": -1])) == .badRequest)
    #expect(code(Message(["type": "release", "id": 1, "handles": [1, -2]])) == .badRequest)
    let weights = Message(
      ["type": "put_weights", "id": 1, "handle": 4, "shape": [2, 3], "dtype": "float64"],
      buffers: [ByteView([UInt8](repeating: 0, count: 40))])
    #expect(code(weights) == .badRequest)
  }
}
