// qf-swift-worker: the Swift worker on stdin/stdout (docs/protocol.md, "Transports: pipes").
//
// Frames arrive on stdin and replies leave on stdout; nothing else is written to stdout
// (logs go to stderr).  EOF on stdin is `bye` (exit 0).  A frame that cannot be parsed, or
// a stream that ends inside a frame, is answered with an unsolicited `error` (`frame`,
// `too_large`, `truncated`) and ends the process (exit 2); a `version` error ends it with
// exit 3; bad options or a backend that cannot start exit 1.

import QFCodec
import QFDevice
import QFWorker

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

let usage = """
  usage: qf-swift-worker [--device auto|cpu|metal] [--budget-bytes N] [--threads N]
                         [--runtime NAME] [--max-message-bytes N] [--hello] [--version]
                         [--run-delay SECONDS] [--crash-file PATH]

    --device             the backend: Metal where available (auto), or cpu, or metal
    --budget-bytes N     payload bytes admitted (default: half the backend's memory)
    --threads N          threads of the CPU backend (default: every core)
    --runtime NAME       the runtime name announced in hello (default: swift)
    --max-message-bytes  largest frame accepted (default: 4 GiB)
    --hello              print the hello reply's header (canonical JSON) and exit
    --run-delay S        (tests) sleep S seconds before answering each run
    --crash-file PATH    (tests) SIGKILL this process when a run arrives while PATH exists
  """

func log(_ text: String) {
  let line = Array("qf-swift-worker: \(text)\n".utf8)
  line.withUnsafeBytes { _ = write(2, $0.baseAddress, $0.count) }
}

func fail(_ text: String) -> Never {
  log(text)
  exit(1)
}

struct Options {
  var worker = WorkerOptions()
  var printHello = false
  var runDelay = 0.0
  var crashFile: String? = nil
}

func parseOptions(_ args: [String]) -> Options {
  var o = Options()
  var i = 0
  func value(_ name: String) -> String {
    i += 1
    guard i < args.count else { fail("\(name) needs a value\n\(usage)") }
    return args[i]
  }
  func integer(_ name: String) -> Int {
    let text = value(name)
    guard let v = Int(text), v > 0 else {
      fail("\(name) takes a positive integer, got '\(text)'")
    }
    return v
  }
  while i < args.count {
    let a = args[i]
    switch a {
    case "--device":
      let text = value(a)
      guard let choice = BackendChoice(rawValue: text) else {
        fail("--device takes auto, cpu or metal, got '\(text)'")
      }
      o.worker.backend = choice
    case "--budget-bytes": o.worker.budgetBytes = integer(a)
    case "--threads": o.worker.threads = integer(a)
    case "--runtime": o.worker.runtime = value(a)
    case "--max-message-bytes": o.worker.maxMessageBytes = integer(a)
    case "--hello": o.printHello = true
    case "--run-delay":
      let text = value(a)
      guard let v = Double(text), v >= 0 else {
        fail("--run-delay takes seconds >= 0, got '\(text)'")
      }
      o.runDelay = v
    case "--crash-file": o.crashFile = value(a)
    case "--version":
      log("quantem-flow-swift \(workerVersion), protocol \(protocolVersion)")
      exit(0)
    case "-h", "--help":
      log(usage)
      exit(0)
    default: fail("unknown option '\(a)'\n\(usage)")
    }
    i += 1
  }
  return o
}

/// Write all of `bytes` to `fd` (false when the reader is gone).
func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
  var done = 0
  while done < bytes.count {
    let n = write(fd, bytes.baseAddress! + done, bytes.count - done)
    if n < 0 {
      if errno == EINTR { continue }
      return false
    }
    done += n
  }
  return true
}

func send(_ message: Message) -> Bool {
  switch Frame.encodePieces(message) {
  case .failure(let error):
    log("cannot encode a \(message.type) reply: \(error)")
    return writeReplyError(id: message.id, error)
  case .success(let pieces):
    for piece in pieces where !piece.withUnsafeBytes({ writeAll(1, $0) }) { return false }
    return true
  }
}

func writeReplyError(id: Int64?, _ error: ProtocolError) -> Bool {
  send(Reply.error(id: id, ProtocolError(.internal, "the reply could not be encoded: \(error)")))
}

let options = parseOptions(Array(CommandLine.arguments.dropFirst()))
signal(SIGPIPE, SIG_IGN)
let worker: Worker
switch Worker.make(options.worker) {
case .success(let w): worker = w
case .failure(let error): fail("cannot start: \(error.message)")
}
if options.printHello {
  switch CanonicalJSON.encode(.object(worker.hello().header)) {
  case .success(let bytes):
    _ = (bytes + [0x0A]).withUnsafeBytes { writeAll(1, $0) }
    exit(0)
  case .failure(let error): fail("cannot encode hello: \(error)")
  }
}
log(
  "quantem-flow-swift \(workerVersion) ready (pid \(getpid()), \(worker.backend.info.name), "
    + "budget \(worker.budgetBytes) bytes)")

var decoder = FrameDecoder(maxMessageBytes: options.worker.maxMessageBytes)
let chunkBytes = 1 << 20
let buffer = UnsafeMutableRawPointer.allocate(byteCount: chunkBytes, alignment: 16)
while true {
  let n = read(0, buffer, chunkBytes)
  if n < 0 && errno == EINTR { continue }
  if n <= 0 {  // EOF (or a closed pipe) is bye; inside a frame it is `truncated`
    if case .failure(let error) = decoder.finish() {
      log("\(error)")
      _ = send(Reply.error(id: nil, error))
      exit(2)
    }
    exit(0)
  }
  let (messages, error) = decoder.feedAll(UnsafeRawBufferPointer(start: buffer, count: n))
  for message in messages {
    if message.type == "run" {
      if let path = options.crashFile, access(path, F_OK) == 0 {
        unlink(path)
        kill(getpid(), SIGKILL)
      }
      if options.runDelay > 0 { usleep(UInt32(options.runDelay * 1e6)) }
    }
    let reply = worker.handle(message)
    if !send(reply) { exit(0) }
    if worker.closing { exit(reply.type == "bye" ? 0 : 3) }
  }
  if let error {
    log("\(error)")
    _ = send(Reply.error(id: nil, error))
    exit(2)
  }
}
