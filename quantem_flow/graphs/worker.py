"""Quantem-flow workers: probe the runtimes here and advertise them to the scheduler.

A quantem-flow worker is a Dask worker that advertises what it can run as
resources (see :mod:`quantem_flow.graphs.capabilities`): one
``qf-runtime-<name>`` slot count and one ``qf-budget-<name>`` byte budget per
runtime, one ``qf-memory-<pool>`` per physical memory pool (``cpu`` and ``mps``
share ``host``: counted once), and keeps device payloads out of the spill-to-disk buffer
(:class:`~quantem_flow.graphs.worker_data.ResidentAwareData`).  Three ways to
start one:

- in Python, ``Worker(**worker_options(runtimes=["cpu"]))`` or
  :func:`quantem_flow.graphs.cluster.start_local_cluster`;
- on a command line, ``dask worker ADDRESS --preload quantem_flow.graphs.worker
  --qf-runtimes cpu,mps`` or ``quantem-flow worker ADDRESS --runtimes cpu,mps``;
- on a running worker, ``client.register_plugin(QuantemFlowWorkerPlugin())``.

The first two advertise before the worker registers, so the scheduler never
sees the worker without its capabilities.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import click
from distributed import WorkerPlugin

from ..errors import ParameterError, RuntimeUnavailableError
from .capabilities import (
    BUDGET_PREFIX,
    MEMORY_PREFIX,
    RESERVE_RESOURCE,
    RUNTIME_PREFIX,
    capability_resources,
    memory_pools,
)
from .direct_pass import PASS_HANDLER, install_pass_handler
from .query_service import HANDLER as QUERY_HANDLER
from .query_service import install_query_handler
from .worker_data import ResidentAwareData

__all__ = [
    "PLUGIN_NAME",
    "QuantemFlowWorkerPlugin",
    "dask_setup",
    "probe_capabilities",
    "probe_runtime_details",
    "process_reserve",
    "worker_options",
]

logger = logging.getLogger(__name__)

#: Name under which the plugin is registered on a worker.
PLUGIN_NAME = "quantem-flow-worker"
#: Key of the capability details in ``worker.metrics`` / startup information.
INFO_KEY = "quantem_flow"
DEFAULT_BUDGET_FRACTION = 0.8


# -- probing -----------------------------------------------------------------------------------
def _check_fraction(budget_fraction: float) -> float:
    if isinstance(budget_fraction, bool) or not isinstance(budget_fraction, (int, float)):
        raise ParameterError(f"budget_fraction must be a number in (0, 1], got {budget_fraction!r}")
    value = float(budget_fraction)
    if not 0.0 < value <= 1.0:
        raise ParameterError(
            f"budget_fraction must be in (0, 1] (the share of memory admitted for resident "
            f"payloads), got {budget_fraction!r}"
        )
    return value


def _check_runtime_names(runtimes: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """Validate names against the registered runtimes; None means every available runtime."""
    from ..runtimes import runtime_specs

    registered = runtime_specs()
    if runtimes is None:
        return None
    if isinstance(runtimes, str):
        runtimes = [r for r in runtimes.split(",")]
    names: list[str] = []
    for r in runtimes:
        if not isinstance(r, str):
            raise ParameterError(f"runtime names must be strings, got {r!r} in {runtimes!r}")
        name = r.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise ParameterError(
            f"runtimes must name at least one runtime (one of {sorted(registered)}) or be None "
            f"for every available one, got {runtimes!r}"
        )
    from ..runtimes.external.spec import register_requested

    if register_requested(names):  # external runtimes join the registry when named
        registered = runtime_specs()
    unknown = [n for n in names if n not in registered]
    if unknown:
        from ..runtimes import available_runtimes, entry_point_errors
        from ..runtimes.registry import unregistered_reason

        broken = entry_point_errors()
        why = "".join(
            f" ({broken.get(n) or unregistered_reason(n)})"
            for n in unknown
            if n in broken or unregistered_reason(n)
        )
        raise RuntimeUnavailableError(
            f"runtime(s) {unknown} requested but no runtime of that name is registered"
            f"{why} (registered: {sorted(registered)}); available on this machine: "
            f"{sorted(available_runtimes())}. Ask for some of those, install the package "
            "that provides it, or pass runtimes=None for every available one"
        )
    return tuple(names)


def _total_memory() -> int:
    """RAM this process may use: psutil's total, capped by cgroup and rlimit (distributed)."""
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT)


