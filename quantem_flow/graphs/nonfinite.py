"""Non-finite per-frame values of a pass: recorded in provenance, warned about once per result.

Every runtime computes a per-frame value over the *support* of its weight row
(the pixels with a nonzero weight; docs/runtimes.md): a NaN or infinite
detector pixel outside a virtual detector does not touch it.  A bad pixel
inside the support does make that scan position NaN or +-inf, and it is
reported, never silently propagated:

- :func:`record_pass` (called once per pass by the executor) adds
  ``execution["non_finite"]`` when any per-frame value is non-finite: one
  entry per weight row with the number of scan positions hit (NaN, +inf,
  -inf) and the first few ``(row, col)`` positions.
- :func:`report_result` (called once per finished chunk-operator result)
  names the result in the entries of its own weight rows, adds a note to its
  provenance and emits one :class:`~quantem_flow.errors.NonFiniteWarning`.

quantem-flow has no detector pixel mask or replace transform yet; the
warning tells the user to give the bad pixels weight 0 (``qf.virtual_mask``
with those pixels zero) or to repair them in the source data.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import NonFiniteWarning

__all__ = ["FIRST_POSITIONS", "record_pass", "report_result"]

#: ``(row, col)`` positions listed per weight row.
FIRST_POSITIONS = 5


def record_pass(
    per_frame: np.ndarray, weight_keys: Sequence[str], execution: dict[str, Any]
) -> None:
    """Record the non-finite per-frame values of a pass in ``execution["non_finite"]``.

    Parameters
    ----------
    per_frame
        ``(R_r, R_c, n_weights)`` float64 values of the pass.
    weight_keys
        The key of each weight row, in ``per_frame``'s last-axis order.
    execution
        The pass's execution record (shared by its results); nothing is
        added when every value is finite.
    """
    if per_frame.size == 0:
        return
    finite = np.isfinite(per_frame)
    if finite.all():
        return
    entries = []
    for i, key in enumerate(weight_keys):
        plane = per_frame[:, :, i]
        bad = ~finite[:, :, i]
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        first = np.argwhere(bad)[:FIRST_POSITIONS]
        entries.append(
            {
                "weight": str(key),
                "weight_row": i,
                "results": [],
                "scan_positions": count,
                "of_scan_positions": int(bad.size),
                "nan": int(np.count_nonzero(np.isnan(plane))),
                "posinf": int(np.count_nonzero(plane == np.inf)),
                "neginf": int(np.count_nonzero(plane == -np.inf)),
                "first_positions": [[int(r), int(c)] for r, c in first],
                "cause": "non-finite detector pixels inside the weight row's support "
                "(pixels outside it, with weight 0, are skipped)",
            }
        )
    execution["non_finite"] = entries


def report_result(result: Any, weight_keys: Iterable[str], *, stacklevel: int = 2) -> None:
    """Name ``result`` in the non-finite entries of its weight rows; note it and warn once.

    Parameters
    ----------
    result
        A finished result whose ``provenance.execution`` is its pass's record.
    weight_keys
        The keys of the weight rows the result was computed from.
    stacklevel
        Passed to :func:`warnings.warn`.
    """
    provenance = getattr(result, "provenance", None)
    if provenance is None:
        return
    entries = provenance.execution.get("non_finite") or []
    keys = set(weight_keys)
    mine = [e for e in entries if e["weight"] in keys]
    if not mine:
        return
    name = str(getattr(result, "name", None) or provenance.operator)
    for e in mine:
        if name not in e["results"]:
            e["results"].append(name)
    worst = max(mine, key=lambda e: e["scan_positions"])
    first = ", ".join(f"({r}, {c})" for r, c in worst["first_positions"])
    note = (
        f"{worst['scan_positions']} of {worst['of_scan_positions']} scan positions are "
        f"non-finite ({worst['nan']} NaN, {worst['posinf']} +inf, {worst['neginf']} -inf in "
        f"weight row {worst['weight_row']}; first (row, col): {first}): those frames hold NaN "
        "or infinite detector pixels inside the detector's support (see "
        "execution['non_finite'])"
    )
    provenance.notes.append(note)
    warnings.warn(
        f"{name}: {note}. Give the bad detector pixels weight 0 (for example "
        "qf.virtual_mask with those pixels set to 0) or replace them in the source data; "
        "quantem-flow has no pixel mask/replace transform yet.",
        NonFiniteWarning,
        stacklevel=stacklevel,
    )
