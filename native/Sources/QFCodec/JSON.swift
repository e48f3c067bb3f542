/// A value of a `qf-worker/1` header: JSON whose numbers are integers only.
///
/// Headers never hold floating-point values (real values travel in buffers), and every
/// integer lies in `[-(2**53 - 1), 2**53 - 1]` (docs/protocol.md, "Canonical JSON").
public enum JSONValue: Equatable, Sendable {
  case null
  case bool(Bool)
  case int(Int64)
  case string(String)
  case array([JSONValue])
  case object([String: JSONValue])

  /// The largest magnitude of a header integer (JavaScript's safe integers).
  public static let maxInteger: Int64 = (1 << 53) - 1

  /// The member `key` of an object (`nil` for a missing member or a non-object).
  public subscript(key: String) -> JSONValue? {
    if case .object(let members) = self { return members[key] }
    return nil
  }

  /// The integer, if this is one.
  public var int: Int64? {
    if case .int(let v) = self { return v }
    return nil
  }

  /// The string, if this is one.
  public var string: String? {
    if case .string(let v) = self { return v }
    return nil
  }

  /// The Boolean, if this is one.
  public var bool: Bool? {
    if case .bool(let v) = self { return v }
    return nil
  }

  /// The elements, if this is an array.
  public var array: [JSONValue]? {
    if case .array(let v) = self { return v }
    return nil
  }

  /// The members, if this is an object.
  public var object: [String: JSONValue]? {
    if case .object(let v) = self { return v }
    return nil
  }

  /// A short name of the value's kind and the value, for error messages.
  public var shortDescription: String {
    switch self {
    case .null: return "null"
    case .bool(let b): return b ? "true" : "false"
    case .int(let v): return String(v)
    case .string(let s): return "\"\(s.prefix(40))\""
    case .array(let a): return "an array of \(a.count)"
    case .object(let o): return "an object of \(o.count) members"
    }
  }
}

extension JSONValue: ExpressibleByIntegerLiteral, ExpressibleByStringLiteral,
  ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral,
  ExpressibleByNilLiteral
{
  public init(integerLiteral value: Int64) { self = .int(value) }
  public init(stringLiteral value: String) { self = .string(value) }
  public init(booleanLiteral value: Bool) { self = .bool(value) }
  public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
  public init(dictionaryLiteral elements: (String, JSONValue)...) {
    self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
  }
  public init(nilLiteral: ()) { self = .null }
}

// MARK: - canonical writer

/// The canonical JSON of docs/protocol.md: keys sorted by code point, no whitespace,
/// integers only, `"` `\` and the controls escaped, every non-ASCII character as a
/// lowercase `\uXXXX` (UTF-16 surrogate pairs above U+FFFF), DEL written as the raw byte.
public enum CanonicalJSON {
  /// The canonical bytes of `value`, or a `frame` error for an integer out of range.
  public static func encode(_ value: JSONValue) -> Result<[UInt8], ProtocolError> {
    var out: [UInt8] = []
    out.reserveCapacity(256)
    do throws(ProtocolError) {
      try write(value, into: &out, path: "$")
    } catch {
      return .failure(error)
    }
    return .success(out)
  }

  static func write(_ value: JSONValue, into out: inout [UInt8], path: String) throws(ProtocolError)
  {
    switch value {
    case .null: out.append(contentsOf: Array("null".utf8))
    case .bool(let b): out.append(contentsOf: Array((b ? "true" : "false").utf8))
    case .int(let v):
      guard v >= -JSONValue.maxInteger && v <= JSONValue.maxInteger else {
        throw .frame(
          "header value at \(path) is \(v), outside the integers a header may hold "
            + "[-(2**53 - 1), 2**53 - 1]; send large values in a buffer")
      }
      out.append(contentsOf: Array(String(v).utf8))
    case .string(let s): writeString(s, into: &out)
    case .array(let items):
      out.append(UInt8(ascii: "["))
      for (i, item) in items.enumerated() {
        if i > 0 { out.append(UInt8(ascii: ",")) }
        try write(item, into: &out, path: "\(path)[\(i)]")
      }
      out.append(UInt8(ascii: "]"))
    case .object(let members):
      out.append(UInt8(ascii: "{"))
      let keys = members.keys.sorted(by: codePointOrder)
      for (i, key) in keys.enumerated() {
        if i > 0 { out.append(UInt8(ascii: ",")) }
        writeString(key, into: &out)
        out.append(UInt8(ascii: ":"))
        try write(members[key]!, into: &out, path: "\(path).\(key)")
      }
      out.append(UInt8(ascii: "}"))
    }
  }

