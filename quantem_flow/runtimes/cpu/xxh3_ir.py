"""XXH3-128 per scan row of frames, written as LLVM IR: the digest a kernel's sweep can carry.

A streamed pass hashes every scan row it reads (XXH3-128, seed 0, the
``xxhash`` package's ``xxh3_128``; docs/data-integrity.md).  As a sweep of
its own the hash reads each piece from memory a second time and costs a
third of the pass (benchmarks/RESULTS.md, issue 24).  This module computes
the same digest in pieces a kernel can call while the frames it has just
read are still in the core's cache: the integer dot kernel
(:mod:`.dot_ir`) calls :func:`compile_row_hasher`'s function after each
group of four frames (docs/digest-in-kernel.md).

XXH3's long-input loop (inputs over 240 bytes) with the default 192-byte
secret reads 64-byte stripes; 16 stripes make a 1024-byte block, after
which the eight 64-bit accumulators are scrambled.  Where a frame is a
whole number of blocks, the blocks of a scan row (its frames back to back)
are the blocks of each frame in turn, so the hash of a row can advance a
frame at a time, in any number of calls, from eight accumulators and the
frame's column.  The row's last block is different (15 stripes, then its
last stripe against the secret at byte 121, no scramble; then the two
64-bit halves merged from the accumulators and the row's length): the
function knows it by the column (``row_frames - 1``).

The state is one int64 block (:data:`HASH_BLOCK`), owned by the caller
(one per stream): the accumulators, the frame size, the row length in
frames, the column of the next frame, where finished digests go (two
uint64 per row: the low then the high half) and how many are done.  The
digests equal ``xxhash.xxh3_128`` of each row's bytes bit for bit
(tests/test_row_hash.py, against the library on random rows, pieces
splitting rows anywhere, through the dot kernel).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ir_loops import open_loop
from .llvm_optimise import assembly, compiled, host_target

__all__ = [
    "BLOCK_BYTES",
    "HASH_BLOCK",
    "RowHasherCode",
    "compile_row_hasher",
    "row_hasher_assembly",
]

#: XXH3's default secret (192 bytes), as the algorithm's specification gives it.
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
#: The accumulators' starting values.
INIT_ACC = (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)
_AVALANCHE = 0x165667919E3779F9
_STRIPE = 64
#: Bytes per block: 16 stripes of 64 with the default secret.
BLOCK_BYTES = 1024
_STRIPES = BLOCK_BYTES // _STRIPE
_SCRAMBLE_AT = len(SECRET) - _STRIPE  # 128
_LAST_STRIPE_AT = len(SECRET) - _STRIPE - 7  # 121
_MERGE_LOW_AT, _MERGE_HIGH_AT = 11, len(SECRET) - _STRIPE - 11  # 11, 117

#: Layout of the int64 state block (slots).
HASH_BLOCK = (
    *(f"acc{i}" for i in range(8)),
    "frame_bytes",  # bytes per frame, a multiple of BLOCK_BYTES
    "row_frames",  # frames per scan row
    "col",  # column of the next frame hashed (advanced by each call)
    "out",  # address of uint64 pairs (low, high), one per finished row
    "done",  # rows finished so far (advanced by each call)
    "back",  # bytes from a frame's start to the address the caller passes for it
    "function",  # address of the compiled function (for kernels that call it)
    "capacity",  # pairs the out buffer holds (checked by the caller before each call)
)

Hasher = Callable[[int, int, int, int], None]


@dataclass(frozen=True)
class RowHasherCode:
    """The compiled row hasher: ``run(first, n, stride, block)``, its address, compile time.

    ``run`` hashes ``n`` frames ``stride`` bytes apart, the first of which
    starts ``block[back]`` bytes before the address ``first``, advancing the
    state in ``block`` (:data:`HASH_BLOCK`).  ``address`` is the same
    function, for a kernel to call.
    """

    run: Hasher
    address: int
    compile_s: float


_lock = threading.Lock()
_compiled: list[RowHasherCode] = []
_keep: list[Any] = []


def compile_row_hasher() -> RowHasherCode:
    """The row hasher for this CPU (compiled once per process, ~0.1 s)."""
    with _lock:
        if _compiled:
            return _compiled[0]
        t0 = time.perf_counter()
        engine = compiled(_module(), **host_target())
        address = int(engine.get_function_address("xxh3_frames"))
        proto = ctypes.CFUNCTYPE(
            None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p
        )
        run = proto(address)
        _keep.append((engine, run))
        code = RowHasherCode(run=run, address=address, compile_s=time.perf_counter() - t0)
        _compiled.append(code)
        return code


def row_hasher_assembly() -> str:
    """The row hasher's machine code for this CPU, as assembly text (inspection and tests)."""
    return assembly(_module(), **host_target())


