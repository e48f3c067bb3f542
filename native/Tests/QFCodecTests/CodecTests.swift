import Foundation
import QFCodec
import Testing

@Suite("golden vectors")
struct GoldenVectorTests {
  @Test func theIndexHoldsEveryKindOfVector() {
    #expect(Golden.index.protocol == "qf-worker/1")
    #expect(Golden.index.vectors.filter { $0.error == nil }.count >= 20)
    #expect(Golden.index.vectors.filter { $0.error != nil }.count >= 15)
  }

  @Test(
    "every valid vector parses to its header and buffers",
    arguments: Golden.index.vectors.filter { $0.error == nil }.map(\.name))
  func parses(_ name: String) throws {
    let v = Golden.vector(name)
    let message = try Frame.decode(Golden.bytes(v)).get()
    #expect(JSONValue.object(message.header) == v.header!.value, "\(name)")
    #expect(message.buffers.map(\.array) == v.buffersHex!.map(Golden.hex), "\(name)")
  }

  @Test(
    "every valid vector is re-emitted byte for byte from its header and buffers",
    arguments: Golden.index.vectors.filter { $0.error == nil }.map(\.name))
  func emits(_ name: String) throws {
    let v = Golden.vector(name)
    let header = try #require(v.header!.value.object)
    let message = Message(header, buffers: v.buffersHex!.map { ByteView(Golden.hex($0)) })
    #expect(try Frame.encode(message).get() == Golden.bytes(v), "\(name)")
  }

  @Test(
    "every invalid vector gets the reference's error code",
    arguments: Golden.index.vectors.filter { $0.error != nil }.map(\.name))
  func refuses(_ name: String) {
    let v = Golden.vector(name)
    switch Frame.decode(Golden.bytes(v)) {
    case .success: Issue.record("\(name): decoded, expected \(v.error!)")
    case .failure(let e): #expect(e.code.rawValue == v.error!, "\(name): \(e)")
    }
  }

  @Test("invalid vectors fed one byte at a time fail with the same code")
  func refusesByteByByte() {
    for v in Golden.index.vectors where v.error != nil {
      var decoder = FrameDecoder()
      var code: String? = nil
      for b in Golden.bytes(v) {
        if case .failure(let e) = [b].withUnsafeBytes({ decoder.feed($0) }) {
          code = e.code.rawValue
          break
        }
      }
      if code == nil, case .failure(let e) = decoder.finish() { code = e.code.rawValue }
      #expect(code == v.error, "\(v.name)")
    }
  }
}

@Suite("canonical JSON")
struct CanonicalJSONTests {
  func text(_ v: JSONValue) throws -> String {
    String(decoding: try CanonicalJSON.encode(v).get(), as: UTF8.self)
  }

  @Test func keysSortByCodePointWithoutWhitespace() throws {
    let v: JSONValue = ["b": 1, "a": [true, false, nil], "B": "x", "\u{e9}": -5, "aa": [:]]
    #expect(try text(v) == #"{"B":"x","a":[true,false,null],"aa":{},"b":1,"\u00e9":-5}"#)
  }

  @Test func stringsEscapeQuoteBackslashControlsAndNonASCIIOnly() throws {
    let s = "q\" b\\ / \u{8}\u{c}\n\r\t \u{1}\u{1f} \u{7f} \u{e9}\u{65e5}\u{1F600}"
    #expect(
      try text(.string(s))
        == #""q\" b\\ / \b\f\n\r\t \u0001\u001f "# + "\u{7f}" + #" \u00e9\u65e5\ud83d\ude00""#)
  }

  @Test func integersOutsideTheSafeRangeAreRefused() throws {
    #expect(try text(.int(JSONValue.maxInteger)) == "9007199254740991")
    #expect(try text(.int(-JSONValue.maxInteger)) == "-9007199254740991")
    for bad in [JSONValue.maxInteger + 1, -JSONValue.maxInteger - 1, Int64.max, Int64.min] {
      guard case .failure(let e) = CanonicalJSON.encode(["n": .int(bad)]) else {
        Issue.record("\(bad) was written")
        continue
      }
      #expect(e.code == .frame)
    }
  }

