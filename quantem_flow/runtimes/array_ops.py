"""The array adapter contract of the SSB FFT stage, and choosing the runtime that runs it.

The stage (:mod:`quantem_flow.operators.ssb.stages`) is written once against a
small array adapter, :class:`ArrayOps`; each runtime declares its adapter in
its :class:`~quantem_flow.runtimes.registry.RuntimeSpec` (``array_ops``) and
keeps it in its own folder (``runtimes/cpu/array_ops.py``: NumPy/SciPy and a
compiled trotter loop; ``runtimes/cuda/array_ops.py``: CuPy;
``runtimes/mps/array_ops.py``: MLX).  Precision is explicit: ``cpu`` and
``cuda`` run in float64/complex128; MLX has no complex128 FFT, so the ``mps``
adapter exists only in complex64 and :func:`resolve_ssb_backend` refuses it
unless the caller allows complex64.

The data the contract passes besides arrays live here too:
:class:`Aberrations` (the coefficients) and :class:`PartialSums` (the
per-frequency sums a block adds).  The stage's frequency grid is passed to
the adapters as an object with the attributes they read (``grid`` in
:meth:`ArrayOps.band_spectra`), so this layer never imports the operator's.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import ParameterError, RuntimeUnavailableError, UnsupportedOperationError
from . import BackendChoice, get_runtime
from .registry import auto_order, dtype_name, get_spec, load_attribute, runtime_specs

__all__ = [
    "Aberrations",
    "ArrayOps",
    "PartialSums",
    "make_ops",
    "prewarm",
    "resolve_ssb_backend",
]


@dataclasses.dataclass(frozen=True)
class Aberrations:
    """Axial aberration coefficients in the polar (Krivanek) notation.

    Attributes
    ----------
    terms
        ``{(n, m): (C_nm in Å, phi_nm in rad)}``; ``m <= n + 1`` and
        ``n + 1 - m`` even.  ``(1, 0)`` is C10 (defocus), ``(1, 2)`` C12
        (two-fold astigmatism), ``(3, 0)`` C30 (spherical aberration).
    """

    terms: Mapping[tuple[int, int], tuple[float, float]]

    @property
    def is_zero(self) -> bool:
        """Whether every coefficient is zero."""
        return all(c == 0.0 for c, _ in self.terms.values())

    @property
    def is_quadratic(self) -> bool:
        """Whether only first-order terms (C10, C12) are non-zero."""
        return all(n == 1 for (n, _), (c, _) in self.terms.items() if c != 0.0)

    def quadratic_form(self) -> tuple[float, float, float]:
        """Return ``(C10, C12 cos 2 phi12, C12 sin 2 phi12)`` in Å."""
        c10 = self.terms.get((1, 0), (0.0, 0.0))[0]
        c12, phi12 = self.terms.get((1, 2), (0.0, 0.0))
        return c10, c12 * math.cos(2 * phi12), c12 * math.sin(2 * phi12)


@dataclasses.dataclass
class PartialSums:
    """Per-frequency sums over the trotters on the band (host, float64/complex128)."""

    s1: np.ndarray
    s2: np.ndarray
    n1: np.ndarray
    n2: np.ndarray
    e1: np.ndarray
    e2: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> PartialSums:
        """Empty sums on a band of ``shape``."""
        return cls(
            s1=np.zeros(shape, np.complex128),
            s2=np.zeros(shape, np.complex128),
            n1=np.zeros(shape),
            n2=np.zeros(shape),
            e1=np.zeros(shape),
            e2=np.zeros(shape),
        )

    def add(self, other: PartialSums) -> None:
        """Add ``other`` in place (complex128/float64)."""
        self.s1 += other.s1
        self.s2 += other.s2
        self.n1 += other.n1
        self.n2 += other.n2
        self.e1 += other.e1
        self.e2 += other.e2


class ArrayOps:
    """The array operations the SSB stage needs, on one runtime."""

    name: ClassVar[str] = "abstract"
    real_dtype: Any = None
    complex_dtype: Any = None
    precision: ClassVar[str] = ""
    #: Whether the constructor takes the FFT's thread count (``make_ops(..., workers=)``).
    takes_workers: ClassVar[bool] = False

    def asarray(self, a: np.ndarray) -> Any:
        """Copy a host array to the device in the real (or complex) working dtype."""
        raise NotImplementedError

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """Real FFT over the last two axes, zero-padded at the end to ``shape``."""
        raise NotImplementedError

    def normalise(self, block: np.ndarray, inv_mean: np.ndarray) -> Any:
        """``block * inv_mean[:, None, None] - 1`` on the device in the real working dtype."""
        x = self.asarray(block)
        scale = self.asarray(np.asarray(inv_mean, dtype=np.float64).reshape(-1, 1, 1))
        return x * scale - 1.0

    def exp_i(self, phase: Any) -> Any:
        """``exp(i * phase)`` of a real array."""
        raise NotImplementedError

    def complex_from(self, re: Any, im: Any) -> Any:
        """``re + i im``."""
        return re + 1j * im

    def real(self, z: Any) -> Any:
        """Real part."""
        raise NotImplementedError

    def abs2(self, z: Any) -> Any:
        """``|z|^2`` as a real array."""
        raise NotImplementedError

    def where(self, mask: Any, a: Any) -> Any:
        """``a`` where ``mask``, else 0."""
        raise NotImplementedError

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        raise NotImplementedError

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """Select ``index`` along ``axis``."""
        raise NotImplementedError

    def to_host(self, x: Any) -> np.ndarray:
        """Copy to a host NumPy array (synchronising)."""
        raise NotImplementedError

    def band_spectra(self, block: np.ndarray, inv_mean: np.ndarray, grid: Any) -> Any:
        """A faster ``spectra`` (:mod:`quantem_flow.operators.ssb.stages`) or ``None``."""
        return None

    def trotter_sums(
        self,
        spec: Any,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
    ) -> PartialSums | None:
        """A faster ``accumulate`` (:mod:`quantem_flow.operators.ssb.stages`) or ``None``."""
        return None

    def band_trotter_sums(
        self,
        block: np.ndarray,
        inv_mean: np.ndarray,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
    ) -> PartialSums | None:
        """``spectra`` then ``accumulate`` in one step, the same values, or ``None``.

        An adapter offers it where taking the spectra a few pixels at a time
        into the sums saves holding the block's spectra
        (:func:`quantem_flow.operators.ssb.stages.block_sums`).
        """
        return None

    @classmethod
    def prewarm(cls) -> threading.Thread | None:
        """Start loading what the first call would load (compiled code), or ``None``."""
        return None

    def lock(self) -> Any:
        """A context manager that serialises device evaluation where needed."""
        return _NullLock()

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for provenance."""
        return {"runtime": self.name, "precision": self.precision}


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def prewarm(runtime: str) -> threading.Thread | None:
    """Start the SSB adapter of ``runtime`` loading its compiled code in the background.

    Called when the SSB plan is made, so the load overlaps the gather pass;
    ``None`` where the adapter has nothing to load (``ArrayOps.prewarm``).
    Values do not depend on it.
    """
    spec = get_spec(runtime)
    if spec.array_ops is None:
        return None
    cls = load_attribute(spec.array_ops)
    hook = getattr(cls, "prewarm", None)
    return hook() if callable(hook) else None


