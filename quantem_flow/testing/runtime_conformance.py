"""The runtime conformance suite: every declared kernel of a runtime against the CPU reference.

A runtime declares ``(operation, representation, dtype)`` triples
(:class:`~quantem_flow.runtimes.registry.RuntimeSpec`); this suite makes one
case per declared triple and nothing else, and exercises the runtime only
through the payload contract: ``put`` a host chunk, ``run_frame_pass`` /
``run_gather`` on the handle, ``release`` it.  The same cases run on the
built-in runtimes, on a third-party runtime and on a bridge to an external
worker (``webgpu``...), which is what makes "conformant" mean the same thing
everywhere.

Running it on a runtime
-----------------------
In a test module of any package (the runtime registered by name, by its
distribution's entry point or by ``register_runtime``)::

    import pytest
    from quantem_flow.testing import conformance_params, run_case

    @pytest.mark.parametrize("case", conformance_params(["webgpu"]))
    def test_webgpu_conforms(case):
        run_case(case)

``run_case(case, factory=...)`` takes a factory (a callable returning the
:class:`~quantem_flow.runtimes.base.Runtime`) when the runtime needs
arguments or is not registered under the case's name.  A runtime that is not
available here makes ``run_case`` skip with the reason (``skip_unavailable=False``
raises instead); a skip is not evidence.

Inputs
------
Fresh random arrays each run: frames are rectangular (``k_r != k_c``),
frame counts odd and not a multiple of 4 (1 and 37), 0/1/2/5 weight rows of
0/1 masks and of signed reals, sum/max on and off, NaN and infinities in
real data, the dtype's extremes in integer data (for ``paired`` and
``packed``, the non-negative range the representation holds), an empty
block, and 70001 frames of extremes (a 32-bit accumulator anywhere would
overflow).  Real dtypes also run :func:`check_nonfinite_support`: NaN, +inf
and -inf pixels inside some weight rows' support and outside others'; a row
whose nonzero weights miss every bad pixel must stay finite (no ``0 * NaN``),
the others are NaN or +-inf as IEEE says (docs/runtimes.md, "Non-finite
pixels"), and the oracle sums over nonzero weights only.  Encoded payloads
hold several pieces of several LZ4 blocks with raw tails.

The CPU reference itself is checked against a plain NumPy oracle in every
case, so the ``cpu`` cases are not tautological.

Unwritten output elements
-------------------------
The contract takes no output buffers, so just before each run the
allocators the runtime draws from (NumPy's heap always; MLX's buffer cache
for ``mps``, CuPy's pool for ``cuda`` residencies, see
:func:`register_poisoner`) are filled with the *bitwise complement* of the
expected outputs, in the output sizes, and released.  A kernel that leaves
an element of a recycled buffer unwritten returns the complement there,
which never equals the expected value (a NaN complements to a non-NaN).
An external worker's own allocator is out of reach; its results travel as
fresh buffers.

Tolerances
----------
They follow the runtime's declared accumulation
(:meth:`~quantem_flow.runtimes.base.Runtime.precision`): ``real`` is
``float64`` or ``float32`` (WGSL has no f64), ``integer`` is ``int64``,
``uint64`` or ``u32x2`` (two 32-bit words with carry), all exact.  With
``u = 2**-53`` (float64) or ``2**-24`` (float32), ``K`` pixels per frame and
``n`` frames, an element passes when ``|got - ref| <= rtol * scale``:
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import (
    ParameterError,
    QuantemFlowError,
    RuntimeUnavailableError,
    UnsupportedOperationError,
)
from ..representations import Chunk, chunk_of, get_representation
from ..runtimes.base import FramePassResult, Precision, Runtime

__all__ = [
    "DETECTOR",
    "N_FRAMES",
    "N_WEIGHTS",
    "OPERATIONS_DRIVEN",
    "REDUCTIONS",
    "SSB_TOLERANCE",
    "ConformanceCase",
    "RuntimeFactory",
    "Tol",
    "check_empty_block",
    "check_frame_pass",
    "check_frame_pass_case",
    "check_frame_pass_cost",
    "check_frame_pass_stream",
    "check_gather_case",
    "check_nonfinite_support",
    "check_release",
    "check_ssb_case",
    "check_stream_row_digests",
    "check_wide_integer_sums",
    "conformance_cases",
    "conformance_params",
    "data_cases",
    "frames_for",
    "nonfinite_support_inputs",
    "oracle",
    "payload_for",
    "poison",
    "register_poisoner",
    "run_case",
    "tolerances",
    "weights_for",
]

#: A callable returning the runtime under test.
RuntimeFactory = Callable[[], Runtime]

DETECTOR = (13, 22)  # rectangular: k_r != k_c
N_FRAMES = (1, 37)  # odd, not a multiple of 4 (the CPU kernel blocks 4 frames)
N_WEIGHTS = (0, 1, 2, 5)
REDUCTIONS = ((False, False), (True, False), (False, True), (True, True))
#: Frames of the wide-sum case: 70001 * 65535 > 2**32.
WIDE_FRAMES = 70_001
#: Operations this suite has a driver for.
OPERATIONS_DRIVEN = ("frame_pass", "gather", "ssb")
#: Encoded payloads: several pieces, several LZ4 blocks each, raw tails.
ENCODED_OPTIONS: dict[str, Any] = {"frames_per_piece": 5, "block_size": 64}


# ----------------------------------------------------------------------------- tolerances


@dataclasses.dataclass(frozen=True)
class Tol:
    """``|got - ref| <= rtol * scale`` element-wise; ``rtol == 0`` means bit-exact."""

    rtol: float
    scale: str
    why: str


def _unit(real: str) -> float:
    return 2.0**-53 if real == "float64" else 2.0**-24


def tolerances(
    precision: Precision | None = None,
    *,
    n_pixels: int = DETECTOR[0] * DETECTOR[1],
    n_frames: int = max(N_FRAMES),
) -> dict[tuple[str, str, str], Tol]:
    """The tolerances for a runtime of ``precision``, keyed by (operation, output, case).

    Parameters
    ----------
    precision
        The runtime's declared accumulation (default float64 / int64).
    n_pixels
        ``K``, the pixels of a frame (terms of a per-frame sum).
    n_frames
        ``n``, the frames of a block (terms of a pattern sum).
    """
    p = precision or Precision()
    if p.real == "float64":
        per_frame = Tol(
            1e-12,
            "|frames| @ |weights|.T",
            "float64 sum of K products in any order (incl. FMA): |err| <= K*u*sum|x*w|, "
            f"u = 2**-53; K = {n_pixels} gives {n_pixels * _unit('float64'):.1e}, within 1e-12 "
            "up to K ~ 9000",
        )
        pattern_sum = Tol(
            1e-12, "sum |frames|", "float64 sum of n terms in any order: |err| <= n*u*sum|x|"
        )
    else:
        u = _unit("float32")
        per_frame = Tol(
            (n_pixels + 2) * u,
            "|frames| @ |weights|.T",
            "float32: data and weights rounded to float32 (2 roundings) and a sum of K "
            f"products in any order: |err| <= (K + 2)*u*sum|x*w|, u = 2**-24, K = {n_pixels}",
        )
        pattern_sum = Tol(
            (n_frames + 1) * u,
            "sum |frames|",
            "float32: data rounded to float32 and a sum of n terms in any order: "
            f"|err| <= (n + 1)*u*sum|x|, u = 2**-24, n = {n_frames}",
        )
    return {
        ("frame_pass", "per_frame", "integer data, 0/1 weights"): Tol(
            0.0,
            "-",
            f"exact ({p.integer} accumulation): every partial sum is an integer (uint32 x "
            f"{n_pixels} pixels < 2**41); 64-bit integer data take the row below",
        ),
        ("frame_pass", "per_frame", "otherwise"): per_frame,
        ("frame_pass", "pattern_sum", "integer data"): Tol(
            0.0,
            "-",
            "widened integer sums are exact: int64 (uint64 for uint64 data), wrapping like "
            "NumPy's; the dtype must match",
        ),
        ("frame_pass", "pattern_sum", "real data"): pattern_sum,
        ("frame_pass", "pattern_max", "any"): Tol(
            0.0,
            "-",
            "a maximum is one of the inputs: exact, in the data's dtype, NaN like numpy.max",
        ),
        ("gather", "values", "any"): Tol(0.0, "-", "copies of the input values, in its dtype"),
    }


#: SSB stage tolerances: relative to the largest magnitude of the reference sums.
SSB_TOLERANCE = {
    "complex128": 1e-10,  # FFTs and sums of ~1e4 terms in float64, any order
    "complex64": 1e-4,  # MLX: complex64 FFT only, allowed explicitly (allow_complex64)
}


def _tolerance_doc() -> str:
    lines = []
    for real in ("float64", "float32"):
        lines.append(f"\n``{real}`` accumulation:\n")
        for (op, out, case), t in tolerances(Precision(real=real)).items():
            rule = f"rtol {t.rtol:.3g} of ``{t.scale}``" if t.rtol else "exact"
            lines.append(f"- {op} {out} ({case}): {rule} -- {t.why}")
    lines.append(
        "\nSSB stage: max |difference| <= tol * max |reference| with tol "
        + ", ".join(f"{k} {v:g}" for k, v in SSB_TOLERANCE.items())
        + " (the adapter's declared FFT precision)."
    )
    return "\n".join(lines) + "\n"


__doc__ = (__doc__ or "") + _tolerance_doc()


# ----------------------------------------------------------------------------- inputs


def _admitted_range(dtype: np.dtype[Any], representation: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    if representation in ("paired", "packed"):  # non-negative counts
        hi = min(int(info.max), 65535) if representation == "packed" else int(info.max)
        return 0, hi
    return int(info.min), int(info.max)


def frames_for(
    rng: np.random.Generator,
    dtype: str,
    n: int,
    *,
    nonfinite: bool = False,
    representation: str = "dense",
    n_pixels: int = DETECTOR[0] * DETECTOR[1],
) -> np.ndarray:
    """Random ``(n, n_pixels)`` frames of ``dtype`` that ``representation`` holds exactly.

    Integer frames hold the extremes of the range; counted layouts (every
    representation but dense and encoded) are mostly empty pixels and have
    empty frames.  Real frames hold NaN and infinities when ``nonfinite``.
    """
    dt = np.dtype(dtype)
    if dt.kind in "ui":
        lo, hi = _admitted_range(dt, representation)
        out = rng.integers(lo, hi, size=(n, n_pixels), dtype=dt, endpoint=True)
        if representation not in ("dense", "encoded"):  # counted-like
            out[rng.random((n, n_pixels)) < 0.9] = 0
            out[:: max(n // 3, 1)][:1] = 0
        if out.size:
            out.flat[rng.integers(0, out.size, size=3)] = hi  # extremes always present
            out.flat[rng.integers(0, out.size, size=3)] = lo
        return out
    if dt.kind != "f":
        raise ParameterError(f"the conformance suite generates integer or real frames, not {dt}")
    out = (rng.standard_normal((n, n_pixels)) * 1000.0).astype(dt)
    if nonfinite and n:
        out[0, 0] = np.nan  # NaN in the first frame, in the last frame only, after finite values
        out[-1, 1] = np.nan
        out[n // 2, 2] = np.nan
        out[n // 2, 3] = np.inf
        out[-1, 4] = -np.inf
        if out.size > 5 * n:
            out.flat[rng.integers(5 * n, out.size, size=4)] = np.nan
    return out


def weights_for(
    rng: np.random.Generator, m: int, kind: str, n_pixels: int = DETECTOR[0] * DETECTOR[1]
) -> np.ndarray:
    """``(m, n_pixels)`` float64 weights: 0/1 masks (``"binary"``) or signed reals (``"real"``)."""
    if kind == "binary":
        return (rng.random((m, n_pixels)) < 0.4).astype(np.float64)
    return rng.standard_normal((m, n_pixels)) * rng.uniform(0.1, 10.0, size=(m, 1))


def data_cases(dtype: str) -> list[tuple[bool, int, str]]:
    """``(nonfinite, n_weights, kind)`` combinations a frame-pass triple of ``dtype`` runs."""
    real = np.dtype(dtype).kind == "f"
    out = []
    for nonfinite in (False, True) if real else (False,):
        for m in N_WEIGHTS:
            for kind in ("binary", "real") if m else ("binary",):
                out.append((nonfinite, m, kind))
    return out


def payload_for(representation: str, frames: np.ndarray, detector: tuple[int, int]) -> Chunk:
    """The frames as one host chunk ``(1, n)`` in ``representation``, checked exact."""
    block = frames.reshape(1, frames.shape[0], *detector)
    if representation == "dense":
        return chunk_of("dense", block)
    rep = get_representation(representation)
    options = ENCODED_OPTIONS if representation == "encoded" else {}
    payload = rep.from_dense(block, **options)
    rep.check(block, payload, full=True)
    return chunk_of(representation, payload)


# ----------------------------------------------------------------------------- poison

_POISONERS: dict[str, Callable[[list[np.ndarray]], None]] = {}


def register_poisoner(residency: str, fill: Callable[[list[np.ndarray]], None]) -> None:
    """Poison a device allocator: ``fill(blobs)`` allocates ``blobs`` there and frees them.

    Parameters
    ----------
    residency
        The residency prefix (``"cuda"``, ``"mps"``...) whose runtimes it serves.
    fill
        Called with the complement blobs (several copies each) before a run.
    """
    _POISONERS[residency] = fill


def _poison_mlx(blobs: list[np.ndarray]) -> None:
    import mlx.core as mx

    dev = [mx.array(b) for b in blobs]
    mx.eval(*dev)
    del dev


def _poison_cupy(blobs: list[np.ndarray]) -> None:  # pragma: no cover - needs a GPU
    import cupy as cp

    dev = [cp.asarray(b) for b in blobs]
    cp.cuda.Device().synchronize()
    del dev


register_poisoner("mps", _poison_mlx)
register_poisoner("cuda", _poison_cupy)


def _complement(a: np.ndarray) -> np.ndarray:
    """Bitwise complement of ``a``'s bytes: differs from ``a`` in every element, NaN included."""
    return np.bitwise_not(np.ascontiguousarray(a).view(np.uint8))


