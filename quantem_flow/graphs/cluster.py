"""The embedded local cluster (the default), heterogeneous local clusters, client helpers.

Every worker the engine starts is a quantem-flow worker: it advertises its
runtimes as Dask resources before registering and keeps device payloads out
of spill-to-disk (see :mod:`quantem_flow.graphs.worker`).

Every server binds to 127.0.0.1, the dashboard included (Dask binds it to
0.0.0.0 otherwise), and URLs are built from the bound sockets, never from
``dashboard_link``.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .. import config
from ..errors import ParameterError, RuntimeUnavailableError

__all__ = ["close_embedded_cluster", "dashboard_url", "embedded_client", "start_local_cluster"]

_lock = threading.Lock()
_embedded: dict[str, Any] = {}


#: Keys a ``workers=`` entry of :func:`start_local_cluster` may have.
WORKER_ENTRY_KEYS = (
    "runtimes",
    "name",
    "nthreads",
    "memory_limit",
    "budget_fraction",
    "budgets",
    "resources",
    "env",
)
STARTUP_TIMEOUT_S = 60.0


def _memory_share(memory_limit: Any, nthreads: int, n_workers: int) -> int | None:
    """Resolve a worker's memory limit as LocalCluster does ("auto": RAM / workers)."""
    import logging

    from distributed.worker_memory import parse_memory_limit

    log = logging.getLogger(__name__)
    try:
        if memory_limit == "auto":
            limit = parse_memory_limit("auto", 1, max(n_workers, 1), logger=log)
        else:
            limit = parse_memory_limit(memory_limit, nthreads, logger=log)
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"memory_limit must be bytes, a string such as '4 GiB', a fraction of RAM, 'auto' "
            f"or None, got {memory_limit!r}: {exc}"
        ) from exc
    return None if limit is None else int(limit)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParameterError(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_entries(workers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    from ..runtimes import available_runtimes

    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise ParameterError(
            f"workers must be a list of dicts such as [{{'runtimes': ['cpu']}}], got {workers!r}"
        )
    if not workers:
        raise ParameterError("workers must list at least one worker, got an empty list")
    available = available_runtimes()
    entries: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, entry in enumerate(workers):
        if not isinstance(entry, Mapping):
            raise ParameterError(
                f"workers[{i}] must be a dict with keys among {list(WORKER_ENTRY_KEYS)}, "
                f"got {entry!r}"
            )
        unknown = sorted(set(entry) - set(WORKER_ENTRY_KEYS))
        if unknown:
            raise ParameterError(
                f"workers[{i}] has unknown key(s) {unknown}; expected keys among "
                f"{list(WORKER_ENTRY_KEYS)}"
            )
        runtimes = entry.get("runtimes")
        if isinstance(runtimes, str):
            runtimes = runtimes.split(",")
        if runtimes is not None:
            missing = [r for r in runtimes if r not in available]
            if missing:
                raise RuntimeUnavailableError(
                    f"workers[{i}] asks for runtime(s) {missing}, not available on this "
                    f"machine; available: {sorted(available)}. Ask for some of those"
                )
        name = str(entry.get("name") or f"qf-{i}-{'+'.join(runtimes or ['all'])}")
        if name in names:
            raise ParameterError(
                f"workers[{i}] repeats the worker name {name!r}; give each worker its own name"
            )
        names.add(name)
        entries.append({**entry, "runtimes": runtimes, "name": name})
    return entries


def start_local_cluster(
    *,
    workers: Sequence[Mapping[str, Any]] | None = None,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    runtimes: Sequence[str] | None = None,
    budget_fraction: float = 0.8,
    **kwargs: Any,
) -> Any:
    """Start a ``distributed.LocalCluster`` of quantem-flow workers bound to 127.0.0.1.

    Every worker advertises its runtimes as resources before it registers
    (:class:`~quantem_flow.graphs.worker.QuantemFlowWorkerPlugin`) and keeps
    device payloads out of the spill-to-disk buffer
    (:class:`~quantem_flow.graphs.worker_data.ResidentAwareData`).

    Parameters
    ----------
    workers
        One dict per worker process for a heterogeneous cluster, e.g.
        ``[{"runtimes": ["cpu"]}, {"runtimes": ["mps"], "name": "mlx-0"}]``.
        Keys: ``runtimes`` (default every available one), ``name`` (default
        ``qf-<i>-<runtimes>``), ``nthreads`` (default ``threads_per_worker``),
        ``memory_limit`` (default an equal share of RAM), ``budget_fraction``,
        ``budgets`` (``{runtime: bytes}``), ``resources`` (extra Dask
        resources), ``env`` (environment of the worker process, e.g.
        ``CUDA_VISIBLE_DEVICES``).  Excludes ``n_workers``.
    n_workers
        Identical worker processes (default ``config.get("local_workers")``).
    threads_per_worker
        Threads per worker (default ``config.get("local_threads")``).
    runtimes, budget_fraction
        What identical workers advertise (default every available runtime);
        see :func:`~quantem_flow.graphs.worker.probe_capabilities`.
    **kwargs
        Passed to :class:`distributed.LocalCluster` (and on to every worker);
        ``memory_limit`` is per worker, ``"auto"`` by default (RAM shared
        equally).

    Returns
    -------
    distributed.LocalCluster
        The running cluster, its workers registered.

    Raises
    ------
    RuntimeUnavailableError
        A worker asks for a runtime not available on this machine.
    ParameterError
        A ``workers`` entry is malformed.
    """
    from distributed import LocalCluster

    from .worker import worker_options

    if workers is not None and n_workers is not None:
        raise ParameterError(
            f"pass either workers= (one dict per worker) or n_workers=, not both; got "
            f"n_workers={n_workers!r} and {len(workers)} worker entries"
        )
    entries = None if workers is None else _check_entries(workers)
    if entries is not None and kwargs.get("asynchronous"):
        raise ParameterError(
            "workers= starts the workers synchronously; call start_local_cluster without "
            "asynchronous=True, or build the worker_spec yourself in async code"
        )
    n = int(n_workers if n_workers is not None else config.get("local_workers"))
    if entries is not None:
        n = len(entries)
    threads = _positive_int(
        "threads_per_worker",
        threads_per_worker if threads_per_worker is not None else config.get("local_threads"),
    )
    memory_limit = kwargs.pop("memory_limit", "auto")
    template = worker_options(
        runtimes=runtimes,
        budget_fraction=budget_fraction,
        memory_limit=_memory_share(memory_limit, threads, n),
        nthreads=threads,
    )
    options: dict[str, Any] = {
        "n_workers": 0 if entries is not None else n,
        "threads_per_worker": threads,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": 40,
        **template,
    }
    options.update(kwargs)
    cluster = LocalCluster(**options)
    if entries is None:
        return cluster
    try:
        _add_workers(cluster, entries, threads=threads, memory_limit=memory_limit)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _add_workers(
    cluster: Any, entries: Sequence[Mapping[str, Any]], *, threads: int, memory_limit: Any
) -> None:
    """Add one spec per entry to ``cluster.worker_spec`` and wait until they registered."""
    from .worker import DEFAULT_BUDGET_FRACTION, worker_options

    base = dict(cluster.new_spec["options"])
    for entry in entries:
        nthreads = _positive_int("nthreads", entry.get("nthreads", threads))
        limit = _memory_share(entry.get("memory_limit", memory_limit), nthreads, len(entries))
        opts = {
            **base,
            "name": entry["name"],
            "nthreads": nthreads,
            **worker_options(
                runtimes=entry.get("runtimes"),
                budget_fraction=entry.get("budget_fraction", DEFAULT_BUDGET_FRACTION),
                budgets=entry.get("budgets"),
                memory_limit=limit,
                nthreads=nthreads,
            ),
        }
        if entry.get("resources"):
            opts["resources"] = dict(entry["resources"])
        if entry.get("env"):
            if cluster.new_spec["cls"].__name__ != "Nanny":
                raise ParameterError(
                    f"worker {entry['name']!r} sets env=, which needs worker processes; "
                    "drop processes=False or the env key"
                )
            opts["env"] = {str(k): str(v) for k, v in entry["env"].items()}
        cluster.worker_spec[entry["name"]] = {"cls": cluster.new_spec["cls"], "options": opts}
    cluster.sync(cluster._correct_state)
    cluster.wait_for_workers(len(cluster.worker_spec), timeout=STARTUP_TIMEOUT_S)


def embedded_client() -> Any:
    """Return the client of this process's embedded local cluster, starting it once."""
    from distributed import Client

    with _lock:
        client = _embedded.get("client")
        if client is not None and client.status == "running":
            return client
        cluster = start_local_cluster()
        client = Client(cluster, set_as_default=False)
        _embedded.update(cluster=cluster, client=client)
        return client


def close_embedded_cluster() -> None:
    """Close the embedded cluster if it runs."""
    with _lock:
        client = _embedded.pop("client", None)
        cluster = _embedded.pop("cluster", None)
    if client is not None:
        client.close()
    if cluster is not None:
        cluster.close()


atexit.register(close_embedded_cluster)


def dashboard_url(client: Any) -> str | None:
    """Return the dashboard URL of a client's scheduler built from the bound socket."""
    info = client.scheduler_info()
    port = info.get("services", {}).get("dashboard")
    if port is None:
        return None
    addr = str(info.get("address", ""))
    host = addr.split("://", 1)[-1].rsplit(":", 1)[0] or "127.0.0.1"
    return f"http://{host}:{port}/status"
