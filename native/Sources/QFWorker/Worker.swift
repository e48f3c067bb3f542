import QFCodec
import QFDevice

/// Options of a worker.
public struct WorkerOptions: Sendable {
  /// The runtime name announced in `hello` (`"swift"`).
  public var runtime: String = "swift"
  /// Payload bytes admitted in total (`nil`: the backend's default, half its memory).
  public var budgetBytes: Int? = nil
  /// Largest frame accepted (announced in `hello`).
  public var maxMessageBytes: Int = 1 << 32
  /// Which backend computes.
  public var backend: BackendChoice = .auto
  /// Threads of the CPU backend (`nil`: every core).
  public var threads: Int? = nil

  public init() {}
}

/// The version of this worker.
public let workerVersion = "0.1.0"

/// A `qf-worker/1` worker, independent of any transport: one request in, exactly one reply
/// out.  It owns the handle table and the budget; validation is the codec's, kernels the
/// backend's.  Nothing throws: every failure is an `error` reply.
///
/// ```swift
/// let worker = try Worker.make(WorkerOptions()).get()
/// let reply = worker.handle(request)   // a Message in, a Message out
/// ```
public final class Worker {
  public let options: WorkerOptions
  public let backend: any ComputeBackend
  /// The budget in force.
  public let budgetBytes: Int

  private var chunks: [Int64: any ResidentPayload] = [:]
  private var weights: [Int64: any ResidentWeights] = [:]
  private var greeted = false
  /// After `bye` or a `version` error: the transport should close.
  public private(set) var closing = false

  /// Make a worker with the backend `options` ask for (an error names why it cannot).
  public static func make(_ options: WorkerOptions) -> Result<Worker, ProtocolError> {
    makeBackend(options.backend, threads: options.threads).map { Worker(options, backend: $0) }
  }

  /// A worker on a given backend (tests, apps that made their own).
  public init(_ options: WorkerOptions, backend: any ComputeBackend) {
    self.options = options
    self.backend = backend
    self.budgetBytes = options.budgetBytes ?? backend.info.defaultBudgetBytes
  }

  /// Bytes held per representation and for weights.
  public var residentBytes: [String: Int] {
    var out = ["dense": 0, "paired": 0, "packed": 0, "weights": 0]
    for c in chunks.values { out[c.payload.representation.rawValue, default: 0] += c.residentBytes }
    out["weights"] = weights.values.reduce(0) { $0 + $1.residentBytes }
    return out
  }

  /// Bytes held in total.
  public var totalBytes: Int { residentBytes.values.reduce(0, +) }

  /// The `hello` reply (the request's id filled in by `handle`).
  public func hello(id: Int64 = 0) -> Message {
    let info = backend.info
    var device = info.details
    device["name"] = .string(info.name)
    device["type"] = .string(info.type)
    device["backend"] = .string(info.backend)
    return Reply.hello(
      id: id, runtime: options.runtime,
      implementation: "quantem-flow-swift \(workerVersion) (\(info.backend), swift)",
      device: device,
      limits: Reply.Limits(
        maxMessageBytes: options.maxMessageBytes,
        maxBufferBytes: min(info.maxBufferBytes, options.maxMessageBytes),
        maxWeights: info.maxWeights, maxFramePixels: info.maxFramePixels),
      memoryBudgetBytes: budgetBytes,
      kernels: info.kernels.map { ($0.operation, $0.representation.rawValue, $0.dtype.rawValue) },
      integerAccumulation: info.integerAccumulation, realAccumulation: info.realAccumulation)
  }

  /// Answer one message: exactly one reply, never a throw.
  public func handle(_ message: Message) -> Message {
    let id = message.id
    switch Request.parse(message) {
    case .failure(let error):
      var e = error
      if e.handle == nil { e.handle = handleOf(message) }
      return Reply.error(id: id, e)
    case .success(let request):
      switch respond(request) {
      case .success(let reply): return reply
      case .failure(let error): return Reply.error(id: request.id, error)
      }
    }
  }

  /// Answer one validated request.
  public func respond(_ request: Request) -> Result<Message, ProtocolError> {
    do throws(ProtocolError) {
      return .success(try answer(request))
    } catch {
      return .failure(error)
    }
  }

  private func answer(_ request: Request) throws(ProtocolError) -> Message {
    if case .hello(let id, let version) = request {
      guard version == protocolVersion else {
        closing = true
        throw ProtocolError(
          .version,
          "this worker speaks '\(protocolVersion)' only, the bridge asked for '\(version)'; "
            + "update one side")
      }
      greeted = true
      return hello(id: id)
    }
    guard greeted else {
      throw .init(.badRequest, "a request before hello: send hello first")
    }
    switch request {
    case .hello: fatalError("answered above")
    case .put(let id, let put): return try store(id, put)
    case .putWeights(let id, let handle, let rows): return try storeWeights(id, handle, rows)
    case .run(let id, let run): return try self.run(id, run)
    case .release(let id, let handles):
      var freed: [Int64] = []
      for h in handles
      where chunks.removeValue(forKey: h) != nil || weights.removeValue(forKey: h) != nil {
        freed.append(h)
      }
      return Reply.released(id: id, handles: freed, residentBytes: totalBytes)
    case .stats(let id):
      return Reply.stats(
        id: id, handles: chunks.count + weights.count, residentBytes: residentBytes,
        memoryBudgetBytes: budgetBytes)
    case .ping(let id): return Reply.echo("ping", id: id)
    case .bye(let id):
      chunks.removeAll()
      weights.removeAll()
      closing = true
      return Reply.echo("bye", id: id)
    }
  }

