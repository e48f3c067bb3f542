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
``qf-memory-<pool>``
    Bytes of one physical memory pool (``host`` RAM, ``cuda`` device
    memory, an external worker's own memory).  Runtimes that compute in
    the same memory share one pool (``cpu`` and ``mps``: Apple silicon's
    unified memory, or MLX on the host), so it is counted once: the pool is
    the largest budget of the runtimes in it.  Streaming tasks request
    their memory need from it (``resources={"qf-memory-host": need}``), so
    a worker runs at once only the tasks whose needs fit.

``qf-reserve-host``
    Bytes of host memory the worker's own process takes (interpreter,
    libraries, compiled kernels), already left out of its ``host`` pool;
    named in admission refusals.  Never requested by tasks.

A worker that advertises no ``qf-runtime-*`` resource (a plain ``dask
worker``) is treated as a CPU-only worker with its memory limit as budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUDGET_PREFIX",
    "MEMORY_PREFIX",
    "RESERVE_RESOURCE",
    "RUNTIME_PREFIX",
    "WorkerCapabilities",
    "capability_resources",
    "memory_pool",
    "memory_pools",
    "parse_resources",
]

RUNTIME_PREFIX = "qf-runtime-"
BUDGET_PREFIX = "qf-budget-"
MEMORY_PREFIX = "qf-memory-"
RESERVE_RESOURCE = "qf-reserve-host"


def memory_pool(runtime: str) -> str:
    """Return the memory pool a runtime's payloads and kernels live in.

    ``cpu`` and ``mps`` share ``"host"`` (MLX computes in unified memory on
    Apple silicon and in host RAM elsewhere); ``cuda`` has ``"cuda"`` (one
    device per worker process); an external runtime has its own pool named
    after it; an unknown name is its own pool.

    Parameters
    ----------
    runtime
        A registered runtime name.

    Returns
    -------
    str
        The pool name.
    """
    from ..runtimes import runtime_specs

    spec = runtime_specs().get(runtime)
    if spec is None:
        return runtime
    if spec.memory_pool is not None:  # declared (mps: "host")
        return spec.memory_pool
    if spec.residency == "external":
        return runtime
    return str(spec.residency)


def memory_pools(budgets: Mapping[str, int]) -> dict[str, int]:
    """Return ``{pool: bytes}`` of runtime ``budgets``, each shared pool counted once.

    A pool's size is the largest budget of the runtimes in it (a worker
    advertising ``cpu`` and ``mps`` budgets of the same RAM has one pool of
    that RAM, not two).
    """
    pools: dict[str, int] = {}
    for name, nbytes in budgets.items():
        pool = memory_pool(name)
        pools[pool] = max(pools.get(pool, 0), int(nbytes))
    return pools


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
    pools
        ``{pool: bytes}`` of its memory pools (:func:`memory_pools`); when
        not given, derived from ``budgets``.
    pool_resources
        The pools the worker advertises as Dask resources
        (``qf-memory-<pool>``), so tasks can request their need from them
        and the worker runs at once only what fits.  Empty for plain Dask
        workers and workers of older versions.
    reserve_bytes
        Host bytes the worker's own process takes (``qf-reserve-host``), 0 when
        not advertised.
    memory_limit
        The worker's memory limit, when known.
    """

    address: str
    runtimes: frozenset[str]
    slots: Mapping[str, float]
    budgets: Mapping[str, int]
    name: str = ""
    pools: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pool_resources: frozenset[str] = frozenset()
    reserve_bytes: int = 0
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        if not self.pools:
            object.__setattr__(self, "pools", memory_pools(self.budgets))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "address": self.address,
            "name": self.name,
            "runtimes": sorted(self.runtimes),
            "slots": dict(self.slots),
            "budgets": dict(self.budgets),
            "pools": dict(self.pools),
            "pool_resources": sorted(self.pool_resources),
            "reserve_bytes": self.reserve_bytes,
            "memory_limit": self.memory_limit,
        }


def capability_resources(
    runtimes: Mapping[str, float],
    budgets: Mapping[str, int],
    *,
    pools: Mapping[str, int] | None = None,
    reserve: int | None = None,
) -> dict[str, float]:
    """Return the Dask resources that advertise ``runtimes``, ``budgets`` and memory pools.

    ``pools`` default to :func:`memory_pools` of ``budgets``; ``reserve`` (the host
    bytes the worker's own process takes) is advertised as ``qf-reserve-host``.
    """
    res: dict[str, float] = {}
    for name, slots in runtimes.items():
        res[RUNTIME_PREFIX + name] = float(slots)
    for name, nbytes in budgets.items():
        res[BUDGET_PREFIX + name] = float(nbytes)
    for pool, nbytes in (memory_pools(budgets) if pools is None else pools).items():
        res[MEMORY_PREFIX + pool] = float(nbytes)
    if reserve is not None:
        res[RESERVE_RESOURCE] = float(reserve)
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
    pools = {
        k[len(MEMORY_PREFIX) :]: int(v) for k, v in resources.items() if k.startswith(MEMORY_PREFIX)
    }
    if not runtimes:
        runtimes = {"cpu": float(nthreads)}
        if memory_limit:
            budgets.setdefault("cpu", int(memory_limit))
    derived = memory_pools(budgets)
    return WorkerCapabilities(
        address=address,
        runtimes=frozenset(runtimes),
        slots=runtimes,
        budgets=budgets,
        name=name,
        pools={**derived, **pools},
        pool_resources=frozenset(pools),
        reserve_bytes=int(resources.get(RESERVE_RESOURCE, 0)),
        memory_limit=int(memory_limit) if memory_limit else None,
    )
