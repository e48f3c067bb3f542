"""Passes prepared from the same weight rows share what was made of them, and only that."""

from __future__ import annotations

import numpy as np
import pytest

from quantem_flow import config
from quantem_flow.runtimes.cpu import structure
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass


def _rows(shape: tuple[int, int]) -> np.ndarray:
    rr, cc = np.indices(shape)
    disk = np.hypot(rr - 15.5, cc - 16.5) < 6
    return np.stack([disk.ravel(), (~disk).ravel(), (rr - 15.5).ravel()]).astype(np.float64)


def _prepared(w: np.ndarray, **options: object) -> PreparedFramePass:
    return PreparedFramePass(
        w,
        dtype=np.dtype(np.uint16),
        n_frames=8,
        want_sum=bool(options.get("want_sum", False)),
        want_max=False,
        frame_shape=(32, 32),
    )


def test_equal_rows_share_the_analysis_and_each_pass_keeps_its_own_record() -> None:
    w = _rows((32, 32))
    first, second = _prepared(w), _prepared(w.copy())
    assert second._padded is first._padded and second._plan is first._plan
    assert second.variant == first.variant and second.variant is not first.variant
    second.variant["kernel"] = "changed by this pass's first use"
    assert first.variant["kernel"] != second.variant["kernel"]
    frames = np.random.default_rng(3).integers(0, 500, size=(8, 32 * 32), dtype=np.uint16)
    for p in (first, second):
        p.run(frames)
    np.testing.assert_array_equal(first.result()[0], second.result()[0])


def test_other_rows_or_another_choice_make_their_own() -> None:
    w = _rows((32, 32))
    base = _prepared(w)
    other = w.copy()
    other[0, 0] = 1.0  # one pixel more in the disk
    assert _prepared(other)._padded is not base._padded
    assert _prepared(w, want_sum=True)._padded is not base._padded
    with config.set(integer_dot_kernel=False):
        off = _prepared(w)
    assert off._dot is None and "integer dot kernel off" in off.variant["kernel"]
    # the rows' analysis left its own cache (its tunables changed): made again
    structure._CACHE.clear()
    again = _prepared(w)
    assert again._plan is not base._plan
    np.testing.assert_array_equal(again._padded, base._padded)


def test_a_cpu_without_the_dot_kernel_keeps_its_weight_states(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quantem_flow.runtimes.cpu import dot_pass, prepared

    monkeypatch.setattr(dot_pass, "host_isa", lambda: None)  # no AVX2: nothing cached there
    monkeypatch.setattr(dot_pass, "_cache", {})  # not even what an earlier test left
    with prepared._STATES_LOCK:
        prepared._STATES.clear()
    w = _rows((32, 32))
    first, second = _prepared(w), _prepared(w.copy())
    assert first._dot is None and "no AVX2" in first.variant["kernel"]
    assert second._padded is first._padded and second._plan is first._plan
    with prepared._STATES_LOCK:
        prepared._STATES.clear()
