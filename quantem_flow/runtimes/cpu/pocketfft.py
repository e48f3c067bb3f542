"""SciPy's FFT (pocketfft) for the SSB stage, without the ``scipy.fft`` package's import.

``import scipy.fft`` (SciPy 1.17) costs 0.17-0.30 s of CPU in a fresh interpreter,
most of it not the FFT: ``scipy.special`` (imported by ``scipy.fft._fftlog``) and
array_api_compat's copy of the NumPy namespace.  A first SSB compute ran it beside its
gather pass on the same cores and was 0.2-0.25 s slower for it on a 2-vCPU VM
(benchmarks/RESULTS.md, issue 24, sixteenth stop).  The transforms themselves are one
compiled extension inside that package, ``scipy/fft/_pocketfft/pypocketfft``, which
loads on its own in 0.02 s.  This module loads that extension from the installed SciPy
and calls it exactly as ``scipy.fft.rfft``, ``fft`` and ``rfft2`` call it (the same
zero-padding or truncation to ``n``, the same normalisation flag, the same output
buffer rules), so the values are SciPy's bit for bit (tests/test_pocketfft.py checks
each against ``scipy.fft``).  Where the extension is not where this SciPy keeps it, or
does not load, every call goes through ``scipy.fft`` itself, and :func:`backend_name`
says which ran.
"""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import os
import threading
from typing import Any

import numpy as np

__all__ = ["backend_name", "extension", "fft", "rfft", "rfft2"]

_lock = threading.Lock()
_loaded: list[Any] = []  # [module or None] once tried


def extension() -> Any | None:
    """SciPy's ``pypocketfft`` extension, loaded once without ``scipy.fft``, or ``None``."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_load())
    return _loaded[0]


def _load() -> Any | None:
    try:
        import scipy

        folder = os.path.join(os.path.dirname(scipy.__file__), "fft", "_pocketfft")
        paths = [
            p
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
            for p in glob.glob(os.path.join(folder, "pypocketfft" + suffix))
        ]
        if not paths:
            return None
        spec = importlib.util.spec_from_file_location("pypocketfft", paths[0])
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not all(hasattr(module, f) for f in ("r2c", "c2c")):
            return None
        return module
    except Exception:  # any failure: scipy.fft serves every call
        return None


def backend_name() -> str:
    """Which FFT the SSB stage calls, for provenance."""
    import scipy

    if extension() is not None:
        return (
            f"SciPy {scipy.__version__}'s pocketfft extension, called as scipy.fft calls it "
            "(loaded without the scipy.fft package, whose import costs 0.2-0.3 s)"
        )
    return f"scipy.fft (pocketfft) {scipy.__version__}"


def _floating(x: Any) -> np.ndarray:
    """As ``scipy.fft`` converts its input: float32/64 and complex64/128 kept, else float64."""
    a = np.asarray(x)
    if a.dtype in (np.float32, np.float64, np.complex64, np.complex128):
        return a
    return np.asarray(a, dtype=np.complex128 if a.dtype.kind == "c" else np.float64)


def _fit(x: np.ndarray, n: int, axis: int) -> tuple[np.ndarray, bool]:
    """``x`` cut or zero-padded to ``n`` along ``axis``, and whether it was copied."""
    have = x.shape[axis]
    if have == n:
        return x, False
    index = [slice(None)] * x.ndim
    if have > n:
        index[axis] = slice(0, n)
        return x[tuple(index)], False
    index[axis] = slice(0, have)
    shape = list(x.shape)
    shape[axis] = n
    z = np.zeros(shape, dtype=x.dtype)
    z[tuple(index)] = x
    return z, True


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {ndim} dimensions")
    return axis % ndim


def rfft(x: Any, *, n: int, axis: int, workers: int) -> np.ndarray:
    """``scipy.fft.rfft(x, n=n, axis=axis, workers=workers)``, the same values."""
    if extension() is None:
        import scipy.fft

        return np.asarray(scipy.fft.rfft(x, n=n, axis=axis, workers=workers))
    return _r2c(x, (n,), (axis,), workers)


def _r2c(x: Any, sizes: tuple[int, ...], axes: tuple[int, ...], workers: int) -> np.ndarray:
    """The real transform over ``axes``, each cut or zero-padded to its size first."""
    ext = extension()
    assert ext is not None  # the callers fall back to scipy.fft before
    a = _floating(x)
    if a.dtype.kind == "c":
        raise TypeError("x must be a real sequence")
    ax = tuple(_axis(v, a.ndim) for v in axes)
    for size, v in zip(sizes, ax, strict=True):
        a, _ = _fit(a, int(size), v)
    return np.asarray(ext.r2c(a, ax, True, 0, None, int(workers)))


def fft(x: Any, *, n: int, axis: int, workers: int, overwrite_x: bool = False) -> np.ndarray:
    """``scipy.fft.fft(x, n=n, axis=axis, workers=workers, overwrite_x=...)``, the same values."""
    ext = extension()
    if ext is None:
        import scipy.fft

        return np.asarray(
            scipy.fft.fft(x, n=n, axis=axis, workers=workers, overwrite_x=overwrite_x)
        )
    given = np.asarray(x)
    a = _floating(given)
    overwrite = overwrite_x or a is not given
    ax = _axis(axis, a.ndim)
    a, copied = _fit(a, n, ax)
    overwrite = overwrite or copied
    out = a if overwrite and a.dtype.kind == "c" else None  # a real input: a new array
    return np.asarray(ext.c2c(a, (ax,), True, 0, out, int(workers)))


def rfft2(x: Any, *, s: tuple[int, int], axes: tuple[int, int], workers: int) -> np.ndarray:
    """``scipy.fft.rfft2(x, s=s, axes=axes, workers=workers)``, the same values."""
    if extension() is None:
        import scipy.fft

        return np.asarray(scipy.fft.rfft2(x, s=s, axes=axes, workers=workers))
    return _r2c(x, tuple(s), tuple(axes), workers)
