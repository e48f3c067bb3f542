import Foundation
import QFCodec

/// The golden vectors of docs/protocol/vectors, read with Foundation's JSONDecoder (not the
/// codec under test): each valid vector's header and buffers, each invalid one's error code.
struct GoldenVector: Decodable {
  let name: String
  let file: String
  let description: String
  let header: AnyJSON?
  let buffersHex: [String]?
  let error: String?

  enum CodingKeys: String, CodingKey {
    case name, file, description, header, error
    case buffersHex = "buffers_hex"
  }
}

struct GoldenIndex: Decodable {
  let `protocol`: String
  let vectors: [GoldenVector]
}

/// A JSON value as Foundation decodes it, converted to the codec's `JSONValue` for comparing.
indirect enum AnyJSON: Decodable {
  case null
  case bool(Bool)
  case int(Int64)
  case string(String)
  case array([AnyJSON])
  case object([String: AnyJSON])

  init(from decoder: Decoder) throws {
    let c = try decoder.singleValueContainer()
    if c.decodeNil() {
      self = .null
    } else if let b = try? c.decode(Bool.self) {
      self = .bool(b)
    } else if let i = try? c.decode(Int64.self) {
      self = .int(i)
    } else if let s = try? c.decode(String.self) {
      self = .string(s)
    } else if let a = try? c.decode([AnyJSON].self) {
      self = .array(a)
    } else {
      self = .object(try c.decode([String: AnyJSON].self))
    }
  }

  var value: JSONValue {
    switch self {
    case .null: return .null
    case .bool(let b): return .bool(b)
    case .int(let i): return .int(i)
    case .string(let s): return .string(s)
    case .array(let a): return .array(a.map(\.value))
    case .object(let o): return .object(o.mapValues(\.value))
    }
  }
}

enum Golden {
  /// docs/protocol/vectors of this checkout.
  static let directory = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("docs/protocol/vectors")

  static let index: GoldenIndex = {
    let data = try! Data(contentsOf: directory.appendingPathComponent("index.json"))
    return try! JSONDecoder().decode(GoldenIndex.self, from: data)
  }()

  static func bytes(_ v: GoldenVector) -> [UInt8] {
    [UInt8](try! Data(contentsOf: directory.appendingPathComponent(v.file)))
  }

  static func vector(_ name: String) -> GoldenVector {
    index.vectors.first { $0.name == name }!
  }

  static func hex(_ text: String) -> [UInt8] {
    var out: [UInt8] = []
    var it = text.utf8.makeIterator()
    func nibble(_ c: UInt8) -> UInt8 { c <= 57 ? c - 48 : c - 87 }
    while let a = it.next(), let b = it.next() { out.append(nibble(a) << 4 | nibble(b)) }
    return out
  }
}
