"""The integer dot kernel (runtimes/cpu/dot_ir.py, dot_pass.py): exact, the cell kernels' bits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from quantem_flow import config
from quantem_flow.operators.geometry import annulus
from quantem_flow.runtimes.cpu.dot_ir import (
    DotISA,
    compile_dot_kernel,
    host_isa,
    kernel_assembly,
    runnable_isas,
    steps_per_widening,
)
from quantem_flow.runtimes.cpu.dot_pass import DotPass, dot_pass_for
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass
from quantem_flow.runtimes.cpu.structure import analyse_weights, structured_vectors

HOST = host_isa()
pytestmark = pytest.mark.skipif(
    HOST is None, reason="the integer dot kernel needs x86-64 with AVX2"
)


ISAS = runnable_isas()  # the AVX2 form runs on an AVX-512 CPU too


def _weights(shape: tuple[int, int], center: tuple[float, float], com: bool = True) -> np.ndarray:
    kr, kc = shape
    rows = [
        annulus(shape, center, 0.0, min(kr, kc) / 6, (1.0, 1.0)).ravel(),
        annulus(shape, center, min(kr, kc) / 4, max(kr, kc), (1.0, 1.0)).ravel(),
    ]
    if com:
        rr = np.repeat(np.arange(kr, dtype=np.float64), kc) - center[0]
        cc = np.tile(np.arange(kc, dtype=np.float64), kr) - center[1]
        rows += [np.ones(kr * kc), rr, cc]
    return np.stack([np.asarray(r, dtype=np.float64) for r in rows])


def _frames(dtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.dtype(dtype))
    fr = rng.integers(int(info.min), int(info.max), size=(n, k), endpoint=True).astype(dtype)
    fr[0] = info.max  # the extremes: the flip of 0 and of 65535, -32768 for int16
    if n > 1:
        fr[1] = info.min
    return fr


def _reference(plan, frames: np.ndarray) -> dict[int, np.ndarray]:  # type: ignore[no-untyped-def]
    """Each structured column's integer value, from int64 products (before finishing)."""
    return {col: frames.astype(np.int64) @ vec for vec, col in structured_vectors(plan)}


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: f"{i.bits}bit")
@pytest.mark.parametrize("dtype", ["uint16", "int16", "uint8", "int8"])
@pytest.mark.parametrize("shape", [(128, 128), (37, 53), (256, 256), (8, 3)])
def test_exact_integers_every_dtype_and_shape(
    isa: DotISA, dtype: str, shape: tuple[int, int]
) -> None:
    w = _weights(shape, (shape[0] / 2 - 0.5, shape[1] / 2))
    plan = analyse_weights(w, frame_shape=shape, force=True)
    dp = DotPass(plan, np.dtype(dtype), isa)
    for n in (1, 3, 4, 9):  # whole groups of frames and the rest
        fr = _frames(dtype, n, shape[0] * shape[1], seed=n)
        out = np.full((n, plan.n_out), np.nan)
        dp.run(fr, out)
        ref = _reference(plan, fr)
        mask_cols = [int(c) for c, kd in zip(plan.srow_out, plan.srow_kind, strict=True) if kd == 0]
        for col in mask_cols + [int(c) for c in plan.srow_scol if c >= 0]:
            assert np.array_equal(out[:, col], ref[col].astype(np.float64)), (dtype, shape, n, col)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: f"{i.bits}bit")
@pytest.mark.parametrize("center", [(63.7, 64.2), (63.5, 64.0), (10.0, 100.25)])
def test_bit_for_bit_the_cell_kernels(isa: DotISA, center: tuple[float, float]) -> None:
    shape = (128, 128)
    w = _weights(shape, center)
    fr = _frames("uint16", 37, 128 * 128, seed=4) // 7
    plan = analyse_weights(w, frame_shape=shape)
    dp = DotPass(plan, fr.dtype, isa)
    out = np.zeros((fr.shape[0], plan.n_out))
    dp.run(fr, out)
    with config.set(integer_dot_kernel=False):
        cells = PreparedFramePass(
            w,
            dtype=fr.dtype,
            n_frames=fr.shape[0],
            want_sum=False,
            want_max=False,
            frame_shape=shape,
        )
    assert "cell kernels" in cells.variant["kernel"]
    cells.run(fr)
    expect = cells.result()[0]
    assert np.array_equal(out[:, : w.shape[0]], expect)  # moment rows included, bit for bit