#: Memory a worker process adds after start-up when it first runs kernels (Numba
#: compiling the CPU kernels: measured 126 -> 189 MiB RSS on a fresh worker).
KERNEL_RESERVE_BYTES = 64 * 2**20


def process_reserve() -> int:
    """Return the host bytes this worker process keeps for itself.

    Its resident memory now plus :data:`KERNEL_RESERVE_BYTES`: a worker is
    paused and killed on its whole resident memory, so only what is left
    after the process itself is available to tasks.
    """
    import psutil  # type: ignore[import-untyped]  # a dependency of distributed

    return int(psutil.Process().memory_info().rss) + KERNEL_RESERVE_BYTES


def _host_bytes(memory_limit: int | None) -> int:
    return int(memory_limit) if memory_limit else _total_memory()


def _probe(
    runtimes: Sequence[str] | str | None,
    memory_limit: int | None,
    budget_fraction: float,
    nthreads: int | None,
) -> tuple[dict[str, float], dict[str, int], dict[str, dict[str, Any]]]:
    """Run each runtime's declared probe (``RuntimeSpec.probe``) and collect what it found."""
    from ..runtimes import probe_runtime, runtime_specs

    fraction = _check_fraction(budget_fraction)
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < 0
    ):
        raise ParameterError(
            f"memory_limit must be a non-negative number of bytes or None, got {memory_limit!r}"
        )
    if nthreads is not None and (
        isinstance(nthreads, bool) or not isinstance(nthreads, int) or nthreads < 1
    ):
        raise ParameterError(f"nthreads must be a positive integer or None, got {nthreads!r}")
    requested = _check_runtime_names(runtimes)
    # by default every registered runtime except external ones: probing those starts a
    # process or a browser, so they are advertised only when named
    names = (
        requested
        if requested is not None
        else tuple(n for n, s in runtime_specs().items() if s.residency != "external")
    )
    host = _host_bytes(memory_limit)
    slots: dict[str, float] = {}
    budgets: dict[str, int] = {}
    details: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for name in names:
        found = probe_runtime(
            name, nthreads=nthreads or 1, memory_limit=host, budget_fraction=fraction
        )
        if not found.available:
            missing[name] = found.reason
            continue
        slots[name], budgets[name] = found.slots, found.budget_bytes
        details[name] = {"available": found.reason, **found.details}
    if requested is not None and missing:
        raise RuntimeUnavailableError(
            f"runtime(s) {sorted(missing)} requested but not available on this machine ("
            + "; ".join(f"{n}: {why}" for n, why in missing.items())
            + f"); available: {sorted(slots)}. Ask for some of those, or start this worker on "
            f"a machine that has {sorted(missing)}"
        )
    for name, why in missing.items():
        logger.debug("quantem-flow: runtime %s not advertised: %s", name, why)
    return slots, budgets, details


def probe_capabilities(
    *,
    runtimes: Sequence[str] | None = None,
    memory_limit: int | None = None,
    budget_fraction: float = DEFAULT_BUDGET_FRACTION,
    nthreads: int | None = None,
) -> tuple[dict[str, float], dict[str, int]]:
    """Return the slots and byte budgets of the runtimes this process can run.

    Parameters
    ----------
    runtimes
        Runtimes to advertise (names from
        :func:`quantem_flow.runtimes.runtime_specs`); default every available one.
        ``cpu`` is included unless a list without it is given.
    memory_limit
        The worker's memory limit in bytes; default the machine's total RAM.
    budget_fraction
        Share of memory admitted for resident payloads, in (0, 1]: of
        ``memory_limit`` (or RAM) for ``cpu`` and for ``mps`` without Metal,
        of the free device memory for ``cuda``.  ``mps`` on Metal admits MLX's
        recommended working set.  Each runtime's declared probe
        (``RuntimeSpec.probe``) computes its own.
    nthreads
        The worker's threads: the ``cpu`` slots (default 1).  ``cuda`` and
        ``mps`` have one slot.

    Returns
    -------
    tuple of dict
        ``({runtime: slots}, {runtime: budget bytes})``; pass them to
        :func:`~quantem_flow.graphs.capabilities.capability_resources`.

    Raises
    ------
    RuntimeUnavailableError
        A requested runtime is unknown or not available here; the message
        names those that are.  There is no silent fallback.
    ParameterError
        ``budget_fraction``, ``memory_limit`` or ``nthreads`` is out of range.
    """
    slots, budgets, _ = _probe(runtimes, memory_limit, budget_fraction, nthreads)
    return slots, budgets


