"""Reference images a reader applies only when asked: dark and gain maps from files.

A detector's dark (offset) or gain reference kept beside an acquisition, or
given by the user, is loaded and checked here (shape, finite values) and
described for provenance (path and SHA-256).  The readers apply them as
``(raw - dark) * gain`` in ``float32`` and record what they applied.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ..errors import FormatError, ParameterError, ShapeError
from .base import check_exists

__all__ = ["apply_dark_gain", "asked_corrections", "file_sha256", "load_reference"]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a reference file's bytes (recorded with what a reader applied)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def asked_corrections(
    corrections: Iterable[str], known: tuple[str, ...], *, fmt: str
) -> tuple[str, ...]:
    """``corrections=`` as a tuple, every name among the reader's ``known`` ones.

    Raises
    ------
    ParameterError
        A name the reader (``fmt``, for the message) does not know.
    """
    asked = tuple(corrections)
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise ParameterError(
            f"corrections={asked!r}: unknown {unknown}; {fmt} corrections are {known}"
        )
    return asked


def apply_dark_gain(target: np.ndarray, references: Mapping[str, np.ndarray]) -> None:
    """``target = (target - dark) * gain`` in place, with whichever of the two is present."""
    if "dark" in references:
        target -= references["dark"]
    if "gain" in references:
        target *= references["gain"]


def load_reference(
    path: str | os.PathLike[str] | None, shape: tuple[int, int], *, kind: str
) -> tuple[np.ndarray, dict[str, str]]:
    """A ``kind`` reference (``"dark"``, ``"gain"``) of the frames' ``shape``, and its record.

    Parameters
    ----------
    path
        A ``.npy`` array, or a MATLAB ``.mat`` file holding one 2-D array.
    shape
        ``(k_r, k_c)`` of the frames it applies to.
    kind
        What it is, for messages and the record.

    Returns
    -------
    tuple
        ``float32`` array and ``{"kind", "path", "sha256"}``.
    """
    if path is None:
        raise ParameterError(
            f"corrections asks for {kind!r} but no {kind} map was given; pass {kind}_map= (a "
            ".npy or .mat file)"
        )
    p = check_exists(path, what=f"{kind} map")
    if p.suffix == ".mat":
        import scipy.io

        arrays = [
            v for k, v in scipy.io.loadmat(p).items() if not k.startswith("__") and np.ndim(v) == 2
        ]
        if len(arrays) != 1:
            raise FormatError(
                f"the {kind} map {str(p)!r} must hold one 2-D array, found {len(arrays)}"
            )
        image = np.asarray(arrays[0])
    else:
        try:
            image = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise FormatError(f"the {kind} map {str(p)!r} is not a .npy array ({exc})") from exc
    if image.shape != shape:
        raise ShapeError(f"the {kind} map {str(p)!r} is {image.shape}; the frames are {shape}")
    if image.dtype.kind not in "uif" or not np.all(np.isfinite(image)):
        raise FormatError(f"the {kind} map {str(p)!r} must hold finite real values")
    return image.astype(np.float32), {"kind": kind, "path": str(p), "sha256": file_sha256(p)}
