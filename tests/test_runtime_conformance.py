"""Conformance of every registered (operation, representation, runtime) kernel to the CPU reference.

The cases come from :data:`quantem_flow.runtimes.MANIFEST` (plus every name of
:data:`~quantem_flow.runtimes.AUTO_ORDER`, so a CUDA case always appears and
says why it did not run).  Inputs are fresh random arrays each run (the seed
is printed); frames are rectangular (k_r != k_c), frame counts odd and not a
multiple of 4, every input dtype the readers produce, 0/1/2/5 weight rows of
0/1 masks and of signed reals, sum/max on and off, NaN and infinities in real
data.

The CPU reference itself is checked against a plain NumPy oracle in the same
case, so the ``cpu`` cases are not tautological.

Unwritten output elements: the runtime API takes no output buffers, so just
before each call the allocators the runtime draws from (NumPy's heap; MLX's
buffer cache; CuPy's memory pool) are filled with the *bitwise complement* of
the expected outputs, in the output sizes, and released.  A kernel that
leaves an element of a recycled buffer unwritten returns the complement's
value there, which never equals the expected value (a NaN complements to a
non-NaN), so the comparison below fails.  ``test_poison_catches_an_unwritten_element``
shows this on a deliberately broken runtime.

Tolerances (one row per operation output; u = 2**-53 = 1.1e-16):
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    ParameterError,
    RuntimeUnavailableError,
    UnsupportedOperationError,
)
from quantem_flow.representations import chunk_of, get_representation
from quantem_flow.runtimes import (
    AUTO_ORDER,
    MANIFEST,
    FramePassResult,
    Runtime,
    available_runtimes,
    get_runtime,
    resolve_backend,
)
from quantem_flow.runtimes.cpu import CpuRuntime
from tests.conftest import probe_data


@dataclasses.dataclass(frozen=True)
class Tol:
    """``|got - ref| <= rtol * scale`` element-wise; ``rtol == 0`` means bit-exact."""

    rtol: float
    scale: str
    why: str


#: (operation, output, data/weights) -> tolerance.
TOLERANCES: dict[tuple[str, str, str], Tol] = {
    ("frame_pass", "per_frame", "integer data, 0/1 weights"): Tol(
        0.0,
        "-",
        "every partial sum is an integer below 2**53 (uint32 x 286 pixels < 2**41), "
        "exact in float64 in any order",
    ),
    ("frame_pass", "per_frame", "otherwise"): Tol(
        1e-12,
        "|frames| @ |weights|.T",
        "float64 sum of K products in any order (incl. FMA): |err| <= K*u*sum|x*w|; "
        "K = 286 here gives 3.2e-14, within 1e-12 up to K ~ 9000",
    ),
    ("frame_pass", "pattern_sum", "integer data"): Tol(
        0.0, "-", "widened integer (int64) sums are exact; the dtype must be int64"
    ),
    ("frame_pass", "pattern_sum", "real data"): Tol(
        1e-12,
        "sum |frames|",
        "float64 sum of n <= 37 terms in any order: |err| <= n*u*sum|x|",
    ),
    ("frame_pass", "pattern_max", "any"): Tol(
        0.0, "-", "a maximum is one of the inputs: exact, in the data's dtype, NaN like numpy.max"
    ),
}
__doc__ = (__doc__ or "") + "".join(
    f"\n- {op} {out} ({case}): "
    + (f"rtol {t.rtol:g} of {t.scale}" if t.rtol else "exact")
    + f" -- {t.why}"
    for (op, out, case), t in TOLERANCES.items()
)

DTYPES = ("uint8", "uint16", "uint32", "int16", "float32", "float64")
DETECTOR = (13, 22)  # rectangular: k_r != k_c
N_FRAMES = (1, 37)  # odd, not a multiple of 4 (the CPU kernel blocks 4 frames)
N_WEIGHTS = (0, 1, 2, 5)
REDUCTIONS = ((False, False), (True, False), (False, True), (True, True))

#: Extra constructor variants of a runtime, beyond its registered default.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {"mps": {"metal": {"path": "metal"}}}

_RUNTIME_MARKS = {"mps": [pytest.mark.mps], "cuda": [pytest.mark.cuda]}


def _kernels() -> list[tuple[str, str]]:
    return sorted({(str(k[0]), str(k[1])) for e in MANIFEST.values() for k in e["kernels"]})


def _runtime_cases(operation: str = "frame_pass") -> list[Any]:
    cases = []
    for op, rep in _kernels():
        if op != operation:
            continue
        for name in sorted(set(MANIFEST) | set(AUTO_ORDER)):
            for variant in ("default", *VARIANTS.get(name, {})):
                cases.append(
                    pytest.param(
                        op,
                        rep,
                        name,
                        variant,
                        id=f"{op}-{rep}-{name}-{variant}",
                        marks=_RUNTIME_MARKS.get(name, []),
                    )
                )
    return cases


def _skip_or_runtime(op: str, rep: str, name: str, variant: str) -> Runtime:
    """Return the runtime under test or skip with the reason it cannot run here."""
    gpu_note = (
        " -- no GPU answers here; a skipped CUDA test is NOT evidence that CUDA works"
        if name == "cuda"
        else ""
    )
    if name not in MANIFEST:
        pytest.skip(f"runtime {name!r} is not registered in MANIFEST{gpu_note}")
    if (op, rep) not in {(k[0], k[1]) for k in MANIFEST[name]["kernels"]}:
        pytest.skip(f"runtime {name!r} registers no {op!r} kernel on {rep!r}")
    try:
        runtime = get_runtime(name)
    except RuntimeUnavailableError as exc:
        pytest.skip(f"runtime {name!r} unavailable: {exc}{gpu_note}")
    if variant != "default":
        try:
            runtime = type(runtime)(**VARIANTS[name][variant])
        except (UnsupportedOperationError, RuntimeUnavailableError) as exc:
            pytest.skip(f"{name} variant {variant!r} cannot run here (never tested here): {exc}")
    return runtime


# ----------------------------------------------------------------------------- inputs


def _frames(
    rng: np.random.Generator, dtype: str, n: int, nonfinite: bool, rep: str = "dense"
) -> np.ndarray:
    k = DETECTOR[0] * DETECTOR[1]
    dt = np.dtype(dtype)
    if dt.kind in "ui":
        info = np.iinfo(dt)
        out = rng.integers(info.min, info.max, size=(n, k), dtype=dt, endpoint=True)
        if rep != "dense":  # counted-like: mostly empty pixels, some frames empty
            out[rng.random((n, k)) < 0.9] = 0
            out[:: max(n // 3, 1)][:1] = 0
        out.flat[rng.integers(0, out.size, size=3)] = info.max  # extremes always present
        out.flat[rng.integers(0, out.size, size=3)] = info.min
        return out
    out = (rng.standard_normal((n, k)) * 1000.0).astype(dt)
    if nonfinite:
        # NaN in the first frame, in the last frame only, and after finite values
        out[0, 0] = np.nan
        out[-1, 1] = np.nan
        out[n // 2, 2] = np.nan
        out[n // 2, 3] = np.inf
        out[-1, 4] = -np.inf
        out.flat[rng.integers(5 * n, out.size, size=4)] = np.nan
    return out


def _weights(rng: np.random.Generator, m: int, kind: str) -> np.ndarray:
    k = DETECTOR[0] * DETECTOR[1]
    if kind == "binary":
        return (rng.random((m, k)) < 0.4).astype(np.float64)
    return rng.standard_normal((m, k)) * rng.uniform(0.1, 10.0, size=(m, 1))


def _data_cases() -> list[Any]:
    out = []
    for dtype in DTYPES:
        for nonfinite in (False, True) if dtype.startswith("float") else (False,):
            for m in N_WEIGHTS:
                for kind in ("binary", "real") if m else ("binary",):
                    out.append(
                        pytest.param(
                            dtype,
                            nonfinite,
                            m,
                            kind,
                            id=f"{dtype}{'-nan' if nonfinite else ''}-m{m}-{kind}",
                        )
                    )
    return out


# ----------------------------------------------------------------------------- poison


def _complement(a: np.ndarray) -> np.ndarray:
    """Bitwise complement of ``a``'s bytes: differs from ``a`` in every element, NaN included."""
    return np.bitwise_not(np.ascontiguousarray(a).view(np.uint8))


