/// The error codes of `qf-worker/1` (docs/protocol.md, "error").
public enum ErrorCode: String, Sendable, CaseIterable {
  /// The protocol version is not spoken.
  case version
  /// The frame cannot be parsed; the connection closes.
  case frame
  /// The stream ended inside a frame.
  case truncated
  /// A frame over `max_message_bytes`.
  case tooLarge = "too_large"
  /// A well-formed frame with wrong members or buffer sizes.
  case badRequest = "bad_request"
  /// No payload or weights under that handle.
  case unknownHandle = "unknown_handle"
  /// The payload does not fit the memory budget; nothing was allocated.
  case budget
  /// A message type, storage schema, operation or dtype not offered.
  case unsupported
  /// The device failed.
  case device
  /// Anything else; the worker stays usable if it can.
  case `internal`

  /// Whether a receiver must close the byte stream after this error.
  public var closesStream: Bool {
    switch self {
    case .frame, .truncated, .tooLarge: return true
    default: return false
    }
  }
}

/// Every failure of the library: a protocol error code and a message that says what was
/// expected, what was given and what to do.  Nothing else crosses the library's boundary.
public struct ProtocolError: Error, Equatable, Sendable, CustomStringConvertible {
  /// The protocol error code.
  public var code: ErrorCode
  /// For people: what was expected, what was given, what to do.
  public var message: String
  /// The handle concerned, when there is one.
  public var handle: Int64?

  public init(_ code: ErrorCode, _ message: String, handle: Int64? = nil) {
    self.code = code
    self.message = message
    self.handle = handle
  }

  public var description: String { "\(code.rawValue): \(message)" }

  static func frame(_ message: String) -> ProtocolError { ProtocolError(.frame, message) }

  static func bad(_ message: String, handle: Int64? = nil) -> ProtocolError {
    ProtocolError(.badRequest, message, handle: handle)
  }
}