def poison(residency: str, expected: Sequence[np.ndarray], copies: int = 8) -> None:
    """Fill and release buffers of the outputs' sizes in the allocators a runtime uses.

    The host heap always; a device allocator when a poisoner is registered
    for ``residency``'s prefix (:func:`register_poisoner`).
    """
    blobs: list[np.ndarray] = []
    for a in expected:
        c = _complement(a)
        blobs.append(c)
        if a.ndim == 2:  # the CPU kernel pads weight rows to an even count
            blobs.append(np.resize(c, a.shape[0] * (a.shape[1] + 1) * a.itemsize))
    held = [b.copy() for b in blobs for _ in range(copies)]
    del held
    fill = _POISONERS.get(residency.split(":", 1)[0])
    if fill is not None:
        fill([b for b in blobs for _ in range(copies)])


# ----------------------------------------------------------------------------- checks


def _sum_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    if dtype.kind in "ui":
        return np.dtype(np.uint64 if dtype == np.uint64 else np.int64)
    return np.dtype(np.float64)


def oracle(
    frames: np.ndarray, weights: np.ndarray, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Plain NumPy: what the CPU reference must agree with.

    ``per_frame[i, j]`` sums ``frames[i, p] * weights[j, p]`` over the pixels
    with ``weights[j, p] != 0`` only: a NaN or infinite pixel outside a row's
    support leaves that row finite.  The patterns are per pixel: NumPy's sum
    (IEEE) and ``numpy.max`` (NaN wins, then +inf; -inf only if every frame
    holds it).
    """
    f = frames.astype(np.float64)
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if np.isfinite(f).all():
            per_frame = f @ w.T
        else:  # a zero weight skips its pixel, even a NaN or an infinity (no 0 * NaN)
            terms = np.where(w[None, :, :] != 0.0, f[:, None, :] * w[None, :, :], 0.0)
            per_frame = terms.sum(axis=2)
    return FramePassResult(
        per_frame=per_frame,
        pattern_sum=frames.sum(axis=0, dtype=_sum_dtype(frames.dtype)) if want_sum else None,
        pattern_max=frames.max(axis=0) if want_max else None,
    )


def _assert_close(got: Any, ref: np.ndarray, tol: Tol, scale: np.ndarray | None, what: str) -> None:
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
    precision: Precision | None = None,
) -> None:
    """Compare a frame pass with the reference under :func:`tolerances` of ``precision``.

    Raises
    ------
    AssertionError
        Naming the output, the number of elements off and the worst error.
    """
    table = tolerances(precision, n_pixels=frames.shape[1], n_frames=max(frames.shape[0], 1))
    integer = frames.dtype.kind in "ui"
    exact_ints = integer and frames.dtype.itemsize <= 4
    binary = bool(np.isin(weights, (0.0, 1.0)).all())
    f_abs = np.abs(frames.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.nan_to_num(f_abs, posinf=0.0) @ np.abs(weights).T
    row = "integer data, 0/1 weights" if exact_ints and binary else "otherwise"
    _assert_close(
        got.per_frame,
        ref.per_frame,
        table[("frame_pass", "per_frame", row)],
        scale,
        f"{what} per_frame",
    )
    if not want_sum:
        assert got.pattern_sum is None, f"{what}: pattern_sum returned but not requested"
    else:
        assert got.pattern_sum is not None, f"{what}: pattern_sum requested but not returned"
        assert ref.pattern_sum is not None
        row = "integer data" if integer else "real data"
        with np.errstate(invalid="ignore", over="ignore"):
            s_scale = np.nan_to_num(f_abs, posinf=0.0).sum(axis=0)
        _assert_close(
            got.pattern_sum,
            ref.pattern_sum,
            table[("frame_pass", "pattern_sum", row)],
            s_scale,
            f"{what} pattern_sum",
        )
    if not want_max:
        assert got.pattern_max is None, f"{what}: pattern_max returned but not requested"
    else:
        assert got.pattern_max is not None, f"{what}: pattern_max requested but not returned"
        assert ref.pattern_max is not None
        _assert_close(
            got.pattern_max,
            ref.pattern_max,
            table[("frame_pass", "pattern_max", "any")],
            None,
            f"{what} pattern_max",
        )


def _reference() -> Runtime:
    from ..runtimes.cpu import CpuRuntime

    return CpuRuntime()


def _check_handle(runtime: Runtime, host: Chunk, handle: Any, what: str) -> None:
    assert isinstance(handle, Chunk), f"{what}: put() returned {type(handle).__name__}, not a Chunk"
    assert handle.runtime == runtime.name, (
        f"{what}: the handle names runtime {handle.runtime!r}, expected {runtime.name!r}"
    )
    assert handle.residency == runtime.residency, (
        f"{what}: the handle is resident on {handle.residency!r}, the runtime reports "
        f"{runtime.residency!r}"
    )
    assert (handle.representation, handle.scan_slice) == (host.representation, host.scan_slice), (
        f"{what}: the handle changed the representation or scan slice"
    )
    assert isinstance(handle.nbytes, int) and handle.nbytes >= 0, f"{what}: bad nbytes"


def check_frame_pass_case(
    factory: RuntimeFactory,
    representation: str,
    dtype: str,
    *,
    n_weights: int,
    kind: str,
    nonfinite: bool,
    rng: np.random.Generator,
    reductions: Iterable[tuple[bool, bool]] = REDUCTIONS,
    n_frames: Iterable[int] = N_FRAMES,
    detector: tuple[int, int] = DETECTOR,
    what: str = "",
) -> None:
    """Check ``run_frame_pass`` of one declared triple on fresh data, through the contract.

    For every frame count and reduction: the CPU reference (itself checked
    against :func:`oracle`), then ``put`` -> poison -> ``run_frame_pass`` ->
    ``release`` on the runtime, compared under the runtime's tolerances;
    the inputs must come back unmodified.
    """
    runtime = factory()
    precision = runtime.precision()
    k = detector[0] * detector[1]
    weights = weights_for(rng, n_weights, kind, k)
    label = what or f"{runtime.name} frame_pass {representation} {dtype}"
    for n in n_frames:
        frames = frames_for(
            rng, dtype, n, nonfinite=nonfinite, representation=representation, n_pixels=k
        )
        host = payload_for(representation, frames, detector)
        for want_sum, want_max in reductions:
            case = f"{label} n={n} m={n_weights} {kind} sum={want_sum} max={want_max}"
            ref = _reference().frame_pass(frames, weights, want_sum=want_sum, want_max=want_max)
            check_frame_pass(
                ref,
                oracle(frames, weights, want_sum, want_max),
                frames,
                weights,
                want_sum=want_sum,
                want_max=want_max,
                what=f"{case} (CPU reference vs oracle)",
            )
            expected = [
                a for a in (ref.per_frame, ref.pattern_sum, ref.pattern_max) if a is not None
            ]
            f_in, w_in = frames.copy(), weights.copy()
            handle = runtime.put(host)
            _check_handle(runtime, host, handle, case)
            try:
                poison(runtime.residency, [a for a in expected if a.size])
                got = runtime.run_frame_pass(handle, weights, want_sum=want_sum, want_max=want_max)
            finally:
                runtime.release(handle)
            np.testing.assert_array_equal(frames, f_in, err_msg=f"{case}: frames were modified")
            np.testing.assert_array_equal(weights, w_in, err_msg=f"{case}: weights were modified")
            check_frame_pass(
                got,
                ref,
                frames,
                weights,
                want_sum=want_sum,
                want_max=want_max,
                what=case,
                precision=precision,
            )


def nonfinite_support_inputs(
    dtype: str, *, n: int = max(N_FRAMES), detector: tuple[int, int] = DETECTOR, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Frames with NaN, +inf and -inf pixels inside some weight rows' support, outside others'.

    Returns ``(frames, weights, expect)``: ``expect["finite_rows"]`` are the
    rows whose support (nonzero weights) holds no bad pixel, which must come
    out finite in every frame; ``expect["nonfinite"]`` maps ``(frame, row)``
    to ``"nan"``, ``"+inf"`` or ``"-inf"`` (IEEE); every other element is finite.
    """
    rng = np.random.default_rng(seed)
    k = detector[0] * detector[1]
    frames = (rng.standard_normal((n, k)) * 100.0).astype(dtype)
    a, b, c, d = 7, k // 2, k // 2 + 3, k - 1  # NaN, +inf, -inf, -inf in every frame
    last = n - 1  # the CPU kernel's tail (frames past the last multiple of 4)
    frames[3, a] = np.nan
    frames[last, a] = np.nan
    frames[5, b] = np.inf
    frames[7, c] = -np.inf
    frames[9 % n, b] = np.inf
    frames[9 % n, c] = -np.inf
    frames[:, d] = -np.inf
    bad = [a, b, c, d]
    weights = np.zeros((6, k))
    disk = rng.random(k) < 0.5
    disk[bad] = False
    weights[0, disk] = 1.0  # a BF-like 0/1 detector away from every bad pixel
    weights[1, ~disk] = 1.0  # an ADF-like 0/1 detector holding every bad pixel but d
    weights[1, d] = 0.0
    weights[2] = rng.standard_normal(k)  # signed reals (CoM-like), zero at the bad pixels
    weights[2, bad] = 0.0
    weights[3, b] = -2.5  # only +inf pixel, negative weight: -inf
    weights[3, disk] = 0.5
    weights[4, [b, c]] = 1.0  # +inf and -inf: NaN where both, else the one present
    weights[5, a] = 0.25  # the NaN pixel only
    expect: dict[str, Any] = {"finite_rows": [0, 2], "nonfinite": {}}
    nf: dict[tuple[int, int], str] = expect["nonfinite"]
    for i in (3, last):
        nf[(i, 1)] = "nan"
        nf[(i, 5)] = "nan"
    nf[(5, 1)] = "+inf"
    nf[(5, 3)] = "-inf"
    nf[(5, 4)] = "+inf"
    nf[(7, 1)] = "-inf"
    nf[(7, 4)] = "-inf"
    nf[(9 % n, 1)] = "nan"
    nf[(9 % n, 3)] = "-inf"
    nf[(9 % n, 4)] = "nan"
    return frames, weights, expect


def check_nonfinite_support(
    factory: RuntimeFactory,
    representation: str,
    dtype: str,
    *,
    detector: tuple[int, int] = DETECTOR,
) -> None:
    """A NaN or infinite pixel outside a weight row's support leaves that row finite.

    Rows whose support (nonzero weights) excludes every bad pixel must be
    finite and equal, within the runtime's tolerance, to the reference over
    the finite pixels; rows that include one are NaN or +-inf as IEEE says.
    The sum pattern is non-finite only at the bad pixels (NaN, +inf, -inf);
    the max pattern is NaN where a frame is NaN, +inf where one is +inf,
    -inf only where every frame is -inf.  Real dtypes only (a no-op otherwise).
    """
    if np.dtype(dtype).kind != "f":
        return
    runtime = factory()
    frames, weights, expect = nonfinite_support_inputs(dtype, detector=detector)
    k = frames.shape[1]
    what = f"{runtime.name} frame_pass {representation} {dtype} non-finite pixels"
    ref = oracle(frames, weights, True, True)
    handle = runtime.put(payload_for(representation, frames, detector))
    try:
        got = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=True)
    finally:
        runtime.release(handle)
    per = np.asarray(got.per_frame)
    labels: dict[str, Callable[[Any], Any]] = {
        "nan": np.isnan,
        "+inf": lambda v: v == np.inf,
        "-inf": lambda v: v == -np.inf,
    }
    expected_nonfinite = np.zeros(per.shape, dtype=bool)
    for (i, j), label in expect["nonfinite"].items():
        expected_nonfinite[i, j] = True
        assert labels[label](ref.per_frame[i, j]), f"{what}: oracle ({i}, {j}) is not {label}"
        assert labels[label](per[i, j]), (
            f"{what}: per_frame[{i}, {j}] is {per[i, j]!r}, expected {label} (the row's "
            "support holds the bad pixel)"
        )
    stray = ~np.isfinite(per) & ~expected_nonfinite
    assert not stray.any(), (
        f"{what}: {int(stray.sum())} per-frame values are non-finite although their weight "
        f"row has weight 0 on every bad pixel, first (frame, row) "
        f"{[tuple(int(v) for v in x) for x in np.argwhere(stray)[:5]]}: a pixel outside a "
        "row's support must not affect it (0 * NaN must not enter the sum)"
    )
    finite_f = np.where(np.isfinite(frames), frames, 0).astype(np.float64)
    clean = finite_f @ weights.T
    for j in expect["finite_rows"]:  # the oracle agrees with the sum over finite pixels
        np.testing.assert_allclose(ref.per_frame[:, j], clean[:, j], rtol=1e-12, atol=1e-9)
    check_frame_pass(
        got,
        ref,
        frames,
        weights,
        want_sum=True,
        want_max=True,
        what=what,
        precision=runtime.precision(),
    )
    assert got.pattern_sum is not None and got.pattern_max is not None
    s_bad = ~np.isfinite(got.pattern_sum)
    m_bad = ~np.isfinite(got.pattern_max.astype(np.float64))
    want_bad = np.zeros(k, dtype=bool)
    want_bad[~np.isfinite(frames).all(axis=0)] = True
    np.testing.assert_array_equal(
        s_bad, want_bad, err_msg=f"{what}: pattern_sum must be non-finite at the bad pixels only"
    )
    m_want = np.isnan(frames).any(axis=0) | np.isposinf(frames).any(axis=0)
    m_want |= np.isneginf(frames).all(axis=0)
    np.testing.assert_array_equal(
        m_bad, m_want, err_msg=f"{what}: pattern_max non-finite at the wrong pixels"
    )


