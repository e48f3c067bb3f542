"""SIMD integer dot products of 8/16-bit frames, written as LLVM IR and compiled in process.

Numba's compiled loops widen each 16-bit pixel to a 32-bit lane before they
multiply or add (``vpmovzxwd`` then ``vpaddd``/``vpmulld``: 16 pixels per
instruction), and it has no way to ask for the instruction x86 has for this
job: ``pmaddwd`` multiplies 16-bit pairs and adds each pair into one 32-bit
lane (32 pixels per 512-bit instruction), and on CPUs with VNNI
(``vpdpwssd``) also adds the result into an accumulator in the same
instruction.  This module writes that loop as LLVM IR with
:mod:`llvmlite` (which ships with Numba: no C compiler at install or run
time), compiles it for the host CPU with LLVM's own optimiser and calls it
through :mod:`ctypes` (which releases the GIL for the call).

The kernel (one per element type, vectors per group and frames per group)
computes ``out[i, j] = sum_p x[i, p] * w[j, p]`` exactly, in integers:

* ``x`` are 8- or 16-bit frames; unsigned 16-bit pixels are flipped to
  signed by XOR ``0x8000`` (``x - 32768``, one instruction per 32 pixels) and
  ``32768 * sum_p w[j, p]`` is added back afterwards by the caller;
* ``w`` are signed 16-bit weights (0/1 masks, pixel coordinates);
* each 32-bit lane adds two products per step, at most ``2 * 32768 *
  max|w|``, and is widened into 64-bit lanes every ``block`` steps, chosen by
  the caller so no 32-bit lane can overflow (:func:`steps_per_widening`);
  the 64-bit lanes are summed once per frame;
* ``F`` frames go through each step together, so each weight vector loaded
  feeds ``F`` multiply-adds (weights of several rows do not fit in L1: one
  frame at a time was bound by loading them from L2, measured 2.1x slower
  with ``F = 1`` than with ``F = 4`` on 128 x 128 u16 frames);
* the last, partial vector of a frame is read with a masked load (nothing
  past the frame is touched); the weights are zero-padded to whole vectors;
* given a row hasher's state block (:mod:`.xxh3_ir`), each group of frames
  is hashed right after the group's dot products, while its bytes are still
  in the core's cache (the content digest in the kernel's sweep).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ir_loops import open_loop
from .llvm_optimise import assembly, compiled
from .xxh3_ir import HASH_BLOCK

__all__ = [
    "DotISA",
    "DotKernel",
    "compile_dot_kernel",
    "host_isa",
    "runnable_isas",
    "steps_per_widening",
]

_INT32_MAX = 2**31 - 1
_ELEMENT_BITS = {"u16": 16, "i16": 16, "u8": 8, "i8": 8}


@dataclass(frozen=True)
class DotISA:
    """The vector instructions a dot kernel is compiled for.

    Attributes
    ----------
    bits
        Vector width: 512 (AVX-512 BW) or 256 (AVX2).
    vnni
        Whether the CPU fuses the multiply-add and the accumulate
        (``vpdpwssd``: AVX-512 VNNI, or AVX-VNNI at 256 bits).
    cpu
        LLVM's name for the host CPU the code is tuned for.
    """

    bits: int
    vnni: bool
    cpu: str

    @property
    def lanes(self) -> int:
        """16-bit pixels per vector."""
        return self.bits // 16

    @property
    def instruction(self) -> str:
        """The multiply-add instruction the kernel runs on, with its width."""
        reg = "zmm" if self.bits == 512 else "ymm"
        return f"vpdpwssd {reg}" if self.vnni else f"vpmaddwd + vpaddd {reg}"


_isa_cache: list[DotISA | None] = []


def host_isa() -> DotISA | None:
    """The widest integer dot-product ISA this CPU has, or ``None`` (not x86-64, no AVX2)."""
    if not _isa_cache:
        _isa_cache.append(_detect_isa())
    return _isa_cache[0]


def runnable_isas() -> list[DotISA]:
    """Every ISA a dot kernel compiled here runs on this CPU (none without AVX2).

    The host's and, on an AVX-512 CPU, the AVX2 form compiled with the
    AVX-512 features off: the code an AVX2-only CPU runs.
    """
    host = host_isa()
    if host is None:
        return []
    if host.bits == 512:
        return [host, DotISA(bits=256, vnni=False, cpu=host.cpu)]
    return [host]


def _detect_isa() -> DotISA | None:
    import llvmlite.binding as llvm

    triple = llvm.get_process_triple()
    if not triple.startswith("x86_64"):
        return None
    features = set(llvm.get_host_cpu_features().flatten().split(","))
    cpu = str(llvm.get_host_cpu_name())
    if "+avx512bw" in features:
        return DotISA(bits=512, vnni="+avx512vnni" in features, cpu=cpu)
    if "+avx2" in features:
        return DotISA(bits=256, vnni="+avxvnni" in features, cpu=cpu)
    return None


def steps_per_widening(element: str, max_abs_weight: int) -> int:
    """Vector steps a 32-bit lane may accumulate before it must be widened to 64 bits.

    Each step adds two products of a pixel (at most ``32768`` in magnitude
    once flipped, ``255`` for 8-bit data) and a weight, so ``block`` steps
    stay below ``2**31`` when ``block * 2 * max|x| * max|w| < 2**31``.
    """
    if element not in _ELEMENT_BITS:
        raise ValueError(f"element type must be one of {sorted(_ELEMENT_BITS)}, got {element!r}")
    if not 0 < max_abs_weight <= 32767:
        raise ValueError(f"weights must be 16-bit and not all zero, got max |w| {max_abs_weight}")
    vmax = 32768 if _ELEMENT_BITS[element] == 16 else 256
    return max(1, _INT32_MAX // (2 * vmax * max_abs_weight))


#: Layout of the int64 parameter block a kernel reads (fixed per pass).
PARAMS = (
    "weights",  # address of the int16 weights, vectors x steps * lanes
    "steps",  # vectors per frame, the last one partial (masked)
    "flip",  # 0x8000 for unsigned 16-bit pixels, else 0
    "block",  # steps between widenings (steps_per_widening)
    "tail",  # pixels in the last vector (1 .. lanes)
    "correction",  # address of int64 per vector, added to each total
    "totals_stride",  # int64 per frame in the totals buffer
    "count",  # output columns the epilogue writes
    "dst",  # address of int64 per output: its column
    "src",  # address of int64 per output: the total it takes
    "sub",  # address of int64 per output: a total to subtract times `off` (-1: none)
    "off",  # address of float64 per output
)

Kernel = Callable[[int, int, int, int, int, int, int, int], None]


@dataclass(frozen=True)
class DotKernel:
    """A compiled dot kernel (see the module docstring) and its epilogue.

    ``run(frames, n, stride, out, out_stride, totals, params, hash)``: ``frames`` the
    address of the first pixel read, frames ``stride`` bytes apart; ``totals``
    an int64 buffer of ``n`` rows of ``totals_stride`` where the kernel writes
    each frame's ``n_vectors`` totals plus their corrections; ``out`` (or 0: no
    epilogue) float64 rows of ``out_stride`` values, where for each output ``t``
    ``out[i, dst[t]] = float(total[src[t]])``, minus ``float(total[sub[t]]) *
    off[t]`` where ``sub[t] >= 0`` (two IEEE roundings, no FMA: NumPy's
    :func:`~quantem_flow.runtimes.cpu.structure.finish_moment_rows` bit for
    bit); ``params`` the address of the int64 block laid out as :data:`PARAMS`;
    ``hash`` the address of a row hasher's state block
    (:data:`~quantem_flow.runtimes.cpu.xxh3_ir.HASH_BLOCK`), whose function
    hashes each group of frames after the kernel's sweep of it, or 0 (none).
    ``finish(0, n, 0, out, out_stride, totals, params, 0)`` runs the epilogue
    alone (passes whose vectors span several kernels).
    """

    element: str
    n_vectors: int
    frames_per_step: int
    isa: DotISA
    compile_s: float
    run: Kernel
    finish: Kernel


_lock = threading.Lock()
_kernels: dict[tuple[Any, ...], DotKernel] = {}
_keep: list[Any] = []  # execution engines must outlive the code they made


def compile_dot_kernel(
    element: str, n_vectors: int, frames_per_step: int, isa: DotISA
) -> DotKernel:
    """The dot kernel for ``element`` frames against ``n_vectors`` weight vectors (cached)."""
    import time

    if element not in _ELEMENT_BITS:
        raise ValueError(f"element type must be one of {sorted(_ELEMENT_BITS)}, got {element!r}")
    key = (element, n_vectors, frames_per_step, isa)
    with _lock:
        hit = _kernels.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        engine = compiled(
            _module(element, n_vectors, frames_per_step, isa), cpu=isa.cpu, features=_features(isa)
        )
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] + [ctypes.c_int64] * 7))
        run = proto(engine.get_function_address("dot"))
        finish = proto(engine.get_function_address("finish"))
        _keep.append((engine, run, finish))
        kernel = DotKernel(
            element=element,
            n_vectors=n_vectors,
            frames_per_step=frames_per_step,
            isa=isa,
            compile_s=time.perf_counter() - t0,
            run=run,
            finish=finish,
        )
        _kernels[key] = kernel
        return kernel


def kernel_assembly(element: str, n_vectors: int, frames_per_step: int, isa: DotISA) -> str:
    """The machine code of one kernel module, as assembly text (for inspection and tests)."""
    module = _module(element, n_vectors, frames_per_step, isa)
    return assembly(module, cpu=isa.cpu, features=_features(isa))


def _module(element: str, n_vectors: int, frames_per_step: int, isa: DotISA) -> Any:
    import llvmlite.binding as llvm
    import llvmlite.ir as ir

    module = ir.Module(name=f"quantem_flow_dot_{element}_{n_vectors}_{frames_per_step}")
    module.triple = llvm.get_process_triple()
    group = _emit_frames(module, "dot_group", element, n_vectors, frames_per_step, isa)
    single = _emit_frames(module, "dot_single", element, n_vectors, 1, isa)
    _emit_driver(module, group, single, frames_per_step)
    return module


def _features(isa: DotISA) -> str:
    """The host's CPU features, less those the ISA does not have.

    An AVX2 kernel on an AVX-512 CPU is compiled as for a CPU with AVX2 only:
    the code such a CPU runs.
    """
    import llvmlite.binding as llvm

    out = []
    for flag in llvm.get_host_cpu_features().flatten().split(","):
        name = flag[1:]
        if flag.startswith("+") and (
            (isa.bits < 512 and name.startswith("avx512"))
            or (not isa.vnni and name in ("avxvnni", "avx512vnni"))
        ):
            flag = "-" + name
        out.append(flag)
    return ",".join(out)


def _signature(ir: Any) -> Any:
    i64 = ir.IntType(64)
    return ir.FunctionType(
        ir.VoidType(),
        [
            ir.PointerType(ir.IntType(8)),
            i64,
            i64,
            ir.PointerType(ir.DoubleType()),
            i64,
            ir.PointerType(i64),
            ir.PointerType(i64),
            ir.PointerType(i64),
        ],
    )


def _param(b: Any, params: Any, name: str) -> Any:
    import llvmlite.ir as ir

    return b.load(b.gep(params, [ir.Constant(ir.IntType(64), PARAMS.index(name))]))


def _emit_epilogue(b: Any, fn: Any, row: Any, out_row: Any, params: Any, tag: str) -> None:
    """``out_row[dst[t]] = float(row[src[t]]) - float(row[sub[t]]) * off[t]`` for every ``t``."""
    import llvmlite.ir as ir

    i64, f64 = ir.IntType(64), ir.DoubleType()
    p64, pf = ir.PointerType(i64), ir.PointerType(f64)
    count = _param(b, params, "count")
    dst = b.inttoptr(_param(b, params, "dst"), p64)
    src = b.inttoptr(_param(b, params, "src"), p64)
    sub = b.inttoptr(_param(b, params, "sub"), p64)
    off = b.inttoptr(_param(b, params, "off"), pf)
    loop = open_loop(b, fn, tag, ir.Constant(i64, 0), count)
    t, body = loop.counter, loop.body
    minus = fn.append_basic_block(f"{tag}_minus")
    store = fn.append_basic_block(f"{tag}_store")
    value = b.sitofp(b.load(b.gep(row, [b.load(b.gep(src, [t]))])), f64)
    k = b.load(b.gep(sub, [t]))
    b.cbranch(b.icmp_signed(">=", k, ir.Constant(i64, 0)), minus, store)
    b.position_at_end(minus)
    scaled = b.fmul(b.sitofp(b.load(b.gep(row, [k])), f64), b.load(b.gep(off, [t])))
    moment = b.fsub(value, scaled)
    b.branch(store)
    b.position_at_end(store)
    result = b.phi(f64)
    result.add_incoming(value, body)
    result.add_incoming(moment, minus)
    b.store(result, b.gep(out_row, [b.load(b.gep(dst, [t]))]))
    loop.close(b, ir.Constant(i64, 1))


def _emit_driver(module: Any, group: Any, single: Any, frames_per_step: int) -> None:
    """``dot``: whole groups of frames, then the rest one by one; ``finish``: the epilogue."""
    import llvmlite.ir as ir

    i64 = ir.IntType(64)
    fn = ir.Function(module, _signature(ir), "dot")
    frames, n, stride, out, out_stride, totals, params, hashed = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    m = b.sub(n, b.srem(n, ir.Constant(i64, frames_per_step)))
    b.call(group, [frames, m, stride, out, out_stride, totals, params, hashed])
    ts = _param(b, params, "totals_stride")
    null = ir.Constant(out.type, None)
    has_out = b.icmp_unsigned("!=", b.ptrtoint(out, i64), ir.Constant(i64, 0))
    out_rest = b.select(has_out, b.gep(out, [b.mul(m, out_stride)]), null)
    b.call(
        single,
        [
            b.gep(frames, [b.mul(m, stride)]),
            b.sub(n, m),
            stride,
            out_rest,
            out_stride,
            b.gep(totals, [b.mul(m, ts)]),
            params,
            hashed,
        ],
    )
    b.ret_void()

    fin = ir.Function(module, _signature(ir), "finish")
    _, n, _, out, out_stride, totals, params, _ = fin.args
    entry = fin.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    ts = _param(b, params, "totals_stride")
    frames = open_loop(b, fin, "frames", ir.Constant(i64, 0), n)
    i = frames.counter
    row = b.gep(totals, [b.mul(i, ts)])
    _emit_epilogue(b, fin, row, b.gep(out, [b.mul(i, out_stride)]), params, "e")
    frames.close(b, ir.Constant(i64, 1))
    b.ret_void()


def _emit_frames(
    module: Any, name: str, element: str, n_vec: int, n_frames: int, isa: DotISA
) -> Any:
    """The kernel over whole groups of ``n_frames`` frames (``n`` a multiple of it)."""
    import llvmlite.ir as ir

    lanes = isa.lanes
    i1, i8, i16, i32, i64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
    elem = i16 if _ELEMENT_BITS[element] == 16 else i8
    v_elem = ir.VectorType(elem, lanes)
    v16 = ir.VectorType(i16, lanes)
    v32 = ir.VectorType(i32, lanes // 2)
    v64 = ir.VectorType(i64, lanes // 2)
    vmask = ir.VectorType(i1, lanes)
    madd_name = "llvm.x86.avx512.pmaddw.d.512" if isa.bits == 512 else "llvm.x86.avx2.pmadd.wd"
    g = module.globals
    madd = g.get(madd_name) or ir.Function(module, ir.FunctionType(v32, [v16, v16]), madd_name)
    red_name = f"llvm.vector.reduce.add.v{lanes // 2}i64"
    reduce = g.get(red_name) or ir.Function(module, ir.FunctionType(i64, [v64]), red_name)
    import llvmlite.binding as llvm

    # LLVM 15+ names the overload by an opaque pointer, older ones by the pointee type
    opaque = llvm.llvm_version_info >= (15,)
    ml_name = f"llvm.masked.load.v{lanes}i{elem.width}.p0" + (
        "" if opaque else f"v{lanes}i{elem.width}"
    )
    masked_load = g.get(ml_name) or ir.Function(
        module,
        ir.FunctionType(v_elem, [ir.PointerType(v_elem), i32, vmask, v_elem]),
        ml_name,
    )
    fn = ir.Function(module, _signature(ir), name)
    fn.linkage = "internal"
    frames, n, stride, out, out_stride, totals, params, hashed = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    weights = b.inttoptr(_param(b, params, "weights"), ir.PointerType(i16))
    steps = _param(b, params, "steps")
    block = _param(b, params, "block")
    tail = _param(b, params, "tail")
    corr = b.inttoptr(_param(b, params, "correction"), ir.PointerType(i64))
    ts = _param(b, params, "totals_stride")
    has_out = b.icmp_unsigned("!=", b.ptrtoint(out, i64), ir.Constant(i64, 0))
    full = b.sub(steps, ir.Constant(i64, 1))  # whole vectors; the last step is masked
    undef16 = ir.Constant(v16, ir.Undefined)
    splat_idx = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
    flip16 = b.trunc(_param(b, params, "flip"), i16)
    flipv = b.shuffle_vector(
        b.insert_element(undef16, flip16, ir.Constant(i32, 0)), undef16, splat_idx
    )
    v64l = ir.VectorType(i64, lanes)
    tail_splat = b.shuffle_vector(
        b.insert_element(ir.Constant(v64l, ir.Undefined), tail, ir.Constant(i32, 0)),
        ir.Constant(v64l, ir.Undefined),
        splat_idx,
    )
    tail_mask = b.icmp_unsigned("<", ir.Constant(v64l, list(range(lanes))), tail_splat)
    zero32 = ir.Constant(v32, [0] * (lanes // 2))
    zero64 = ir.Constant(v64, [0] * (lanes // 2))
    row_len = b.mul(steps, ir.Constant(i64, lanes))
    vec_w = [b.gep(weights, [b.mul(ir.Constant(i64, j), row_len)]) for j in range(n_vec)]
    corrections = [b.load(b.gep(corr, [ir.Constant(i64, j)])) for j in range(n_vec)]
    nacc = n_vec * n_frames
    esize = elem.width // 8

    def load_pixels(base: Any, offset: Any, masked: bool) -> Any:
        at = b.gep(base, [b.mul(offset, ir.Constant(i64, esize))])
        ptr = b.bitcast(at, ir.PointerType(v_elem))
        if masked:
            zero = ir.Constant(v_elem, None)
            x = b.call(masked_load, [ptr, ir.Constant(i32, 1), tail_mask, zero])
        else:
            x = b.load(ptr, align=1)
        if elem is i8:
            x = b.zext(x, v16) if element == "u8" else b.sext(x, v16)
        return b.xor(x, flipv)

    def load_weight(j: int, offset: Any) -> Any:
        return b.load(b.bitcast(b.gep(vec_w[j], [offset]), ir.PointerType(v16)), align=2)

    frame_loop = open_loop(b, fn, "frames", ir.Constant(i64, 0), n)
    i = frame_loop.counter
    bases = [b.gep(frames, [b.mul(b.add(i, ir.Constant(i64, q)), stride)]) for q in range(n_frames)]
    # blocks of steps in 32-bit lanes, widened into 64-bit lanes after each block
    blocks = open_loop(b, fn, "blocks", ir.Constant(i64, 0), full, [(v64, zero64)] * nacc)
    s0, acc64 = blocks.counter, blocks.carried
    s_end = b.select(b.icmp_signed("<", b.add(s0, block), full), b.add(s0, block), full)
    steps_loop = open_loop(b, fn, "steps", s0, s_end, [(v32, zero32)] * nacc)
    s, acc32 = steps_loop.counter, steps_loop.carried
    offset = b.mul(s, ir.Constant(i64, lanes))
    xs = [load_pixels(base, offset, False) for base in bases]
    new32: list[Any] = [None] * nacc
    for j in range(n_vec):
        wj = load_weight(j, offset)
        for q in range(n_frames):
            new32[q * n_vec + j] = b.add(acc32[q * n_vec + j], b.call(madd, [xs[q], wj]))
    steps_loop.close(b, ir.Constant(i64, 1), new32)
    widened = [b.add(a64, b.sext(a32, v64)) for a64, a32 in zip(acc64, acc32, strict=True)]
    blocks.counter.add_incoming(s_end, b.block)
    for phi, value in zip(acc64, widened, strict=True):
        phi.add_incoming(value, b.block)
    b.branch(blocks.head)
    b.position_at_end(blocks.done)
    # the last (partial) vector: a masked load; the weights are zero past the frame
    offset = b.mul(full, ir.Constant(i64, lanes))
    xs = [load_pixels(base, offset, True) for base in bases]
    rows = [b.gep(totals, [b.mul(b.add(i, ir.Constant(i64, q)), ts)]) for q in range(n_frames)]
    for j in range(n_vec):
        wj = load_weight(j, offset)
        for q in range(n_frames):
            a = q * n_vec + j
            last = b.sext(b.call(madd, [xs[q], wj]), v64)
            total = b.add(b.call(reduce, [b.add(acc64[a], last)]), corrections[j])
            b.store(total, b.gep(rows[q], [ir.Constant(i64, j)]))
    epi = fn.append_basic_block("epilogue")
    nxt = fn.append_basic_block("next")
    b.cbranch(has_out, epi, nxt)
    b.position_at_end(epi)
    for q in range(n_frames):
        out_row = b.gep(out, [b.mul(b.add(i, ir.Constant(i64, q)), out_stride)])
        _emit_epilogue(b, fn, rows[q], out_row, params, f"e{q}")
    b.branch(nxt)
    b.position_at_end(nxt)
    _emit_hash_call(b, fn, hashed, bases[0], n_frames, stride)
    frame_loop.close(b, ir.Constant(i64, n_frames))
    b.ret_void()
    return fn


def _emit_hash_call(b: Any, fn: Any, hashed: Any, first: Any, n_frames: int, stride: Any) -> None:
    """Where ``hashed`` is not null: call its hasher on the ``n_frames`` frames just swept."""
    import llvmlite.ir as ir

    i64 = ir.IntType(64)
    call = fn.append_basic_block("hash")
    after = fn.append_basic_block("hashed")
    b.cbranch(b.icmp_unsigned("!=", b.ptrtoint(hashed, i64), ir.Constant(i64, 0)), call, after)
    b.position_at_end(call)
    where = b.gep(hashed, [ir.Constant(i64, HASH_BLOCK.index("function"))])
    hasher_type = ir.FunctionType(ir.VoidType(), [first.type, i64, i64, hashed.type])
    hasher = b.inttoptr(b.load(where), ir.PointerType(hasher_type))
    b.call(hasher, [first, ir.Constant(i64, n_frames), stride, hashed])
    b.branch(after)
    b.position_at_end(after)