def test_the_default_pass_runs_it_and_says_so() -> None:
    shape = (128, 128)
    w = _weights(shape, (63.7, 64.2))
    fr = _frames("uint16", 64, 128 * 128, seed=2) // 3
    p = PreparedFramePass(
        w, dtype=fr.dtype, n_frames=64, want_sum=False, want_max=False, frame_shape=shape
    )
    assert p.variant["variant"] == "structured"
    assert p.variant["kernel"].startswith("integer dot products: 5 vectors")
    assert "chosen:" in p.variant["kernel"]
    for piece in np.array_split(fr, [5, 6, 30]):  # pieces of any size: the same values
        p.run(piece)
    got = p.result()[0]
    with config.set(integer_dot_kernel=False):
        q = PreparedFramePass(
            w, dtype=fr.dtype, n_frames=64, want_sum=False, want_max=False, frame_shape=shape
        )
    q.run(fr)
    assert np.array_equal(got, q.result()[0])


def test_a_probe_sweep_runs_the_dot_kernel_and_keeps_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sweep`` (a read-method probe's) runs the pass's own kernel; its results go nowhere."""
    import threading

    shape = (128, 128)
    w = _weights(shape, (63.7, 64.2))
    fr = _frames("uint16", 48, 128 * 128, seed=4) // 3
    other = _frames("uint16", 40, 128 * 128, seed=5)
    p = PreparedFramePass(
        w, dtype=fr.dtype, n_frames=48, want_sum=False, want_max=False, frame_shape=shape
    )
    assert p.runs_dot_kernel and p.can_sweep
    calls: list[int] = []
    run = p._dot.run

    def counted(frames: np.ndarray, out: np.ndarray, **kw: object) -> None:
        calls.append(frames.shape[0])
        run(frames, out, **kw)

    monkeypatch.setattr(p._dot, "run", counted)  # the pass is shared (cached): undone after
    two = [threading.Thread(target=p.sweep, args=(other[i::2],)) for i in range(2)]
    for t in two:
        t.start()
    p.sweep(other)
    for t in two:
        t.join()
    assert sorted(calls) == [20, 20, 40]  # the dot kernel itself, on every frame swept
    p.run(fr[:17])
    p.sweep(other[:3])
    p.run(fr[17:])
    got = p.result()[0]
    q = PreparedFramePass(
        w, dtype=fr.dtype, n_frames=48, want_sum=False, want_max=False, frame_shape=shape
    )
    q.run(fr)
    assert np.array_equal(got, q.result()[0])
    with pytest.raises(ValueError, match="cannot sweep"):
        p.sweep(other.astype(np.int32))


def test_many_vectors_span_several_kernels() -> None:
    assert HOST is not None
    shape = (64, 64)
    radii = [(0, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 21), (21, 24), (24, 30), (30, 40)]
    rows = [annulus(shape, (31.5, 32.0), a, b, (1.0, 1.0)).ravel() for a, b in radii]
    rr = np.repeat(np.arange(64.0), 64) - 31.5
    w = np.stack([np.asarray(r, dtype=np.float64) for r in rows] + [rr])
    plan = analyse_weights(w, frame_shape=shape, force=True)
    dp = DotPass(plan, np.dtype("uint16"), HOST)
    assert len(dp.groups) > 1
    fr = _frames("uint16", 11, 64 * 64, seed=9)
    out = np.zeros((11, plan.n_out))
    dp.run(fr, out)
    ref = fr.astype(np.int64) @ w[:9].T.astype(np.int64)
    assert np.array_equal(out[:, :9], ref.astype(np.float64))


def test_widening_keeps_32_bit_lanes_exact_at_the_bound() -> None:
    assert HOST is not None
    shape = (256, 256)
    w = _weights(shape, (127.5, 128.0))
    plan = analyse_weights(w, frame_shape=shape, force=True)
    dp = DotPass(plan, np.dtype("uint16"), HOST)
    assert dp.block == steps_per_widening("u16", dp.max_abs_weight) < 2**15
    for value in (0, 65535):  # every pixel at an extreme: the largest 32-bit lane sums
        fr = np.full((5, 256 * 256), value, dtype=np.uint16)
        out = np.zeros((5, plan.n_out))
        dp.run(fr, out)
        ref = _reference(plan, fr)
        for col, vals in ref.items():
            if col in [int(c) for c in plan.srow_scol] or col in [
                int(c) for c, kd in zip(plan.srow_out, plan.srow_kind, strict=True) if kd == 0
            ]:
                assert np.array_equal(out[:, col], vals.astype(np.float64))


@pytest.mark.parametrize("element,vmax", [("u16", 32768), ("i16", 32768), ("u8", 256), ("i8", 256)])
@pytest.mark.parametrize("weight", [1, 2, 127, 1000, 32767])
def test_steps_per_widening_bound(element: str, vmax: int, weight: int) -> None:
    block = steps_per_widening(element, weight)
    assert block >= 1
    assert block * 2 * vmax * weight < 2**31
    assert (block + 1) * 2 * vmax * weight >= 2**31


def test_steps_per_widening_refuses_what_it_cannot_bound() -> None:
    with pytest.raises(ValueError, match="16-bit"):
        steps_per_widening("u16", 40000)
    with pytest.raises(ValueError, match="element type"):
        steps_per_widening("u32", 1)


def test_strided_frames_and_bad_arguments() -> None:
    assert HOST is not None
    shape = (32, 32)
    w = _weights(shape, (15.5, 16.0))
    plan = analyse_weights(w, frame_shape=shape, force=True)
    dp = DotPass(plan, np.dtype("uint16"), HOST)
    fr = _frames("uint16", 12, 1024, seed=3)
    out = np.zeros((6, plan.n_out))
    dp.run(fr[::2], out)  # every other frame: a row stride of two frames
    expect = np.zeros((6, plan.n_out))
    dp.run(np.ascontiguousarray(fr[::2]), expect)
    assert np.array_equal(out, expect)
    with pytest.raises(TypeError, match=r"prepared for <u2 \(uint16\)"):
        dp.run(fr.astype(np.int16), out)
    with pytest.raises(ValueError, match="float64"):
        dp.run(fr[:6], np.zeros((6, plan.n_out), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\(n, 1024\)"):
        dp.run(fr[:, :100], out)


def test_when_it_does_not_run_the_record_says_why() -> None:
    shape = (128, 128)
    w = _weights(shape, (63.7, 64.2))
    plan = analyse_weights(w, frame_shape=shape)
    assert dot_pass_for(plan, np.dtype("uint32"), want_patterns=False)[1].endswith(
        "(8/16-bit integers only)"
    )
    assert "pattern" in dot_pass_for(plan, np.dtype("uint16"), want_patterns=True)[1]
    with config.set(integer_dot_kernel=False):
        assert "off" in dot_pass_for(plan, np.dtype("uint16"), want_patterns=False)[1]
    general = np.vstack([w, np.linspace(0, 1, 128 * 128)])
    gplan = analyse_weights(general, frame_shape=shape)
    assert "general rows" in dot_pass_for(gplan, np.dtype("uint16"), want_patterns=False)[1]
    small = analyse_weights(_weights(shape, (63.7, 64.2), com=False)[:1], frame_shape=shape)
    dp, why = dot_pass_for(small, np.dtype("uint16"), want_patterns=False)
    assert dp is None and "cell kernels" in why  # one small disk: the cell kernels win
    p = PreparedFramePass(
        w, dtype=np.dtype("uint16"), n_frames=1, want_sum=True, want_max=False, frame_shape=shape
    )
    assert p.variant["kernel"].startswith("cell kernels (")


@pytest.mark.skipif(HOST is None or not HOST.vnni, reason="this CPU has no VNNI")
def test_the_machine_code_is_pairwise_multiply_adds_fused_where_llvm_tunes_for_it() -> None:
    assert HOST is not None
    asm = kernel_assembly("u16", 5, 4, HOST)
    reg = "zmm" if HOST.bits == 512 else "ymm"
    fused = [ln for ln in asm.splitlines() if "vpdpwssd" in ln]
    split = [ln for ln in asm.splitlines() if "vpmaddwd" in ln]
    # 4 frames x 5 vectors per step, each 32 pixel pairs multiplied and added at once;
    # LLVM fuses the add into vpdpwssd where its tuning for this CPU favours it (Zen 4: most;
    # Intel Ice Lake to Emerald Rapids: a few, the rest vpmaddwd + vpaddd;
    # docs/integer-dot-kernel.md)
    assert len(fused) + len(split) >= 20
    assert fused, "VNNI is targeted but no vpdpwssd was selected"
    assert all(reg in ln for ln in fused + split)


def test_the_avx2_form_uses_pmaddwd() -> None:
    assert HOST is not None
    asm = kernel_assembly("u16", 2, 2, DotISA(bits=256, vnni=False, cpu=HOST.cpu))
    assert "vpmaddwd" in asm and "zmm" not in asm


def test_kernels_are_cached_and_the_isa_pickles() -> None:
    assert HOST is not None
    a = compile_dot_kernel("u8", 2, 4, HOST)
    assert compile_dot_kernel("u8", 2, 4, HOST) is a
    assert pickle.loads(pickle.dumps(HOST)) == HOST
    assert HOST.instruction.startswith("vp")


def test_a_kernel_that_cannot_compile_leaves_the_cell_kernels_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quantem_flow.runtimes.cpu import dot_pass

    def broken(*args: object) -> None:
        raise AttributeError("module 'llvmlite.binding' has no attribute 'create_pass_builder'")

    monkeypatch.setattr(dot_pass, "compile_dot_kernel", broken)
    monkeypatch.setattr(dot_pass, "_cache", {})
    shape = (64, 64)
    w = _weights(shape, (31.5, 32.5))
    plan = analyse_weights(w, frame_shape=shape)
    dp, why = dot_pass_for(plan, np.dtype("uint16"), want_patterns=False)
    assert dp is None
    assert "could not be compiled (AttributeError" in why
    p = PreparedFramePass(
        w, dtype=np.dtype("uint16"), n_frames=3, want_sum=False, want_max=False, frame_shape=shape
    )
    assert p.variant["kernel"].startswith("cell kernels (integer dot kernel could not be compiled")
    fr = _frames("uint16", 3, 64 * 64)
    p.run(fr)
    assert np.array_equal(p.result()[0][:, 0], fr.astype(np.int64) @ (w[0] != 0))


def test_frames_not_in_native_byte_order_are_never_read_by_the_dot_kernel() -> None:
    assert HOST is not None
    shape = (32, 32)
    w = _weights(shape, (15.5, 16.0))
    plan = analyse_weights(w, frame_shape=shape, force=True)
    swapped = np.dtype("uint16").newbyteorder()
    dp, why = dot_pass_for(plan, swapped, want_patterns=False)
    assert dp is None and "native byte order" in why
    native = DotPass(plan, np.dtype("uint16"), HOST)
    big = (_frames("uint16", 3, 32 * 32, seed=11) // 5).astype(swapped)
    with pytest.raises(TypeError, match="prepared for <u2"):
        native.run(big, np.zeros((3, plan.n_out)))


def test_frames_of_another_dtype_run_the_cells_and_the_record_says_so() -> None:
    shape = (64, 64)
    w = _weights(shape, (31.5, 32.5))
    p = PreparedFramePass(
        w, dtype=np.dtype("uint16"), n_frames=4, want_sum=False, want_max=False, frame_shape=shape
    )
    assert p.variant["kernel"].startswith("integer dot products")
    fr = _frames("uint8", 4, 64 * 64, seed=12)
    p.run(fr)
    assert "arrived as |u1" in p.variant["kernel"]
    with config.set(integer_dot_kernel=False):
        q = PreparedFramePass(
            w,
            dtype=np.dtype("uint8"),
            n_frames=4,
            want_sum=False,
            want_max=False,
            frame_shape=shape,
        )
    q.run(fr)
    assert np.array_equal(p.result()[0], q.result()[0])


def test_rejected_plans_are_remembered_and_masks_need_no_detector_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quantem_flow.runtimes.cpu import dot_pass

    shape = (128, 128)
    small = analyse_weights(_weights(shape, (63.7, 64.2), com=False)[:1], frame_shape=shape)
    built: list[object] = []
    real = dot_pass.DotPass

    def counting(*args: object) -> object:
        built.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dot_pass, "_cache", {})
    monkeypatch.setattr(dot_pass, "DotPass", counting)
    for _ in range(3):
        assert dot_pass_for(small, np.dtype("uint16"), want_patterns=False)[0] is None
    assert len(built) == 1  # the cost rule's verdict is kept with the plan
    masks = _weights(shape, (63.7, 64.2), com=False)
    flat = analyse_weights(masks)  # no detector shape: (1, 16384), masks only
    dp, why = dot_pass_for(flat, np.dtype("uint16"), want_patterns=False)
    assert "too wide" not in why
    assert dp is not None  # two masks over the frame: the dot kernel takes them
