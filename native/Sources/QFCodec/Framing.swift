/// Framing of `qf-worker/1` (docs/protocol.md, "Framing"): a 16-byte prefix (`QFW1`,
/// header length, body length), a canonical JSON header, zero padding to 8 bytes, then the
/// buffers the header declares, each padded with zeros to a multiple of 8.

/// Bytes received or to send, shared without copying: a frame's storage keeps its
/// buffers alive for as long as a payload holds a view of them.
public final class Bytes: @unchecked Sendable {
  /// The bytes (never mutated after the frame is complete).
  public let storage: [UInt8]

  public init(_ storage: [UInt8]) { self.storage = storage }
}

/// A range of a `Bytes` storage: one buffer of a message.  Buffers of a received frame
/// start 8-byte aligned (the storage of a Swift array is at least 16-byte aligned).
public struct ByteView: Sendable {
  public let bytes: Bytes
  public let offset: Int
  public let count: Int

  public init(_ bytes: Bytes, offset: Int, count: Int) {
    precondition(offset >= 0 && count >= 0 && offset + count <= bytes.storage.count)
    self.bytes = bytes
    self.offset = offset
    self.count = count
  }

  /// A view of a whole new array.
  public init(_ array: [UInt8]) {
    self.init(Bytes(array), offset: 0, count: array.count)
  }

  /// A view of the raw bytes of `values` (little-endian hosts: every Apple and Linux one).
  public init<T: BitwiseCopyable>(values: [T]) {
    let raw = values.withUnsafeBytes { Array($0) }
    self.init(raw)
  }

  /// Call `body` with the view's raw bytes.
  public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R)
    throws(E) -> R
  {
    let result: Result<R, E> = bytes.storage.withUnsafeBytes { all in
      Result { () throws(E) -> R in
        try body(UnsafeRawBufferPointer(rebasing: all[offset..<(offset + count)]))
      }
    }
    return try result.get()
  }

  /// The bytes as a new array.
  public var array: [UInt8] { withUnsafeBytes { Array($0) } }

  /// The `index`-th little-endian value of type `T` (no alignment needed).
  @inline(__always)
  public func load<T: FixedWidthInteger>(_ index: Int, as: T.Type) -> T {
    withUnsafeBytes {
      T(littleEndian: $0.loadUnaligned(fromByteOffset: index * MemoryLayout<T>.size, as: T.self))
    }
  }
}

/// One protocol message: a header (a JSON object with `type` and `id`) and its buffers.
public struct Message: Sendable {
  public var header: [String: JSONValue]
  public var buffers: [ByteView]

  public init(_ header: [String: JSONValue], buffers: [ByteView] = []) {
    self.header = header
    self.buffers = buffers
  }

  /// The message type (`""` when absent, which decoding never lets through).
  public var type: String { header["type"]?.string ?? "" }

  /// The request id (`nil` for an unsolicited error).
  public var id: Int64? { header["id"]?.int }
}

/// Round `n` up to a multiple of 8.
@inline(__always)
public func pad8(_ n: Int) -> Int { (n + 7) & ~7 }

/// Framing constants and one-frame encoding and decoding.
public enum Frame {
  /// The ASCII bytes `QFW1`.
  public static let magic: [UInt8] = Array("QFW1".utf8)
  /// Bytes of the fixed prefix.
  public static let prefixBytes = 16
  /// Largest header a receiver accepts.
  public static let maxHeaderBytes = 16 * 1024 * 1024

  /// The frame of `message` as pieces (prefix and padded header, then each buffer and its
  /// padding) whose concatenation is the frame, without copying the buffers.
  ///
  /// A `buffers` member in the header must list the buffers' lengths (`bad_request`
  /// otherwise); if absent it is added when there are buffers.
  public static func encodePieces(_ message: Message) -> Result<[ByteView], ProtocolError> {
    var header = message.header
    let lengths = message.buffers.map { JSONValue.int(Int64($0.count)) }
    if let declared = header["buffers"] {
      guard declared == .array(lengths) else {
        return .failure(
          .bad(
            "header 'buffers' \(declared.shortDescription) disagrees with the \(lengths.count) "
              + "buffers given"))
      }
    } else if !lengths.isEmpty {
      header["buffers"] = .array(lengths)
    }
    guard header["type"]?.string != nil else {
      return .failure(.frame("a message needs a string 'type'"))
    }
    let raw: [UInt8]
    switch CanonicalJSON.encode(.object(header)) {
    case .success(let bytes): raw = bytes
    case .failure(let error): return .failure(error)
    }
    guard raw.count <= maxHeaderBytes else {
      return .failure(
        .frame("header of \(raw.count) bytes exceeds the limit of \(maxHeaderBytes) bytes"))
    }
    let body = message.buffers.reduce(0) { $0 + pad8($1.count) }
    let headEnd = pad8(prefixBytes + raw.count)
    var first = magic
    first.reserveCapacity(headEnd)
    withUnsafeBytes(of: UInt32(raw.count).littleEndian) { first.append(contentsOf: $0) }
    withUnsafeBytes(of: UInt64(body).littleEndian) { first.append(contentsOf: $0) }
    first.append(contentsOf: raw)
    first.append(contentsOf: [UInt8](repeating: 0, count: headEnd - first.count))
    var pieces = [ByteView(first)]
    let zeros = Bytes([UInt8](repeating: 0, count: 8))
    for buffer in message.buffers {
      if buffer.count > 0 { pieces.append(buffer) }
      let pad = pad8(buffer.count) - buffer.count
      if pad > 0 { pieces.append(ByteView(zeros, offset: 0, count: pad)) }
    }
    return .success(pieces)
  }

