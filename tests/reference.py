"""Independent NumPy references for the operators (loops and plain sums).

Written without importing quantem_flow so that a bug shared by the engine
and its test cannot hide.
"""

from __future__ import annotations

import math

import numpy as np


def ref_annulus(
    shape: tuple[int, int],
    center: tuple[float, float],
    inner: float,
    outer: float,
    scale: tuple[float, float] = (1.0, 1.0),
) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for r in range(shape[0]):
        for c in range(shape[1]):
            d = math.sqrt(((r - center[0]) * scale[0]) ** 2 + ((c - center[1]) * scale[1]) ** 2)
            mask[r, c] = inner <= d < outer
    return mask


def ref_virtual(data: np.ndarray, weights: np.ndarray) -> np.ndarray:
    if weights.dtype == bool:
        return data[..., weights].astype(np.int64).sum(axis=-1)
    return np.einsum("abij,ij->ab", data.astype(np.float64), weights)


def ref_com(
    data: np.ndarray, center: tuple[float, float], mask: np.ndarray | None = None
) -> np.ndarray:
    R, C, kr, kc = data.shape
    w = np.ones((kr, kc)) if mask is None else mask.astype(np.float64)
    out = np.full((2, R, C), np.nan)
    rr = np.arange(kr)[:, None] - center[0]
    cc = np.arange(kc)[None, :] - center[1]
    for i in range(R):
        for j in range(C):
            f = data[i, j].astype(np.float64) * w
            s = f.sum()
            if s:
                out[0, i, j] = (f * rr).sum() / s
                out[1, i, j] = (f * cc).sum() / s
    return out


def ref_bin(data: np.ndarray, factor: tuple[int, int]) -> np.ndarray:
    fr, fc = factor
    kr, kc = data.shape[-2:]
    nr, nc = -(-kr // fr), -(-kc // fc)
    wide = (
        np.uint64
        if data.dtype.kind == "u"
        else (np.int64 if data.dtype.kind == "i" else np.float64)
    )
    out = np.zeros((*data.shape[:-2], nr, nc), dtype=wide)
    for i in range(nr):
        for j in range(nc):
            out[..., i, j] = data[..., i * fr : (i + 1) * fr, j * fc : (j + 1) * fc].sum(
                axis=(-2, -1), dtype=wide
            )
    return out