def _poison(runtime_name: str, expected: list[np.ndarray], copies: int = 8) -> None:
    """Fill and release buffers of the outputs' sizes in the allocators the runtime uses."""
    blobs: list[np.ndarray] = []
    for a in expected:
        c = _complement(a)
        blobs.append(c)
        if a.ndim == 2:  # the CPU kernel pads weight rows to an even count
            pad = np.resize(c, a.shape[0] * (a.shape[1] + 1) * a.itemsize)
            blobs.append(pad)
    held = [b.copy() for b in blobs for _ in range(copies)]
    del held
    if runtime_name == "mps":
        import mlx.core as mx

        dev = [mx.array(b) for b in blobs for _ in range(copies)]
        mx.eval(*dev)
        del dev
    elif runtime_name == "cuda":  # pragma: no cover - needs a GPU (never run here)
        import cupy as cp

        dev = [cp.asarray(b) for b in blobs for _ in range(copies)]
        cp.cuda.Device().synchronize()
        del dev


# ----------------------------------------------------------------------------- checks


def _oracle(
    frames: np.ndarray, weights: np.ndarray, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Plain NumPy: what the CPU reference must agree with."""
    f = frames.astype(np.float64)
    acc = np.int64 if frames.dtype.kind in "ui" else np.float64
    with np.errstate(invalid="ignore"):
        per_frame = f @ weights.T
    return FramePassResult(
        per_frame=per_frame,
        pattern_sum=frames.sum(axis=0, dtype=acc) if want_sum else None,
        pattern_max=frames.max(axis=0) if want_max else None,
    )


def _assert_close(
    got: np.ndarray, ref: np.ndarray, tol: Tol, scale: np.ndarray | None, what: str
) -> None:
    assert isinstance(got, np.ndarray), f"{what}: expected a NumPy host array, got {type(got)}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, expected {ref.dtype}"
    if tol.rtol == 0.0 or scale is None:
        np.testing.assert_array_equal(got, ref, err_msg=f"{what}: must be exact")
        return
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(
        got[~finite], ref[~finite], err_msg=f"{what}: non-finite elements must match exactly"
    )
    err = np.abs(got[finite] - ref[finite])
    bound = tol.rtol * scale[finite]
    bad = ~(err <= bound)  # NaN in got fails too
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {err.size} elements beyond rtol {tol.rtol:g} of "
        f"{tol.scale}; worst |err| {float(np.nanmax(err)):.3g} at bound "
        f"{float(bound[np.argmax(np.where(bad, err, -1))]):.3g}"
    )


def check_frame_pass(
    got: FramePassResult,
    ref: FramePassResult,
    frames: np.ndarray,
    weights: np.ndarray,
    *,
    want_sum: bool,
    want_max: bool,
    what: str,
) -> None:
    """Compare a frame pass with the reference under :data:`TOLERANCES`."""
    integer = frames.dtype.kind in "ui"
    binary = bool(np.isin(weights, (0.0, 1.0)).all())
    f_abs = np.abs(frames.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.nan_to_num(f_abs, posinf=0.0) @ np.abs(weights).T
    row = "integer data, 0/1 weights" if integer and binary else "otherwise"
    _assert_close(
        got.per_frame,
        ref.per_frame,
        TOLERANCES[("frame_pass", "per_frame", row)],
        scale,
        f"{what} per_frame",
    )
    if not want_sum:
        assert got.pattern_sum is None, f"{what}: pattern_sum returned but not requested"
    else:
        assert got.pattern_sum is not None and ref.pattern_sum is not None
        row = "integer data" if integer else "real data"
        with np.errstate(invalid="ignore"):
            s_scale = np.nan_to_num(f_abs, posinf=0.0).sum(axis=0)
        _assert_close(
            got.pattern_sum,
            ref.pattern_sum,
            TOLERANCES[("frame_pass", "pattern_sum", row)],
            s_scale,
            f"{what} pattern_sum",
        )
    if not want_max:
        assert got.pattern_max is None, f"{what}: pattern_max returned but not requested"
    else:
        assert got.pattern_max is not None and ref.pattern_max is not None
        _assert_close(
            got.pattern_max,
            ref.pattern_max,
            TOLERANCES[("frame_pass", "pattern_max", "any")],
            None,
            f"{what} pattern_max",
        )


def _payload(rep: str, frames: np.ndarray) -> Any:
    """The frames as one chunk in representation ``rep`` (skip what it cannot hold)."""
    k = frames.shape[1]
    det = DETECTOR if k == DETECTOR[0] * DETECTOR[1] else (1, k)
    block = frames.reshape(1, frames.shape[0], *det)
    if rep == "dense":
        return block
    try:
        payload = get_representation(rep).from_dense(block)
    except ParameterError as exc:  # admission: e.g. negative or real data in a counted layout
        pytest.skip(f"the {rep} representation does not hold this data: {exc}")
    get_representation(rep).check(block, payload, full=True)
    return payload


def _run_checked(
    runtime: Runtime,
    poison_as: str,
    frames: np.ndarray,
    weights: np.ndarray,
    want_sum: bool,
    want_max: bool,
    what: str,
    rep: str = "dense",
) -> None:
    reference = CpuRuntime()
    ref = reference.frame_pass(frames, weights, want_sum=want_sum, want_max=want_max)
    check_frame_pass(
        ref,
        _oracle(frames, weights, want_sum, want_max),
        frames,
        weights,
        want_sum=want_sum,
        want_max=want_max,
        what=f"{what} (CPU reference vs NumPy oracle)",
    )
    expected = [
        a for a in (ref.per_frame, ref.pattern_sum, ref.pattern_max) if a is not None and a.size
    ]
    f_in, w_in = frames.copy(), weights.copy()
    payload = _payload(rep, frames)
    _poison(poison_as, expected)
    if rep == "dense":
        got = runtime.frame_pass(frames, weights, want_sum=want_sum, want_max=want_max)
    else:
        handle = runtime.put(chunk_of(rep, payload))
        got = runtime.run_frame_pass(handle, weights, want_sum=want_sum, want_max=want_max)
        runtime.release(handle)
    np.testing.assert_array_equal(frames, f_in, err_msg=f"{what}: the kernel modified its frames")
    np.testing.assert_array_equal(weights, w_in, err_msg=f"{what}: the kernel modified weights")
    check_frame_pass(got, ref, frames, weights, want_sum=want_sum, want_max=want_max, what=what)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize(("want_sum", "want_max"), REDUCTIONS, ids=lambda b: "on" if b else "off")
@pytest.mark.parametrize(("dtype", "nonfinite", "n_weights", "kind"), _data_cases())
@pytest.mark.parametrize(("op", "rep", "name", "variant"), _runtime_cases())
def test_kernel_matches_cpu_reference(
    op: str,
    rep: str,
    name: str,
    variant: str,
    dtype: str,
    nonfinite: bool,
    n_weights: int,
    kind: str,
    want_sum: bool,
    want_max: bool,
    rng: np.random.Generator,
) -> None:
    runtime = _skip_or_runtime(op, rep, name, variant)
    assert op == "frame_pass", f"no conformance driver for {(op, rep)}"
    weights = _weights(rng, n_weights, kind)
    for n in N_FRAMES:
        frames = _frames(rng, dtype, n, nonfinite, rep)
        _run_checked(
            runtime,
            name,
            frames,
            weights,
            want_sum,
            want_max,
            f"{name}/{variant} {rep} {dtype} n={n} m={n_weights} {kind}",
            rep,
        )


@pytest.mark.parametrize(("op", "rep", "name", "variant"), _runtime_cases())
def test_empty_block_matches_cpu_reference(op: str, rep: str, name: str, variant: str) -> None:
    runtime = _skip_or_runtime(op, rep, name, variant)
    k = DETECTOR[0] * DETECTOR[1]
    for dtype in DTYPES:
        frames = np.zeros((0, k), dtype=dtype)
        weights = np.ones((3, k))
        ref = CpuRuntime().frame_pass(frames, weights, want_sum=True, want_max=True)
        if rep == "dense":
            got = runtime.frame_pass(frames, weights, want_sum=True, want_max=True)
        else:
            try:
                payload = get_representation(rep).from_dense(frames.reshape(1, 0, *DETECTOR))
            except ParameterError:
                continue  # this dtype is not held by the representation
            handle = runtime.put(chunk_of(rep, payload))
            got = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=True)
        for a, b in zip(
            (got.per_frame, got.pattern_sum, got.pattern_max),
            (ref.per_frame, ref.pattern_sum, ref.pattern_max),
            strict=True,
        ):
            assert a is not None and b is not None
            assert a.shape == b.shape and a.dtype == b.dtype, (dtype, a.dtype, b.dtype)
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("op", "rep", "name", "variant"), _runtime_cases())
def test_integer_sums_widen_over_many_frames(op: str, rep: str, name: str, variant: str) -> None:
    """70001 frames of extreme values: a 32-bit accumulator anywhere would overflow."""
    runtime = _skip_or_runtime(op, rep, name, variant)
    n = 70_001
    for dtype in ("uint16", "int16", "uint32"):
        info = np.iinfo(dtype)
        frames = np.empty((n, 5), dtype=dtype)
        frames[:, :2] = info.max
        frames[:, 2:4] = info.min
        frames[:, 4] = np.arange(n) % (int(info.max) + 1)
        weights = np.eye(5)[:2]
        if rep != "dense" and info.min < 0:
            continue  # counted layouts hold no negative values (admission is tested elsewhere)
        _run_checked(
            runtime,
            name,
            frames,
            weights,
            True,
            True,
            f"{name}/{variant} {rep} {dtype} n={n}",
            rep,
        )


class _LeakyRuntime(CpuRuntime):
    """A broken runtime: leaves the last element of per_frame unwritten."""

    def frame_pass(
        self, frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        out = np.empty((frames.shape[0], weights.shape[0]), dtype=np.float64)
        good = super().frame_pass(frames, weights, want_sum=want_sum, want_max=want_max)
        out.flat[:-1] = good.per_frame.flat[:-1]
        return FramePassResult(out, good.pattern_sum, good.pattern_max)


def test_poison_catches_an_unwritten_element(rng: np.random.Generator) -> None:
    frames = _frames(rng, "uint16", 37, False)
    weights = _weights(rng, 5, "real")
    with pytest.raises(AssertionError, match="per_frame"):
        _run_checked(_LeakyRuntime(), "cpu", frames, weights, True, True, "leaky")


def test_every_registered_runtime_is_a_conformance_case() -> None:
    ids = {p.id for op in ("frame_pass", "ssb") for p in _runtime_cases(op)}
    ops_with_a_driver = {"frame_pass", "ssb"}
    for name, entry in MANIFEST.items():
        for op, rep, _ in entry["kernels"]:
            if op == "gather":
                continue
            assert op in ops_with_a_driver, f"no conformance driver for operation {op!r}"
            assert f"{op}-{rep}-{name}-default" in ids
    assert any("-cuda-" in i for i in ids), "a CUDA case must always appear (and say why it skips)"


# ----------------------------------------------------------------------------- mps specifics


def _mps() -> Runtime:
    try:
        return get_runtime("mps")
    except RuntimeUnavailableError as exc:
        pytest.skip(f"mps unavailable: {exc}")


@pytest.mark.mps
def test_mps_round_trips_every_dtype_exactly(rng: np.random.Generator) -> None:
    rt: Any = _mps()
    for dtype in (*DTYPES, "int8", "int32", "int64", "uint64", "float16", ">u2", ">f8"):
        host = _frames(rng, np.dtype(dtype).newbyteorder("=").name, 5, False)
        host = host.astype(dtype).reshape(5, *DETECTOR)
        dev = rt.to_device(host)
        back = rt.to_host(dev)
        assert back.dtype == host.dtype.newbyteorder("="), (dtype, back.dtype)
        assert back.shape == host.shape
        np.testing.assert_array_equal(back, host)
        # a resident payload runs without a host round trip
        frames = dev.reshape(5, -1)
        if np.dtype(dtype).name in (*DTYPES, "int8", "int32"):  # what the CPU reference takes
            w = _weights(rng, 2, "real")
            got = rt.frame_pass(frames, w, want_sum=True, want_max=True)
            ref = CpuRuntime().frame_pass(
                np.ascontiguousarray(back.reshape(5, -1)), w, want_sum=True, want_max=True
            )
            check_frame_pass(
                got,
                ref,
                back.reshape(5, -1),
                w,
                want_sum=True,
                want_max=True,
                what=f"resident {dtype}",
            )


@pytest.mark.mps
def test_mps_blocks_of_frames_join_up(rng: np.random.Generator) -> None:
    """Tiny blocks force many blocks per call: per_frame rows and sums must join exactly."""
    _mps()
    from quantem_flow.runtimes.mps.kernels import frame_pass_mlx

    k = DETECTOR[0] * DETECTOR[1]
    for dtype in DTYPES:
        frames = _frames(rng, dtype, 37, dtype.startswith("float"))
        weights = _weights(rng, 3, "real")
        per_frame, s, m = frame_pass_mlx(
            frames, weights, want_sum=True, want_max=True, block_bytes=8 * k * 3
        )
        ref = CpuRuntime().frame_pass(frames, weights, want_sum=True, want_max=True)
        check_frame_pass(
            FramePassResult(per_frame, s, m),
            ref,
            frames,
            weights,
            want_sum=True,
            want_max=True,
            what=f"blocks of 3 frames, {dtype}",
        )


@pytest.mark.mps
def test_mps_records_the_precision_it_used() -> None:
    d = _mps().describe()
    assert d["runtime"] == "mps"
    assert d["per_frame_accumulation"] == "float64"
    assert d["per_frame_device"] == "cpu"
    assert "never" in d["lowered_precision"]
    assert d["device"] in ("cpu", "gpu")


@pytest.mark.mps
def test_auto_does_not_pick_mlx_on_a_cpu() -> None:
    _mps()
    from quantem_flow.runtimes.mps import MpsRuntime

    eligible, why = MpsRuntime.auto_eligible()
    choice = resolve_backend("auto")
    if eligible:  # pragma: no cover - MLX on a Metal GPU
        assert choice.chosen in ("cuda", "mps")
        return
    assert "not an accelerator" in why
    assert choice.chosen == "cpu"
    assert "skipped by auto: mps" in choice.reason and "not an accelerator" in choice.reason
    assert resolve_backend("mps").chosen == "mps"


def test_mps_unavailable_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantem_flow.runtimes import mps as mps_module

    mps_module._probe.cache_clear()
    monkeypatch.setitem(sys.modules, "mlx.core", None)  # import mlx.core -> ImportError
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setattr("quantem_flow.runtimes.registry._instances", {})
    try:
        ok, why = mps_module.MpsRuntime.available()
        assert not ok and "does not import" in why
        assert "mps" not in available_runtimes()
        with pytest.raises(RuntimeUnavailableError, match=r"cpu"):
            resolve_backend("mps")
        assert resolve_backend("auto").chosen == "cpu"
    finally:
        mps_module._probe.cache_clear()


# ----------------------------------------------------------------------------- engine


@pytest.mark.mps
def test_compute_through_the_engine_on_mps_matches_cpu(rng: np.random.Generator) -> None:
    _mps()
    data = probe_data(rng, scan=(7, 9), det=(20, 26))
    ds = qf.open(data, chunk_rows=3)
    center = (8.6, 14.2)

    def lazy() -> list[Any]:
        return [
            qf.virtual_bf(ds, radius=4.5, center=center),
            qf.virtual_adf(ds, inner=7, center=center),
            qf.center_of_mass(ds, center=center),
            qf.mean_diffraction(ds),
            qf.max_diffraction(ds),
        ]

    on_mps = qf.compute(*lazy(), backend="mps", client="synchronous")
    on_cpu = qf.compute(*lazy(), backend="cpu", client="synchronous")
    exact: Callable[[Any, Any], None] = np.testing.assert_array_equal
    for a, b in zip(on_mps, on_cpu, strict=True):
        if isinstance(a, qf.VectorField):  # real weights: float64 sums in another order
            np.testing.assert_allclose(a.data, b.data, rtol=1e-12, atol=0)
        else:
            exact(a.data, b.data)
        ex = a.provenance.execution
        assert ex["backend"] == {
            "requested": "mps",
            "chosen": "mps",
            "reason": "requested explicitly",
        }
        assert ex["runtimes"] == ["mps"]
        assert len(ex["chunks"]) == len(ds.chunks) == 3
        assert all(r["runtime"] == "mps" for r in ex["chunks"])
        assert b.provenance.execution["runtimes"] == ["cpu"]


# ----------------------------------------------------------------------------- SSB stage

#: SSB stage tolerances: relative to the largest magnitude of the reference sums.
SSB_TOLERANCE = {
    "complex128": 1e-10,  # FFTs and sums of ~1e4 terms in float64, any order
    "complex64": 1e-4,  # MLX: complex64 FFT only, allowed explicitly (allow_complex64)
}


@pytest.mark.parametrize(("op", "rep", "name", "variant"), _runtime_cases("ssb"))
def test_ssb_stage_matches_cpu_reference(
    op: str, rep: str, name: str, variant: str, rng: np.random.Generator
) -> None:
    """The SSB FFT + trotter accumulation on fresh random bright-field data, every runtime."""
    from quantem_flow.runtimes import ssb_kernels as sk

    _skip_or_runtime(op, rep, name, variant)
    ops = sk.make_ops(name)
    ref_ops = sk.make_ops("cpu")
    scan = (21, 26)  # rectangular, odd and even
    n_pix = 37
    alpha = 0.02
    lam = 0.0197
    grid = sk.QGrid.build(scan, (0.35, 0.41), lam, alpha)
    theta = rng.uniform(0, 2 * np.pi, n_pix)
    radius = alpha * np.sqrt(rng.uniform(0, 0.95, n_pix))
    v_r, v_c = radius * np.cos(theta), radius * np.sin(theta)
    block = rng.poisson(50.0, (n_pix, *scan)).astype(np.uint16)
    inv_mean = 1.0 / block.reshape(n_pix, -1).mean(axis=1)
    ab = sk.Aberrations(
        {
            (1, 0): (float(rng.uniform(-80, 80)), 0.0),
            (1, 2): (float(rng.uniform(0, 20)), float(rng.uniform(0, np.pi))),
        }
    )
    ref = sk.accumulate(
        ref_ops, sk.spectra(ref_ops, block, inv_mean, grid), v_r, v_c, grid, ab, lam
    )
    got = sk.accumulate(ops, sk.spectra(ops, block, inv_mean, grid), v_r, v_c, grid, ab, lam)
    tol = SSB_TOLERANCE["complex64" if name == "mps" else "complex128"]
    for field in ("s1", "s2", "e1", "e2"):
        a, b = getattr(got, field), getattr(ref, field)
        scale = float(np.max(np.abs(b))) or 1.0
        assert np.max(np.abs(a - b)) <= tol * scale, (name, field)
    np.testing.assert_array_equal(got.n1, ref.n1)  # trotter membership is exact geometry
    np.testing.assert_array_equal(got.n2, ref.n2)
    c_got, rec_got = sk.assemble(got, grid)
    c_ref, rec_ref = sk.assemble(ref, grid)
    assert np.max(np.abs(c_got - c_ref)) <= tol * 10 * (float(np.max(np.abs(c_ref))) or 1.0)
    assert abs(rec_got["loss"] - rec_ref["loss"]) <= tol * 10