  /// The frame of `message` as one array.
  public static func encode(_ message: Message) -> Result<[UInt8], ProtocolError> {
    encodePieces(message).map { pieces in
      var out: [UInt8] = []
      out.reserveCapacity(pieces.reduce(0) { $0 + $1.count })
      for piece in pieces { piece.withUnsafeBytes { out.append(contentsOf: $0) } }
      return out
    }
  }

  /// Decode exactly one frame (bytes after it are a `frame` error, a short one `truncated`).
  public static func decode(_ bytes: [UInt8], maxMessageBytes: Int? = nil) -> Result<
    Message, ProtocolError
  > {
    var decoder = FrameDecoder(maxMessageBytes: maxMessageBytes)
    var messages: [Message] = []
    let fed = bytes.withUnsafeBytes { decoder.feed($0) }
    switch fed {
    case .success(let got): messages = got
    case .failure(let error): return .failure(error)
    }
    if case .failure(let error) = decoder.finish() { return .failure(error) }
    guard messages.count == 1 else {
      return .failure(.frame("expected exactly one frame, found \(messages.count)"))
    }
    return .success(messages[0])
  }
}

/// An incremental frame decoder for a byte stream (pipes, sockets).
///
/// Feed it pieces of any size; it returns the messages they complete.  It checks in the
/// protocol's order: the magic as soon as bytes arrive, the header length from the prefix,
/// the total against `maxMessageBytes` (`too_large`), then the header, its padding and
/// `body_length` before waiting for the body, then the body's padding.  After an error it
/// refuses all input: a byte stream cannot be resynchronised.  Each frame's body is
/// allocated once, only after its header checked out.
public struct FrameDecoder {
  public let maxMessageBytes: Int?
  public let maxHeaderBytes: Int

  private var head: [UInt8] = []
  private var need = Frame.prefixBytes
  private var frame: [UInt8]? = nil
  private var filled = 0
  private var total = 0
  private var headerLength = 0
  private var bodyLength = 0
  private var magicOK = false
  private var header: [String: JSONValue] = [:]
  private var lengths: [Int] = []
  private var failed: ProtocolError? = nil

  public init(maxMessageBytes: Int? = nil, maxHeaderBytes: Int = Frame.maxHeaderBytes) {
    self.maxMessageBytes = maxMessageBytes
    self.maxHeaderBytes = maxHeaderBytes
  }

  /// Whether bytes of an incomplete frame are pending.
  public var inFrame: Bool { !head.isEmpty || frame != nil }

  /// Consume `data`; return the messages it completes, or the first error (messages that
  /// `data` completed before the error are dropped: see `feedAll` to keep them).
  public mutating func feed(_ data: UnsafeRawBufferPointer) -> Result<[Message], ProtocolError> {
    let (messages, error) = feedAll(data)
    if let error { return .failure(error) }
    return .success(messages)
  }

  /// Consume `data`; return the messages it completes and, if a frame failed after them, the
  /// error (a transport answers the messages, then sends the error and closes).
  public mutating func feedAll(_ data: UnsafeRawBufferPointer) -> (
    messages: [Message], error: ProtocolError?
  ) {
    if let failed {
      return (
        [],
        ProtocolError(
          failed.code, "the stream already failed (\(failed.message)); it cannot be resynchronised")
      )
    }
    var out: [Message] = []
    do throws(ProtocolError) {
      try consume(data, into: &out)
      return (out, nil)
    } catch {
      failed = error
      return (out, error)
    }
  }

  /// Signal the end of the stream: `truncated` if it ended inside a frame.
  public mutating func finish() -> Result<Void, ProtocolError> {
    if failed != nil || !inFrame { return .success(()) }
    let got = frame != nil ? filled : head.count
    let want = total > 0 ? total : Frame.prefixBytes
    let error = ProtocolError(
      .truncated, "the stream ended inside a frame: \(got) of \(want) bytes received")
    failed = error
    return .failure(error)
  }

  private mutating func consume(_ data: UnsafeRawBufferPointer, into out: inout [Message])
    throws(ProtocolError)
  {
    var pos = 0
    let end = data.count
    while pos < end {
      var message: Message? = nil
      if frame == nil {
        let take = min(need - head.count, end - pos)
        head.append(contentsOf: UnsafeRawBufferPointer(rebasing: data[pos..<(pos + take)]))
        pos += take
        if !magicOK { try checkMagicStart() }
        if head.count < need { continue }
        if need == Frame.prefixBytes {
          try startFrame()
          if head.count < need { continue }
        }
        message = try headerDone()
      } else {
        let take = min(total - filled, end - pos)
        frame!.withUnsafeMutableBytes { dst in
          dst.baseAddress!.advanced(by: filled).copyMemory(
            from: data.baseAddress!.advanced(by: pos), byteCount: take)
        }
        filled += take
        pos += take
        if filled == total { message = try bodyDone() }
      }
      if let message { out.append(message) }
    }
  }

