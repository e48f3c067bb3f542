"""The exact NumPy frame pass: bit for bit the compiled kernels, while they compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.runtimes.cpu import warmup
from quantem_flow.runtimes.cpu.exact_numpy import exact_pass
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass
from quantem_flow.runtimes.cpu.structure import analyse_weights
from tests.conftest import probe_data

SHAPE = (20, 26)


def _disk(center: tuple[float, float], inner: float, outer: float) -> np.ndarray:
    rr, cc = np.indices(SHAPE)
    d2 = (rr - center[0]) ** 2 + (cc - center[1]) ** 2
    return ((d2 >= inner**2) & (d2 < outer**2)).astype(np.float64)


def _com(center: tuple[float, float], radius: float) -> list[np.ndarray]:
    rr, cc = np.indices(SHAPE)
    mask = _disk(center, 0, radius)
    return [mask, mask * (rr - center[0]), mask * (cc - center[1])]


def _stacks() -> dict[str, np.ndarray]:
    frac = (8.6, 14.2)
    half = (9.5, 12.0)
    graded = (np.arange(SHAPE[0] * SHAPE[1]) % 4).reshape(SHAPE).astype(np.float64)
    return {
        "bf_adf_com_fractional": np.stack(
            [_disk(frac, 0, 4.5), _disk(frac, 7, 1e9), *_com(frac, 1e9)]
        ),
        "com_half_integer_no_mask_row": np.stack(_com(half, 8)[1:]),
        "annuli": np.stack([_disk(frac, r, r + 3) for r in range(0, 12, 3)]),
        "integer_general_row": np.stack([graded, _disk(frac, 0, 5)]),
        "no_rows": np.zeros((0, SHAPE[0] * SHAPE[1])),
    }


def _run(weights: np.ndarray, frames: np.ndarray, *, exact: bool, **options: Any) -> Any:
    flat = weights.reshape(weights.shape[0], SHAPE[0] * SHAPE[1])
    p = PreparedFramePass(
        flat, dtype=frames.dtype, n_frames=frames.shape[0], frame_shape=SHAPE, **options
    )
    if exact:
        ex = exact_pass(flat, dtype=frames.dtype, plan=p._plan)
        assert ex is not None
        p._exact = ex  # the path a not-yet-compiled kernel takes
    for f0 in range(0, frames.shape[0], 7):  # pieces, as a streamed pass feeds them
        p.run(frames[f0 : f0 + 7])
    return p.result()


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int16"])
@pytest.mark.parametrize("stack", sorted(_stacks()))
def test_the_exact_form_equals_the_compiled_kernels_bit_for_bit(
    rng: np.random.Generator, dtype: str, stack: str
) -> None:
    weights = _stacks()[stack]
    frames = probe_data(rng, scan=(5, 9), det=SHAPE, dtype=dtype, bright=200).reshape(45, -1)
    if np.dtype(dtype).kind == "i":
        frames = frames - np.asarray(100, dtype=dtype)  # negative values too
    for want_sum, want_max in ((False, False), (True, True)):
        compiled = _run(weights, frames, exact=False, want_sum=want_sum, want_max=want_max)
        exact = _run(weights, frames, exact=True, want_sum=want_sum, want_max=want_max)
        np.testing.assert_array_equal(exact[0], compiled[0])
        assert exact[0].tobytes() == compiled[0].tobytes()  # same bits, signed zeros too
        for a, b in zip(exact[1:3], compiled[1:3], strict=True):
            if b is None:
                assert a is None
            else:
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)


def test_passes_without_an_exact_form_wait_for_the_compiled_kernel() -> None:
    k = SHAPE[0] * SHAPE[1]
    mask = _disk((8.6, 14.2), 0, 4.5).reshape(1, k)
    fractional = np.full((1, k), 0.3)
    plan = analyse_weights(mask)
    assert exact_pass(mask, dtype=np.dtype("float32"), plan=plan) is None
    assert exact_pass(mask, dtype=np.dtype("int64"), plan=plan) is None
    assert exact_pass(fractional, dtype=np.dtype("uint16"), plan=None) is None
    huge = np.full((1, k), 2.0**40)  # max|value| * sum|w| reaches 2**53
    assert exact_pass(huge, dtype=np.dtype("uint16"), plan=None) is None
    assert exact_pass(mask, dtype=np.dtype("uint16"), plan=plan) is not None


def test_a_kernel_not_yet_run_compiles_in_the_background_then_takes_over(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warmup, "_ready", set())
    monkeypatch.setattr(warmup, "_threads", {})
    weights = _stacks()["bf_adf_com_fractional"].reshape(5, -1)
    frames = probe_data(rng, scan=(4, 4), det=SHAPE).reshape(16, -1)

    def prepared() -> PreparedFramePass:
        return PreparedFramePass(
            weights,
            dtype=frames.dtype,
            n_frames=16,
            want_sum=True,
            want_max=False,
            frame_shape=SHAPE,
            background_jit=True,
        )

    first = prepared()
    assert first.variant["variant"] == "exact-numpy"
    assert first.variant["compiled_variant"]["variant"] == "structured"
    first.run(frames)
    key = first.kernel_key
    assert warmup.wait(key, timeout_s=120)  # the thread compiled (or loaded) it
    assert "error" not in warmup.history[key]
    second = prepared()
    assert second.variant["variant"] == "structured"
    second.run(frames)
    for a, b in zip(first.result()[:2], second.result()[:2], strict=True):
        assert a.tobytes() == b.tobytes()
    real = PreparedFramePass(
        weights,
        dtype=np.dtype("float32"),
        n_frames=16,
        want_sum=False,
        want_max=False,
        frame_shape=SHAPE,
        background_jit=True,
    )
    assert real.variant["variant"] == "structured"  # no exact form: the compiled kernel


_FIRST_COMPUTE = """
import json, sys
import numpy as np
import quantem_flow as qf
from quantem_flow.runtimes.cpu import warmup
data = np.load(sys.argv[1])
ds = qf.open(data, chunk_rows=2)
res = qf.compute(qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2)),
                 qf.center_of_mass(ds, center=(8.6, 14.2)), client="synchronous")
keys = list(warmup._threads)
ok = all(warmup.wait(k, 300) for k in keys)
again = qf.compute(qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2)),
                   qf.center_of_mass(ds, center=(8.6, 14.2)), client="synchronous")
variant = lambda r: sorted({c["frame_pass_variant"]["variant"]
                            for c in r.provenance.execution["chunks"]})
print(json.dumps({
    "first": variant(res[0]), "again": variant(again[0]), "warmed": ok,
    "same": all(a.data.tobytes() == b.data.tobytes() for a, b in zip(res, again)),
    "compile_s": res[0].provenance.execution["compile_s_total"],
}))
"""


def test_a_first_compute_on_an_empty_numba_cache_runs_exact_numpy_then_compiled(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = probe_data(rng, scan=(6, 5), det=SHAPE)
    np.save(tmp_path / "d.npy", data)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _FIRST_COMPUTE, str(tmp_path / "d.npy")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["first"] == ["exact-numpy"], out
    # nothing compiled in the compute's own thread (a compile there takes seconds); importing
    # the kernels' module, which the first frame pass does, holds Numba's lock for ~2 ms
    assert out["compile_s"] < 0.1
    assert out["warmed"] and out["again"] == ["structured"], out
    assert out["same"], out  # identical values, BF and CoM, before and after compiling