  /// `a` before `b` in Unicode code point order (what the protocol sorts keys by).
  public static func codePointOrder(_ a: String, _ b: String) -> Bool {
    a.unicodeScalars.lexicographicallyPrecedes(b.unicodeScalars)
  }

  private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

  private static func writeUnit(_ unit: UInt16, into out: inout [UInt8]) {
    out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u")])
    for shift in stride(from: 12, through: 0, by: -4) {
      out.append(hex[Int((unit >> UInt16(shift)) & 0xF)])
    }
  }

  static func writeString(_ s: String, into out: inout [UInt8]) {
    out.append(UInt8(ascii: "\""))
    for scalar in s.unicodeScalars {
      let v = scalar.value
      switch v {
      case 0x22: out.append(contentsOf: [0x5C, 0x22])
      case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
      case 0x08: out.append(contentsOf: [0x5C, UInt8(ascii: "b")])
      case 0x0C: out.append(contentsOf: [0x5C, UInt8(ascii: "f")])
      case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
      case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
      case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
      case 0..<0x20: writeUnit(UInt16(v), into: &out)
      case 0x20..<0x80: out.append(UInt8(v))
      default:
        for unit in String(scalar).utf16 { writeUnit(unit, into: &out) }
      }
    }
    out.append(UInt8(ascii: "\""))
  }
}

// MARK: - parser

/// A strict JSON parser with the protocol's number rules: a number whose value is not an
/// integer in `[-(2**53 - 1), 2**53 - 1]`, and the literals `NaN`/`Infinity`, are `frame`
/// errors.  `1.0` and `1e2` read as the integers 1 and 100 (their values), as JavaScript's
/// `JSON.parse` sees them.  Invalid UTF-8 is a `frame` error.
public enum JSONParser {
  /// Deepest nesting of arrays and objects accepted.
  public static let maxDepth = 256

  /// Parse `bytes` as one JSON value (surrounding whitespace allowed).
  public static func parse(_ bytes: UnsafeRawBufferPointer) -> Result<JSONValue, ProtocolError> {
    do throws(ProtocolError) {
      return .success(try parseOrThrow(bytes))
    } catch {
      return .failure(error)
    }
  }

  static func parseOrThrow(_ bytes: UnsafeRawBufferPointer) throws(ProtocolError) -> JSONValue {
    let buffer = bytes.bindMemory(to: UInt8.self)
    if !validUTF8(buffer) {
      throw .frame("header is not valid UTF-8; emit UTF-8 (ASCII) JSON")
    }
    var parser = Cursor(bytes: buffer)
    parser.skipSpace()
    let value = try parser.value(depth: 0)
    parser.skipSpace()
    if parser.pos != buffer.count {
      throw .frame("header is not valid JSON (extra data at byte \(parser.pos))")
    }
    return value
  }

  static func validUTF8(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
    var it = bytes.makeIterator()
    var decoder = UTF8()
    while true {
      switch decoder.decode(&it) {
      case .scalarValue: continue
      case .emptyInput: return true
      case .error: return false
      }
    }
  }

  struct Cursor {
    let bytes: UnsafeBufferPointer<UInt8>
    var pos = 0

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    func fail(_ what: String) -> ProtocolError {
      .frame("header is not valid JSON (\(what) at byte \(pos))")
    }

    mutating func skipSpace() {
      while pos < bytes.count {
        switch bytes[pos] {
        case 0x20, 0x09, 0x0A, 0x0D: pos += 1
        default: return
        }
      }
    }

