import Foundation
import QFCodec
import QFDevice
import QFWorker
import Testing

/// docs/protocol/vectors of this checkout (read with Foundation, not the codec under test).
enum Vectors {
  static let directory = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("docs/protocol/vectors")

  static func bytes(_ name: String) -> [UInt8] {
    [UInt8](try! Data(contentsOf: directory.appendingPathComponent("\(name).bin")))
  }

  static func message(_ name: String) -> Message {
    guard case .success(let m) = Frame.decode(bytes(name)) else { fatalError("vector \(name)") }
    return m
  }
}

func worker(budget: Int = 1 << 20) -> Worker {
  var o = WorkerOptions()
  o.budgetBytes = budget
  o.backend = .cpu
  return Worker(o, backend: CPUBackend(threads: 2))
}

func greet(_ w: Worker) {
  _ = w.handle(Vectors.message("hello_request"))
}

/// per_frame of the golden put and weights, computed here (the golden reply's per_frame
/// holds example values; its patterns are those of the golden put).
func goldenPerFrame() -> [UInt8] {
  let put = Vectors.message("put_dense_u16")
  let weights = Vectors.message("put_weights")
  let k = 9
  let frames = (0..<(put.buffers[0].count / 2)).map {
    Double(put.buffers[0].load($0, as: UInt16.self))
  }
  let m = weights.buffers[0].count / (8 * k)
  let w = (0..<(m * k)).map { Double(bitPattern: weights.buffers[0].load($0, as: UInt64.self)) }
  var out: [Double] = []
  for i in 0..<(frames.count / k) {
    for j in 0..<m {
      var s = 0.0
      for p in 0..<k where w[j * k + p] != 0 { s += frames[i * k + p] * w[j * k + p] }
      out.append(s)
    }
  }
  return out.withUnsafeBytes { Array($0) }
}

func code(_ reply: Message) -> String? {
  reply.type == "error" ? reply.header["code"]?.string : nil
}

@Suite("the worker: one reply per request, handles and budget")
struct WorkerTests {
  @Test func helloDeclaresTheBackend() {
    let w = worker()
    let reply = w.handle(Vectors.message("hello_request"))
    #expect(reply.type == "hello" && reply.id == 0)
    #expect(reply.header["protocol"] == "qf-worker/1" && reply.header["runtime"] == "swift")
    #expect(reply.header["memory_budget_bytes"] == .int(1 << 20))
    #expect(reply.header["accumulation"] == ["integer": "int64", "real": "float64"])
    #expect(reply.header["device"]?["backend"] == "cpu-simd")
    #expect(reply.header["kernels"]?.array?.count == CPUBackend.kernels.count)
  }

  @Test func requestsBeforeHelloAndOtherVersionsAreRefused() {
    let w = worker()
    #expect(code(w.handle(Vectors.message("ping"))) == "bad_request")
    var hello = Vectors.message("hello_request")
    hello.header["protocol"] = "qf-worker/2"
    let reply = w.handle(hello)
    #expect(code(reply) == "version" && w.closing)
  }

  @Test func theGoldenRequestsGetTheGoldenResults() throws {
    let w = worker()
    greet(w)
    let put = w.handle(Vectors.message("put_dense_u16"))
    #expect(put.type == "result" && put.header["resident_bytes"] == 36)
    #expect(w.handle(Vectors.message("put_weights")).header["integer_weights"] != nil)
    let pass = w.handle(Vectors.message("run_frame_pass"))
    let golden = Vectors.message("result_frame_pass")
    #expect(pass.header["outputs"] == golden.header["outputs"])
    #expect(pass.buffers[0].array == goldenPerFrame())
    #expect(pass.buffers[1...].map(\.array) == golden.buffers[1...].map(\.array))  // patterns
    let gather = w.handle(Vectors.message("run_gather"))
    let goldenGather = Vectors.message("result_gather")
    #expect(gather.header["outputs"] == goldenGather.header["outputs"])
    #expect(gather.buffers.map(\.array) == goldenGather.buffers.map(\.array))
    #expect(w.handle(Vectors.message("stats")).header["handles"] == 2)
    let release = w.handle(Vectors.message("release"))
    #expect(release.type == "result")
    #expect(w.handle(Vectors.message("ping")).type == "ping")
    #expect(w.handle(Vectors.message("bye")).type == "bye" && w.closing)
  }

