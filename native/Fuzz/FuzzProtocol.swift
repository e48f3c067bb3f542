// libFuzzer entry point over the codec: any bytes decode as frames (fed in pieces) and
// validate as requests, or fail with a protocol error; nothing else may happen (no trap, no
// sanitizer report).  Built with `swiftc -sanitize=fuzzer,address` together with the
// codec's sources (scripts/build-native.sh), so it needs no package product.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzProtocol(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  let bytes = UnsafeRawBufferPointer(start: data, count: size)
  // whole, then in uneven pieces: the incremental decoder must agree with itself
  var whole = FrameDecoder(maxMessageBytes: 1 << 24)
  let first = whole.feed(bytes)
  var pieces = FrameDecoder(maxMessageBytes: 1 << 24)
  var messages: [Message] = []
  var failed = false
  var pos = 0
  var step = 1
  while pos < size && !failed {
    let n = min(step, size - pos)
    switch pieces.feed(UnsafeRawBufferPointer(rebasing: bytes[pos..<(pos + n)])) {
    case .success(let got): messages += got
    case .failure: failed = true
    }
    pos += n
    step = step * 3 % 17 + 1
  }
  switch first {
  case .success(let got):
    precondition(!failed && got.count == messages.count, "piecewise decoding disagrees")
    for message in got {
      _ = Request.parse(message)
      if case .success(let encoded) = Frame.encode(message) {
        // a decoded frame re-encodes to a frame that decodes to the same header
        guard case .success(let again) = Frame.decode(encoded) else {
          preconditionFailure("a re-encoded frame does not decode")
        }
        precondition(again.header == message.header, "re-encoding changed the header")
      }
    }
  case .failure:
    precondition(failed, "piecewise decoding accepted what whole decoding refused")
  }
  return 0
}
