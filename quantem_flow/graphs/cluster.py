"""The embedded local cluster (the default), heterogeneous local clusters, client helpers.

Every worker the engine starts is a quantem-flow worker: it advertises its
runtimes as Dask resources before registering and keeps device payloads out
of spill-to-disk (see :mod:`quantem_flow.graphs.worker`).

Every server binds to 127.0.0.1, the dashboard included (Dask binds it to
0.0.0.0 otherwise), and URLs are built from the bound sockets, never from
``dashboard_link``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from distributed.deploy.spec import ProcessInterface

from .. import config as qf_config
from ..errors import ParameterError, RuntimeUnavailableError
from .message_batching import BatchIntervalSchedulerPlugin, batch_interval_s, set_interval

__all__ = [
    "WorkerProgram",
    "close_embedded_cluster",
    "dashboard_url",
    "embedded_client",
    "flow_dashboard_url",
    "start_local_cluster",
]

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


#: Variables of Dask's ``distributed.nanny.pre-spawn-environ`` not given to worker programs.
#:
#: ``MALLOC_TRIM_THRESHOLD_=65536``: setting any glibc malloc threshold turns
#: off glibc's dynamic mmap threshold, so every buffer above 128 KiB that HDF5
#: and the codecs allocate per chunk is a fresh ``mmap`` (zeroed pages,
#: faulted in) and is returned with ``munmap`` when freed.  Issue 14's profile
#: measured HDF5 chunk reads 1.8-4x slower with it, and on this project's VM a
#: bitshuffle pass read 1.2-1.6x slower (docs/architecture-notes.md "Embedded
#: cluster defaults"); the engine reuses its large buffers (staging), so the
#: memory the setting would give back is small.  A value the user set in this
#: process's environment is passed on unchanged.
WORKER_ENV_DROPPED = ("MALLOC_TRIM_THRESHOLD_",)

#: Restarts of one worker program allowed within :data:`RESTART_WINDOW_S` seconds.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 300.0


class WorkerProgram(ProcessInterface):  # type: ignore[misc]
    """A quantem-flow worker run as a program of its own, for ``SpecCluster``/``LocalCluster``.

    The worker runs in ``python -m quantem_flow.graphs.local_worker`` (see
    :mod:`quantem_flow.graphs.local_worker`), started with
    :func:`asyncio.create_subprocess_exec`, not through ``multiprocessing``:
    it never re-imports the caller's ``__main__``, so the embedded cluster
    starts from a script without a ``__main__`` guard, from stdin, a REPL or
    a notebook.  The child inherits this process's environment (plus
    ``env``), ``sys.path`` (as ``PYTHONPATH``), working directory and Dask
    configuration; :meth:`start` returns once the worker has registered with
    the scheduler, and raises with the end of the worker's stderr if it
    exits first.

    Parameters
    ----------
    scheduler
        Address of the scheduler.
    name
        Worker name.
    nthreads, memory_limit, host, silence_logs
        As for ``distributed.Worker`` (``memory_limit`` in bytes or None).
    runtimes, budget_fraction, budgets, resources
        What the worker advertises, see
        :func:`~quantem_flow.graphs.worker.worker_options`.
    batch_interval_s
        Seconds the worker's stream to the scheduler batches messages
        (:mod:`~quantem_flow.graphs.message_batching`); ``None``: Dask's.
    env
        Extra environment variables of the worker process.
    startup_timeout
        Seconds to wait for the worker to register.
    **ignored
        Options ``LocalCluster`` gives every worker class that do not apply
        (``services``, ``dashboard``, ``interface``...).
    """

    def __init__(
        self,
        scheduler: str,
        *,
        name: Any = None,
        nthreads: int = 1,
        memory_limit: int | None = None,
        host: str | None = "127.0.0.1",
        silence_logs: int | bool = 40,
        runtimes: Sequence[str] | None = None,
        budget_fraction: float | None = None,
        budgets: Mapping[str, int] | None = None,
        resources: Mapping[str, float] | None = None,
        batch_interval_s: float | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float | None = None,
        **ignored: Any,
    ) -> None:
        super().__init__(scheduler=scheduler, name=name)
        tls = str(ignored.get("protocol") or "").startswith("tls")
        if tls or getattr(ignored.get("security"), "require_encryption", False):
            raise ParameterError(
                "security= (TLS) is not supported by the embedded local cluster's worker "
                "programs; start a cluster with `dask scheduler` / `quantem-flow worker`"
            )
        self.scheduler = scheduler
        self.name = name
        self.spec: dict[str, Any] = {
            "scheduler": scheduler,
            "name": name,
            "nthreads": int(nthreads),
            "memory_limit": None if not memory_limit else int(memory_limit),
            "runtimes": None if runtimes is None else list(runtimes),
            "budgets": None if budgets is None else dict(budgets),
            "resources": None if resources is None else dict(resources),
            "host": host or "127.0.0.1",
            "silence_logs": int(silence_logs) if silence_logs else 0,
            "parent_pid": os.getpid(),
        }
        if budget_fraction is not None:
            self.spec["budget_fraction"] = float(budget_fraction)
        if batch_interval_s is not None:
            self.spec["batch_interval_s"] = float(batch_interval_s)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.startup_timeout = float(startup_timeout or STARTUP_TIMEOUT_S)
        self.process: asyncio.subprocess.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._drain: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        #: ``(time, exit status)`` of each unexpected exit, restarted or not
        self.exits: list[tuple[float, int | None]] = []

    def _environment(self) -> dict[str, str]:
        import dask.config

        env = dict(os.environ)
        # what a Nanny sets before it spawns a worker (OMP_NUM_THREADS=1...), except
        # the malloc trim threshold: see WORKER_ENV_DROPPED
        for key in ("distributed.nanny.pre-spawn-environ", "distributed.nanny.environ"):
            env.update({str(k): str(v) for k, v in (dask.config.get(key, {}) or {}).items()})
        for name in WORKER_ENV_DROPPED:
            if name in os.environ:
                env[name] = os.environ[name]  # set by the user: kept as they set it
            else:
                env.pop(name, None)
        env.update(self.env)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["DASK_INTERNAL_INHERIT_CONFIG"] = dask.config.serialize(dask.config.global_config)
        return env

    async def _drain_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.stderr_tail.append(line)
            print(line, file=sys.stderr)

    async def start(self) -> None:
        """Start the worker program, wait until it has registered, then watch it."""
        await self._spawn()
        await super().start()
        self._watch = asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        """Restart the worker program when it dies unexpectedly (as a Nanny would).

        A worker killed by a signal, the OOM killer or a crash (a non-zero
        exit status; a worker the scheduler closes exits with 0) is restarted
        at once, at most :data:`MAX_RESTARTS` times within
        :data:`RESTART_WINDOW_S` seconds; each exit is logged at WARNING
        with its status, and a worker that is not restarted is logged at
        ERROR, so a lost worker is either restored or reported, never
        silently gone.
        """
        import logging
        import time

        log = logging.getLogger("quantem_flow.cluster")
        while not self._closing:
            proc = self.process
            if proc is None:
                return
            status = await proc.wait()
            if self._closing or status == 0:
                return  # closed on purpose (by the cluster or the scheduler): not restarted
            now = time.monotonic()
            self.exits.append((now, status))
            recent = [t for t, _ in self.exits if now - t < RESTART_WINDOW_S]
            what = f"signal {-status}" if status is not None and status < 0 else f"status {status}"
            if len(recent) > MAX_RESTARTS:
                detail = (
                    f"worker {self.name!r} (pid {getattr(self, 'pid', '?')}) exited with {what}; "
                    f"not restarted: it exited {len(recent)} times within "
                    f"{RESTART_WINDOW_S:.0f} s. Its stderr ended with: {self._tail()}"
                )
                log.error("quantem-flow %s", detail)
                await self._report("gave-up", detail)
                return
            log.warning(
                "quantem-flow worker %r (pid %s, %s) exited with %s; restarting it",
                self.name,
                getattr(self, "pid", "?"),
                getattr(self, "address", "?"),
                what,
            )
            await self._report("restarting", f"exited with {what}; restarting it")
            try:
                await self._spawn()
            except Exception as exc:  # reported, never silent
                log.error("quantem-flow worker %r could not be restarted: %s", self.name, exc)
                await self._report("failed", f"exited with {what}; the restart failed: {exc}")
                return
            log.warning("quantem-flow worker %r is back at %s", self.name, self.address)

    async def _report(self, restart: str, detail: str) -> None:
        """Tell the scheduler's placement plugin about a restart (best effort, logged)."""
        import logging

        from distributed.core import rpc

        from .scheduler_plugin import REPORT_HANDLER

        try:
            async with rpc(self.scheduler) as scheduler:
                await asyncio.wait_for(
                    getattr(scheduler, REPORT_HANDLER)(
                        name=self.name,
                        address=getattr(self, "address", None),
                        restart=restart,
                        detail=detail,
                        exits=self._exit_history(),
                    ),
                    10,
                )
        except Exception as exc:  # the scheduler may be gone or plugin-less: say so
            logging.getLogger("quantem_flow.cluster").info(
                "could not report worker %r (%s) to the scheduler: %s", self.name, restart, exc
            )

    def _exit_history(self) -> list[tuple[float, int | None]]:
        """``[(wall time, exit status), ...]`` of this program's unexpected exits."""
        import time

        shift = time.time() - time.monotonic()
        return [(t + shift, status) for t, status in self.exits]

    async def _spawn(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "quantem_flow.graphs.local_worker",
            json.dumps(self.spec),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._environment(),
        )
        self._drain = asyncio.ensure_future(self._drain_stderr())
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), self.startup_timeout)
        except TimeoutError:
            await self._kill()
            raise RuntimeError(
                f"quantem-flow worker {self.name!r} did not register within "
                f"{self.startup_timeout:.0f} s; its stderr ended with: {self._tail()}"
            ) from None
        if not line:
            await self.process.wait()
            if self._drain is not None:
                await asyncio.wait({self._drain}, timeout=2)
            raise RuntimeError(
                f"quantem-flow worker {self.name!r} exited with status "
                f"{self.process.returncode} before registering; its stderr ended with: "
                f"{self._tail()}"
            )
        info = json.loads(line)
        self.address = info["address"]
        self.pid = int(info["pid"])

    def _tail(self) -> str:
        return " | ".join(list(self.stderr_tail)[-8:]) or "(nothing)"

    async def _kill(self) -> None:
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def close(self) -> None:
        """Stop the worker program (SIGTERM, then SIGKILL after 10 s); no restart."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
        await self._kill()
        if self._drain is not None:
            self._drain.cancel()
        await super().close()


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
            from ..runtimes.external.spec import register_requested

            if register_requested(list(runtimes)):  # webgpu...: registered when named
                available = available_runtimes()
            missing = [r for r in runtimes if r not in available]
            if missing:
                from ..runtimes.registry import unregistered_reason

                reasons = "".join(
                    f" ({r}: {unregistered_reason(r)})" for r in missing if unregistered_reason(r)
                )
                raise RuntimeUnavailableError(
                    f"workers[{i}] asks for runtime(s) {missing}, not available on this "
                    f"machine{reasons}; available: {sorted(available)}. Ask for some of those"
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
    config: Mapping[str, Any] | None = None,
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
    config
        ``qf.config`` settings for every worker process, e.g.
        ``{"external_timeout_s": 60, "external_stall_grace_s": 5}`` (the
        external workers' timeouts); passed as ``QUANTEM_FLOW_<NAME>``
        variables (an entry's own ``env`` wins).  Needs worker processes.
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
    settings_env = _config_env(config)
    if settings_env and kwargs.get("processes", True) is False:
        raise ParameterError(
            "config= sets the settings of worker processes; with processes=False the workers "
            "run in this process: use qf.config.set(...) here instead"
        )
    if workers is not None and settings_env:
        workers = [
            {**e, "env": {**settings_env, **dict(e.get("env") or {})}}
            if isinstance(e, Mapping)
            else e
            for e in workers
        ]
    entries = None if workers is None else _check_entries(workers)
    if entries is not None and kwargs.get("asynchronous"):
        raise ParameterError(
            "workers= starts the workers synchronously; call start_local_cluster without "
            "asynchronous=True, or build the worker_spec yourself in async code"
        )
    n = int(n_workers if n_workers is not None else qf_config.get("local_workers"))
    if entries is not None:
        n = len(entries)
    threads = _positive_int(
        "threads_per_worker",
        threads_per_worker if threads_per_worker is not None else qf_config.get("local_threads"),
    )
    memory_limit = kwargs.pop("memory_limit", "auto")
    share = _memory_share(memory_limit, threads, n)
    interval = batch_interval_s()  # every stream of this cluster (graphs/message_batching.py)
    template: dict[str, Any]
    if kwargs.get("processes", True):
        # workers are programs of their own: nothing re-imports the caller's __main__
        template = {
            "worker_class": WorkerProgram,
            "memory_limit": share,
            "runtimes": None if runtimes is None else list(runtimes),
            "budget_fraction": budget_fraction,
            "batch_interval_s": interval,
        }
        if settings_env:
            template["env"] = settings_env
    else:
        template = worker_options(
            runtimes=runtimes,
            budget_fraction=budget_fraction,
            memory_limit=share,
            nthreads=threads,
            batch_interval_s=interval,
        )
    from .scheduler_plugin import PlacementSchedulerPlugin

    # the placement plugin (and its dashboard page) from the start, not at the first compute
    scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
    plugins = list(scheduler_kwargs.get("plugins", ()))
    if not any(isinstance(p, PlacementSchedulerPlugin) for p in plugins):
        plugins.append(PlacementSchedulerPlugin())
    if not any(isinstance(p, BatchIntervalSchedulerPlugin) for p in plugins):
        plugins.append(BatchIntervalSchedulerPlugin(interval))
    scheduler_kwargs["plugins"] = plugins
    options: dict[str, Any] = {
        "scheduler_kwargs": scheduler_kwargs,
        "n_workers": 0 if entries is not None else n,
        "threads_per_worker": threads,
        "processes": True,
        "host": "127.0.0.1",
        "protocol": "tcp://",  # with processes=False Dask would pick inproc://, which has no host
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


def _config_env(settings: Mapping[str, Any] | None) -> dict[str, str]:
    """The worker processes' ``QUANTEM_FLOW_*`` variables for ``config=`` (checked)."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ParameterError(
            f"config must map qf.config names to values, e.g. {{'external_timeout_s': 60}}, "
            f"got {settings!r}"
        )
    return qf_config.environment(dict(settings))