    mutating func value(depth: Int) throws(ProtocolError) -> JSONValue {
      guard pos < bytes.count else { throw fail("a value expected, the text ended") }
      switch bytes[pos] {
      case UInt8(ascii: "{"): return try object(depth: depth + 1)
      case UInt8(ascii: "["): return try array(depth: depth + 1)
      case UInt8(ascii: "\""): return .string(try string())
      case UInt8(ascii: "t"):
        try literal("true")
        return .bool(true)
      case UInt8(ascii: "f"):
        try literal("false")
        return .bool(false)
      case UInt8(ascii: "n"):
        try literal("null")
        return .null
      case UInt8(ascii: "N"), UInt8(ascii: "I"):
        throw .frame("header holds NaN or Infinity, which is not JSON (numbers are integers only)")
      case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .int(try number())
      default: throw fail("unexpected character")
      }
    }

    mutating func literal(_ word: String) throws(ProtocolError) {
      for c in word.utf8 {
        guard pos < bytes.count, bytes[pos] == c else { throw fail("expected \(word)") }
        pos += 1
      }
    }

    mutating func object(depth: Int) throws(ProtocolError) -> JSONValue {
      guard depth <= JSONParser.maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
      pos += 1
      var members: [String: JSONValue] = [:]
      skipSpace()
      if pos < bytes.count && bytes[pos] == UInt8(ascii: "}") {
        pos += 1
        return .object(members)
      }
      while true {
        skipSpace()
        guard pos < bytes.count, bytes[pos] == UInt8(ascii: "\"") else {
          throw fail("an object key (a string) expected")
        }
        let key = try string()
        skipSpace()
        guard pos < bytes.count, bytes[pos] == UInt8(ascii: ":") else { throw fail("':' expected") }
        pos += 1
        skipSpace()
        members[key] = try value(depth: depth)  // a duplicate key keeps the last value
        skipSpace()
        guard pos < bytes.count else { throw fail("the object is not closed") }
        if bytes[pos] == UInt8(ascii: ",") {
          pos += 1
          continue
        }
        if bytes[pos] == UInt8(ascii: "}") {
          pos += 1
          return .object(members)
        }
        throw fail("',' or '}' expected")
      }
    }

    mutating func array(depth: Int) throws(ProtocolError) -> JSONValue {
      guard depth <= JSONParser.maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
      pos += 1
      var items: [JSONValue] = []
      skipSpace()
      if pos < bytes.count && bytes[pos] == UInt8(ascii: "]") {
        pos += 1
        return .array(items)
      }
      while true {
        skipSpace()
        items.append(try value(depth: depth))
        skipSpace()
        guard pos < bytes.count else { throw fail("the array is not closed") }
        if bytes[pos] == UInt8(ascii: ",") {
          pos += 1
          continue
        }
        if bytes[pos] == UInt8(ascii: "]") {
          pos += 1
          return .array(items)
        }
        throw fail("',' or ']' expected")
      }
    }

    mutating func hex4() throws(ProtocolError) -> UInt32 {
      guard pos + 4 <= bytes.count else { throw fail("a \\u escape needs 4 hex digits") }
      var v: UInt32 = 0
      for _ in 0..<4 {
        let c = bytes[pos]
        let d: UInt32
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
        case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
        case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
        default: throw fail("a \\u escape needs 4 hex digits")
        }
        v = v << 4 | d
        pos += 1
      }
      return v
    }

