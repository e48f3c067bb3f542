"""Conformance of every declared (operation, representation, dtype) kernel to the CPU reference.

The suite lives in the package (:mod:`quantem_flow.testing.runtime_conformance`,
where its inputs, the poisoning of allocators and the tolerances are
documented) so that third-party runtimes and the bridge to external workers
run the same cases; this module runs it on every registered runtime, one case
per declared triple (plus the ``mps`` Metal variant).  A CUDA case always
appears, and says why it skips where no GPU answers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import RuntimeUnavailableError, UnsupportedOperationError
from quantem_flow.runtimes import (
    FramePassResult,
    Precision,
    Runtime,
    available_runtimes,
    get_runtime,
    resolve_backend,
    runtime_specs,
)
from quantem_flow.runtimes.cpu import CpuRuntime
from quantem_flow.runtimes.nonfinite import repair_per_frame
from quantem_flow.runtimes.registry import RuntimeSpec, register_runtime, unregister_runtime
from quantem_flow.testing import (
    ConformanceCase,
    RuntimeFactory,
    check_frame_pass,
    check_frame_pass_case,
    check_gather_case,
    conformance_cases,
    conformance_params,
    run_case,
    tolerances,
)
from quantem_flow.testing.runtime_conformance import (
    DETECTOR,
    OPERATIONS_DRIVEN,
    check_empty_block,
    check_release,
    check_ssb_case,
    check_wide_integer_sums,
    data_cases,
    frames_for,
    weights_for,
)
from tests.conftest import probe_data

DTYPES = ("uint8", "uint16", "uint32", "int16", "float32", "float64")

#: Extra constructor variants of a runtime, beyond its registered default.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {"mps": {"metal": {"path": "metal"}}}
MARKS = {"mps": [pytest.mark.mps], "cuda": [pytest.mark.cuda]}


def _declared() -> list[str]:
    """Built-in and installed runtimes; those registered in process belong to their registrar.

    (The bridge's tests register the external runtimes and run this suite on
    them themselves; collecting after them must not run their cases again.)
    """
    return [n for n, s in runtime_specs().items() if s.origin != "register_runtime()"]


def _params(operation: str) -> list[Any]:
    return conformance_params(_declared(), operations=[operation], variants=VARIANTS, marks=MARKS)


def _data_params() -> list[Any]:
    out = []
    for param in _params("frame_pass"):
        (case,) = param.values
        for nonfinite, m, kind in data_cases(case.dtype):
            out.append(
                pytest.param(
                    case,
                    nonfinite,
                    m,
                    kind,
                    id=f"{case.id}-{'nan-' if nonfinite else ''}m{m}-{kind}",
                    marks=param.marks,
                )
            )
    return out


def _factory(case: ConformanceCase) -> RuntimeFactory:
    """The runtime under test, or skip with the reason it cannot run here."""
    factory = case.factory()
    try:
        factory()
    except (RuntimeUnavailableError, UnsupportedOperationError) as exc:
        note = (
            " -- no GPU answers here; a skipped CUDA test is NOT evidence that CUDA works"
            if case.runtime == "cuda"
            else ""
        )
        pytest.skip(f"{case.runtime}/{case.variant} cannot run here: {exc}{note}")
    return factory


# ----------------------------------------------------------------------------- the suite


@pytest.mark.parametrize(("case", "nonfinite", "n_weights", "kind"), _data_params())
def test_kernel_matches_cpu_reference(
    case: ConformanceCase, nonfinite: bool, n_weights: int, kind: str, rng: np.random.Generator
) -> None:
    check_frame_pass_case(
        _factory(case),
        case.representation,
        case.dtype,
        n_weights=n_weights,
        kind=kind,
        nonfinite=nonfinite,
        rng=rng,
        what=case.id,
    )


@pytest.mark.parametrize("case", _params("frame_pass"))
def test_empty_block_matches_cpu_reference(case: ConformanceCase) -> None:
    check_empty_block(_factory(case), case.representation, case.dtype)


@pytest.mark.parametrize("case", _params("frame_pass"))
def test_integer_sums_widen_over_many_frames(case: ConformanceCase) -> None:
    """70001 frames of extreme values: a 32-bit accumulator anywhere would overflow."""
    if np.dtype(case.dtype).kind not in "ui" or np.dtype(case.dtype).itemsize > 4:
        pytest.skip(f"{case.dtype}: no integer of at most 32 bits to overflow")
    check_wide_integer_sums(_factory(case), case.representation, case.dtype)


@pytest.mark.parametrize("case", _params("frame_pass"))
def test_release_is_idempotent_and_final(case: ConformanceCase) -> None:
    check_release(_factory(case), case.representation, case.dtype)


@pytest.mark.parametrize("case", _params("gather"))
def test_gather_returns_the_chosen_pixels_exactly(
    case: ConformanceCase, rng: np.random.Generator
) -> None:
    check_gather_case(_factory(case), case.representation, case.dtype, rng=rng)


@pytest.mark.parametrize("case", _params("ssb"))
def test_ssb_stage_matches_cpu_reference(case: ConformanceCase, rng: np.random.Generator) -> None:
    """The SSB FFT + trotter accumulation on fresh random bright-field data, every runtime."""
    _factory(case)
    check_ssb_case(case.runtime, case.dtype, rng=rng)


class _LeakyRuntime(CpuRuntime):
    """A broken runtime: leaves the last element of per_frame unwritten."""

    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
        frame_shape: tuple[int, int] | None = None,
    ) -> FramePassResult:
        out = np.empty((frames.shape[0], weights.shape[0]), dtype=np.float64)
        good = super().frame_pass(
            frames, weights, want_sum=want_sum, want_max=want_max, frame_shape=frame_shape
        )
        out.flat[:-1] = good.per_frame.flat[:-1]
        return FramePassResult(out, good.pattern_sum, good.pattern_max)


def test_poison_catches_an_unwritten_element(rng: np.random.Generator) -> None:
    with pytest.raises(AssertionError, match="per_frame"):
        check_frame_pass_case(
            _LeakyRuntime, "dense", "uint16", n_weights=5, kind="real", nonfinite=False, rng=rng
        )


def test_every_registered_runtime_is_a_conformance_case() -> None:
    ids = {p.id for op in OPERATIONS_DRIVEN for p in _params(op)}
    for name in _declared():
        spec = runtime_specs()[name]
        for op, rep, dtype in spec.kernels:
            assert op in OPERATIONS_DRIVEN, f"no conformance driver for operation {op!r}"
            assert f"{op}-{rep}-{dtype}-{name}-default" in ids
    assert any("-cuda-" in i for i in ids), "a CUDA case must always appear (and say why it skips)"
    # one case per declared triple and nothing else
    cpu = conformance_cases(["cpu"])
    assert {(c.operation, c.representation, c.dtype) for c in cpu} == set(
        runtime_specs()["cpu"].kernels
    )
    assert len(cpu) == len(runtime_specs()["cpu"].kernels)


# ----------------------------------------------------------------------------- precision


class _Float32Runtime(CpuRuntime):
    """The CPU kernels with per_frame and real sums rounded through float32 (a WGSL-like device).

    Integer data with 0/1 weights stay exact, as its declared ``u32x2``
    accumulation promises; everything real is computed in float32.
    """

    name: ClassVar[str] = "float32-sim"

    def precision(self) -> Precision:
        return Precision(integer="u32x2", real="float32")

    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
        frame_shape: tuple[int, int] | None = None,
    ) -> FramePassResult:
        exact = super().frame_pass(
            frames, weights, want_sum=want_sum, want_max=want_max, frame_shape=frame_shape
        )
        integer = frames.dtype.kind in "ui"
        binary = bool(np.isin(weights, (0.0, 1.0)).all())
        per_frame = exact.per_frame
        if not (integer and binary):
            with np.errstate(invalid="ignore"):  # inf * 0 = NaN, as in float64
                f32 = frames.astype(np.float32) @ weights.astype(np.float32).T
            # a non-finite pixel outside a row's support leaves it alone (as every runtime)
            per_frame = repair_per_frame(f32.astype(np.float64), weights, lambda r: frames[r])
        total = exact.pattern_sum
        if total is not None and not integer:
            total = frames.astype(np.float32).sum(axis=0, dtype=np.float32).astype(np.float64)
        return FramePassResult(per_frame, total, exact.pattern_max)


FLOAT32_SPEC = RuntimeSpec(
    name="float32-sim",
    factory=f"{__name__}:_Float32Runtime",
    dependency=None,
    kernels=frozenset(
        (op, "dense", d) for op in ("frame_pass", "gather") for d in ("uint16", "float32")
    ),
    description="test: float32 accumulation of real data",
)


def test_tolerances_follow_the_declared_precision(rng: np.random.Generator) -> None:
    k = DETECTOR[0] * DETECTOR[1]
    f64, f32 = tolerances(), tolerances(Precision(integer="u32x2", real="float32"))
    assert f64[("frame_pass", "per_frame", "otherwise")].rtol == 1e-12
    assert f32[("frame_pass", "per_frame", "otherwise")].rtol == (k + 2) * 2.0**-24
    for table in (f64, f32):  # exact stays exact whatever the device
        assert table[("frame_pass", "per_frame", "integer data, 0/1 weights")].rtol == 0
        assert table[("frame_pass", "pattern_sum", "integer data")].rtol == 0
        assert table[("frame_pass", "pattern_max", "any")].rtol == 0
    register_runtime(FLOAT32_SPEC)
    try:
        # float32 sums pass under the tolerances the runtime declares...
        for dtype in ("uint16", "float32"):
            for kind in ("binary", "real"):
                check_frame_pass_case(
                    _Float32Runtime, "dense", dtype, n_weights=5, kind=kind, nonfinite=True, rng=rng
                )
        run_case(ConformanceCase("float32-sim", "gather", "dense", "float32"), rng=rng)

        # ...and fail under float64's
        class _Claims64(_Float32Runtime):
            def precision(self) -> Precision:
                return Precision()

        with pytest.raises(AssertionError, match="beyond rtol 1e-12"):
            check_frame_pass_case(
                _Claims64, "dense", "float32", n_weights=2, kind="real", nonfinite=False, rng=rng
            )
    finally:
        unregister_runtime("float32-sim")


def test_run_case_is_what_an_external_package_calls(rng: np.random.Generator) -> None:
    params = conformance_params(["cpu"], operations=["gather"])
    assert params and all(
        p.id.startswith("gather-") and p.id.endswith("-cpu-default") for p in params
    )
    (case,) = [p.values[0] for p in params if p.id == "gather-paired-uint16-cpu-default"]
    run_case(case, rng=rng)
    run_case(ConformanceCase("cpu", "frame_pass", "packed", "uint8"), rng=rng)
    if "cuda" not in available_runtimes():
        with pytest.raises(RuntimeUnavailableError, match="cuda"):
            run_case(
                ConformanceCase("cuda", "frame_pass", "dense", "uint16"), skip_unavailable=False
            )
    with pytest.raises(UnsupportedOperationError, match="no conformance driver"):
        run_case(ConformanceCase("cpu", "transmogrify", "dense", "uint16"))


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
        host = frames_for(rng, np.dtype(dtype).newbyteorder("=").name, 5)
        host = host.astype(dtype).reshape(5, *DETECTOR)
        dev = rt.to_device(host)
        back = rt.to_host(dev)
        assert back.dtype == host.dtype.newbyteorder("="), (dtype, back.dtype)
        assert back.shape == host.shape
        np.testing.assert_array_equal(back, host)
        # a resident payload runs without a host round trip
        frames = dev.reshape(5, -1)
        if np.dtype(dtype).name in (*DTYPES, "int8", "int32"):  # what the CPU reference takes
            w = weights_for(rng, 2, "real")
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
        frames = frames_for(rng, dtype, 37, nonfinite=dtype.startswith("float"))
        weights = weights_for(rng, 3, "real")
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


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal may exist on macOS: auto probes MLX")
def test_auto_skips_mlx_off_macos_without_starting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantem_flow.runtimes import mps as mps_module

    def must_not_run() -> tuple[bool, bool, str]:
        raise AssertionError("backend='auto' started MLX to find it is not an accelerator")

    monkeypatch.setattr(mps_module, "_probe", must_not_run)
    choice = resolve_backend("auto")
    assert choice.chosen in ("cpu", "cuda")
    assert "mps (no Metal GPU off macOS" in choice.reason and "not probed" in choice.reason
    eligible, why = mps_module.MpsRuntime.auto_eligible()
    assert not eligible and "not an accelerator" in why
    ssb_choice = resolve_backend("auto", operation="ssb")  # the SSB stage's choice too
    assert (
        ssb_choice.chosen in ("cpu", "cuda") and "mps (no Metal GPU off macOS" in ssb_choice.reason
    )