def check_empty_block(
    factory: RuntimeFactory,
    representation: str,
    dtype: str,
    *,
    detector: tuple[int, int] = DETECTOR,
) -> None:
    """A chunk of zero frames gives empty per-frame rows and the reference's empty patterns."""
    runtime = factory()
    k = detector[0] * detector[1]
    frames = np.zeros((0, k), dtype=dtype)
    weights = np.ones((3, k))
    ref = _reference().frame_pass(frames, weights, want_sum=True, want_max=True)
    handle = runtime.put(payload_for(representation, frames, detector))
    try:
        got = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=True)
    finally:
        runtime.release(handle)
    what = f"{runtime.name} frame_pass {representation} {dtype} empty block"
    for name in ("per_frame", "pattern_sum", "pattern_max"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a is not None, f"{what}: {name} missing"
        assert a.shape == b.shape and a.dtype == b.dtype, (
            f"{what}: {name} is {a.dtype} {a.shape}, expected {b.dtype} {b.shape}"
        )
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}")


def check_wide_integer_sums(
    factory: RuntimeFactory, representation: str, dtype: str, *, n: int = WIDE_FRAMES
) -> None:
    """``n`` frames of extreme values: a 32-bit accumulator anywhere would overflow.

    Integer dtypes of at most 32 bits only (64-bit data sum modulo 2**64 by
    definition); a no-op for other dtypes.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "ui" or dt.itemsize > 4:
        return
    runtime = factory()
    lo, hi = _admitted_range(dt, representation)
    frames = np.empty((n, 5), dtype=dt)
    frames[:, :2] = hi
    frames[:, 2:4] = lo
    frames[:, 4] = np.arange(n) % (hi + 1)
    weights = np.eye(5)[:2]
    ref = _reference().frame_pass(frames, weights, want_sum=True, want_max=True)
    handle = runtime.put(payload_for(representation, frames, (1, 5)))
    try:
        got = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=True)
    finally:
        runtime.release(handle)
    check_frame_pass(
        got,
        ref,
        frames,
        weights,
        want_sum=True,
        want_max=True,
        what=f"{runtime.name} frame_pass {representation} {dtype} n={n} extremes",
        precision=runtime.precision(),
    )


def check_release(factory: RuntimeFactory, representation: str, dtype: str) -> None:
    """``release`` is idempotent, and a released device handle no longer runs."""
    runtime = factory()
    rng = np.random.default_rng(0)
    frames = frames_for(rng, dtype, 3, representation=representation)
    handle = runtime.put(payload_for(representation, frames, DETECTOR))
    runtime.release(handle)
    runtime.release(handle)  # idempotent
    if runtime.residency == "host":
        return
    try:
        runtime.run_frame_pass(
            handle, np.ones((1, frames.shape[1])), want_sum=False, want_max=False
        )
    except QuantemFlowError:
        return
    raise AssertionError(
        f"{runtime.name}: run_frame_pass on a released {runtime.residency!r} handle returned "
        "a result; a released handle must raise"
    )


def check_gather_case(
    factory: RuntimeFactory,
    representation: str,
    dtype: str,
    *,
    rng: np.random.Generator,
    detector: tuple[int, int] = DETECTOR,
) -> None:
    """``run_gather`` returns exactly the chosen pixels of every frame, in the data's dtype."""
    runtime = factory()
    k = detector[0] * detector[1]
    label = f"{runtime.name} gather {representation} {dtype}"
    for n in N_FRAMES:
        frames = frames_for(
            rng, dtype, n, nonfinite=True, representation=representation, n_pixels=k
        )
        host = payload_for(representation, frames, detector)
        chosen = np.unique(np.concatenate([[0, k - 1], rng.integers(0, k, 17)]))
        handle = runtime.put(host)
        _check_handle(runtime, host, handle, label)
        try:
            for idx in (chosen, np.zeros(0, dtype=np.int64), np.arange(k)):
                expected = np.ascontiguousarray(frames[:, idx])
                poison(runtime.residency, [expected] if expected.size else [])
                got = runtime.run_gather(handle, idx)
                _assert_close(
                    got,
                    expected,
                    tolerances()[("gather", "values", "any")],
                    None,
                    f"{label} n={n} {idx.size} pixels",
                )
        finally:
            runtime.release(handle)