  private func newHandle(_ handle: Int64, _ kind: String) throws(ProtocolError) {
    if chunks[handle] != nil || weights[handle] != nil {
      throw ProtocolError(
        .badRequest,
        "\(kind): handle \(handle) is already in use; handles are new for every put (release it "
          + "first)", handle: handle)
    }
  }

  private func admit(_ bytes: Int, _ handle: Int64, _ what: String) throws(ProtocolError) {
    let held = totalBytes
    if bytes > budgetBytes - held {
      throw ProtocolError(
        .budget,
        "\(what) of \(bytes) bytes refused: \(held) of the \(budgetBytes) byte memory budget are "
          + "resident; release handles, give the worker a larger --budget-bytes or place the "
          + "chunk on another worker (nothing was allocated)", handle: handle)
    }
  }

  private func store(_ id: Int64, _ put: PutRequest) throws(ProtocolError) -> Message {
    try newHandle(put.handle, "put")
    let payload = put.payload
    let info = backend.info
    let rep = payload.representation
    guard info.kernels.contains(where: { $0.representation == rep && $0.dtype == payload.dtype })
    else {
      let offered = info.kernels.filter { $0.representation == rep }.map(\.dtype.rawValue)
      throw ProtocolError(
        .unsupported,
        "put: no kernel here takes \(rep.rawValue) \(payload.dtype.rawValue) payloads (this "
          + "\(info.backend) backend takes \(rep.rawValue) \(Set(offered).sorted())); keep the "
          + "chunk on a runtime that does", handle: put.handle)
    }
    let k = payload.shape.pixels
    guard k >= 1, k <= info.maxFramePixels else {
      throw ProtocolError(
        .badRequest,
        "put: a frame of \(k) pixels, expected 1 .. \(info.maxFramePixels) (max_frame_pixels)",
        handle: put.handle)
    }
    try admit(backend.heldBytes(for: payload), put.handle, "put of a \(rep.rawValue) chunk")
    let stored = try backend.store(payload).get()
    chunks[put.handle] = stored
    return Reply.stored(id: id, handle: put.handle, residentBytes: stored.residentBytes)
  }

  private func storeWeights(_ id: Int64, _ handle: Int64, _ rows: WeightRows) throws(ProtocolError)
    -> Message
  {
    try newHandle(handle, "put_weights")
    let info = backend.info
    guard rows.rows <= info.maxWeights else {
      throw ProtocolError(
        .badRequest,
        "put_weights: \(rows.rows) rows, over max_weights \(info.maxWeights); send fewer rows "
          + "per pass", handle: handle)
    }
    try admit(backend.heldBytes(for: rows), handle, "put_weights")
    let stored = try backend.store(weights: rows).get()
    weights[handle] = stored
    return Reply.stored(
      id: id, handle: handle, residentBytes: stored.residentBytes, integerWeights: stored.integer)
  }

  private func chunk(_ handle: Int64) throws(ProtocolError) -> any ResidentPayload {
    guard let c = chunks[handle] else {
      throw ProtocolError(
        .unknownHandle,
        "no chunk under handle \(handle) (\(chunks.count) held); put the chunk first, or "
          + "re-place it if this worker restarted", handle: handle)
    }
    return c
  }

  private func run(_ id: Int64, _ run: RunRequest) throws(ProtocolError) -> Message {
    let stored = try chunk(run.chunk)
    let payload = stored.payload
    let n = payload.shape.frames
    let k = payload.shape.pixels
    let operation: String
    switch run {
    case .framePass: operation = "frame_pass"
    case .gather: operation = "gather"
    }
    guard backend.info.offers(operation, payload.representation, payload.dtype) else {
      throw ProtocolError(
        .unsupported,
        "run: no \(operation) kernel for \(payload.representation.rawValue) "
          + "\(payload.dtype.rawValue) here", handle: run.chunk)
    }
    switch run {
    case .gather(_, let indices):
      if let bad = indices.first(where: { $0 >= k }) {
        throw ProtocolError(
          .badRequest, "gather: pixel index \(bad) is outside the frame of \(k) pixels",
          handle: run.chunk)
      }
      let values = try backend.gather(stored, indices: indices).get()
      return Reply.result(
        id: id,
        outputs: [
          .init(
            name: "values", dtype: payload.dtype, shape: [n, indices.count], bytes: ByteView(values)
          )
        ], accumulation: nil)
    case .framePass(_, let wh, let wantSum, let wantMax):
      guard let w = weights[wh] else {
        throw ProtocolError(
          .unknownHandle,
          "no weights under handle \(wh) (\(weights.count) held); put_weights first", handle: wh)
      }
      guard w.pixels == k else {
        throw ProtocolError(
          .badRequest,
          "run: weights \(wh) have \(w.pixels) columns but chunk \(run.chunk) has frames of \(k) "
            + "pixels", handle: wh)
      }
      let out = try backend.framePass(stored, weights: w, wantSum: wantSum, wantMax: wantMax).get()
      var outputs: [Reply.Output] = [
        .init(
          name: "per_frame", dtype: .float64, shape: [n, w.rows],
          bytes: ByteView(values: out.perFrame))
      ]
      switch out.patternSum {
      case .integer(let s)?:
        outputs.append(
          .init(name: "pattern_sum", dtype: .int64, shape: [k], bytes: ByteView(values: s)))
      case .real(let s)?:
        outputs.append(
          .init(name: "pattern_sum", dtype: .float64, shape: [k], bytes: ByteView(values: s)))
      case nil: break
      }
      if let mx = out.patternMax {
        outputs.append(
          .init(name: "pattern_max", dtype: payload.dtype, shape: [k], bytes: ByteView(mx)))
      }
      return Reply.result(id: id, outputs: outputs, accumulation: out.accumulation)
    }
  }
}
