"""SSB's trotter sums as one loop written in LLVM IR and compiled in the process (llvmlite).

The CPU stage's loop (:func:`quantem_flow.runtimes.cpu.array_ops._trotter_loop`,
whose Python body is the reference) used to be compiled by Numba.  Numba's
first dispatch in a process builds its typing and target contexts: 0.4 s,
plus 0.2-0.28 s to import it, on this project's 2-vCPU VM, most of what a
fresh interpreter's SSB paid beyond a warm one (benchmarks/RESULTS.md, "SSB
in a fresh interpreter").  The same loop written as IR compiles in about
0.02 s and needs neither.

The IR evaluates the reference's float64 expressions in the reference's
order, one operation per instruction, without fast-math flags (no
reassociation, no contraction into fused multiply-adds), the complex
products as ``(ac - bd) + (ad + bc)i`` and the pixels summed in order:
the values are the Numba loop's bit for bit (tests/test_trotter_ir.py
compares them).

It is parsed and compiled in an LLVM context of its own, so it may run
while Numba compiles in another thread (Numba's code generator uses LLVM's
global context, under its own lock).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import numpy as np

from .llvm_optimise import optimise_o3

__all__ = ["TrotterKernel", "trotter_kernel"]

_lock = threading.Lock()
_kernel: TrotterKernel | None = None

_ARGS = (
    "f",
    "vr",
    "vc",
    "m",
    "qr",
    "qc",
    "er",
    "ec",
    "phase",
    "s1",
    "s2",
    "counts",
    "e1",
    "e2",
    "n",
    "nr",
    "nc",
)


class TrotterKernel:
    """The compiled loop; call it as the reference is called.

    Attributes
    ----------
    compile_s
        Seconds the compile took (in this process, once).
    """

    def __init__(self, engine: Any, context: Any, address: int, compile_s: float) -> None:
        self._keep = (engine, context)  # the machine code lives as long as its engine
        pointer, integer = ctypes.c_void_p, ctypes.c_int64
        proto = ctypes.CFUNCTYPE(None, *([pointer] * 8 + [integer] + [pointer] * 5 + [integer] * 3))
        self._fn = proto(address)
        self.compile_s = compile_s

    def __call__(
        self,
        f: np.ndarray,
        vr: np.ndarray,
        vc: np.ndarray,
        m: np.ndarray,
        qr: np.ndarray,
        qc: np.ndarray,
        er: np.ndarray,
        ec: np.ndarray,
        phase: bool,
        s1: np.ndarray,
        s2: np.ndarray,
        counts: np.ndarray,
        e1: np.ndarray,
        e2: np.ndarray,
    ) -> None:
        """Add the pixels' trotter sums into ``s1, s2, counts, e1, e2`` (in place).

        Shapes and dtypes as the reference: ``f`` ``(n, nr, nc)`` complex128;
        ``vr, vc, m`` ``(n,)``, ``qr`` ``(nr,)``, ``qc`` ``(nc,)`` float64;
        ``er`` ``(n, nr)`` and ``ec`` ``(n, nc)`` complex128 when ``phase``
        (else unused); ``s1, s2`` ``(nr, nc)`` complex128, ``counts``
        ``(2, nr, nc)`` int64, ``e1, e2`` ``(nr, nc)`` float64.

        Raises
        ------
        ValueError
            For arrays of another shape, dtype or layout (the loop reads raw memory).
        """
        n, nr, nc = (int(v) for v in f.shape)
        c128, f64 = np.dtype(np.complex128), np.dtype(np.float64)
        want: list[tuple[str, np.ndarray, tuple[int, ...], np.dtype[Any]]] = [
            ("f", f, (n, nr, nc), c128),
            ("vr", vr, (n,), f64),
            ("vc", vc, (n,), f64),
            ("m", m, (n,), f64),
            ("qr", qr, (nr,), f64),
            ("qc", qc, (nc,), f64),
            ("s1", s1, (nr, nc), c128),
            ("s2", s2, (nr, nc), c128),
            ("counts", counts, (2, nr, nc), np.dtype(np.int64)),
            ("e1", e1, (nr, nc), f64),
            ("e2", e2, (nr, nc), f64),
        ]
        if phase:
            want += [("er", er, (n, nr), c128), ("ec", ec, (n, nc), c128)]
        for name, a, shape, dtype in want:
            if a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
                raise ValueError(
                    f"trotter loop argument {name}: expected a C-contiguous {dtype} array of "
                    f"shape {shape}, got {a.dtype} {a.shape} (contiguous: {a.flags.c_contiguous})"
                )
        for name, a in (("s1", s1), ("s2", s2), ("counts", counts), ("e1", e1), ("e2", e2)):
            if not a.flags.writeable:
                raise ValueError(f"trotter loop output {name} is read-only")
        if n == 0 or nr == 0 or nc == 0:
            return
        ptr = [a.ctypes.data for a in (f, vr, vc, m, qr, qc, er, ec)]
        out = [a.ctypes.data for a in (s1, s2, counts, e1, e2)]
        self._fn(*ptr, int(bool(phase)), *out, n, nr, nc)


def trotter_kernel() -> TrotterKernel:
    """The compiled loop of this process (compiled on first use, about 0.02 s)."""
    global _kernel
    with _lock:
        if _kernel is None:
            _kernel = _compile()
        return _kernel


def _compile() -> TrotterKernel:
    import llvmlite.binding as llvm

    t0 = time.perf_counter()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    context = llvm.create_context()
    module = llvm.parse_assembly(str(_module(llvm.get_process_triple())), context=context)
    module.verify()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    machine = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    optimise_o3(module, machine)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    address = engine.get_function_address("trotter")
    return TrotterKernel(engine, context, address, time.perf_counter() - t0)


def _module(triple: str) -> Any:
    """The IR: ``for p, for i, for j`` as the reference, its expressions in its order."""
    import llvmlite.ir as ir

    f64 = ir.DoubleType()
    i64 = ir.IntType(64)
    pd = f64.as_pointer()
    module = ir.Module(name="quantem_flow_ssb_trotter")
    module.triple = triple
    fnty = ir.FunctionType(
        ir.VoidType(), [pd] * 8 + [i64] + [pd, pd, i64.as_pointer(), pd, pd] + [i64] * 3
    )
    fn = ir.Function(module, fnty, name="trotter")
    a = dict(zip(_ARGS, fn.args, strict=True))
    for name, arg in a.items():
        arg.name = name
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n, nr, nc = a["n"], a["nr"], a["nc"]
    phase = b.icmp_signed("!=", a["phase"], i64(0), name="phase_on")

    def load(ptr: Any, index: Any) -> Any:
        return b.load(b.gep(ptr, [index], inbounds=True))

    def loop(count: Any, name: str, body: Any) -> None:
        """``for k in range(count): body(k)`` with a phi counter."""
        before = b.block
        head = fn.append_basic_block(f"{name}_head")
        inner = fn.append_basic_block(f"{name}_body")
        done = fn.append_basic_block(f"{name}_done")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(i64, name=name)
        k.add_incoming(i64(0), before)
        b.cbranch(b.icmp_signed("<", k, count), inner, done)
        b.position_at_end(inner)
        body(k)
        k.add_incoming(b.add(k, i64(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def cmul(ar: Any, ai: Any, br: Any, bi: Any) -> tuple[Any, Any]:
        """``(a + bi)(c + di) = (ac - bd) + (ad + bc)i``, as Numba's complex product."""
        return (
            b.fsub(b.fmul(ar, br), b.fmul(ai, bi)),
            b.fadd(b.fmul(ar, bi), b.fmul(ai, br)),
        )

    def per_pixel(p: Any) -> None:
        vr, vc, mp = load(a["vr"], p), load(a["vc"], p), load(a["m"], p)

        def per_row(i: Any) -> None:
            qr = load(a["qr"], i)
            row = b.mul(b.add(b.mul(p, nr), i), nc)  # (p * nr + i) * nc

            def per_col(j: Any) -> None:
                qc = load(a["qc"], j)
                q2 = b.fadd(b.fmul(qr, qr), b.fmul(qc, qc))
                two_dot = b.fmul(f64(2.0), b.fadd(b.fmul(vr, qr), b.fmul(vc, qc)))
                in_minus = b.fcmp_ordered("<", b.fsub(q2, two_dot), mp)
                in_plus = b.fcmp_ordered("<", b.fadd(q2, two_dot), mp)
                with b.if_then(b.icmp_unsigned("!=", in_minus, in_plus)):
                    at = b.add(row, j)
                    zr = load(a["f"], b.mul(at, i64(2)))
                    zi = load(a["f"], b.add(b.mul(at, i64(2)), i64(1)))
                    power = b.fadd(b.fmul(zr, zr), b.fmul(zi, zi))
                    with b.if_else(phase) as (rotated, plain):
                        with rotated:
                            er_at = b.mul(b.add(b.mul(p, nr), i), i64(2))
                            ec_at = b.mul(b.add(b.mul(p, nc), j), i64(2))
                            wr, wi = cmul(
                                load(a["er"], er_at),
                                load(a["er"], b.add(er_at, i64(1))),
                                load(a["ec"], ec_at),
                                load(a["ec"], b.add(ec_at, i64(1))),
                            )
                            xr1, xi1 = cmul(zr, zi, wr, wi)
                            from_rotated = b.block
                        with plain:
                            from_plain = b.block
                    xr = b.phi(f64)
                    xr.add_incoming(xr1, from_rotated)
                    xr.add_incoming(zr, from_plain)
                    xi = b.phi(f64)
                    xi.add_incoming(xi1, from_rotated)
                    xi.add_incoming(zi, from_plain)
                    cell = b.add(b.mul(i, nc), j)
                    which = b.select(in_minus, i64(0), i64(1))
                    s = b.select(in_minus, a["s1"], a["s2"])
                    e = b.select(in_minus, a["e1"], a["e2"])
                    sr_ptr = b.gep(s, [b.mul(cell, i64(2))], inbounds=True)
                    si_ptr = b.gep(s, [b.add(b.mul(cell, i64(2)), i64(1))], inbounds=True)
                    b.store(b.fadd(b.load(sr_ptr), xr), sr_ptr)
                    b.store(b.fadd(b.load(si_ptr), xi), si_ptr)
                    count_ptr = b.gep(
                        a["counts"], [b.add(b.mul(which, b.mul(nr, nc)), cell)], inbounds=True
                    )
                    b.store(b.add(b.load(count_ptr), i64(1)), count_ptr)
                    e_ptr = b.gep(e, [cell], inbounds=True)
                    b.store(b.fadd(b.load(e_ptr), power), e_ptr)

            loop(nc, "j", per_col)

        loop(nr, "i", per_row)

    loop(n, "p", per_pixel)
    b.ret_void()
    return module