def _mask_and_moment_rows(detector: tuple[int, int]) -> np.ndarray:
    """BF, ADF and a centre of mass's three rows about an off-grid centre, float64."""
    rr, cc = np.mgrid[: detector[0], : detector[1]]
    centre = ((detector[0] - 1) / 2 + 0.3, (detector[1] - 1) / 2 - 0.2)
    d = np.hypot(rr - centre[0], cc - centre[1])
    reach = min(detector) / 2
    rows = [d < reach / 3, d >= reach / 2, np.ones(detector), rr - centre[0], cc - centre[1]]
    return np.stack([np.asarray(r, dtype=np.float64).ravel() for r in rows])


def check_frame_pass_stream(
    factory: RuntimeFactory,
    dtype: str,
    *,
    rng: np.random.Generator,
    detector: tuple[int, int] = DETECTOR,
) -> bool:
    """A runtime's :meth:`~quantem_flow.runtimes.base.Runtime.frame_pass_stream`, fed in pieces.

    Frames (with NaN and infinities when real) go in uneven pieces (1, 5,
    4, 13 and the rest of 37) through a stream with a disk and an annulus
    mask, a whole-detector mask, its two moment rows about an off-grid
    centre, a real-valued row, both patterns and a gather; the result must
    equal the CPU reference on the whole block under the runtime's
    tolerances and the gathered pixels must be exact.  A gather-only stream
    runs no frame pass.  Feeding more frames than declared, or finishing
    early, raises ``ValueError``.  A stream that can stop early
    (:attr:`~quantem_flow.runtimes.base.FramePassStream.can_stop_early`) gives
    the pass over the frames it kept.

    Returns
    -------
    bool
        ``False`` when the runtime offers no stream (its chunks are then
        loaded whole: nothing else to check), ``True`` once checked.
    """
    runtime = factory()
    k = detector[0] * detector[1]
    n = 37
    frames = frames_for(rng, dtype, n, nonfinite=True, n_pixels=k)
    weights = np.concatenate([_mask_and_moment_rows(detector), rng.standard_normal((1, k))])
    idx = np.unique(np.concatenate([[0, k - 1], rng.integers(0, k, 11)]))
    label = f"{runtime.name} frame_pass_stream {dtype}"
    stream = _full_stream(runtime, weights, frames, idx, detector)
    if stream is None:
        return False
    for a, b in ((0, 1), (1, 6), (6, 10), (10, 23), (23, n)):
        stream.feed(frames[a:b])
    _check_finished(runtime, stream, frames, weights, idx, label)
    only = runtime.frame_pass_stream(
        np.zeros((0, k)),
        n_frames=n,
        frame_shape=detector,
        dtype=frames.dtype,
        want_sum=False,
        want_max=False,
        gather=idx,
    )
    assert only is not None, f"{label}: a stream offered once must be offered again"
    only.feed(frames[:20])
    with _raises(ValueError, f"{label}: finishing after 20 of {n} frames"):
        only.finish()
    only.feed(frames[20:])
    with _raises(ValueError, f"{label}: feeding beyond {n} frames"):
        only.feed(frames[:1])
    result, values = only.finish()
    assert result.per_frame.shape == (n, 0), f"{label}: a gather-only stream ran a frame pass"
    assert result.pattern_sum is None and result.pattern_max is None
    assert values is not None
    np.testing.assert_array_equal(values, frames[:, idx], err_msg=f"{label} gather only")
    _check_stream_stops_early(runtime, frames, weights, idx, detector, label)
    _check_stream_sweeps(runtime, frames, weights, idx, detector, label)
    return True


