"""The CPU runtime: NumPy arrays, Numba-compiled fused kernels."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..base import FramePassKernel, FramePassResult, FramePassStream, Runtime, _frames_of

__all__ = ["CpuRuntime"]


@functools.cache
def _numba_version() -> str:
    """Numba's installed version, read once from its metadata (every chunk record asks)."""
    from importlib.metadata import version

    return version("numba")


class CpuRuntime(Runtime):
    """Host memory, NumPy layout, Numba kernels."""

    name: ClassVar[str] = "cpu"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The CPU runtime is always available."""
        return True, "always available"

    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
        frame_shape: tuple[int, int] | None = None,
    ) -> FramePassResult:
        """Run the Numba pass on host frames ``(n, k_r * k_c)``.

        Mask and moment rows take the structured kernel when it is cheaper
        (moment rows need ``frame_shape``, the detector's ``(k_r, k_c)``),
        the other rows the fused kernel; ``variant`` of the result says which
        ran and why (:mod:`~quantem_flow.runtimes.cpu.structure`).  A kernel not yet
        compiled in this process compiles in the background while an exact NumPy form
        runs, where the pass has one (``jit_in_background``;
        :mod:`~quantem_flow.runtimes.cpu.warmup`).
        """
        from ... import config
        from .kernels import frame_pass_variant  # Numba: loaded by the first frame pass

        per_frame, s, m, variant = frame_pass_variant(
            frames,
            weights,
            want_sum=want_sum,
            want_max=want_max,
            frame_shape=frame_shape,
            background_jit=bool(config.get("jit_in_background")),
        )
        return FramePassResult(per_frame=per_frame, pattern_sum=s, pattern_max=m, variant=variant)

    def _dense_frame_pass(
        self, payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        n, k = _frames_of(payload)
        shape = (int(payload.shape[2]), int(payload.shape[3]))
        return self.frame_pass(
            payload.reshape(n, k),
            weights,
            want_sum=want_sum,
            want_max=want_max,
            frame_shape=shape,
        )

    streams: ClassVar[bool] = True
    gather_compiles: ClassVar[bool] = False  # a NumPy take

    def frame_pass_cost(
        self,
        weights: np.ndarray,
        *,
        dtype: np.dtype[Any],
        frame_shape: tuple[int, int] | None,
    ) -> float | None:
        """The kernel choice's own estimate, in pixel-steps (:mod:`.pass_cost`)."""
        from .pass_cost import frame_pass_cost

        return frame_pass_cost(weights, dtype=dtype, frame_shape=frame_shape)

    def frame_pass_stream(
        self,
        weights: np.ndarray,
        *,
        n_frames: int,
        frame_shape: tuple[int, int],
        dtype: np.dtype[Any],
        want_sum: bool,
        want_max: bool,
        gather: np.ndarray | None = None,
        gather_into: np.ndarray | None = None,
    ) -> FramePassStream:
        """The Numba pass prepared once and fed host frames piece by piece (in place)."""
        from .stream import CpuFramePassStream

        return CpuFramePassStream(
            weights,
            n_frames=n_frames,
            frame_shape=frame_shape,
            dtype=dtype,
            want_sum=want_sum,
            want_max=want_max,
            gather=gather,
            gather_into=gather_into,
        )

    def frame_pass_kernels(self) -> Mapping[str, FramePassKernel]:
        """Dense (the fused kernel), paired (O(events)), packed and encoded (decoded in groups).

        One row per representation in :data:`~quantem_flow.runtimes.cpu.spec.FRAME_PASS_KERNELS`.
        """
        from ...plugins import load_attribute
        from .spec import FRAME_PASS_KERNELS

        return {
            rep: self._dense_frame_pass if target is None else load_attribute(target)
            for rep, (target, _) in FRAME_PASS_KERNELS.items()
        }

    def describe(self) -> dict[str, Any]:
        """Kernel, precision and versions, for provenance (Numba's version without importing it)."""
        return {
            "runtime": self.name,
            "device": "host CPU",
            "kernel": (
                "Numba frame pass: mask and moment rows by detector cells (structured) or, "
                "on 8/16-bit frames where its cost rule wins, as SIMD integer dot products "
                "(LLVM IR: pmaddwd / vpdpwssd, same integers), other rows fused (4 frames x 2 "
                "weight rows); the variant per chunk is in frame_pass_variant"
            ),
            "per_frame_accumulation": (
                "float64; structured cells of integer data in int64 (exact, bound checked)"
            ),
            "sum_accumulation": "int64 for integer data, float64 otherwise",
            "fastmath": "reassociation and contraction only (IEEE NaN/inf kept)",
            "numba": _numba_version(),
        }
