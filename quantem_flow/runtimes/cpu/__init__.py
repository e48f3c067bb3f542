"""The CPU runtime: NumPy arrays, Numba-compiled fused kernels."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..base import FramePassResult, Runtime
from .kernels import frame_pass_numba

__all__ = ["CpuRuntime"]


class CpuRuntime(Runtime):
    """Host memory, NumPy layout, Numba kernels."""

    name: ClassVar[str] = "cpu"
    payload_kernels: ClassVar[dict[str, str]] = {
        "paired": "quantem_flow.runtimes.cpu.paired_kernels:frame_pass_paired",
        "packed": "quantem_flow.runtimes.cpu.packed_kernels:frame_pass_packed",
        "encoded": "quantem_flow.runtimes.cpu.encoded_kernels:frame_pass_encoded",
    }

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

    def describe(self) -> dict[str, Any]:
        """Kernel, precision and versions, for provenance."""
        import numba

        return {
            "runtime": self.name,
            "device": "host CPU",
            "kernel": "Numba fused frame pass (4 frames x 2 weight rows)",
            "per_frame_accumulation": "float64",
            "sum_accumulation": "int64 for integer data, float64 otherwise",
            "fastmath": "reassociation and contraction only (IEEE NaN/inf kept)",
            "numba": numba.__version__,
        }
