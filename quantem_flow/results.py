"""Typed results: data, axes, units, calibration and provenance together.

Every result holds a NumPy array in ``(row, column)`` order, the axes that
calibrate it, the unit of its values and its :class:`Provenance`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from .calibration import Axis
from .errors import ParameterError, ShapeError, UnsupportedOperationError
from .provenance import Provenance

__all__ = [
    "RESULT_TYPES",
    "ComplexObject",
    "DiffractionImage",
    "PhaseImage",
    "Result",
    "ScanImage",
    "VectorField",
    "register_plotter",
    "result_from_parts",
]

#: The function :meth:`Result.plot` delegates to (see :func:`register_plotter`).
_PLOTTER: list[Callable[..., Any]] = []


def register_plotter(plotter: Callable[..., Any]) -> None:
    """Register the function :meth:`Result.plot` delegates to.

    :mod:`quantem_flow.plotting` registers its ``plot_result`` on import
    (``import quantem_flow`` imports it), so results never import the
    plotting layer above them.
    """
    _PLOTTER[:] = [plotter]


def _binary(ufunc: np.ufunc) -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]:
    """The forward and reflected operator methods of ``ufunc`` (as NumPy's mixin makes them)."""

    def forward(self: Any, other: Any) -> Any:
        return ufunc(self, other)

    def reflected(self: Any, other: Any) -> Any:
        return ufunc(other, self)

    forward.__name__ = f"__{ufunc.__name__}__"
    reflected.__name__ = f"__r{ufunc.__name__}__"
    return forward, reflected


def _unary(ufunc: np.ufunc) -> Callable[[Any], Any]:
    def method(self: Any) -> Any:
        return ufunc(self)

    method.__name__ = f"__{ufunc.__name__}__"
    return method


@dataclasses.dataclass(eq=False)
class Result:
    """Base of every typed result.

    Attributes
    ----------
    data
        The values, in ``(row, column)`` order.
    units
        Unit of the values (``"counts"``, ``"mrad"``, ``"rad"``, ...).
    axes
        One :class:`Axis` per dimension of ``data`` (vector components have
        an axis named ``"component"``).
    provenance
        How the result was produced.
    name
        A short label (``"bf"``, ``"com"``...).
    """

    data: np.ndarray
    units: str
    axes: tuple[Axis, ...]
    provenance: Provenance
    name: str = ""

    kind: ClassVar[str] = "result"
    ndim: ClassVar[int] = 2

    def __post_init__(self) -> None:
        self.data = np.asarray(self.data)
        if self.data.ndim != self.ndim:
            raise ShapeError(
                f"{type(self).__name__} needs {self.ndim}-D data, got shape {self.data.shape}"
            )
        if len(self.axes) != self.data.ndim:
            raise ShapeError(
                f"{type(self).__name__} has {self.data.ndim} dimensions but {len(self.axes)} axes"
            )
        for axis, size in zip(self.axes, self.data.shape, strict=True):
            if axis.size != size:
                raise ShapeError(
                    f"axis {axis.name!r} has size {axis.size} but data has {size} along it"
                )

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of ``data``."""
        return tuple(self.data.shape)

    def metadata(self) -> dict[str, Any]:
        """Return everything but the data, JSON-ready."""
        return {
            "kind": self.kind,
            "name": self.name,
            "units": self.units,
            "shape": list(self.data.shape),
            "dtype": str(self.data.dtype),
            "axes": [a.to_dict() for a in self.axes],
            "provenance": self.provenance.to_dict(),
        }

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """Return ``data`` for ``np.asarray(result)`` (a copy only when asked or cast)."""
        if copy:
            return np.array(self.data, dtype=dtype, copy=True)
        if dtype is None or np.dtype(dtype) == self.data.dtype:
            return self.data
        if copy is False:
            raise ValueError(
                f"casting {self.data.dtype} to {np.dtype(dtype)} needs a copy, but copy=False"
            )
        return self.data.astype(dtype)

    # -- NumPy's array protocols (quantem_flow.result_math) ------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """Element-wise NumPy on results: axes kept, units combined, provenance recorded."""
        from .result_math import apply_ufunc

        return apply_ufunc(self, ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """NumPy functions on the data; element-wise ones (``np.clip``...) give a result."""
        from .result_math import apply_function

        return apply_function(self, func, types, args, kwargs)

    # arithmetic and ordering operators; == and != stay identity, so results hash
    __add__, __radd__ = _binary(np.add)
    __sub__, __rsub__ = _binary(np.subtract)
    __mul__, __rmul__ = _binary(np.multiply)
    __truediv__, __rtruediv__ = _binary(np.true_divide)
    __floordiv__, __rfloordiv__ = _binary(np.floor_divide)
    __mod__, __rmod__ = _binary(np.remainder)
    __pow__, __rpow__ = _binary(np.power)
    __matmul__, __rmatmul__ = _binary(np.matmul)
    __lt__ = _binary(np.less)[0]
    __le__ = _binary(np.less_equal)[0]
    __gt__ = _binary(np.greater)[0]
    __ge__ = _binary(np.greater_equal)[0]
    __neg__ = _unary(np.negative)
    __pos__ = _unary(np.positive)
    __abs__ = _unary(np.absolute)

    def to_xarray(self) -> Any:
        """Return an ``xarray.DataArray`` with coordinates, units and provenance.

        Needs the optional package ``xarray`` (``pip install quantem-flow[xarray]``).

        Returns
        -------
        xarray.DataArray
            The data (not copied) with one dimension per axis (``scan_row``,
            ``scan_col``, ``k_row``, ``k_col`` or ``component``), calibrated
            coordinates whose ``attrs["units"]`` is the axis unit, and
            ``attrs`` holding ``units``, ``kind``, ``operator`` and the
            provenance as a JSON string (``attrs["provenance"]``).
        """
        return _to_xarray(self)

    def plot(self, **options: Any) -> Any:
        """Draw the result with matplotlib (see :func:`quantem_flow.plotting.plot_result`).

        Parameters
        ----------
        **options
            Keyword options of :func:`~quantem_flow.plotting.plot_result`
            (``ax``, ``arrows``, ``detectors``, ``scalebar``, ``cmap``...).

        Returns
        -------
        matplotlib.figure.Figure
            The figure drawn in.
        """
        if not _PLOTTER:  # pragma: no cover - importing quantem_flow registers it
            raise UnsupportedOperationError(
                "no plotter is registered; import quantem_flow (its plotting module registers "
                "quantem_flow.plotting.plot_result)"
            )
        return _PLOTTER[0](self, **options)

    def _repr_html_(self) -> str:
        """What a Jupyter notebook shows: a thumbnail, shape, units, axes, provenance summary."""
        from .html_repr import result_html

        return result_html(self)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, shape={self.shape}, "
            f"dtype={self.data.dtype}, units={self.units!r}, operator="
            f"{self.provenance.operator!r}, native={self.provenance.native})"
        )


@dataclasses.dataclass(eq=False, repr=False)
class ScanImage(Result):
    """A real image over the scan, ``data[R_r, R_c]`` (virtual images...)."""

    kind: ClassVar[str] = "ScanImage"


@dataclasses.dataclass(eq=False, repr=False)
class PhaseImage(Result):
    """A phase over the scan, ``data[R_r, R_c]``, in ``rad`` or ``arb.``."""

    kind: ClassVar[str] = "PhaseImage"


@dataclasses.dataclass(eq=False, repr=False)
class DiffractionImage(Result):
    """A pattern over the detector, ``data[k_r, k_c]`` (mean, max, sum)."""

    kind: ClassVar[str] = "DiffractionImage"


@dataclasses.dataclass(eq=False, repr=False)
class VectorField(Result):
    """A 2-vector per scan position, ``data[component, R_r, R_c]``.

    Component 0 is the row (``k_r``) component and component 1 the column
    (``k_c``) component.
    """

    kind: ClassVar[str] = "VectorField"
    ndim: ClassVar[int] = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.data.shape[0] != 2:
            raise ShapeError(
                f"VectorField needs data of shape (2, rows, cols), got {self.data.shape}"
            )

    @property
    def row(self) -> np.ndarray:
        """Row component, ``data[0]``."""
        return np.asarray(self.data[0])

    @property
    def col(self) -> np.ndarray:
        """Column component, ``data[1]``."""
        return np.asarray(self.data[1])

    @property
    def magnitude(self) -> np.ndarray:
        """Euclidean length of each vector."""
        return np.asarray(np.hypot(self.data[0], self.data[1]))


@dataclasses.dataclass(eq=False, repr=False)
class ComplexObject(Result):
    """A complex transmission function over the scan, ``data[R_r, R_c]``."""

    kind: ClassVar[str] = "ComplexObject"

    @property
    def amplitude(self) -> np.ndarray:
        """Modulus of the object."""
        return np.asarray(np.abs(self.data))

    @property
    def phase(self) -> np.ndarray:
        """Argument of the object, in rad."""
        return np.asarray(np.angle(self.data))


def _to_xarray(result: Result) -> Any:
    import json

    try:
        import xarray as xr
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "to_xarray needs the optional package xarray: pip install 'quantem-flow[xarray]'"
        ) from exc
    coords: dict[str, Any] = {}
    for axis in result.axes:
        if axis.name == "component":
            coords[axis.name] = ("component", ["row", "col"])
        else:
            coords[axis.name] = (
                axis.name,
                np.asarray(axis.coordinates()),
                {"units": axis.units, "sampling": axis.sampling, "origin": axis.origin},
            )
    attrs = {
        "units": result.units,
        "kind": result.kind,
        "name": result.name,
        "operator": result.provenance.operator,
        "native": str(result.provenance.native),
        "provenance": json.dumps(result.provenance.to_dict(), ensure_ascii=False),
    }
    return xr.DataArray(
        result.data,
        dims=[a.name for a in result.axes],
        coords=coords,
        name=result.name or result.kind,
        attrs=attrs,
    )


RESULT_TYPES: dict[str, type[Result]] = {
    cls.kind: cls for cls in (ScanImage, PhaseImage, DiffractionImage, VectorField, ComplexObject)
}


def result_from_parts(data: np.ndarray, metadata: Mapping[str, Any]) -> Result:
    """Rebuild a typed result from its data and :meth:`Result.metadata`.

    Parameters
    ----------
    data
        The stored values.
    metadata
        The dict :meth:`Result.metadata` returned when it was saved.

    Returns
    -------
    Result
        An instance of the stored kind.
    """
    kind = metadata.get("kind")
    cls = RESULT_TYPES.get(str(kind))
    if cls is None:
        raise ParameterError(f"unknown result kind {kind!r}; known kinds: {sorted(RESULT_TYPES)}")
    return cls(
        data=np.asarray(data),
        units=str(metadata["units"]),
        axes=tuple(Axis.from_dict(a) for a in metadata["axes"]),
        provenance=Provenance.from_dict(metadata["provenance"]),
        name=str(metadata.get("name", "")),
    )