  func parse(_ s: String) -> Result<JSONValue, ProtocolError> {
    Array(s.utf8).withUnsafeBytes { JSONParser.parse($0) }
  }

  @Test func numbersAreReadByValue() throws {
    #expect(
      try parse("[1.0, 1e2, -0.0, 2.5e1, 9007199254740991]").get()
        == [1, 100, 0, 25, 9_007_199_254_740_991])
    for bad in [
      "1.5", "1e-1", "9007199254740992", "-9007199254740992", "1e400", "NaN",
      "Infinity", "-Infinity", "123456789012345678901234567890", "01", "+1", ".5", "1.",
    ] {
      guard case .failure(let e) = parse("[\(bad)]") else {
        Issue.record("\(bad) was accepted")
        continue
      }
      #expect(e.code == .frame, "\(bad)")
    }
  }

  @Test func stringsAndStructureFollowStrictJSON() throws {
    #expect(try parse(#" {"a" : "\u00e9\ud83d\ude00\/" , "a": 2 } "#).get() == ["a": 2])
    #expect(try parse(#"["\u00e9\ud83d\ude00\/"]"#).get() == ["\u{e9}\u{1F600}/"])
    for bad in [
      "{\"a\":1,}", "[1,]", "{'a':1}", "\"raw\ncontrol\"", "[1] x", "", "\"\\x\"",
      "{\"a\"}", "[", "tru",
      String(repeating: "[", count: 300) + String(repeating: "]", count: 300),
    ] {
      guard case .failure(let e) = parse(bad) else {
        Issue.record("\(bad.prefix(20)) was accepted")
        continue
      }
      #expect(e.code == .frame)
    }
    let invalid: [UInt8] = [0x22, 0xC3, 0x28, 0x22]
    #expect(invalid.withUnsafeBytes { JSONParser.parse($0) }.isFailure)
  }

  @Test("canonical text parses back to the same value, over random headers")
  func roundTrips() throws {
    var rng = SplitMix(seed: 7)
    for _ in 0..<500 {
      let v = JSONValue.random(&rng, depth: 0)
      let bytes = try CanonicalJSON.encode(v).get()
      let back = try bytes.withUnsafeBytes { JSONParser.parse($0) }.get()
      #expect(back == v)
      #expect(try CanonicalJSON.encode(back).get() == bytes)
    }
  }
}

extension Result {
  var isFailure: Bool {
    if case .failure = self { return true }
    return false
  }
}

/// A small seeded generator (tests are repeatable; the seed is in the test).
struct SplitMix: RandomNumberGenerator {
  var state: UInt64
  init(seed: UInt64) { state = seed }
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
}

extension JSONValue {
  static func random(_ rng: inout SplitMix, depth: Int) -> JSONValue {
    let pick = Int.random(in: 0..<(depth > 3 ? 4 : 6), using: &rng)
    switch pick {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2: return .int(Int64.random(in: -JSONValue.maxInteger...JSONValue.maxInteger, using: &rng))
    case 3:
      let pool: [Unicode.Scalar] = [
        "a", "Z", "\"", "\\", "/", "\n", "\u{0}", "\u{7f}", "\u{e9}",
        "\u{65e5}", "\u{1F600}", " ",
      ]
      var s = String.UnicodeScalarView()
      for _ in 0..<Int.random(in: 0..<8, using: &rng) { s.append(pool.randomElement(using: &rng)!) }
      return .string(String(s))
    case 4:
      return .array(
        (0..<Int.random(in: 0..<4, using: &rng)).map { _ in random(&rng, depth: depth + 1) })
    default:
      var o: [String: JSONValue] = [:]
      for i in 0..<Int.random(in: 0..<4, using: &rng) {
        o[["k\(i)", "K", "\u{e9}", "_"][Int.random(in: 0..<4, using: &rng)]] = random(
          &rng, depth: depth + 1)
      }
      return .object(o)
    }
  }
}
