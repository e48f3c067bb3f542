"""What a stream simulator replays: frames in scan order, from an array or read piece by piece."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ParameterError

__all__ = ["FrameSupply", "frame_supply"]


@dataclasses.dataclass(frozen=True)
class FrameSupply:
    """Frames ``rows(start, stop)`` of ``n_frames`` frames of ``frame_shape`` and ``dtype``."""

    rows: Callable[[int, int], np.ndarray]
    n_frames: int
    frame_shape: tuple[int, int]
    dtype: np.dtype[Any]


def frame_supply(
    frames: np.ndarray | Callable[[int, int], np.ndarray],
    *,
    n_frames: int | None = None,
    frame_shape: tuple[int, int] | None = None,
    dtype: Any = None,
) -> FrameSupply:
    """An ``(n, k_r, k_c)`` array, or a callable with ``n_frames``, ``frame_shape``, ``dtype``.

    Raises
    ------
    ParameterError
        A callable without its sizes, or an array that is not 3-D.
    """
    if callable(frames):
        if n_frames is None or frame_shape is None or dtype is None:
            raise ParameterError(
                "a callable frames source needs n_frames, frame_shape and dtype, got "
                f"{n_frames!r}, {frame_shape!r}, {dtype!r}"
            )
        shape = (int(frame_shape[0]), int(frame_shape[1]))
        return FrameSupply(frames, int(n_frames), shape, np.dtype(dtype))
    array = np.asarray(frames)
    if array.ndim != 3:
        raise ParameterError(f"frames must be (n, k_r, k_c), got shape {array.shape}")
    return FrameSupply(
        lambda a, b: array[a:b],
        int(array.shape[0]),
        (int(array.shape[1]), int(array.shape[2])),
        array.dtype,
    )