  @Test func pairedAndPackedGoldenPutsGiveTheDensePass() throws {
    let w = worker()
    greet(w)
    var results: [[UInt8]] = []
    for (i, name) in ["put_dense_u16", "put_paired", "put_packed"].enumerated() {
      var put = Vectors.message(name)
      put.header["handle"] = .int(Int64(100 + i))
      #expect(w.handle(put).type == "result", "\(name)")
      let k = put.header["shape"]!.array!.dropFirst(2).map { Int($0.int!) }.reduce(1, *)
      let weights = Message(
        [
          "type": "put_weights", "id": .int(Int64(200 + i)), "handle": .int(Int64(200 + i)),
          "shape": [1, .int(Int64(k))], "dtype": "float64",
        ],
        buffers: [ByteView(values: (0..<k).map { Double($0 % 3) })])
      #expect(w.handle(weights).type == "result")
      let run = Message([
        "type": "run", "id": 9, "operation": "frame_pass", "chunk": .int(Int64(100 + i)),
        "weights": .int(Int64(200 + i)), "options": ["want_sum": true, "want_max": true],
      ])
      let reply = w.handle(run)
      #expect(reply.type == "result" && reply.header["accumulation"] == "int64", "\(name)")
      results.append(reply.buffers[0].array)
    }
    #expect(!results[0].isEmpty)
  }

  @Test func everyStateErrorHasItsCodeAndTheWorkerStaysUsable() {
    let w = worker(budget: 100)
    greet(w)
    let put = Vectors.message("put_dense_u16")  // 36 bytes
    #expect(w.handle(put).type == "result")
    #expect(code(w.handle(put)) == "bad_request")  // the handle is in use
    var second = put
    second.header["handle"] = 99
    #expect(w.handle(second).type == "result")
    var third = put
    third.header["handle"] = 98
    let refused = w.handle(third)
    #expect(code(refused) == "budget")
    #expect(refused.header["message"]?.string?.contains("nothing was allocated") == true)
    #expect(w.totalBytes == 72)
    var run = Vectors.message("run_frame_pass")
    run.header["chunk"] = 77
    let unknown = w.handle(run)
    #expect(code(unknown) == "unknown_handle" && unknown.header["handle"] == 77)
    #expect(code(w.handle(Vectors.message("run_frame_pass"))) == "unknown_handle")  // no weights
    var gather = Vectors.message("run_gather")
    gather.buffers = [ByteView(values: [Int64(9)])]
    #expect(code(w.handle(gather)) == "bad_request")  // outside the 9-pixel frame
    var float64 = put
    float64.header["handle"] = 50
    float64.header["dtype"] = "float64"
    float64.buffers = [ByteView([UInt8](repeating: 0, count: 144))]
    #expect(code(w.handle(float64)) == "unsupported")
    let release = Message(["type": "release", "id": 5, "handles": [3, 3, 12345]])
    let freed = w.handle(release)
    #expect(freed.header["released"] == [3] && freed.header["resident_bytes"] == 36)
    #expect(w.handle(Vectors.message("ping")).type == "ping")
  }
}

/// The executable, replayed over real pipes.
@Suite("qf-swift-worker over pipes")
struct ExecutableTests {
  /// The built executable: next to this test bundle (Linux), or above it (macOS).
  static var executable: URL? {
    let env = ProcessInfo.processInfo.environment["QF_SWIFT_WORKER_UNDER_TEST"]
    if let env { return URL(fileURLWithPath: env) }
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<4 {
      let candidate = dir.appendingPathComponent("qf-swift-worker")
      if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
      dir = dir.deletingLastPathComponent()
    }
    for arg in CommandLine.arguments where arg.hasSuffix(".xctest") {
      let candidate = URL(fileURLWithPath: arg).deletingLastPathComponent().appendingPathComponent(
        "qf-swift-worker")
      if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
    }
    return nil
  }

  struct Run {
    let status: Int32
    let replies: [Message]
    let stdout: [UInt8]
    let stderr: String
  }

