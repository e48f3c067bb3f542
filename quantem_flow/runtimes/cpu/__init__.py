"""The CPU runtime: NumPy arrays, Numba-compiled fused kernels."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..base import FramePassResult, Runtime
from .kernels import frame_pass_numba

__all__ = ["CpuRuntime"]


class CpuRuntime(Runtime):
    """Host memory, NumPy layout, Numba kernels."""

    name: ClassVar[str] = "cpu"
    kernels: ClassVar[frozenset[tuple[str, str]]] = frozenset({("frame_pass", "dense")})

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The CPU runtime is always available."""
        return True, "always available"

    def frame_pass(
        self, frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Run the fused Numba pass on host frames."""
        per_frame, s, m = frame_pass_numba(frames, weights, want_sum=want_sum, want_max=want_max)
        return FramePassResult(per_frame=per_frame, pattern_sum=s, pattern_max=m)
