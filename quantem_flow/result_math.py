"""NumPy's array protocols for typed results: arithmetic that keeps axes, units and provenance.

:class:`~quantem_flow.results.Result` delegates ``__array_ufunc__`` and
``__array_function__`` here, as xarray's ``DataArray`` does for its own
metadata:

* an element-wise ufunc (``bf + 1``, ``adf / bf``, ``np.log(mean)``,
  ``-phase``) on results whose axes agree returns a result of the first
  result's type, with the same axes, the units the operation gives, and a
  provenance that names the operation and holds its operands' provenance
  (``derived_from``);
* units follow the operation: ``+``, ``-``, comparisons, ``minimum``... need
  equal units (a bare number takes the result's units); ``*`` and ``/``
  compose them (``counts/counts`` is dimensionless ``1``); ``x**2`` gives
  ``counts^2``; other functions name themselves (``log(counts)``);
* comparisons and anything that changes the shape (a reduction such as
  ``np.mean(bf)``, ``np.add.reduce``, an ``out=`` argument) give plain NumPy
  values, as the metadata no longer describes them;
* ``__array_function__`` runs the NumPy function on the data: functions
  that keep every element where it is (``np.clip``, ``np.nan_to_num``,
  ``np.round``...) give a result, the rest plain NumPy values.

Results of different axes (another scan, another calibration) are refused
with :class:`~quantem_flow.errors.ShapeError`; different units where the
operation needs equal ones with :class:`~quantem_flow.errors.UnitsError`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ShapeError, UnitsError
from .provenance import Provenance

if TYPE_CHECKING:
    from .results import Result

__all__ = ["apply_function", "apply_ufunc", "combine_units"]

#: ufuncs whose operands must share units, and whose result keeps them.
_SAME_UNITS = frozenset(
    {
        "add",
        "subtract",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "hypot",
        "copysign",
        "remainder",
        "fmod",
    }
)
#: ufuncs that keep the unit of their one operand.
_KEEP_UNITS = frozenset(
    {
        "negative",
        "positive",
        "absolute",
        "fabs",
        "rint",
        "floor",
        "ceil",
        "trunc",
        "conjugate",
        "real",
        "imag",
    }
)
#: ufuncs with a boolean answer: compared in equal units, returned as plain arrays.
_COMPARISONS = frozenset(
    {
        "greater",
        "greater_equal",
        "less",
        "less_equal",
        "equal",
        "not_equal",
        "isnan",
        "isfinite",
        "isinf",
        "signbit",
        "logical_and",
        "logical_or",
        "logical_xor",
        "logical_not",
    }
)
#: NumPy functions that keep every element in place: the result keeps its axes.
_ELEMENTWISE_FUNCTIONS = frozenset(
    {
        "clip",
        "nan_to_num",
        "round",
        "around",
        "real",
        "imag",
        "conj",
        "conjugate",
        "angle",
        "real_if_close",
        "fix",
    }
)


def _unit_text(units: str) -> str:
    return units if units.isidentifier() or units in ("1", "") else f"({units})"


def combine_units(name: str, units: list[str | None]) -> str:
    """The unit of ``ufunc(*operands)``; ``None`` marks a bare number.

    Raises
    ------
    UnitsError
        When an addition, subtraction, comparison or extremum mixes units.
    """
    known = [u for u in units if u is not None]
    first = known[0] if known else "1"
    if name in _SAME_UNITS or name in _COMPARISONS:
        if len(set(known)) > 1:
            raise UnitsError(
                f"np.{name} needs operands in the same units, got {known}; convert one first "
                "(or take .data to work on bare numbers)"
            )
        return first
    if name in _KEEP_UNITS:
        return first
    if name in ("multiply", "matmul"):
        parts = [u for u in known if u not in ("1", "")]
        return "·".join(_unit_text(u) for u in parts) or "1"
    if name in ("divide", "true_divide", "floor_divide"):
        top, bottom = units[0], units[1]
        if top == bottom or bottom in (None, "1", ""):
            return "1" if top == bottom and top is not None else (top or "1")
        return f"{_unit_text(top or '1')}/{_unit_text(bottom)}"
    if name == "reciprocal":
        return f"1/{_unit_text(first)}"
    if name == "square":
        return f"{_unit_text(first)}^2"
    if name == "sqrt":
        return f"{_unit_text(first)}^0.5"
    if name in ("power", "float_power"):
        return f"{_unit_text(first)}^?"  # refined by the caller when the exponent is a number
    if first in ("1", ""):
        return "1"
    return f"{name}({first})"


def _results(values: Any) -> list[Result]:
    from .results import Result

    return [v for v in values if isinstance(v, Result)]


def _axes_text(result: Result) -> list[str]:
    return [f"{a.name} {a.size} x {a.sampling:g} {a.units}" for a in result.axes]


def _check_axes(results: list[Result], what: str) -> None:
    first = results[0]
    for other in results[1:]:
        if other.shape != first.shape or other.axes != first.axes:
            raise ShapeError(
                f"{what}: results {first.name or first.kind!r} and {other.name or other.kind!r} "
                f"have different axes ({_axes_text(first)} and {_axes_text(other)}); take .data "
                "to combine bare arrays"
            )


def _describe(value: Any) -> Any:
    from .results import Result

    if isinstance(value, Result):
        return {"result": value.name or value.kind, "units": value.units}
    if np.ndim(value) == 0:
        try:
            return float(value) if np.isrealobj(value) else str(value)
        except (TypeError, ValueError):
            return repr(value)[:80]
    return {"array": list(np.shape(value)), "dtype": str(np.asarray(value).dtype)}


def _wrap(
    template: Result, data: np.ndarray, units: str, operation: str, operands: list[Any]
) -> Result:
    """A result like ``template`` holding ``data``, its provenance naming ``operation``."""
    parents = _results(operands)
    parent = template.provenance
    provenance = Provenance(
        operator=f"numpy.{operation}",
        parameters={"operation": operation, "operands": [_describe(v) for v in operands]},
        source=parent.source,
        dataset=parent.dataset,
        transforms=parent.transforms,
        flags=parent.flags,
        accumulation_dtype=str(data.dtype),
        execution={"computed_on": "client (NumPy on a result)"},
        derived_from=[r.provenance.to_dict() for r in parents],
        notes=[f"{operation} of {[_describe(v) for v in operands]}, in units {units!r}"],
        timings={},
    )
    cls = type(template)
    try:
        return dataclasses.replace(template, data=data, units=units, provenance=provenance)
    except ShapeError:  # pragma: no cover - same shape and axes by construction
        return cls(
            data=data, units=units, axes=template.axes, provenance=provenance, name=template.name
        )


def apply_ufunc(owner: Result, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """``Result.__array_ufunc__``: ``ufunc`` on the data, rewrapped where the metadata holds."""
    from .results import Result

    results = _results(inputs)
    if kwargs.get("out") is not None:
        out = kwargs["out"]
        kwargs["out"] = tuple(o.data if isinstance(o, Result) else o for o in out)
    raw = [v.data if isinstance(v, Result) else v for v in inputs]
    name = ufunc.__name__
    if method != "__call__" or kwargs.get("out") is not None or ufunc.nout != 1:
        return getattr(ufunc, method)(*raw, **kwargs)
    _check_axes(results, f"np.{name}")
    units = combine_units(name, [v.units if isinstance(v, Result) else None for v in inputs])
    value = ufunc(*raw, **kwargs)
    if name in _COMPARISONS:
        return value
    if name in ("power", "float_power") and len(inputs) == 2 and np.ndim(inputs[1]) == 0:
        base = inputs[0].units if isinstance(inputs[0], Result) else "1"
        if isinstance(inputs[1], Result):
            return value
        units = "1" if base in ("1", "") else f"{_unit_text(base)}^{float(inputs[1]):g}"
    elif name in ("power", "float_power"):
        return value  # an exponent per element or with units: no single unit
    template = results[0]
    data = np.asarray(value)
    if data.shape != template.shape or data.ndim != template.ndim:
        return value
    return _wrap(template, data, units, name, list(inputs))


def apply_function(owner: Result, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """``Result.__array_function__``: NumPy on the data; element-wise functions give results."""
    from .results import Result

    def unwrap(value: Any) -> Any:
        if isinstance(value, Result):
            return value.data
        if isinstance(value, (list, tuple)):
            return type(value)(unwrap(v) for v in value)
        return value

    value = func(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
    name = getattr(func, "__name__", "")
    template = args[0] if args and isinstance(args[0], Result) else None
    if template is None or name not in _ELEMENTWISE_FUNCTIONS:
        return value
    data = np.asarray(value)
    if data.shape != template.shape:
        return value
    units = "rad" if name == "angle" else template.units
    return _wrap(template, data, units, name, [*args, *kwargs.values()])
