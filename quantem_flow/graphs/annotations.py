"""Per-key annotations of the engine's graph layers, validated on the client.

Dask drops ``dask.annotate`` contexts during graph optimisation, so the
engine attaches annotations to its own ``MaterializedLayer``s.  Values are
checked here, before submission: a bad value raises
:class:`~quantem_flow.errors.AnnotationError` and never reaches the
scheduler (where, for example, ``resources=None`` crashes it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import AnnotationError
from ..representations import REPRESENTATIONS
from ..runtimes import runtime_specs

__all__ = ["ANNOTATION_KEYS", "validate_annotations"]

#: Annotation names the engine sets, and what each means.
ANNOTATION_KEYS: dict[str, str] = {
    "qf_runtime": "registered runtime the task's kernel needs (cpu, cuda, mps...) or 'any'",
    "qf_representation": "representation of the payload the task reads",
    "qf_role": "load, kernel, pass (load+kernel), combine or probe",
    "qf_resident": "key of the resident chunk the task reads, or ''",
    "qf_nbytes": "bytes the task holds on its device (resident or one chunk in flight)",
    "qf_chunks": "indices of the chunks a chunk task runs (several: a group run in turn)",
    "qf_need": (
        "memory a chunk task needs at its peak: {'total': {pool: bytes}, 'parts': {part: bytes},"
        " 'rows': int, 'fixed': {pool: bytes}, 'per_row': {pool: bytes}, 'source_row_bytes': int}"
    ),
    "qf_pass": (
        "the pass or load a graph submits, for the scheduler's plugin (dashboard, departures): "
        "{'name', 'kind', 'label', 'scan_shape', 'chunks', 'row_bytes'}"
    ),
    "resources": "Dask worker resources, {name: positive amount}",
    "retries": "Dask retries, a non-negative integer",
    "priority": "Dask priority, an integer",
}

_ROLES = ("load", "kernel", "pass", "combine", "probe")


def validate_annotations(annotations: Mapping[str, Any]) -> dict[str, Any]:
    """Check annotation values and return them as a plain dict.

    Parameters
    ----------
    annotations
        ``{name: value}`` for one layer or key.

    Returns
    -------
    dict
        The same annotations.

    Raises
    ------
    AnnotationError
        On an unknown name or a value of the wrong type or range.
    """
    out: dict[str, Any] = {}
    for name, value in annotations.items():
        if name not in ANNOTATION_KEYS:
            raise AnnotationError(
                f"unknown annotation {name!r}={value!r}; known: {sorted(ANNOTATION_KEYS)}"
            )
        if name == "qf_runtime":
            registered = runtime_specs()
            if value != "any" and value not in registered:
                raise AnnotationError(
                    f"qf_runtime={value!r} is not a registered runtime {sorted(registered)} or "
                    "'any'"
                )
        elif name == "qf_representation":
            if value not in REPRESENTATIONS:
                raise AnnotationError(
                    f"qf_representation={value!r}; expected one of {list(REPRESENTATIONS)}"
                )
        elif name == "qf_role":
            if value not in _ROLES:
                raise AnnotationError(f"qf_role={value!r}; expected one of {list(_ROLES)}")
        elif name == "qf_resident":
            if not _is_key(value):
                raise AnnotationError(
                    f"qf_resident must be a Dask key (a string or a tuple starting with one), "
                    f"got {value!r}"
                )
        elif name == "qf_nbytes":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AnnotationError(f"qf_nbytes must be an integer >= 0, got {value!r}")
        elif name == "qf_need":
            _check_need(value)
        elif name == "qf_chunks":
            if (
                not isinstance(value, (tuple, list))
                or not value
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
            ):
                raise AnnotationError(
                    f"qf_chunks must be a non-empty tuple of chunk indices >= 0, got {value!r}"
                )
        elif name == "qf_pass":
            if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
                raise AnnotationError(
                    f"qf_pass must be {ANNOTATION_KEYS['qf_pass']} with a string name, got "
                    f"{value!r}"
                )
        elif name == "resources":
            if not isinstance(value, Mapping):
                raise AnnotationError(
                    f"resources must be a mapping {{name: amount}} (use {{}} for none), got "
                    f"{value!r}"
                )
            for rname, amount in value.items():
                if (
                    not isinstance(rname, str)
                    or isinstance(amount, bool)
                    or not isinstance(amount, (int, float))
                    or not math.isfinite(amount)
                    or amount <= 0
                ):
                    raise AnnotationError(
                        f"resources entry {rname!r}: {amount!r} must be a name with a positive "
                        "finite amount"
                    )
        elif name == "retries":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AnnotationError(f"retries must be an integer >= 0, got {value!r}")
        elif name == "priority" and (isinstance(value, bool) or not isinstance(value, int)):
            raise AnnotationError(f"priority must be an integer, got {value!r}")
        out[name] = value
    return out


_NEED_FIELDS = {
    "total": "pools",
    "parts": "parts",
    "rows": "int",
    "fixed": "pools",
    "per_row": "pools",
    "source_row_bytes": "int",
}


def _check_need(value: Any) -> None:
    expected = ANNOTATION_KEYS["qf_need"]
    if not isinstance(value, Mapping) or set(value) != set(_NEED_FIELDS):
        raise AnnotationError(f"qf_need must be {expected}, got {value!r}")
    for field, kind in _NEED_FIELDS.items():
        item = value[field]
        entries = item.items() if isinstance(item, Mapping) else [(field, item)]
        if kind != "int" and not isinstance(item, Mapping):
            entries = [(field, None)]
        for name, amount in entries:
            if (
                not isinstance(name, str)
                or isinstance(amount, bool)
                or not isinstance(amount, int)
                or amount < 0
                or (kind == "int" and isinstance(item, Mapping))
            ):
                raise AnnotationError(
                    f"qf_need[{field!r}] must be "
                    + ("an integer >= 0" if kind == "int" else "a mapping {name: integer >= 0}")
                    + f", got {item!r}; expected {expected}"
                )


def _is_key(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return (
        isinstance(value, tuple)
        and bool(value)
        and isinstance(value[0], str)
        and all(isinstance(v, (str, int, float)) for v in value[1:])
    )