def _signed(value: int) -> int:
    """``value`` (an unsigned 64-bit constant) as the signed i64 LLVM's text form takes."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _secret64(offset: int) -> int:
    return int.from_bytes(SECRET[offset : offset + 8], "little")


def _module() -> Any:
    import llvmlite.binding as llvm
    import llvmlite.ir as ir

    module = ir.Module(name="quantem_flow_xxh3_rows")
    module.triple = llvm.get_process_triple()
    emit_row_hasher(module)
    return module


def emit_row_hasher(module: Any) -> Any:
    """Emit ``void xxh3_frames(i8* first, i64 n, i64 stride, i64* block)`` into ``module``."""
    import llvmlite.ir as ir

    i8, i32, i64, i128 = (ir.IntType(b) for b in (8, 32, 64, 128))
    v8 = ir.VectorType(i64, 8)
    p8, p64 = ir.PointerType(i8), ir.PointerType(i64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [p8, i64, i64, p64]), "xxh3_frames")
    first, n, stride, block = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def const(value: int) -> Any:
        return ir.Constant(i64, _signed(value))

    def vconst(values: list[int]) -> Any:
        return ir.Constant(v8, [_signed(v) for v in values])

    def splat(value: int) -> Any:
        return vconst([value] * 8)

    def slot(name: str) -> Any:
        return b.gep(block, [ir.Constant(i64, HASH_BLOCK.index(name))])

    secrets = [vconst([_secret64(8 * s + 8 * i) for i in range(8)]) for s in range(_STRIPES)]
    last_secret = vconst([_secret64(_LAST_STRIPE_AT + 8 * i) for i in range(8)])
    scramble_secret = vconst([_secret64(_SCRAMBLE_AT + 8 * i) for i in range(8)])
    low32 = splat(0xFFFFFFFF)
    swap = ir.Constant(ir.VectorType(i32, 8), [1, 0, 3, 2, 5, 4, 7, 6])
    undef = ir.Constant(v8, ir.Undefined)
    init = vconst(list(INIT_ACC))

    def stripe(acc: Any, at: Any, secret: Any) -> Any:
        data = b.load(b.bitcast(at, ir.PointerType(v8)), align=1)
        key = b.xor(data, secret)
        product = b.mul(b.and_(key, low32), b.lshr(key, splat(32)))
        return b.add(acc, b.add(b.shuffle_vector(data, undef, swap), product))

    def stripes(acc: Any, at: Any, count: int) -> Any:
        for s in range(count):
            acc = stripe(acc, b.gep(at, [ir.Constant(i64, _STRIPE * s)]), secrets[s])
        return acc

    def scramble(acc: Any) -> Any:
        acc = b.xor(acc, b.lshr(acc, splat(47)))
        return b.mul(b.xor(acc, scramble_secret), splat(_P32_1))

    def avalanche(h: Any) -> Any:
        h = b.xor(h, b.lshr(h, const(37)))
        h = b.mul(h, const(_AVALANCHE))
        return b.xor(h, b.lshr(h, const(32)))

    def merge(acc: Any, at: int, start: Any) -> Any:
        result = start
        for i in range(4):
            lo = b.xor(
                b.extract_element(acc, ir.Constant(i32, 2 * i)), const(_secret64(at + 16 * i))
            )
            hi = b.xor(
                b.extract_element(acc, ir.Constant(i32, 2 * i + 1)),
                const(_secret64(at + 16 * i + 8)),
            )
            wide = b.mul(b.zext(lo, i128), b.zext(hi, i128))
            folded = b.xor(b.trunc(wide, i64), b.trunc(b.lshr(wide, ir.Constant(i128, 64)), i64))
            result = b.add(result, folded)
        return avalanche(result)

    acc0 = b.load(b.bitcast(slot("acc0"), ir.PointerType(v8)), align=8)
    frame_bytes = b.load(slot("frame_bytes"))
    row_frames = b.load(slot("row_frames"))
    col0 = b.load(slot("col"))
    out = b.inttoptr(b.load(slot("out")), p64)
    done0 = b.load(slot("done"))
    back = b.load(slot("back"))
    inner = b.sub(b.lshr(frame_bytes, const(10)), const(1))  # blocks before a frame's last
    row_len = b.mul(row_frames, frame_bytes)
    last_col = b.sub(row_frames, const(1))
    low_start = b.mul(row_len, const(_P64_1))
    high_start = b.xor(b.mul(row_len, const(_P64_2)), const(-1))

    frames = open_loop(
        b, fn, "frames", ir.Constant(i64, 0), n, [(v8, acc0), (i64, col0), (i64, done0)]
    )
    q, (acc_f, col, done) = frames.counter, frames.carried
    start = b.gep(first, [b.sub(b.mul(q, stride), back)])
    # every block of the frame but its last: 16 stripes, then a scramble
    blocks = open_loop(b, fn, "blocks", ir.Constant(i64, 0), inner, [(v8, acc_f)])
    t, (acc_b,) = blocks.counter, blocks.carried
    at = b.gep(start, [b.mul(t, const(BLOCK_BYTES))])
    blocks.close(b, ir.Constant(i64, 1), [scramble(stripes(acc_b, at, _STRIPES))])
    # the frame's last block: the row's last (digest finished) or not (as any other)
    at = b.gep(start, [b.mul(inner, const(BLOCK_BYTES))])
    row_ends = b.icmp_signed("==", col, last_col)
    normal = fn.append_basic_block("normal")
    final = fn.append_basic_block("final")
    join = fn.append_basic_block("join")
    b.cbranch(row_ends, final, normal)

    b.position_at_end(normal)
    acc_n = scramble(stripes(acc_b, at, _STRIPES))
    b.branch(join)

    b.position_at_end(final)
    acc_l = stripes(acc_b, at, _STRIPES - 1)
    acc_l = stripe(acc_l, b.gep(at, [const(BLOCK_BYTES - _STRIPE)]), last_secret)
    low = merge(acc_l, _MERGE_LOW_AT, low_start)
    high = merge(acc_l, _MERGE_HIGH_AT, high_start)
    pair = b.gep(out, [b.mul(done, const(2))])
    b.store(low, pair)
    b.store(high, b.gep(pair, [ir.Constant(i64, 1)]))
    b.branch(join)

    b.position_at_end(join)
    acc_j = b.phi(v8)
    acc_j.add_incoming(acc_n, normal)
    acc_j.add_incoming(init, final)
    done_j = b.select(row_ends, b.add(done, const(1)), done)
    col_j = b.select(row_ends, const(0), b.add(col, const(1)))
    frames.close(b, ir.Constant(i64, 1), [acc_j, col_j, done_j])

    b.store(acc_f, b.bitcast(slot("acc0"), ir.PointerType(v8)), align=8)
    b.store(col, slot("col"))
    b.store(done, slot("done"))
    b.ret_void()
    return fn