def _complex128(spec: Any) -> bool:
    return bool(spec.array_ops_precision == "complex128")


def resolve_ssb_backend(
    backend: str, *, allow_complex64: bool = False, dtype: Any = None
) -> BackendChoice:
    """Choose the runtime of the SSB FFT/accumulation stage from the runtime declarations.

    A runtime runs the stage when it declares an array adapter
    (``RuntimeSpec.array_ops``) and the ``("ssb", "gathered", dtype)``
    kernel; one whose adapter is complex64 only (MLX) runs only when the
    caller allows complex64.

    Parameters
    ----------
    backend
        ``"auto"`` or a registered runtime name.
    allow_complex64
        Allow a runtime without complex128 FFT (MLX) to run in complex64.
    dtype
        The dtype of the gathered bright-field values (the dataset's);
        ``None`` accepts any.

    Returns
    -------
    BackendChoice
        Requested and chosen runtime and why.

    Raises
    ------
    RuntimeUnavailableError
        An explicit runtime is unknown or not available here, or no runtime
        is eligible for ``"auto"`` (the message names those that are).
    UnsupportedOperationError
        An explicit runtime has no SSB stage for ``dtype``, or is complex64
        only without ``allow_complex64=True``.
    """
    if not isinstance(backend, str):
        raise ParameterError(f"backend must be a string, got {backend!r}")
    dt = None if dtype is None else dtype_name(dtype)
    specs = runtime_specs()
    if backend == "auto":
        from . import _auto_verdict

        order = auto_order()
        skipped: list[str] = []
        for name in order:
            spec = specs[name]
            if spec.array_ops is None or not spec.supports("ssb", "gathered", dt):
                skipped.append(f"{name} (no SSB stage" + (f" for {dt}" if dt else "") + ")")
                continue
            verdict = _auto_verdict(name)  # the frame pass's checks: MLX off macOS not started
            if verdict is not None:
                absent = verdict[0] == "absent"
                skipped.append(f"{name} ({'not available here' if absent else verdict[1]})")
                continue
            if not _complex128(spec) and not allow_complex64:
                skipped.append(f"{name} (no complex128 FFT; allow_complex64=False)")
                continue
            reason = f"first of {list(order)} able to run the SSB FFT stage"
            if skipped:
                reason += "; passed over: " + "; ".join(skipped)
            return BackendChoice("auto", name, reason)
        raise RuntimeUnavailableError(
            f"no runtime here can run the SSB FFT stage by backend='auto'; passed over: "
            f"{'; '.join(skipped)}"
        )
    explicit = specs.get(backend)
    if explicit is None:
        able = [n for n, s in specs.items() if s.array_ops is not None]
        raise RuntimeUnavailableError(
            f"unknown runtime {backend!r} for the SSB FFT stage; expected 'auto' or one of {able}"
        )
    if explicit.array_ops is None or not explicit.supports("ssb", "gathered", dt):
        able = [
            n
            for n, s in specs.items()
            if s.array_ops is not None and s.supports("ssb", "gathered", dt)
        ]
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no SSB FFT stage"
            + (f" for {dt} data" if dt else "")
            + f"; runtimes that have one: {able}"
        )
    get_runtime(backend)  # raises RuntimeUnavailableError naming those that are available
    if not _complex128(explicit) and not allow_complex64:
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no complex128 FFT (its SSB adapter computes in "
            f"{explicit.array_ops_precision} only). SSB never lowers precision silently: pass "
            "allow_complex64=True to run the FFT stage in complex64 (recorded in provenance), "
            "or use a complex128 runtime such as backend='cpu' or 'cuda'"
        )
    return BackendChoice(backend, backend, "requested explicitly")


def make_ops(name: str, *, workers: int | None = None) -> ArrayOps:
    """Return the SSB array adapter runtime ``name`` declares (``RuntimeSpec.array_ops``).

    ``workers`` is passed to adapters that take it (the NumPy adapter's FFT threads).
    """
    spec = get_spec(name)
    if spec.array_ops is None:
        raise RuntimeUnavailableError(
            f"runtime {name!r} declares no SSB array adapter; runtimes that do: "
            f"{[n for n, s in runtime_specs().items() if s.array_ops is not None]}"
        )
    cls = load_attribute(spec.array_ops)
    ops = cls(workers) if workers is not None and getattr(cls, "takes_workers", False) else cls()
    if not isinstance(ops, ArrayOps):
        raise RuntimeUnavailableError(
            f"the SSB adapter {spec.array_ops} of runtime {name!r} is not an ArrayOps"
        )
    return ops