def probe_runtime_details(*, runtimes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Return ``{runtime: {device, versions, ...}}`` for display (same selection rules)."""
    _, _, details = _probe(runtimes, None, DEFAULT_BUDGET_FRACTION, None)
    return details


# -- the worker plugin -------------------------------------------------------------------------
def _check_budgets(budgets: Mapping[str, int] | None) -> dict[str, int]:
    from ..runtimes import runtime_specs

    if budgets is None:
        return {}
    registered = runtime_specs()
    if not isinstance(budgets, Mapping):
        raise ParameterError(f"budgets must map runtime names to bytes, got {budgets!r}")
    out: dict[str, int] = {}
    for name, nbytes in budgets.items():
        if name not in registered:
            raise ParameterError(
                f"budgets names unknown runtime {name!r}; registered runtimes: {sorted(registered)}"
            )
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ParameterError(
                f"budgets[{name!r}] must be a non-negative number of bytes, got {nbytes!r}"
            )
        out[name] = int(nbytes)
    return out


def _worker_metrics(worker: Any) -> dict[str, Any]:
    """Heartbeat metric: advertised capabilities, details and resident bytes."""
    plugin = getattr(worker, "plugins", {}).get(PLUGIN_NAME)
    out: dict[str, Any] = dict(plugin.info) if isinstance(plugin, QuantemFlowWorkerPlugin) else {}
    data = getattr(worker, "data", None)
    if isinstance(data, ResidentAwareData):
        out["resident_bytes"] = data.resident_bytes()
    return out


def _worker_runtimes_metric(worker: Any) -> str:
    """Heartbeat metric shown as a column of the dashboard's worker table."""
    plugin = getattr(worker, "plugins", {}).get(PLUGIN_NAME)
    if isinstance(plugin, QuantemFlowWorkerPlugin):
        return ",".join(plugin.slots)
    return ""


def _worker_startup_info(worker: Any) -> dict[str, Any]:
    plugin = getattr(worker, "plugins", {}).get(PLUGIN_NAME)
    return dict(plugin.info) if isinstance(plugin, QuantemFlowWorkerPlugin) else {}


def _install_data(worker: Any) -> None:
    """Give a worker that has not registered yet a :class:`ResidentAwareData`."""
    data = worker.memory_manager.data
    if isinstance(data, ResidentAwareData):
        return
    if len(data):
        logger.warning(
            "quantem-flow: worker %s already holds %d keys; keeping its %s data mapping, "
            "so device payloads may spill to disk",
            getattr(worker, "address", "?"),
            len(data),
            type(data).__name__,
        )
        return
    new = ResidentAwareData(worker.local_directory, memory_limit=worker.memory_manager.memory_limit)
    worker.memory_manager.data = new
    worker.state.data = new


class QuantemFlowWorkerPlugin(WorkerPlugin):  # type: ignore[misc]
    """Probe this worker's runtimes and advertise them as Dask resources.

    Parameters
    ----------
    runtimes
        Runtimes to advertise (default every available one); a requested
        runtime that is not available makes :meth:`setup` raise
        :class:`~quantem_flow.errors.RuntimeUnavailableError` (a worker given
        the plugin at construction then fails to start).
    budget_fraction
        See :func:`probe_capabilities`.
    budgets
        ``{runtime: bytes}`` overriding the probed budgets.
    install_data
        On a worker that has not registered yet and holds no data, replace
        its data mapping with a
        :class:`~quantem_flow.graphs.worker_data.ResidentAwareData` (what
        ``--preload`` does, since ``dask worker`` cannot be given ``data=``).

    Attributes
    ----------
    slots, budgets, pools
        What was advertised, after :meth:`setup`.  ``pools`` are the memory
        pools (``cpu`` and ``mps`` share ``host``, counted once); the
        ``host`` pool is the budget less :func:`process_reserve`.
    info
        ``{"runtimes", "slots", "budgets", "details"}`` also published in
        ``worker.metrics["quantem_flow"]`` (every heartbeat) and, when set up
        before registration, in the worker's startup information.
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(
        self,
        *,
        runtimes: Sequence[str] | None = None,
        budget_fraction: float = DEFAULT_BUDGET_FRACTION,
        budgets: Mapping[str, int] | None = None,
        install_data: bool = False,
    ) -> None:
        self.install_data = bool(install_data)
        self.runtimes = _check_runtime_names(runtimes)
        self.budget_fraction = _check_fraction(budget_fraction)
        self.budget_overrides = _check_budgets(budgets)
        self.slots: dict[str, float] = {}
        self.budgets: dict[str, int] = {}
        self.pools: dict[str, int] = {}
        self.info: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"QuantemFlowWorkerPlugin(runtimes={self.runtimes!r}, "
            f"budget_fraction={self.budget_fraction!r}, budgets={self.budget_overrides!r}, "
            f"install_data={self.install_data!r})"
        )

    async def setup(self, worker: Any) -> None:
        """Probe, then advertise the capabilities on ``worker``.

        Before the worker has registered (plugin given at construction or by
        ``--preload``) the resources are written into its state and travel
        with the registration; afterwards (``client.register_plugin``) they
        are sent with ``worker.set_resources``.
        """
        from distributed.core import Status

        memory_limit = worker.memory_manager.memory_limit
        if self.install_data and worker.status == Status.init:
            _install_data(worker)
        data = worker.data
        if isinstance(data, ResidentAwareData) and data.memory_limit is None and memory_limit:
            data.set_memory_limit(int(memory_limit))
        slots, budgets, details = _probe(
            self.runtimes,
            int(memory_limit) if memory_limit else None,
            self.budget_fraction,
            int(worker.state.nthreads),
        )
        extra = sorted(set(self.budget_overrides) - set(slots))
        if extra:
            raise ParameterError(
                f"budgets given for {extra}, which this worker does not advertise "
                f"(it advertises {sorted(slots)}); drop them or add them to runtimes"
            )
        budgets.update(self.budget_overrides)
        self.slots, self.budgets = slots, budgets
        pools = memory_pools(budgets)
        reserve = process_reserve()
        if "host" in pools and "host" not in self.budget_overrides:
            # what this process already uses (interpreter, libraries, kernels compiled on
            # first use) is not available to tasks: Dask pauses and kills on the whole RSS
            host = _host_bytes(int(memory_limit) if memory_limit else None)
            pools["host"] = max(0, min(pools["host"], int(self.budget_fraction * host) - reserve))
        self.pools = pools
        self.info = {
            "runtimes": sorted(slots),
            "slots": dict(slots),
            "budgets": dict(budgets),
            "pools": dict(pools),
            "reserve_bytes": reserve,
            "details": details,
        }
        resources = capability_resources(slots, budgets, pools=pools, reserve=reserve)
        # Resources of an earlier setup that this one no longer advertises go to 0.
        for key in list(worker.state.total_resources):
            if (
                key.startswith((RUNTIME_PREFIX, BUDGET_PREFIX, MEMORY_PREFIX))
                or key == RESERVE_RESOURCE
            ) and key not in resources:
                resources[key] = 0.0
        worker.metrics[INFO_KEY] = _worker_metrics
        worker.metrics["qf-runtimes"] = _worker_runtimes_metric
        install_query_handler(worker)  # queries on resident chunks, without the scheduler
        install_pass_handler(worker)  # file passes on a cluster of one worker, the same way
        worker.startup_information[INFO_KEY] = _worker_startup_info
        if worker.status == Status.init:
            # Not registered yet: the registration message carries total_resources.
            state = worker.state
            for key, quantity in resources.items():
                old = state.total_resources.get(key)
                if old is None:
                    state.available_resources[key] = quantity
                else:
                    state.available_resources[key] += quantity - old
                state.total_resources[key] = quantity
        else:
            await worker.set_resources(**resources)
        logger.info(
            "quantem-flow worker %s advertises %s",
            getattr(worker, "address", "?"),
            {k: v for k, v in resources.items() if v},
        )

    def teardown(self, worker: Any) -> None:
        """Stop publishing the capability metrics (the resources stay)."""
        for key in (INFO_KEY, "qf-runtimes"):
            worker.metrics.pop(key, None)
        worker.handlers.pop(QUERY_HANDLER, None)
        worker.handlers.pop(PASS_HANDLER, None)
        worker.startup_information.pop(INFO_KEY, None)


class _RefuseToStart(WorkerPlugin):  # type: ignore[misc]
    """Fail the worker's start with the error found while reading the preload options."""

    name = PLUGIN_NAME

    def __init__(self, error: Exception) -> None:
        self.error = error

    def setup(self, worker: Any) -> None:
        raise self.error


# -- preload entry point -----------------------------------------------------------------------
@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--qf-runtimes",
    type=str,
    default=None,
    help="Comma-separated runtimes to advertise (default: every available one).",
)
@click.option(
    "--qf-budget-fraction",
    type=float,
    default=DEFAULT_BUDGET_FRACTION,
    show_default=True,
    help="Share of memory admitted for resident payloads.",
)
@click.option(
    "--qf-data/--no-qf-data",
    default=True,
    show_default=True,
    help="Keep device payloads out of spill-to-disk (ResidentAwareData as worker data).",
)
async def dask_setup(
    worker: Any, qf_runtimes: str | None, qf_budget_fraction: float, qf_data: bool
) -> None:
    """Make a worker a quantem-flow worker (``dask worker --preload quantem_flow.graphs.worker``).

    Runs before the worker registers.  The plugin is queued with the
    plugins given at construction (replacing a quantem-flow plugin given
    there), so a requested runtime that is not available fails the worker's
    start instead of being logged and ignored as preload errors are.
    """
    runtimes = None if qf_runtimes is None else qf_runtimes.split(",")
    plugin: WorkerPlugin
    try:
        plugin = QuantemFlowWorkerPlugin(
            runtimes=runtimes, budget_fraction=qf_budget_fraction, install_data=qf_data
        )
    except (ParameterError, RuntimeUnavailableError) as exc:
        plugin = _RefuseToStart(exc)
    pending = getattr(worker, "_pending_plugins", None)
    if isinstance(pending, (tuple, list, set, frozenset)):
        others = tuple(p for p in pending if getattr(p, "name", None) != PLUGIN_NAME)
        worker._pending_plugins = (*others, plugin)
    else:  # pragma: no cover - other distributed versions
        await worker.plugin_add(plugin=plugin, catch_errors=False)