  private func checkMagicStart() throws(ProtocolError) {
    let n = min(head.count, 4)
    if Array(head[0..<n]) != Array(Frame.magic[0..<n]) {
      let shown = head[0..<n].map { String($0, radix: 16) }.joined(separator: " ")
      throw .frame(
        "frame magic starts with bytes [\(shown)], expected \"QFW1\": not a qf-worker frame")
    }
  }

  private mutating func startFrame() throws(ProtocolError) {
    let h = head.withUnsafeBytes {
      Int(UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
    }
    let b = head.withUnsafeBytes {
      UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
    }
    guard h <= maxHeaderBytes else {
      throw .frame("header_length \(h) exceeds the limit of \(maxHeaderBytes) bytes")
    }
    let headEnd = pad8(Frame.prefixBytes + h)
    let limit = maxMessageBytes ?? Int.max
    guard b <= UInt64(Int.max - headEnd), headEnd + Int(b) <= limit else {
      throw ProtocolError(
        .tooLarge,
        "a frame of \(UInt64(headEnd) &+ b) bytes exceeds max_message_bytes \(limit); split the "
          + "payload into smaller chunks")
    }
    headerLength = h
    bodyLength = Int(b)
    total = headEnd + bodyLength
    need = headEnd
    magicOK = true
  }

  private mutating func headerDone() throws(ProtocolError) -> Message? {
    let headEnd = pad8(Frame.prefixBytes + headerLength)
    let parsed = head.withUnsafeBytes { all in
      JSONParser.parse(
        UnsafeRawBufferPointer(
          rebasing: all[Frame.prefixBytes..<(Frame.prefixBytes + headerLength)]))
    }
    let value: JSONValue
    switch parsed {
    case .success(let v): value = v
    case .failure(let error): throw error
    }
    guard case .object(let members) = value else {
      throw .frame("header must be a JSON object, got \(value.shortDescription)")
    }
    guard let type = members["type"]?.string else {
      throw .frame(
        "header member 'type' must be a string, got \(members["type"]?.shortDescription ?? "none")")
    }
    var lengths: [Int] = []
    if let declared = members["buffers"] {
      guard let items = declared.array else {
        throw .frame(
          "header member 'buffers' must be a list of non-negative integers, got "
            + declared.shortDescription)
      }
      for item in items {
        guard let n = item.int, n >= 0 else {
          throw .frame(
            "header member 'buffers' must be a list of non-negative integers, got "
              + item.shortDescription)
        }
        lengths.append(Int(n))
      }
    }
    for i in (Frame.prefixBytes + headerLength)..<headEnd where head[i] != 0 {
      throw .frame("a padding byte after the header of a \(type) message is not zero")
    }
    var expect = 0
    for n in lengths {
      let (sum, overflow) = expect.addingReportingOverflow(pad8(n))
      guard !overflow else { throw .frame("the header's buffers overflow a frame") }
      expect = sum
    }
    guard expect == bodyLength else {
      throw .frame(
        "body_length is \(bodyLength) but the header's buffers \(lengths) need sum(pad8(L)) = "
          + "\(expect) bytes")
    }
    header = members
    self.lengths = lengths
    if bodyLength == 0 {
      let message = try split(Bytes(head), headEnd: headEnd)
      reset()
      return message
    }
    // only now, with a header whose buffers agree with body_length, allocate the frame
    var storage = [UInt8](unsafeUninitializedCapacity: total) { _, count in count = total }
    storage.withUnsafeMutableBytes { dst in
      head.withUnsafeBytes { src in
        dst.baseAddress!.copyMemory(from: src.baseAddress!, byteCount: headEnd)
      }
    }
    frame = storage
    filled = headEnd
    return nil
  }

  private mutating func bodyDone() throws(ProtocolError) -> Message {
    let bytes = Bytes(frame!)
    frame = nil
    let message = try split(bytes, headEnd: pad8(Frame.prefixBytes + headerLength))
    reset()
    return message
  }

  private func split(_ bytes: Bytes, headEnd: Int) throws(ProtocolError) -> Message {
    var buffers: [ByteView] = []
    var pos = headEnd
    for (i, n) in lengths.enumerated() {
      buffers.append(ByteView(bytes, offset: pos, count: n))
      for j in (pos + n)..<(pos + pad8(n)) where bytes.storage[j] != 0 {
        throw .frame("a padding byte after buffer \(i) is not zero")
      }
      pos += pad8(n)
    }
    return Message(header, buffers: buffers)
  }

  private mutating func reset() {
    head = []
    need = Frame.prefixBytes
    frame = nil
    filled = 0
    total = 0
    magicOK = false
  }
}
