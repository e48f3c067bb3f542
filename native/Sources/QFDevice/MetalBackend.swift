#if canImport(Metal)
  import Metal
  import QFCodec

  /// The layout of `Params` in MetalKernels.source: 12 uints.
  struct MetalParams {
    var nFrames: UInt32 = 0
    var k: UInt32 = 0
    var m: UInt32 = 0
    var row0: UInt32 = 0
    var frame0: UInt32 = 0
    var blockValues: UInt32 = 0
    var blocksPerFrame: UInt32 = 0
    var nIndices: UInt32 = 0
    var nPairs: UInt32 = 0
    var outFrame0: UInt32 = 0
    var pad0: UInt32 = 0
    var pad1: UInt32 = 0
  }

  /// A payload in shared (unified) memory: dense frames; paired indptr (as uint32), indices,
  /// counts (uint64 counts as uint32); packed widths, offsets (as uint32), words.
  final class MetalPayload: ResidentPayload {
    let payload: Payload
    let buffers: [MTLBuffer]
    let residentBytes: Int

    init(_ payload: Payload, _ buffers: [MTLBuffer]) {
      self.payload = payload
      self.buffers = buffers
      self.residentBytes = buffers.reduce(0) { $0 + $1.length }
    }
  }

  /// Weight rows on the device: float32 rows, int32 rows when every weight is an integer
  /// within int32 (the exact path), non-finite counts per row.
  final class MetalWeights: ResidentWeights {
    let rows: Int
    let pixels: Int
    let integer: Bool
    let exact: Bool
    let floats: MTLBuffer
    let ints: MTLBuffer
    let bad: MTLBuffer
    var residentBytes: Int { floats.length + ints.length + bad.length }

    init(
      rows: Int, pixels: Int, integer: Bool, exact: Bool, floats: MTLBuffer, ints: MTLBuffer,
      bad: MTLBuffer
    ) {
      self.rows = rows
      self.pixels = pixels
      self.integer = integer
      self.exact = exact
      self.floats = floats
      self.ints = ints
      self.bad = bad
    }
  }

  /// The Metal backend: MSL kernels compiled from source at start-up, specialised by
  /// function constants (dtype, representation, exact path, paired widths) on first use;
  /// payloads in shared memory (unified memory on Apple silicon: no copies to a device).
  ///
  /// Integer data with int32 weights are exact (two 32-bit words with carry, `u32x2`);
  /// float32 data or real weights are summed in float32 (`(K + 2) u` relative to
  /// `sum|x w|`).  Written for Apple platforms and compiled there only.
  public final class MetalBackend: ComputeBackend {
    let device: MTLDevice
    let queue: MTLCommandQueue
    let library: MTLLibrary
    var pipelines: [String: MTLComputePipelineState] = [:]
    let dummy: MTLBuffer
    public let info: BackendInfo

    /// Whether a Metal device answers here, and its name or why not.
    static func probe() -> (Bool, String) {
      guard let device = MTLCreateSystemDefaultDevice() else {
        return (false, "MTLCreateSystemDefaultDevice() found no Metal device")
      }
      return (true, device.name)
    }

    static func make() -> Result<MetalBackend, ProtocolError> {
      guard let device = MTLCreateSystemDefaultDevice() else {
        return .failure(ProtocolError(.device, "no Metal device"))
      }
      guard let queue = device.makeCommandQueue() else {
        return .failure(ProtocolError(.device, "\(device.name): no command queue"))
      }
      let library: MTLLibrary
      let options = MTLCompileOptions()
      // IEEE semantics: NaN and infinities must propagate (fast math would drop them)
      if #available(macOS 15.0, iOS 18.0, *) {
        options.mathMode = .safe
      } else {
        options.fastMathEnabled = false
      }
      do {
        library = try device.makeLibrary(source: MetalKernels.source, options: options)
      } catch {
        return .failure(
          ProtocolError(.device, "the Metal kernels did not compile on \(device.name): \(error)"))
      }
      guard let dummy = device.makeBuffer(length: 16, options: .storageModeShared) else {
        return .failure(ProtocolError(.device, "\(device.name): no 16-byte buffer"))
      }
      return .success(MetalBackend(device: device, queue: queue, library: library, dummy: dummy))
    }

    init(device: MTLDevice, queue: MTLCommandQueue, library: MTLLibrary, dummy: MTLBuffer) {
      self.device = device
      self.queue = queue
      self.library = library
      self.dummy = dummy
      let working = Int(clamping: device.recommendedMaxWorkingSetSize)
      info = BackendInfo(
        name: device.name, type: "gpu", backend: "metal",
        details: [
          "unified_memory": .int(device.hasUnifiedMemory ? 1 : 0),
          "registry_id": .string(String(device.registryID)),
          "max_buffer_length": .int(Int64(min(device.maxBufferLength, Int(JSONValue.maxInteger)))),
        ],
        kernels: CPUBackend.kernels, integerAccumulation: "u32x2", realAccumulation: "float32",
        maxBufferBytes: min(device.maxBufferLength, Int(UInt32.max)),
        maxFramePixels: 1 << 24, maxWeights: 4096,
        defaultBudgetBytes: max(1 << 26, working / 2))
    }

    // MARK: pipelines

    func pipeline(
      _ name: String, dtype: UInt32 = 0, representation: UInt32 = 0, exact: Bool = false,
      indexBytes: UInt32 = 4, countBytes: UInt32 = 4
    ) throws(ProtocolError) -> MTLComputePipelineState {
      let key = "\(name)/\(dtype)/\(representation)/\(exact)/\(indexBytes)/\(countBytes)"
      if let p = pipelines[key] { return p }
      let values = MTLFunctionConstantValues()
      var d = dtype
      var r = representation
      var e = exact
      var ib = indexBytes
      var cb = countBytes
      values.setConstantValue(&d, type: .uint, index: MetalKernels.Constant.dtype.rawValue)
      values.setConstantValue(&r, type: .uint, index: MetalKernels.Constant.representation.rawValue)
      values.setConstantValue(&e, type: .bool, index: MetalKernels.Constant.exact.rawValue)
      values.setConstantValue(&ib, type: .uint, index: MetalKernels.Constant.indexBytes.rawValue)
      values.setConstantValue(&cb, type: .uint, index: MetalKernels.Constant.countBytes.rawValue)
      do {
        let function = try library.makeFunction(name: name, constantValues: values)
        let state = try device.makeComputePipelineState(function: function)
        pipelines[key] = state
        return state
      } catch {
        throw ProtocolError(.device, "the Metal pipeline \(key) could not be made: \(error)")
      }
    }

    func threads(_ p: MTLComputePipelineState) -> Int {
      var t = MetalKernels.groupThreads
      while t > p.maxTotalThreadsPerThreadgroup { t /= 2 }
      return t
    }

    // MARK: buffers

    func buffer(_ bytes: UnsafeRawBufferPointer) throws(ProtocolError) -> MTLBuffer {
      let length = max(bytes.count, 16)
      guard let b = device.makeBuffer(length: length, options: .storageModeShared) else {
        throw ProtocolError(.device, "\(device.name) could not allocate \(length) bytes")
      }
      if let base = bytes.baseAddress, bytes.count > 0 {
        b.contents().copyMemory(from: base, byteCount: bytes.count)
      }
      return b
    }

    func buffer(_ view: ByteView) throws(ProtocolError) -> MTLBuffer {
      try view.withUnsafeBytes { (raw) throws(ProtocolError) in try buffer(raw) }
    }

    func buffer<T: BitwiseCopyable>(values: [T]) throws(ProtocolError) -> MTLBuffer {
      try values.withUnsafeBytes { (raw) throws(ProtocolError) in try buffer(raw) }
    }

    func zeroed(_ length: Int) throws(ProtocolError) -> MTLBuffer {
      let n = max(length, 16)
      guard let b = device.makeBuffer(length: n, options: .storageModeShared) else {
        throw ProtocolError(.device, "\(device.name) could not allocate \(n) bytes")
      }
      b.contents().initializeMemory(as: UInt8.self, repeating: 0, count: n)
      return b
    }

    /// Run `encode` in one command buffer and wait; a GPU error is a `device` error.
    func run(_ what: String, _ encode: (MTLComputeCommandEncoder) throws(ProtocolError) -> Void)
      throws(ProtocolError)
    {
      guard let cb = queue.makeCommandBuffer(), let enc = cb.makeComputeCommandEncoder() else {
        throw ProtocolError(.device, "\(device.name): no command buffer for \(what)")
      }
      do throws(ProtocolError) {
        try encode(enc)
      } catch {
        enc.endEncoding()
        throw error
      }
      enc.endEncoding()
      cb.commit()
      cb.waitUntilCompleted()
      if cb.status == .error {
        throw ProtocolError(
          .device, "\(device.name) failed in \(what): \(cb.error.map { "\($0)" } ?? "unknown")")
      }
    }

    // MARK: ComputeBackend

    /// uint32 element indices address every buffer: chunks of 2**32 values or more split.
    func checkAddressable(_ payload: Payload) throws(ProtocolError) {
      let values = payload.shape.frames * payload.shape.pixels
      guard values < Int(UInt32.max), payload.nbytes <= info.maxBufferBytes else {
        throw ProtocolError(
          .badRequest,
          "a chunk of \(values) values (\(payload.nbytes) bytes) is over what the Metal kernels "
            + "address (2**32 values, \(info.maxBufferBytes) bytes a buffer): split the chunk")
      }
    }

    public func heldBytes(for payload: Payload) -> Int {
      switch payload {
      case .dense(let d): return max(d.frames.count, 16)
      case .paired(let p):
        return max(4 * (p.shape.frames + 1), 16) + max(p.indices.count, 16)
          + max(p.pairs * min(p.countType.size, 4), 16)
      case .packed(let p):
        return max(p.widths.count, 16) + max(p.widths.count * 4, 16) + max(p.data.count, 16)
      }
    }

    public func heldBytes(for weights: WeightRows) -> Int {
      3 * max(4 * weights.rows * weights.pixels, 16)
    }

    public func store(_ payload: Payload) -> Result<any ResidentPayload, ProtocolError> {
      do throws(ProtocolError) {
        try checkAddressable(payload)
        switch payload {
        case .dense(let d):
          return .success(MetalPayload(payload, [try buffer(d.frames)]))
        case .paired(let p):
          let n = p.shape.frames
          let indptr = (0...n).map { UInt32(truncatingIfNeeded: p.indptr.load($0, as: Int64.self)) }
          let counts: MTLBuffer
          if p.countType == .uint64 {  // values within uint32 (the codec checked the dtype)
            counts = try buffer(
              values: (0..<p.pairs).map {
                UInt32(truncatingIfNeeded: p.counts.load($0, as: UInt64.self))
              })
          } else {
            counts = try buffer(p.counts)
          }
          return .success(
            MetalPayload(payload, [try buffer(values: indptr), try buffer(p.indices), counts]))
        case .packed(let p):
          let blocks = p.widths.count
          let offsets = (0..<blocks).map {
            UInt32(truncatingIfNeeded: p.offsets.load($0, as: Int64.self))
          }
          return .success(
            MetalPayload(
              payload, [try buffer(p.widths), try buffer(values: offsets), try buffer(p.data)]))
        }
      } catch {
        return .failure(error)
      }
    }

    public func store(weights: WeightRows) -> Result<any ResidentWeights, ProtocolError> {
      do throws(ProtocolError) {
        let count = weights.rows * weights.pixels
        var floats = [Float](repeating: 0, count: count)
        var ints = [Int32](repeating: 0, count: count)
        var bad = [UInt32](repeating: 0, count: weights.rows)
        var integer = true
        var fits = true
        weights.values.withUnsafeBytes { raw in
          for i in 0..<count {
            let v = raw.loadUnaligned(fromByteOffset: 8 * i, as: Double.self)
            floats[i] = Float(v)
            if !v.isFinite {
              integer = false
              bad[i / max(weights.pixels, 1)] += 1
            } else if v.rounded(.towardZero) != v {
              integer = false
            } else if abs(v) > Double(Int32.max) {
              fits = false
            } else {
              ints[i] = Int32(v)
            }
          }
        }
        let exact = integer && fits
        return .success(
          MetalWeights(
            rows: weights.rows, pixels: weights.pixels, integer: integer, exact: exact,
            floats: try buffer(values: floats),
            ints: exact ? try buffer(values: ints) : dummy, bad: try buffer(values: bad)))
      } catch {
        return .failure(error)
      }
    }

    public func framePass(
      _ chunk: any ResidentPayload, weights: any ResidentWeights, wantSum: Bool, wantMax: Bool
    ) -> Result<FramePassOutput, ProtocolError> {
      guard let c = chunk as? MetalPayload, let w = weights as? MetalWeights else {
        return .failure(ProtocolError(.internal, "a payload or weights of another backend"))
      }
      do throws(ProtocolError) {
        return .success(try pass(c, w, wantSum: wantSum, wantMax: wantMax))
      } catch {
        return .failure(error)
      }
    }

    static func dtypeCode(_ d: DType) -> UInt32 {
      switch d {
      case .uint8: return 0
      case .uint16: return 1
      case .float32: return 3
      default: return 2
      }
    }

    func pass(_ c: MetalPayload, _ w: MetalWeights, wantSum: Bool, wantMax: Bool)
      throws(ProtocolError) -> FramePassOutput
    {
      let payload = c.payload
      let n = payload.shape.frames
      let k = payload.shape.pixels
      let m = w.rows
      let isFloat = payload.dtype == .float32
      let exact = !isFloat && w.exact
      let out = try zeroed(n * m * (exact ? 8 : 4))
      let sums = try zeroed(k * (isFloat ? 4 : 8))
      let maxes = try zeroed(k * 4)
      if isFloat {  // the max of no frames is -inf
        let p = maxes.contents().bindMemory(to: Float.self, capacity: k)
        for i in 0..<k { p[i] = -.infinity }
      }
      var params = MetalParams()
      params.k = UInt32(k)
      params.m = UInt32(m)
      let groupLimit = 65_535
      try run("frame_pass") { (enc) throws(ProtocolError) in
        func dense(_ frames: MTLBuffer, dtype: UInt32, first: Int, count: Int, outFirst: Int)
          throws(ProtocolError)
        {
          var p = params
          if m > 0 {
            let dot = try pipeline("frame_dot", dtype: dtype, exact: exact)
            let t = threads(dot)
            var g0 = 0
            while g0 < count {
              let g = min(groupLimit, count - g0)
              p.frame0 = UInt32(first + g0)
              p.outFrame0 = UInt32(outFirst + g0)
              enc.setComputePipelineState(dot)
              enc.setBuffer(frames, offset: 0, index: 0)
              enc.setBuffer(w.floats, offset: 0, index: 1)
              enc.setBuffer(w.ints, offset: 0, index: 2)
              enc.setBuffer(out, offset: 0, index: 3)
              enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
              enc.dispatchThreadgroups(
                MTLSize(width: g, height: 1, depth: 1),
                threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
              g0 += g
            }
          }
          if wantSum || wantMax {
            let pat = try pipeline("pattern", dtype: dtype)
            p.frame0 = UInt32(first)
            p.nFrames = UInt32(count)
            enc.setComputePipelineState(pat)
            enc.setBuffer(frames, offset: 0, index: 0)
            enc.setBuffer(sums, offset: 0, index: 1)
            enc.setBuffer(maxes, offset: 0, index: 2)
            enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
            let t = threads(pat)
            enc.dispatchThreadgroups(
              MTLSize(width: (k + t - 1) / t, height: 1, depth: 1),
              threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
          }
        }
        guard n > 0 else { return }
        switch payload {
        case .dense(let d):
          try dense(c.buffers[0], dtype: Self.dtypeCode(d.dtype), first: 0, count: n, outFirst: 0)
        case .packed(let pk):
          // frames in groups through a scratch of decoded uint32 values (16 MiB)
          let group = max(1, (16 << 20) / (4 * k))
          let scratch = try zeroed(min(n, group) * k * 4)
          let decode = try pipeline("packed_decode")
          var f0 = 0
          while f0 < n {
            let g = min(group, n - f0)
            var p = params
            p.nFrames = UInt32(g)
            p.frame0 = UInt32(f0)
            p.blockValues = UInt32(pk.blockValues)
            p.blocksPerFrame = UInt32(pk.blocksPerFrame)
            enc.setComputePipelineState(decode)
            for (i, b) in c.buffers.enumerated() { enc.setBuffer(b, offset: 0, index: i) }
            enc.setBuffer(scratch, offset: 0, index: 3)
            enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
            let t = threads(decode)
            enc.dispatchThreadgroups(
              MTLSize(width: (g * k + t - 1) / t, height: 1, depth: 1),
              threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
            enc.memoryBarrier(scope: .buffers)
            try dense(scratch, dtype: 2, first: 0, count: g, outFirst: f0)
            enc.memoryBarrier(scope: .buffers)
            f0 += g
          }
        case .paired(let pr):
          let ib = UInt32(pr.indexType.size)
          let cb = UInt32(min(pr.countType.size, 4))
          var p = params
          p.nPairs = UInt32(pr.pairs)
          if m > 0 {
            let dot = try pipeline("paired_dot", exact: exact, indexBytes: ib, countBytes: cb)
            let t = threads(dot)
            var g0 = 0
            while g0 < n {
              let g = min(groupLimit, n - g0)
              p.frame0 = UInt32(g0)
              enc.setComputePipelineState(dot)
              for (i, b) in c.buffers.enumerated() { enc.setBuffer(b, offset: 0, index: i) }
              enc.setBuffer(w.floats, offset: 0, index: 3)
              enc.setBuffer(w.ints, offset: 0, index: 5)
              enc.setBuffer(w.bad, offset: 0, index: 6)
              enc.setBuffer(out, offset: 0, index: 7)
              enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
              enc.dispatchThreadgroups(
                MTLSize(width: g, height: 1, depth: 1),
                threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
              g0 += g
            }
          }
          if (wantSum || wantMax) && pr.pairs > 0 {
            let pat = try pipeline("paired_pattern", indexBytes: ib, countBytes: cb)
            enc.setComputePipelineState(pat)
            enc.setBuffer(c.buffers[1], offset: 0, index: 1)
            enc.setBuffer(c.buffers[2], offset: 0, index: 2)
            enc.setBuffer(sums, offset: 0, index: 5)
            enc.setBuffer(maxes, offset: 0, index: 6)
            enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
            let t = threads(pat)
            enc.dispatchThreadgroups(
              MTLSize(width: (pr.pairs + t - 1) / t, height: 1, depth: 1),
              threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
          }
        }
      }
      // read back: per_frame as float64; patterns as int64 / float64 and the dtype's bytes
      var perFrame = [Double](repeating: 0, count: n * m)
      if exact {
        let words = out.contents().bindMemory(to: UInt32.self, capacity: 2 * n * m)
        for i in 0..<(n * m) {
          let v = UInt64(words[2 * i]) | UInt64(words[2 * i + 1]) << 32
          perFrame[i] = Double(Int64(bitPattern: v))
        }
      } else {
        let f = out.contents().bindMemory(to: Float.self, capacity: max(n * m, 1))
        for i in 0..<(n * m) { perFrame[i] = Double(f[i]) }
      }
      var patternSum: PatternSum? = nil
      if wantSum {
        if isFloat {
          let f = sums.contents().bindMemory(to: Float.self, capacity: k)
          patternSum = .real((0..<k).map { Double(f[$0]) })
        } else {
          let words = sums.contents().bindMemory(to: UInt32.self, capacity: 2 * k)
          patternSum = .integer(
            (0..<k).map {
              Int64(bitPattern: UInt64(words[2 * $0]) | UInt64(words[2 * $0 + 1]) << 32)
            })
        }
      }
      var patternMax: [UInt8]? = nil
      if wantMax {
        let size = payload.dtype.size
        let src = UnsafeRawPointer(maxes.contents())
        var bytes = [UInt8](repeating: 0, count: k * size)
        for i in 0..<k {  // little-endian narrowing of each uint32
          for b in 0..<size {
            bytes[i * size + b] = src.load(fromByteOffset: 4 * i + b, as: UInt8.self)
          }
        }
        patternMax = bytes
      }
      return FramePassOutput(
        perFrame: perFrame, patternSum: patternSum, patternMax: patternMax,
        accumulation: exact ? "u32x2" : "float32")
    }

    public func gather(_ chunk: any ResidentPayload, indices: [Int]) -> Result<
      [UInt8], ProtocolError
    > {
      guard let c = chunk as? MetalPayload else {
        return .failure(ProtocolError(.internal, "a payload of another backend"))
      }
      let payload = c.payload
      let n = payload.shape.frames
      let total = n * indices.count
      if total == 0 { return .success([]) }
      do throws(ProtocolError) {
        let idx = try buffer(values: indices.map { UInt32($0) })
        let out = try zeroed(total * 4)
        var p = MetalParams()
        p.nFrames = UInt32(n)
        p.k = UInt32(payload.shape.pixels)
        p.nIndices = UInt32(indices.count)
        let state: MTLComputePipelineState
        switch payload {
        case .dense(let d):
          state = try pipeline("gather", dtype: Self.dtypeCode(d.dtype), representation: 0)
        case .paired(let pr):
          state = try pipeline(
            "gather", representation: 1, indexBytes: UInt32(pr.indexType.size),
            countBytes: UInt32(min(pr.countType.size, 4)))
        case .packed(let pk):
          p.blockValues = UInt32(pk.blockValues)
          p.blocksPerFrame = UInt32(pk.blocksPerFrame)
          state = try pipeline("gather", representation: 2)
        }
        try run("gather") { (enc) throws(ProtocolError) in
          enc.setComputePipelineState(state)
          for i in 0..<3 {
            enc.setBuffer(i < c.buffers.count ? c.buffers[i] : dummy, offset: 0, index: i)
          }
          enc.setBuffer(idx, offset: 0, index: 3)
          enc.setBuffer(out, offset: 0, index: 5)
          enc.setBytes(&p, length: MemoryLayout<MetalParams>.stride, index: 4)
          let t = threads(state)
          enc.dispatchThreadgroups(
            MTLSize(width: (total + t - 1) / t, height: 1, depth: 1),
            threadsPerThreadgroup: MTLSize(width: t, height: 1, depth: 1))
        }
        let size = payload.dtype.size
        let src = UnsafeRawPointer(out.contents())
        var bytes = [UInt8](repeating: 0, count: total * size)
        for i in 0..<total {
          for b in 0..<size {
            bytes[i * size + b] = src.load(fromByteOffset: 4 * i + b, as: UInt8.self)
          }
        }
        return .success(bytes)
      } catch {
        return .failure(error)
      }
    }
  }
#endif
