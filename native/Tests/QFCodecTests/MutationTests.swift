import QFCodec
import Testing

/// A seeded random-mutation run over the golden vectors (a bounded fuzz run that needs no
/// fuzzer; the libFuzzer target in Fuzz/ is the coverage-guided one): every mutant decodes
/// or fails with a framing code, whole and fed in pieces alike, and every decoded request
/// validates or fails with a request code.  Nothing traps.
@Suite("mutations of the golden vectors")
struct MutationTests {
  static let seeds: [[UInt8]] = Golden.index.vectors.map(Golden.bytes)

  func mutate(_ input: [UInt8], _ rng: inout SplitMix) -> [UInt8] {
    var b = input
    for _ in 0..<Int.random(in: 1...4, using: &rng) {
      switch Int.random(in: 0..<6, using: &rng) {
      case 0 where !b.isEmpty:
        b[Int.random(in: 0..<b.count, using: &rng)] ^= UInt8(
          1 << Int.random(in: 0..<8, using: &rng))
      case 1 where !b.isEmpty:
        b[Int.random(in: 0..<b.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
      case 2 where !b.isEmpty: b.removeSubrange(Int.random(in: 0..<b.count, using: &rng)..<b.count)
      case 3:
        b.insert(
          UInt8.random(in: 0...255, using: &rng), at: Int.random(in: 0...b.count, using: &rng))
      case 4 where b.count > 16:  // a length field
        let at = [4, 8][Int.random(in: 0..<2, using: &rng)]
        b[at] = UInt8.random(in: 0...255, using: &rng)
      default: b += Self.seeds.randomElement(using: &rng)!
      }
    }
    return b
  }

  @Test func twelveThousandMutantsDecodeOrFailWithAFramingCode() {
    var rng = SplitMix(seed: 20_261_204)
    var decoded = 0
    var refused = 0
    let framing: Set<ErrorCode> = [.frame, .truncated, .tooLarge]
    let request: Set<ErrorCode> = [.badRequest, .unsupported]
    for i in 0..<12_000 {
      let input = mutate(Self.seeds[i % Self.seeds.count], &rng)
      var whole = FrameDecoder(maxMessageBytes: 1 << 20)
      let got = input.withUnsafeBytes { whole.feed($0) }
      var pieces = FrameDecoder(maxMessageBytes: 1 << 20)
      var piecewise: [Message] = []
      var pieceError: ProtocolError? = nil
      var pos = 0
      while pos < input.count && pieceError == nil {
        let n = min(Int.random(in: 1...9, using: &rng), input.count - pos)
        switch input[pos..<(pos + n)].withUnsafeBytes({ pieces.feed($0) }) {
        case .success(let m): piecewise += m
        case .failure(let e): pieceError = e
        }
        pos += n
      }
      switch got {
      case .success(let messages):
        #expect(pieceError == nil && piecewise.count == messages.count)
        decoded += messages.count
        for m in messages {
          if case .failure(let e) = Request.parse(m) {
            #expect(request.contains(e.code), "\(e)")
          }
        }
      case .failure(let e):
        refused += 1
        #expect(framing.contains(e.code), "\(e)")
        #expect(
          pieceError?.code == e.code || (pieceError == nil && e.code == .tooLarge)
            || pieceError != nil)
      }
    }
    #expect(decoded > 500 && refused > 5000, "decoded \(decoded), refused \(refused)")
  }
}
