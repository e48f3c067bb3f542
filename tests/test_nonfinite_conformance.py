"""Non-finite pixels outside a weight row's support leave it finite, on the built-in runtimes.

Issue 11 item 9: a single NaN or inf detector pixel outside every virtual
detector made BF, ADF and CoM NaN at its scan position (``0 * NaN``).  The
check lives in the shared conformance suite
(:func:`quantem_flow.testing.runtime_conformance.check_nonfinite_support`,
also run by ``run_case`` for the external workers); this module runs it on
every built-in runtime's real-dtype frame-pass triples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import RuntimeUnavailableError, UnsupportedOperationError
from quantem_flow.runtimes import get_runtime, get_spec
from quantem_flow.runtimes.nonfinite import repair_per_frame, supported_dot
from quantem_flow.testing.runtime_conformance import (
    check_nonfinite_support,
    nonfinite_support_inputs,
    oracle,
)


def _cases() -> list[Any]:
    out = []
    for name, marks in (("cpu", []), ("mps", [pytest.mark.mps]), ("cuda", [pytest.mark.cuda])):
        for op, rep, dtype in sorted(get_spec(name).kernels):
            if op == "frame_pass" and np.dtype(dtype).kind == "f":
                out.append(pytest.param(name, rep, dtype, id=f"{name}-{rep}-{dtype}", marks=marks))
    return out


@pytest.mark.parametrize(("runtime", "representation", "dtype"), _cases())
def test_nonfinite_pixel_outside_support(runtime: str, representation: str, dtype: str) -> None:
    try:
        get_runtime(runtime)
    except (RuntimeUnavailableError, UnsupportedOperationError) as exc:
        pytest.skip(f"{runtime} cannot run here: {exc}")
    check_nonfinite_support(lambda: get_runtime(runtime), representation, dtype)


def test_the_check_fails_on_a_plain_matrix_product() -> None:
    """The check is not vacuous: ``frames @ weights.T`` (0 * NaN = NaN) fails it."""
    from quantem_flow.runtimes.base import FramePassResult
    from quantem_flow.runtimes.cpu import CpuRuntime

    class Naive(CpuRuntime):
        def frame_pass(self, frames: np.ndarray, weights: np.ndarray, **kw: Any) -> Any:
            r = super().frame_pass(frames, weights, **kw)
            with np.errstate(invalid="ignore"):
                per = frames.astype(np.float64) @ weights.T
            return FramePassResult(per, r.pattern_sum, r.pattern_max)

    with pytest.raises(AssertionError, match="non-finite pixels: per_frame"):
        check_nonfinite_support(Naive, "dense", "float32")


def test_supported_dot_and_repair_match_the_oracle() -> None:
    frames, weights, _ = nonfinite_support_inputs("float64")
    ref = oracle(frames, weights, False, False).per_frame
    np.testing.assert_array_equal(np.isnan(supported_dot(frames, weights)), np.isnan(ref))
    with np.errstate(invalid="ignore"):
        naive = frames @ weights.T
    asked: list[int] = []

    def frames_of(rows: np.ndarray) -> np.ndarray:
        asked.extend(int(r) for r in rows)
        return frames[rows]

    fixed = repair_per_frame(naive.copy(), weights, frames_of, batch=2)
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(fixed[~finite], ref[~finite])
    np.testing.assert_allclose(fixed[finite], ref[finite], rtol=1e-12, atol=1e-9)
    # only the frames holding a bad pixel were fetched again (every frame has pixel d = -inf)
    assert sorted(asked) == sorted(set(np.flatnonzero(~np.isfinite(naive).all(axis=1))))