    mutating func string() throws(ProtocolError) -> String {
      pos += 1  // the opening quote
      var scalars = String.UnicodeScalarView()
      var runStart = pos
      func flush(_ end: Int) {
        if end > runStart {
          let run = UnsafeBufferPointer(rebasing: bytes[runStart..<end])
          scalars.append(contentsOf: String(decoding: run, as: UTF8.self).unicodeScalars)
        }
      }
      while true {
        guard pos < bytes.count else { throw fail("the string is not closed") }
        let c = bytes[pos]
        if c == UInt8(ascii: "\"") {
          flush(pos)
          pos += 1
          return String(scalars)
        }
        if c < 0x20 { throw fail("a raw control character in a string") }
        if c != UInt8(ascii: "\\") {
          pos += 1
          continue
        }
        flush(pos)
        pos += 1
        guard pos < bytes.count else { throw fail("the string is not closed") }
        let e = bytes[pos]
        pos += 1
        switch e {
        case UInt8(ascii: "\""): scalars.append("\"")
        case UInt8(ascii: "\\"): scalars.append("\\")
        case UInt8(ascii: "/"): scalars.append("/")
        case UInt8(ascii: "b"): scalars.append("\u{08}")
        case UInt8(ascii: "f"): scalars.append("\u{0C}")
        case UInt8(ascii: "n"): scalars.append("\n")
        case UInt8(ascii: "r"): scalars.append("\r")
        case UInt8(ascii: "t"): scalars.append("\t")
        case UInt8(ascii: "u"):
          var v = try hex4()
          if (0xD800..<0xDC00).contains(v), pos + 6 <= bytes.count,
            bytes[pos] == UInt8(ascii: "\\"), bytes[pos + 1] == UInt8(ascii: "u")
          {
            let save = pos
            pos += 2
            let low = try hex4()
            if (0xDC00..<0xE000).contains(low) {
              v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00)
            } else {
              pos = save
            }
          }
          // A lone surrogate cannot be held by a Swift string: it reads as U+FFFD.
          scalars.append(Unicode.Scalar(v) ?? "\u{FFFD}")
        default: throw fail("an unknown escape \\\(Character(Unicode.Scalar(e)))")
        }
        runStart = pos
      }
    }

    /// A JSON number; its value must be an integer within the header range.
    mutating func number() throws(ProtocolError) -> Int64 {
      let start = pos
      if bytes[pos] == UInt8(ascii: "-") { pos += 1 }
      guard pos < bytes.count, isDigit(bytes[pos]) else { throw fail("a digit expected") }
      if bytes[pos] == UInt8(ascii: "0") {
        pos += 1
      } else {
        while pos < bytes.count && isDigit(bytes[pos]) { pos += 1 }
      }
      var integral = true
      if pos < bytes.count && bytes[pos] == UInt8(ascii: ".") {
        integral = false
        pos += 1
        guard pos < bytes.count, isDigit(bytes[pos]) else { throw fail("a digit expected") }
        while pos < bytes.count && isDigit(bytes[pos]) { pos += 1 }
      }
      if pos < bytes.count && (bytes[pos] == UInt8(ascii: "e") || bytes[pos] == UInt8(ascii: "E")) {
        integral = false
        pos += 1
        if pos < bytes.count && (bytes[pos] == UInt8(ascii: "+") || bytes[pos] == UInt8(ascii: "-"))
        {
          pos += 1
        }
        guard pos < bytes.count, isDigit(bytes[pos]) else { throw fail("a digit expected") }
        while pos < bytes.count && isDigit(bytes[pos]) { pos += 1 }
      }
      let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<pos]), as: UTF8.self)
      let outside = ProtocolError.frame(
        "header holds the integer \(text.prefix(40)), outside [-(2**53 - 1), 2**53 - 1]; large "
          + "values travel in buffers")
      if integral {
        // exact: more than 16 digits is beyond 2**53 whatever they are
        let digits = text.hasPrefix("-") ? text.count - 1 : text.count
        guard digits <= 16, let v = Int64(text), abs(v) <= JSONValue.maxInteger else {
          throw outside
        }
        return v
      }
      guard let d = Double(text) else { throw fail("a number expected") }
      guard d.isFinite, d.rounded(.towardZero) == d else {
        throw .frame(
          "header holds the non-integer number \(text.prefix(40)); qf-worker/1 headers hold "
            + "integers only (real values travel in buffers)")
      }
      guard abs(d) <= Double(JSONValue.maxInteger) else { throw outside }
      return Int64(d)
    }

    func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }
  }
}
