"""What every runtime adapter provides.

A runtime owns allocation, layout, compilation and synchronisation for one
device class.  It knows nothing of Dask: it receives arrays and returns
arrays.  Kernels are registered per (operation, representation).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np

__all__ = ["FramePassResult", "Runtime"]


@dataclasses.dataclass
class FramePassResult:
    """What one fused pass over a block of frames returns (always on the host).

    Attributes
    ----------
    per_frame
        ``(n_frames, n_weights)`` float64: the dot product of every frame with
        every weight row.  Integer data with integer weights give exact
        integer values while partial sums stay below 2**53.
    pattern_sum
        ``(k_r * k_c,)`` sum over the frames (int64 for integer data, float64
        otherwise), or ``None`` when not requested.
    pattern_max
        ``(k_r * k_c,)`` maximum over the frames in the data's dtype, or
        ``None``.
    """

    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None


class Runtime(abc.ABC):
    """A device class that runs kernels on resident payloads."""

    name: ClassVar[str] = "abstract"
    #: (operation, representation) pairs this runtime has kernels for.
    kernels: ClassVar[frozenset[tuple[str, str]]] = frozenset()

    @classmethod
    @abc.abstractmethod
    def available(cls) -> tuple[bool, str]:
        """Return whether the runtime can run here, and why not if it cannot."""

    @classmethod
    def auto_eligible(cls) -> tuple[bool, str]:
        """Return whether ``backend="auto"`` may choose this runtime, and why.

        The default is :meth:`available`.  A runtime that runs here but is
        not worth choosing automatically (MLX on its CPU backend is no
        accelerator) says no, with the reason; it still runs when requested
        explicitly.
        """
        return cls.available()

    def supports(self, operation: str, representation: str) -> bool:
        """Whether a kernel is registered for ``operation`` on ``representation``."""
        return (operation, representation) in self.kernels

    @abc.abstractmethod
    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
    ) -> FramePassResult:
        """Run the fused pass over a dense block of frames.

        Parameters
        ----------
        frames
            ``(n_frames, k_r * k_c)`` C-contiguous host array.
        weights
            ``(n_weights, k_r * k_c)`` float64 weight rows (may be 0 rows).
        want_sum, want_max
            Also accumulate the sum / maximum pattern over the frames.

        Returns
        -------
        FramePassResult
            Host arrays.
        """

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description for provenance."""
        return {"runtime": self.name}
