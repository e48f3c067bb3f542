"""How a worker advertises what it can run, and how the scheduler reads it.

Capabilities travel as Dask worker resources, the only thing placement can
read without a round trip:

``qf-runtime-<name>``
    The worker can run kernels of runtime ``<name>`` (``cpu``, ``cuda``,
    ``mps``); the amount is the number of such tasks it runs at once (its
    threads for ``cpu``, 1 per device otherwise).
``qf-budget-<name>``
    Bytes of resident payload the worker admits for that runtime (device
    memory for ``cuda``/``mps``, host memory for ``cpu``).  Tasks never
    request this resource; it is read by the placement plugin.

A worker that advertises no ``qf-runtime-*`` resource (a plain ``dask
worker``) is treated as a CPU-only worker with its memory limit as budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUDGET_PREFIX",
    "RUNTIME_PREFIX",
    "WorkerCapabilities",
    "capability_resources",
    "parse_resources",
]

RUNTIME_PREFIX = "qf-runtime-"
BUDGET_PREFIX = "qf-budget-"


@dataclasses.dataclass(frozen=True)
class WorkerCapabilities:
    """What one worker can run and hold.

    Attributes
    ----------
    address
        The worker's address.
    runtimes
        Runtime names it runs (always includes ``cpu`` unless restricted).
    slots
        ``{runtime: tasks at once}``.
    budgets
        ``{runtime: admissible resident bytes}``.
    name
        The worker's name, for display.
    """

    address: str
    runtimes: frozenset[str]
    slots: Mapping[str, float]
    budgets: Mapping[str, int]
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "address": self.address,
            "name": self.name,
            "runtimes": sorted(self.runtimes),
            "slots": dict(self.slots),
            "budgets": dict(self.budgets),
        }


def capability_resources(
    runtimes: Mapping[str, float], budgets: Mapping[str, int]
) -> dict[str, float]:
    """Return the Dask resources that advertise ``runtimes`` and ``budgets``."""
    res: dict[str, float] = {}
    for name, slots in runtimes.items():
        res[RUNTIME_PREFIX + name] = float(slots)
    for name, nbytes in budgets.items():
        res[BUDGET_PREFIX + name] = float(nbytes)
    return res


def parse_resources(
    address: str,
    resources: Mapping[str, float],
    *,
    nthreads: int = 1,
    memory_limit: int | None = None,
    name: str = "",
) -> WorkerCapabilities:
    """Read a worker's capabilities from its Dask resources.

    A worker without any ``qf-runtime-*`` resource is a CPU worker with
    ``nthreads`` slots and its memory limit as budget.
    """
    runtimes = {
        k[len(RUNTIME_PREFIX) :]: float(v)
        for k, v in resources.items()
        if k.startswith(RUNTIME_PREFIX)
    }
    budgets = {
        k[len(BUDGET_PREFIX) :]: int(v) for k, v in resources.items() if k.startswith(BUDGET_PREFIX)
    }
    if not runtimes:
        runtimes = {"cpu": float(nthreads)}
        if memory_limit:
            budgets.setdefault("cpu", int(memory_limit))
    return WorkerCapabilities(
        address=address,
        runtimes=frozenset(runtimes),
        slots=runtimes,
        budgets=budgets,
        name=name,
    )