def _check_finished(
    runtime: Any,
    stream: Any,
    frames: np.ndarray,
    weights: np.ndarray,
    idx: np.ndarray | None,
    what: str,
    *,
    patterns: bool = True,
) -> None:
    """``stream`` (fed ``frames``) finishes as the reference pass over them.

    With the sum and maximum patterns where ``patterns``, and the gather of the
    pixels ``idx`` where given.
    """
    got, gathered = stream.finish()
    ref = _reference().frame_pass(frames, weights, want_sum=patterns, want_max=patterns)
    check_frame_pass(
        got,
        ref,
        frames,
        weights,
        want_sum=patterns,
        want_max=patterns,
        what=what,
        precision=runtime.precision(),
    )
    if idx is not None:
        assert gathered is not None, f"{what}: a gather was asked for and none returned"
        np.testing.assert_array_equal(gathered, frames[:, idx], err_msg=f"{what}: gathered")


def _full_stream(
    runtime: Any,
    weights: np.ndarray,
    frames: np.ndarray,
    idx: np.ndarray,
    detector: tuple[int, int],
) -> Any:
    """The runtime's stream over every frame of ``frames``, with both patterns and a gather."""
    return runtime.frame_pass_stream(
        weights,
        n_frames=frames.shape[0],
        frame_shape=detector,
        dtype=frames.dtype,
        want_sum=True,
        want_max=True,
        gather=idx,
    )