def preload_argv(
    *, runtimes: Sequence[str] | None = None, budget_fraction: float = DEFAULT_BUDGET_FRACTION
) -> list[str]:
    """Return the ``--preload-argv`` words for :func:`dask_setup`."""
    argv: list[str] = []
    names = _check_runtime_names(runtimes)
    if names is not None:
        argv += ["--qf-runtimes", ",".join(names)]
    argv += ["--qf-budget-fraction", repr(_check_fraction(budget_fraction))]
    return argv


# -- worker options --------------------------------------------------------------------------
def worker_options(
    *,
    runtimes: Sequence[str] | None = None,
    budget_fraction: float = DEFAULT_BUDGET_FRACTION,
    budgets: Mapping[str, int] | None = None,
    memory_limit: int | float | str | None = "auto",
    nthreads: int = 1,
    batch_interval_s: float | None = None,
) -> dict[str, Any]:
    """Return the keyword arguments that make a ``Worker``/``Nanny`` a quantem-flow worker.

    Parameters
    ----------
    runtimes, budget_fraction, budgets
        See :class:`QuantemFlowWorkerPlugin`.
    memory_limit
        The worker's memory limit as distributed accepts it (bytes, ``"4
        GiB"``, a fraction of RAM, ``"auto"``: RAM times ``nthreads`` over
        the cores, None: no limit).  It is resolved here so the worker and
        its data mapping agree.
    nthreads
        The worker's threads (used by ``"auto"``).
    batch_interval_s
        Seconds the worker's stream to the scheduler holds a message back to
        batch it (:mod:`~quantem_flow.graphs.message_batching`); ``None``
        keeps Dask's.

    Returns
    -------
    dict
        ``plugins`` (the :class:`QuantemFlowWorkerPlugin`, which runs before
        registration, and the batching interval's plugin when given),
        ``data`` (``(ResidentAwareData, {"memory_limit": ...})``) and
        ``memory_limit``.  Merge it into a worker spec's options:
        ``Nanny(scheduler, nthreads=1, **worker_options(...))``.
    """
    from distributed.worker_memory import parse_memory_limit

    if isinstance(nthreads, bool) or not isinstance(nthreads, int) or nthreads < 1:
        raise ParameterError(f"nthreads must be a positive integer, got {nthreads!r}")
    try:
        limit = parse_memory_limit(memory_limit, nthreads, logger=logger)
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"memory_limit must be bytes, a string such as '4 GiB', a fraction of RAM, 'auto' "
            f"or None, got {memory_limit!r}: {exc}"
        ) from exc
    plugins: list[Any] = [
        QuantemFlowWorkerPlugin(runtimes=runtimes, budget_fraction=budget_fraction, budgets=budgets)
    ]
    if batch_interval_s is not None:
        from .message_batching import BatchIntervalWorkerPlugin

        plugins.append(BatchIntervalWorkerPlugin(batch_interval_s))
    return {
        "plugins": tuple(plugins),
        "data": (ResidentAwareData, {"memory_limit": limit}),
        "memory_limit": 0 if limit is None else int(limit),
    }
