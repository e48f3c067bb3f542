/// Replies of `qf-worker/1` (docs/protocol.md, "Messages"), built from typed values.
public enum Reply {
  /// The header of a reply of `type` to request `id`, with `members`.
  static func make(_ type: String, _ id: Int64?, _ members: [String: JSONValue]) -> [String:
    JSONValue]
  {
    var header = members
    header["type"] = .string(type)
    header["id"] = id.map { .int($0) } ?? .null
    return header
  }

  /// The limits a worker announces in `hello`.
  public struct Limits: Sendable {
    public var maxMessageBytes: Int
    public var maxBufferBytes: Int
    public var maxWeights: Int
    public var maxFramePixels: Int

    public init(maxMessageBytes: Int, maxBufferBytes: Int, maxWeights: Int, maxFramePixels: Int) {
      self.maxMessageBytes = maxMessageBytes
      self.maxBufferBytes = maxBufferBytes
      self.maxWeights = maxWeights
      self.maxFramePixels = maxFramePixels
    }

    var json: JSONValue {
      [
        "max_message_bytes": .int(Int64(maxMessageBytes)),
        "max_buffer_bytes": .int(Int64(maxBufferBytes)),
        "max_weights": .int(Int64(maxWeights)),
        "max_frame_pixels": .int(Int64(maxFramePixels)),
      ]
    }
  }

  /// The `hello` reply.
  public static func hello(
    id: Int64, runtime: String, implementation: String, device: [String: JSONValue],
    limits: Limits, memoryBudgetBytes: Int, kernels: [(String, String, String)],
    integerAccumulation: String, realAccumulation: String
  ) -> Message {
    Message(
      make(
        "hello", id,
        [
          "protocol": .string(protocolVersion),
          "runtime": .string(runtime),
          "implementation": .string(implementation),
          "device": .object(device),
          "limits": limits.json,
          "memory_budget_bytes": .int(Int64(memoryBudgetBytes)),
          "kernels": .array(kernels.map { .array([.string($0.0), .string($0.1), .string($0.2)]) }),
          "storage_schemas": .array(Representation.allCases.map { .string($0.storageSchema) }),
          "accumulation": [
            "integer": .string(integerAccumulation), "real": .string(realAccumulation),
          ],
        ]))
  }

  /// The reply to `put` and `put_weights` (`integerWeights` only for the latter).
  public static func stored(
    id: Int64, handle: Int64, residentBytes: Int, integerWeights: Bool? = nil
  )
    -> Message
  {
    var members: [String: JSONValue] = [
      "handle": .int(handle), "resident_bytes": .int(Int64(residentBytes)),
    ]
    if let integerWeights { members["integer_weights"] = .bool(integerWeights) }
    return Message(make("result", id, members))
  }

  /// One output of a `run` result: its name, dtype, shape and bytes.
  public struct Output: Sendable {
    public var name: String
    public var dtype: DType
    public var shape: [Int]
    public var bytes: ByteView

    public init(name: String, dtype: DType, shape: [Int], bytes: ByteView) {
      self.name = name
      self.dtype = dtype
      self.shape = shape
      self.bytes = bytes
    }
  }

  /// The reply to `run`: one buffer per output, in order.
  public static func result(id: Int64, outputs: [Output], accumulation: String?) -> Message {
    var members: [String: JSONValue] = [
      "outputs": .array(
        outputs.map {
          [
            "name": .string($0.name), "dtype": .string($0.dtype.rawValue),
            "shape": .array($0.shape.map { .int(Int64($0)) }),
          ]
        })
    ]
    if let accumulation { members["accumulation"] = .string(accumulation) }
    return Message(make("result", id, members), buffers: outputs.map(\.bytes))
  }

  /// The reply to `release`.
  public static func released(id: Int64, handles: [Int64], residentBytes: Int) -> Message {
    Message(
      make(
        "result", id,
        [
          "released": .array(handles.map { .int($0) }),
          "resident_bytes": .int(Int64(residentBytes)),
        ]))
  }

  /// The reply to `stats`.
  public static func stats(
    id: Int64, handles: Int, residentBytes: [String: Int], memoryBudgetBytes: Int
  ) -> Message {
    Message(
      make(
        "stats", id,
        [
          "handles": .int(Int64(handles)),
          "resident_bytes": .object(residentBytes.mapValues { .int(Int64($0)) }),
          "memory_budget_bytes": .int(Int64(memoryBudgetBytes)),
        ]))
  }

  /// `ping` and `bye` replies: the same message.
  public static func echo(_ type: String, id: Int64) -> Message { Message(make(type, id, [:])) }

  /// An `error` reply (`id` nil for an unsolicited one, sent just before closing).
  public static func error(id: Int64?, _ error: ProtocolError) -> Message {
    var members: [String: JSONValue] = [
      "code": .string(error.code.rawValue), "message": .string(error.message),
    ]
    if let handle = error.handle { members["handle"] = .int(handle) }
    return Message(make("error", id, members))
  }
}