def _check_stream_stops_early(
    runtime: Any,
    frames: np.ndarray,
    weights: np.ndarray,
    idx: np.ndarray,
    detector: tuple[int, int],
    label: str,
) -> None:
    """A stream that says it can stop early gives the pass over the frames it kept.

    Fed 10 of 37 frames, it refuses to stop before them (``ValueError``); told to
    stop after 23 and fed up to there, it equals the reference on those 23
    frames, gather included (work sharing: graphs/work_sharing.py).
    """
    stream = _full_stream(runtime, weights, frames, idx, detector)
    assert stream is not None, f"{label}: a stream offered once must be offered again"
    if not stream.can_stop_early:
        return
    stream.feed(frames[:10])
    with _raises(ValueError, f"{label}: stopping after 5 frames when 10 were fed"):
        stream.stop_early(5)
    stream.stop_early(23)
    stream.feed(frames[10:23])
    _check_finished(runtime, stream, frames[:23], weights, idx, f"{label} stopped early")


def _check_stream_sweeps(
    runtime: Any,
    frames: np.ndarray,
    weights: np.ndarray,
    idx: np.ndarray,
    detector: tuple[int, int],
    label: str,
) -> None:
    """A stream that says it can sweep runs frames through its kernels and keeps nothing.

    Other frames swept before, between and after the frames fed (as a read-method
    probe sweeps its pieces, from two threads at once) leave the pass and the
    gather equal to the reference.
    """
    stream = _full_stream(runtime, weights, frames, idx, detector)
    assert stream is not None, f"{label}: a stream offered once must be offered again"
    if not stream.can_sweep:
        return
    other = frames[::-1].copy() + frames.dtype.type(1)

    def sweep_twice(rows: np.ndarray) -> None:
        done = threading.Thread(target=stream.sweep, args=(rows,))
        done.start()
        stream.sweep(rows[: max(1, rows.shape[0] // 2)])
        done.join()

    sweep_twice(other)
    stream.feed(frames[:11])
    sweep_twice(other[5:])
    stream.feed(frames[11:])
    sweep_twice(other)
    _check_finished(runtime, stream, frames, weights, idx, f"{label} with sweeps between feeds")


def check_stream_row_digests(
    factory: RuntimeFactory,
    dtype: str,
    *,
    rng: np.random.Generator,
    detector: tuple[int, int] = (64, 64),
) -> bool:
    """A stream that takes over the content digest hashes every scan row exactly.

    A pass of masks and moments only (BF, ADF, a centre of mass: the
    pass a kernel may carry the digest in) over frames of whole 1024-byte
    blocks.  Where :meth:`~quantem_flow.runtimes.base.FramePassStream.hash_rows`
    returns a line, frames fed in uneven pieces, splitting scan rows, must give
    ``row_digests()`` equal to ``xxhash.xxh3_128`` of each finished row's bytes
    (in order, none for the unfinished row), and the pass's values must equal
    the CPU reference's.

    Returns
    -------
    bool
        ``False`` when the runtime offers no stream or its stream leaves the
        digest to the caller (``None``), ``True`` once checked.
    """
    import xxhash

    runtime = factory()
    k = detector[0] * detector[1]
    row_frames = 7
    n = 3 * row_frames + 2  # the last row unfinished
    frames = frames_for(rng, dtype, n, n_pixels=k)
    weights = _mask_and_moment_rows(detector)
    label = f"{runtime.name} frame_pass_stream row digests {dtype}"
    stream = runtime.frame_pass_stream(
        weights,
        n_frames=n,
        frame_shape=detector,
        dtype=frames.dtype,
        want_sum=False,
        want_max=False,
        gather=None,
    )
    if stream is None:
        return False
    how = stream.hash_rows(row_frames=row_frames, frame_nbytes=k * frames.itemsize)
    if how is None:
        return False
    assert isinstance(how, str) and how, f"{label}: hash_rows must say how, got {how!r}"
    for a, b in ((0, 3), (3, 4), (4, 11), (11, 19), (19, n)):
        stream.feed(frames[a:b])
    digests = stream.row_digests()
    expect = [
        xxhash.xxh3_128_hexdigest(frames[r * row_frames : (r + 1) * row_frames].tobytes())
        for r in range(n // row_frames)
    ]
    assert digests == expect, f"{label}: {digests} != the rows' XXH3-128 {expect}"
    _check_finished(runtime, stream, frames, weights, None, label, patterns=False)
    return True


def check_frame_pass_cost(
    factory: RuntimeFactory,
    dtype: str,
    *,
    rng: np.random.Generator,
    detector: tuple[int, int] = DETECTOR,
) -> bool:
    """A runtime's :meth:`~quantem_flow.runtimes.base.Runtime.frame_pass_cost`, if it has one.

    Masks, moment rows, a real-valued row and no rows at all must each get
    a finite, non-negative price, the same one when asked again; no rows
    cost least.

    Returns
    -------
    bool
        ``False`` when the runtime has no price (callers keep their own
        rule), ``True`` once checked.
    """
    runtime = factory()
    k = detector[0] * detector[1]
    rr, cc = np.mgrid[: detector[0], : detector[1]]
    d = np.hypot(rr - detector[0] / 2, cc - detector[1] / 2)
    ones = np.ones(detector)
    stacks = {
        "no rows": np.zeros((0, k)),
        "a disk": (d < min(detector) / 4).astype(np.float64).reshape(1, k),
        "disk, ring and moments": np.stack(
            [
                (d < min(detector) / 4).ravel(),
                (d >= min(detector) / 3).ravel(),
                ones.ravel(),
                (rr * ones).ravel(),
                (cc * ones).ravel(),
            ]
        ).astype(np.float64),
        "real rows": rng.standard_normal((3, k)),
    }
    label = f"{runtime.name} frame_pass_cost {dtype}"
    prices: dict[str, float] = {}
    for name, weights in stacks.items():
        price = runtime.frame_pass_cost(weights, dtype=np.dtype(dtype), frame_shape=detector)
        if price is None:
            assert not prices, f"{label}: priced some stacks and not {name!r}"
            return False
        assert np.isfinite(price) and price >= 0.0, f"{label}: {name!r} priced {price!r}"
        again = runtime.frame_pass_cost(weights, dtype=np.dtype(dtype), frame_shape=detector)
        assert again == price, f"{label}: {name!r} priced {price!r}, then {again!r}"
        prices[name] = float(price)
    assert prices["no rows"] <= min(prices.values()), f"{label}: {prices}"
    return True


@contextlib.contextmanager
def _raises(kind: type[BaseException], what: str) -> Iterator[None]:
    """Assert that the block raises ``kind`` (without importing pytest)."""
    try:
        yield
    except kind:
        return
    raise AssertionError(f"{what}: expected {kind.__name__}, nothing was raised")


def check_ssb_case(runtime_name: str, dtype: str, *, rng: np.random.Generator) -> None:
    """The SSB FFT + trotter accumulation on random bright-field data of ``dtype`` vs ``cpu``.

    Tolerance: :data:`SSB_TOLERANCE` of the runtime's declared FFT precision.
    """
    from ..operators.ssb import stages as sk
    from ..runtimes import get_spec
    from ..runtimes.array_ops import Aberrations, make_ops

    spec = get_spec(runtime_name)
    ops = make_ops(runtime_name)
    ref_ops = make_ops("cpu")
    scan = (21, 26)  # rectangular, odd and even
    n_pix = 37
    alpha, lam = 0.02, 0.0197
    grid = sk.QGrid.build(scan, (0.35, 0.41), lam, alpha)
    theta = rng.uniform(0, 2 * np.pi, n_pix)
    radius = alpha * np.sqrt(rng.uniform(0, 0.95, n_pix))
    v_r, v_c = radius * np.cos(theta), radius * np.sin(theta)
    block = np.minimum(rng.poisson(50.0, (n_pix, *scan)), 100).astype(dtype)
    inv_mean = 1.0 / block.reshape(n_pix, -1).astype(np.float64).mean(axis=1)
    ab = Aberrations(
        {
            (1, 0): (float(rng.uniform(-80, 80)), 0.0),
            (1, 2): (float(rng.uniform(0, 20)), float(rng.uniform(0, np.pi))),
        }
    )
    ref = sk.accumulate(
        ref_ops, sk.spectra(ref_ops, block, inv_mean, grid), v_r, v_c, grid, ab, lam
    )
    with ops.lock():
        got = sk.accumulate(ops, sk.spectra(ops, block, inv_mean, grid), v_r, v_c, grid, ab, lam)
    tol = SSB_TOLERANCE[str(spec.array_ops_precision)]
    what = f"{runtime_name} ssb {dtype}"
    for field in ("s1", "s2", "e1", "e2"):
        a, b = getattr(got, field), getattr(ref, field)
        scale = float(np.max(np.abs(b))) or 1.0
        err = float(np.max(np.abs(a - b)))
        assert err <= tol * scale, f"{what} {field}: max |err| {err:.3g} > {tol:g} * {scale:.3g}"
    np.testing.assert_array_equal(got.n1, ref.n1, err_msg=f"{what}: trotter membership")
    np.testing.assert_array_equal(got.n2, ref.n2, err_msg=f"{what}: trotter membership")
    c_got, rec_got = sk.assemble(got, grid)
    c_ref, rec_ref = sk.assemble(ref, grid)
    assert np.max(np.abs(c_got - c_ref)) <= tol * 10 * (float(np.max(np.abs(c_ref))) or 1.0)
    assert abs(rec_got["loss"] - rec_ref["loss"]) <= tol * 10


# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class ConformanceCase:
    """One declared ``(operation, representation, dtype)`` triple of one runtime (variant).

    Attributes
    ----------
    runtime
        The registered runtime name.
    operation, representation, dtype
        The declared triple.
    variant
        ``"default"`` or the name of a constructor variant.
    options
        Constructor keyword arguments of the variant (``{}`` for the default,
        which is ``get_runtime(runtime)``).
    """

    runtime: str
    operation: str
    representation: str
    dtype: str
    variant: str = "default"
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        """A test id: ``frame_pass-dense-uint16-cpu-default``."""
        return f"{self.operation}-{self.representation}-{self.dtype}-{self.runtime}-{self.variant}"

    def factory(self) -> RuntimeFactory:
        """A factory of the runtime under test (raises RuntimeUnavailableError when called)."""
        from ..runtimes import get_runtime

        def make() -> Runtime:
            runtime = get_runtime(self.runtime)
            if self.options:
                runtime = type(runtime)(**dict(self.options))
            return runtime

        return make


def conformance_cases(
    runtime_names: Iterable[str] | None = None,
    *,
    operations: Iterable[str] | None = None,
    variants: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
) -> list[ConformanceCase]:
    """One case per declared triple of each runtime, and nothing else.

    Parameters
    ----------
    runtime_names
        Registered runtimes (default every registered one).
    operations
        Only these operations (default every one declared).
    variants
        ``{runtime: {variant name: constructor kwargs}}``: extra cases built
        with ``type(get_runtime(runtime))(**kwargs)``.

    Raises
    ------
    RuntimeUnavailableError
        A name is not registered.
    """
    from ..runtimes import get_spec, runtime_specs

    names = list(runtime_specs()) if runtime_names is None else list(runtime_names)
    wanted = None if operations is None else set(operations)
    cases = []
    for name in names:
        spec = get_spec(name)
        extra = (variants or {}).get(name, {})
        for op, rep, dtype in sorted(spec.kernels):
            if wanted is not None and op not in wanted:
                continue
            cases.append(ConformanceCase(name, op, rep, dtype))
            for variant, kwargs in extra.items():
                cases.append(ConformanceCase(name, op, rep, dtype, variant, tuple(kwargs.items())))
    return cases


def conformance_params(
    runtime_names: Iterable[str] | None = None,
    *,
    operations: Iterable[str] | None = None,
    variants: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    marks: Mapping[str, Sequence[Any]] | None = None,
) -> list[Any]:
    """:func:`conformance_cases` as ``pytest.param`` objects with readable ids.

    ``marks`` maps a runtime name to pytest marks for its cases.
    """
    import pytest

    return [
        pytest.param(case, id=case.id, marks=list((marks or {}).get(case.runtime, ())))
        for case in conformance_cases(runtime_names, operations=operations, variants=variants)
    ]


def _skip_or_raise(message: str, skip: bool) -> None:
    if skip:
        import pytest

        pytest.skip(message)
    raise RuntimeUnavailableError(message)


def run_case(
    case: ConformanceCase,
    *,
    factory: RuntimeFactory | None = None,
    rng: np.random.Generator | None = None,
    skip_unavailable: bool = True,
) -> None:
    """Run every check of one case (all data cases, reductions, edge cases).

    Parameters
    ----------
    case
        From :func:`conformance_cases` / :func:`conformance_params`.
    factory
        Makes the runtime under test (default: the case's, by name).
    rng
        Random generator (default: freshly seeded; the seed is printed).
    skip_unavailable
        ``pytest.skip`` when the runtime is not available here (default);
        otherwise raise :class:`~quantem_flow.errors.RuntimeUnavailableError`.

    Raises
    ------
    AssertionError
        The runtime does not conform; the message names the case.
    UnsupportedOperationError
        The case's operation has no driver here.
    """
    make = factory or case.factory()
    try:
        make()
    except (RuntimeUnavailableError, UnsupportedOperationError) as exc:
        _skip_or_raise(
            f"{case.id}: runtime {case.runtime!r} cannot run here: {exc}", skip_unavailable
        )
    if rng is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
        print(f"conformance {case.id}: random seed {seed}")
        rng = np.random.default_rng(seed)
    rep, dtype = case.representation, case.dtype
    if case.operation == "frame_pass":
        for nonfinite, m, kind in data_cases(dtype):
            check_frame_pass_case(
                make, rep, dtype, n_weights=m, kind=kind, nonfinite=nonfinite, rng=rng
            )
        check_nonfinite_support(make, rep, dtype)
        check_empty_block(make, rep, dtype)
        check_wide_integer_sums(make, rep, dtype)
        check_release(make, rep, dtype)
    elif case.operation == "gather":
        check_gather_case(make, rep, dtype, rng=rng)
    elif case.operation == "ssb":
        check_ssb_case(case.runtime, dtype, rng=rng)
    else:
        raise UnsupportedOperationError(
            f"no conformance driver for operation {case.operation!r} (drivers: "
            f"{list(OPERATIONS_DRIVEN)}); {case.runtime!r} declares it"
        )