def _add_workers(
    cluster: Any, entries: Sequence[Mapping[str, Any]], *, threads: int, memory_limit: Any
) -> None:
    """Add one spec per entry to ``cluster.worker_spec`` and wait until they registered."""
    from .worker import DEFAULT_BUDGET_FRACTION, worker_options

    base = dict(cluster.new_spec["options"])
    program = cluster.new_spec["cls"] is WorkerProgram
    for entry in entries:
        nthreads = _positive_int("nthreads", entry.get("nthreads", threads))
        limit = _memory_share(entry.get("memory_limit", memory_limit), nthreads, len(entries))
        fraction = entry.get("budget_fraction", DEFAULT_BUDGET_FRACTION)
        advertised: dict[str, Any] = (
            {
                "runtimes": entry.get("runtimes"),
                "budget_fraction": fraction,
                "budgets": entry.get("budgets"),
                "memory_limit": limit,
            }
            if program
            else worker_options(
                runtimes=entry.get("runtimes"),
                budget_fraction=fraction,
                budgets=entry.get("budgets"),
                memory_limit=limit,
                nthreads=nthreads,
            )
        )
        opts = {**base, "name": entry["name"], "nthreads": nthreads, **advertised}
        if entry.get("resources"):
            opts["resources"] = dict(entry["resources"])
        if entry.get("env"):
            if cluster.new_spec["cls"].__name__ not in ("Nanny", "WorkerProgram"):
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
        # the client fetches results from the workers itself, one hop fewer than through the
        # scheduler (3.6 ms less for a 2 GiB pass's four partials: docs/architecture-notes.md)
        client = Client(cluster, set_as_default=False, direct_to_workers=True)
        set_interval(getattr(client, "scheduler_comm", None), batch_interval_s())
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


def flow_dashboard_url(client: Any) -> str | None:
    """Return the URL of the quantem-flow dashboard page of a client's scheduler.

    The page (``<dashboard>/quantem-flow``) is served by the placement
    plugin from the moment it starts: on the embedded and local clusters
    when the cluster starts, elsewhere at the first compute (or with
    ``dask scheduler --preload quantem_flow.graphs.scheduler_plugin``).
    Without Bokeh it is a plain table that says so.

    Parameters
    ----------
    client
        A ``distributed.Client``.

    Returns
    -------
    str or None
        ``http://HOST:PORT/quantem-flow``, or ``None`` when the scheduler
        has no HTTP (dashboard) server.
    """
    url = dashboard_url(client)
    if url is None:
        return None
    return url.rsplit("/", 1)[0] + "/quantem-flow"