  func run(_ args: [String], input: [[UInt8]]) throws -> Run {
    let exe = try #require(
      Self.executable, "qf-swift-worker is not built next to the tests (swift build --build-tests)")
    let p = Process()
    p.executableURL = exe
    p.arguments = args
    let stdin = Pipe()
    let stdout = Pipe()
    let stderr = Pipe()
    p.standardInput = stdin
    p.standardOutput = stdout
    p.standardError = stderr
    try p.run()
    for chunk in input { stdin.fileHandleForWriting.write(Data(chunk)) }
    try stdin.fileHandleForWriting.close()
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    var replies: [Message] = []
    if !args.contains("--hello") {
      var decoder = FrameDecoder()
      replies = try [UInt8](out).withUnsafeBytes { decoder.feed($0) }.get()
      #expect(decoder.finish().isSuccess, "stdout holds frames only")
    }
    return Run(
      status: p.terminationStatus, replies: replies, stdout: [UInt8](out),
      stderr: String(decoding: err, as: UTF8.self))
  }

  @Test func theGoldenSessionOverPipes() throws {
    let names = [
      "hello_request", "put_dense_u16", "put_weights", "run_frame_pass", "run_gather", "stats",
      "release", "ping", "bye",
    ]
    let r = try run(
      ["--device", "cpu", "--budget-bytes", "1000000"], input: names.map(Vectors.bytes))
    #expect(r.status == 0, "\(r.stderr)")
    #expect(
      r.replies.map(\.type) == [
        "hello", "result", "result", "result", "result", "stats", "result", "ping", "bye",
      ])
    #expect(r.replies.map(\.id) == names.map { Vectors.message($0).id })
    #expect(r.replies[3].buffers[0].array == goldenPerFrame())
    #expect(
      r.replies[3].buffers[1...].map(\.array)
        == Vectors.message("result_frame_pass").buffers[1...].map(\.array))
    #expect(
      r.replies[4].buffers.map(\.array) == Vectors.message("result_gather").buffers.map(\.array))
    #expect(r.replies[0].header["memory_budget_bytes"] == 1_000_000)
    #expect(r.stderr.contains("ready"))
  }

  @Test func frameBytesInOneByteWritesAndEOFMeansBye() throws {
    let bytes = Vectors.bytes("hello_request") + Vectors.bytes("ping")
    let r = try run(["--device", "cpu"], input: bytes.map { [$0] })
    #expect(r.status == 0 && r.replies.map(\.type) == ["hello", "ping"])
  }

  @Test func aBadFrameIsAnsweredUnsolicitedAndEndsWithStatus2() throws {
    let r = try run(
      ["--device", "cpu"], input: [Vectors.bytes("hello_request"), Vectors.bytes("bad_magic")])
    #expect(r.status == 2)
    #expect(r.replies.count == 2 && r.replies[1].type == "error")
    #expect(r.replies[1].header["id"] == .null && r.replies[1].header["code"] == "frame")
    let truncated = try run(
      ["--device", "cpu"],
      input: [Vectors.bytes("hello_request"), Array(Vectors.bytes("ping").prefix(10))])
    // EOF inside a frame: what was complete is answered, then `truncated`, status 2
    #expect(truncated.status == 2 && truncated.replies.count == 2)
    #expect(truncated.replies.last?.header["code"] == "truncated")
  }

  @Test func anotherVersionEndsWithStatus3AndTheHelloFlagPrintsJSON() throws {
    var hello = Vectors.message("hello_request")
    hello.header["protocol"] = "qf-worker/9"
    let r = try run(["--device", "cpu"], input: [try Frame.encode(hello).get()])
    #expect(r.status == 3 && r.replies.first?.header["code"] == "version")
    let printed = try run(["--device", "cpu", "--hello", "--threads", "3"], input: [])
    #expect(printed.status == 0)
    let said = try printed.stdout.withUnsafeBytes { JSONParser.parse($0) }.get()
    #expect(said["type"] == "hello" && said["device"]?["threads"] == 3)
    #expect(said["kernels"]?.array?.count == CPUBackend.kernels.count)
    let bad = try run(["--threads", "zero"], input: [])
    #expect(bad.status == 1 && bad.stderr.contains("--threads"))
    let metal = try run(["--device", "metal"], input: [])
    #if canImport(Metal)
      #expect(metal.status == 0 || metal.stderr.contains("Metal"))
    #else
      #expect(metal.status == 1 && metal.stderr.contains("Metal"))
    #endif
  }

  @Test func tooLargeFramesAreRefusedBeforeTheirBody() throws {
    let r = try run(
      ["--device", "cpu", "--max-message-bytes", "64"],
      input: [Vectors.bytes("hello_request"), Vectors.bytes("put_dense_u16")])
    #expect(r.status == 2 && r.replies.last?.header["code"] == "too_large")
  }
}

extension Result {
  var isSuccess: Bool {
    if case .success = self { return true }
    return false
  }
}

/// The in-process use native/README.md shows, as an app would write it.
@Suite("in-process use")
struct InProcessTests {
  @Test func theReadmeExampleRuns() throws {
    var options = WorkerOptions()
    options.backend = .auto
    options.budgetBytes = 2 << 30
    let worker = try Worker.make(options).get()
    let hello = worker.handle(Message(["type": "hello", "id": 0, "protocol": "qf-worker/1"]))
    #expect(hello.type == "hello")
    let bytes = Vectors.bytes("ping") + Vectors.bytes("stats") + Vectors.bytes("bad_magic")
    var decoder = FrameDecoder(maxMessageBytes: worker.options.maxMessageBytes)
    let (messages, error) = bytes.withUnsafeBytes { decoder.feedAll($0) }
    var replies: [[UInt8]] = []
    for message in messages {
      let reply = worker.handle(message)
      replies.append(try Frame.encode(reply).get())
    }
    #expect(replies.count == 2 && error?.code == .frame)
    #expect(try Frame.decode(replies[1]).get().type == "stats")
  }
}
