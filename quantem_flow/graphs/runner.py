"""Running lowered graphs on a distributed client, or in this process (one thread or a pool)."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from typing import Any

from ..errors import ParameterError
from .lowering import LoweredLoad, LoweredPass, pass_info, relower
from .tasks import ChunkPartial, combine_partials

logger = logging.getLogger("quantem_flow.runner")

__all__ = ["Runner", "client_for_address", "progress_bar_class", "progress_default"]


def progress_default() -> bool:
    """Whether ``progress=None`` shows a bar: ``config.get("progress")`` and a terminal or notebook.

    Turn bars off with ``qf.config.set(progress=False)`` or the environment
    variable ``QUANTEM_FLOW_PROGRESS=0``.  In a Jupyter kernel the bar is a
    notebook widget when ipywidgets is installed (the ``notebook`` extra), text
    otherwise (:func:`progress_bar_class`).
    """
    from .. import config

    if not config.get("progress"):
        return False
    if "ipykernel" in sys.modules:
        return True
    return bool(sys.stderr.isatty())


#: Clients this process connected by address (``compute(client="tcp://...")``), reused.
_BY_ADDRESS: dict[str, Any] = {}
_BY_ADDRESS_LOCK = threading.Lock()


def client_for_address(address: str, *, timeout_s: float = 10.0) -> Any:
    """A ``distributed.Client`` connected to the scheduler at ``address``, reused per address.

    Parameters
    ----------
    address
        ``"tcp://host:port"`` (or ``tls://``, ``ws://``...), as ``quantem-flow
        run --scheduler`` takes.
    timeout_s
        Seconds to wait for the scheduler to answer.

    Raises
    ------
    ParameterError
        For a string that is not an address, or a scheduler that does not answer.
    """
    if "://" not in address:
        raise ParameterError(
            f"client must be None, a distributed.Client, a scheduler address such as "
            f"'tcp://127.0.0.1:8786', 'synchronous' or 'threads'; got {address!r}"
        )
    with _BY_ADDRESS_LOCK:
        known = _BY_ADDRESS.get(address)
        if known is not None and known.status == "running":
            return known
        from distributed import Client

        try:
            client = Client(address, set_as_default=False, timeout=timeout_s)
        except (OSError, TimeoutError) as exc:
            raise ParameterError(
                f"could not connect to the scheduler at {address} within {timeout_s:g} s "
                f"({type(exc).__name__}: {exc}); check the address and that the scheduler runs"
            ) from exc
        _BY_ADDRESS[address] = client
        return client


def _in_notebook() -> bool:
    """Whether this process is a Jupyter kernel showing rich output."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - ipykernel depends on IPython
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


_WIDGET_HINT_SHOWN: list[bool] = []


def progress_bar_class() -> Any:
    """The tqdm class of the progress bar: a widget in a notebook when ipywidgets is there.

    In a Jupyter kernel without ipywidgets (``pip install
    'quantem-flow[notebook]'``) the bar is text, and the hint is logged once,
    instead of tqdm's ``TqdmWarning`` on every pass.
    """
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            if not _WIDGET_HINT_SHOWN:
                _WIDGET_HINT_SHOWN.append(True)
                logger.warning(
                    "progress bars are text: install ipywidgets for a notebook widget "
                    "(pip install 'quantem-flow[notebook]')"
                )
        else:
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
    from tqdm.std import tqdm as text_tqdm

    return text_tqdm


#: Clients that run in this process, without workers: one thread, or a thread pool.
IN_PROCESS_CLIENTS = ("synchronous", "threads")


def in_process(client: Any) -> bool:
    """Whether ``client`` names an in-process run (:data:`IN_PROCESS_CLIENTS`)."""
    return isinstance(client, str) and client in IN_PROCESS_CLIENTS


def in_process_threads() -> int:
    """Threads of a ``client="threads"`` run: the CPUs this process may use.

    As Dask's threaded scheduler counts them (``local_threads`` and
    ``local_workers`` shape the embedded cluster, not this).
    """
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class Runner:
    """Runs graphs on a distributed client or in this process (one thread or a pool).

    Parameters
    ----------
    client
        ``None`` (the embedded local cluster), a ``distributed.Client``, a
        scheduler address (``"tcp://host:port"``, connected once per process
        by :func:`client_for_address`), ``"synchronous"`` (this process, one
        thread) or ``"threads"`` (this process, a thread per CPU it may use:
        Dask's threaded scheduler; no cluster to start).  On a distributed
        client the placement plugin is installed on the scheduler once.

    Attributes
    ----------
    departures
        Workers that left the cluster during this runner's last :meth:`run`
        or :meth:`load` (as the scheduler plugin recorded them: address,
        name, ``lost`` (left without closing), what happened next,
        ``restored`` and by which worker, the restart supervisor's report).
        :attr:`description` (the ``scheduler`` field of a pass's execution
        provenance) names them too.
    """

    def __init__(self, client: Any):
        #: Per pass of the last :meth:`run`: how its weight rows reached its tasks (provenance).
        self.weights_travel: list[str] = []
        self._pins: list[Any] = []
        self.gathered: list[Any] = []
        self.routes: list[dict[str, Any] | None] = []
        self._temp: list[str] = []
        self.departures: list[dict[str, Any]] = []
        self.in_process = in_process(client)
        #: Threads an in-process run uses (1: ``"synchronous"``).
        self.threads = in_process_threads() if client == "threads" else 1
        if isinstance(client, str) and not self.in_process:
            client = client_for_address(client)
        if self.in_process:
            self.client = None
            self._where = (
                f"threads (in this process on {self.threads} threads, no workers)"
                if client == "threads"
                else "synchronous (in this process, no workers)"
            )
            return
        if client is None:
            from .cluster import embedded_client

            client = embedded_client()
            self._where = "embedded local cluster"
        else:
            self._where = "given distributed.Client"
        self.client = client
        self._where += f" at {client.scheduler.address}"
        from .scheduler_plugin import ensure_placement  # distributed: only with a client

        ensure_placement(client)

    @property
    def description(self) -> str:
        """Where the work ran, and the workers lost during the last pass (if any)."""
        lost = [d for d in self.departures if d.get("lost")]
        left = [d for d in self.departures if not d.get("lost")]
        text = self._where
        if lost:
            text += f"; {len(lost)} worker(s) lost during the pass: " + "; ".join(
                _describe_loss(d) for d in lost
            )
        if left:
            text += f"; {len(left)} worker(s) left during the pass (announced): " + ", ".join(
                f"{d['worker']} (name {d.get('name')!r})" for d in left
            )
        return text

    def _begin(self) -> Any:
        """Subscribe to the plugin's pass events before a graph goes out; return the watch.

        The graph registers its passes itself (the ``qf_pass`` annotation),
        and the plugin tells this client their departures' cursors
        (:mod:`.pass_watch`): no request to the scheduler before or after.
        """
        assert self.client is not None
        self.departures = []
        from .pass_watch import pass_watch

        return pass_watch(self.client)

    def _end(self, events: Any, names: list[str]) -> None:
        """Collect (and log) the workers that left since the passes ``names`` arrived."""
        if self.client is None:
            return
        self.departures = list(events.departures(names) or [])
        for d in self.departures:
            if d.get("lost"):
                logger.warning(
                    "quantem-flow: worker %s was lost during this pass (%s); %s. The result "
                    "is complete and its provenance records the loss",
                    d.get("worker"),
                    d.get("what_next"),
                    _restoration(d),
                )

    @property
    def task_threads(self) -> int:
        """Threads that run tasks where this runner runs them (the cluster's workers, or here).

        On a cluster, the total the client's periodic scheduler update keeps
        (``total_threads``, no request; a synchronous ``scheduler_info()`` would
        ask the scheduler each pass: docs/dask-notes-additions.md), else asked
        once; at least 1 (no worker has joined yet).
        """
        if self.client is None:
            return self.threads
        kept = getattr(self.client, "_scheduler_identity", None) or {}
        total = kept.get("total_threads") if isinstance(kept, dict) else None
        if not isinstance(total, int) or total < 1:
            try:
                workers = self.client.scheduler_info().get("workers", {})
                total = sum(int(w.get("nthreads", 0)) for w in workers.values())
            except Exception:  # a closed or odd client: the pass still runs, in fewer groups
                total = 0
        return max(1, int(total))

    @property
    def task_processes(self) -> int:
        """Processes those threads are in: the cluster's workers, or 1 here; at least 1.

        As kept by the client's periodic scheduler update, like :attr:`task_threads`.
        """
        if self.client is None:
            return 1
        kept = getattr(self.client, "_scheduler_identity", None) or {}
        n = kept.get("n_workers") if isinstance(kept, dict) else None
        if not isinstance(n, int) or n < 1:
            try:
                n = len(self.client.scheduler_info().get("workers", {}))
            except Exception:  # a closed or odd client: counted as several (no sharing)
                n = 2
        return max(1, int(n))

    def weights_task(self, key: str) -> bool:
        """Whether a pass of one task should take its weights from their data task ``key``.

        True where this runner's client holds them on its cluster, or sent them
        in one of its last :data:`~quantem_flow.graphs.held_weights.HELD_SETS`
        passes (the pass sends them in their own task, then holds them:
        :mod:`.held_weights`); always False in this process.
        """
        if self.client is None:
            return False
        from .held_weights import held_weights

        held = held_weights(self.client)
        return held.holds(key) or held.seen(key)

    @property
    def scheduler_address(self) -> str | None:
        """Address of the scheduler, ``None`` in this process."""
        return None if self.client is None else str(self.client.scheduler.address)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run one small function on the cluster (or here) and return its value."""
        if self.client is None:
            return fn(*args)
        return self.client.submit(fn, *args, pure=False).result()

    def load(self, lowered: LoweredLoad) -> list[Any]:
        """Run load tasks and return what keeps them resident.

        Returns futures on a cluster (held: the chunks stay on the workers)
        or the chunks themselves when in this process.
        """
        if self.client is None:
            return list(self._get(dict(lowered.graph), lowered.keys))
        from distributed import wait

        events = self._begin()
        futures = self.client.get(lowered.graph, lowered.keys, sync=False)
        with self.client.as_current():
            wait(futures)
        self._end(events, [_load_name(lowered)])
        for f in futures:
            if f.status == "error":
                exc = f.exception()
                for g in futures:
                    g.release()
                raise exc
        return list(futures)

    def run(self, passes: list[LoweredPass], *, progress: bool) -> list[ChunkPartial]:
        """Run passes and return their combined partials.

        Pixels a pass gathers (``spec.gather``) are written chunk by chunk,
        as chunks finish, into :attr:`gathered` (one ``(n_pixels, R_r, R_c)``
        array per pass, disk-backed beyond ``config.get("gather_memory_mib")``).
        """
        self.gathered = [self._sink(p) for p in passes]
        self.routes = [None] * len(passes)
        self.weights_travel = [_travel_in_process(p) for p in passes]
        self.departures = []
        passes = list(passes)
        if self.client is None:
            from .gathered import gathered_in_place

            out = []
            for i, p in enumerate(passes):
                sink = self.gathered[i]
                # in this process the tasks write their pixels straight into the array
                here = {} if sink is None else {p.spec.pass_name: sink}
                outputs = [] if p.output_key is None else [p.output_key]
                with gathered_in_place(here):
                    values = self._get(dict(p.graph), [*outputs, *p.chunk_keys])
                parts = list(values[len(outputs) :])
                for part in parts:
                    self._store(i, part)
                out.append(values[0] if outputs else _merged(parts))
            return out
        results: dict[int, ChunkPartial] = {}
        n_file = sum(not getattr(p.spec.dataset, "is_persisted", False) for p in passes)
        for i, p in enumerate(passes):  # resident queries: straight to the holders
            direct = self._direct(i, p)
            if isinstance(direct, ChunkPartial):
                results[i] = direct
            elif direct is not None:
                passes[i] = direct  # the route failed: lowered again on fresh placement
            else:  # a file pass: straight to a one-worker cluster's worker, where it can
                done = self._direct_file(i, p, progress=progress, n_passes=n_file)
                if done is not None:
                    results[i] = done
        rest = [i for i in range(len(passes)) if i not in results]
        if rest:
            parts = self._run_graph([(i, passes[i]) for i in rest], progress)
            results.update(zip(rest, parts, strict=True))
        return [results[i] for i in range(len(passes))]

    def _get(self, graph: dict[Any, Any], keys: list[Any]) -> Any:
        """Run ``graph`` in this process: one thread, or a pool of :attr:`threads`."""
        if self.threads > 1:
            from dask.threaded import get

            return get(graph, keys, num_workers=self.threads)
        from dask.local import get_sync

        return get_sync(graph, keys)

    def _direct(self, i: int, lowered: LoweredPass) -> ChunkPartial | LoweredPass | None:
        """Run a resident query by the direct route (:mod:`.query_service`), if it can.

        Returns the partial; a pass lowered again when the route failed (its
        groups came from a placement that no longer holds); ``None`` to run
        the pass as lowered.  :attr:`routes` records which and why.
        """
        from .. import config
        from .query_service import DirectQueryUnavailable, run_direct

        spec = lowered.spec
        ds = spec.dataset
        if not getattr(ds, "is_persisted", False) or self.client is None:
            return None
        if spec.gather is not None:
            self.routes[i] = {"path": "graph", "why": "a gather (SSB) streams its pixels back"}
            return None
        if not config.get("direct_queries"):
            self.routes[i] = {"path": "graph", "why": "qf.config direct_queries is off"}
            return None
        resident = ds.resident
        route = resident.route()
        if route is None:
            self.routes[i] = {
                "path": "graph",
                "why": "a chunk's holder is unknown, or does not run the quantem-flow worker "
                "plugin (its query handler)",
            }
            return None
        try:
            partial, record = run_direct(
                self.client, spec, route, resident.keys, fan_in=lowered.fan_in
            )
        except DirectQueryUnavailable as exc:
            resident.forget_route()
            logger.info("quantem-flow: direct query route failed (%s); running it as a graph", exc)
            self.routes[i] = {"path": "graph", "why": f"the direct route failed: {exc}"}
            return relower(lowered, weights_task=self.weights_task)
        self.routes[i] = record
        self.weights_travel[i] = "in the query message to the workers holding the chunks"
        self._report_direct(lowered, partial, record)
        return partial

    def _direct_file(
        self, i: int, lowered: LoweredPass, *, progress: bool, n_passes: int
    ) -> ChunkPartial | None:
        """Run a file pass by the direct route (:mod:`.direct_pass`), if it can.

        Returns the partial, or ``None`` to run the pass as lowered (a graph);
        :attr:`routes` records which and why.
        """
        from .. import config
        from .direct_pass import (
            direct_pass_blocker,
            forget_pass_route,
            pass_route,
            run_direct_pass,
        )
        from .query_service import DirectQueryBusy, DirectQueryUnavailable

        ds = lowered.spec.dataset
        if self.client is None or getattr(ds, "is_persisted", False):
            return None
        if not config.get("direct_passes"):
            self.routes[i] = {"path": "graph", "why": "qf.config direct_passes is off"}
            return None
        route, why = pass_route(self.client)
        if route is None:
            self.routes[i] = {"path": "graph", "why": why}
            return None
        blocker = direct_pass_blocker(lowered, route, progress=progress, n_passes=n_passes)
        if blocker is not None:
            self.routes[i] = {"path": "graph", "why": blocker}
            return None
        try:
            partial, record = run_direct_pass(self.client, lowered, route)
        except DirectQueryBusy as exc:  # this once: the next pass asks again
            self.routes[i] = {"path": "graph", "why": f"the worker sent it back: {exc}"}
            return None
        except DirectQueryUnavailable as exc:
            forget_pass_route(self.client, failed=str(exc))
            logger.info("quantem-flow: direct pass route failed (%s); running it as a graph", exc)
            self.routes[i] = {"path": "graph", "why": f"the direct route failed: {exc}"}
            return None
        self.routes[i] = record
        self.weights_travel[i] = "in the pass message to the worker"
        self._report_direct(lowered, partial, record, kind="pass")
        return partial

    def _report_direct(
        self,
        lowered: LoweredPass,
        partial: ChunkPartial,
        record: dict[str, Any],
        *,
        kind: str = "resident query",
    ) -> None:
        """Tell the scheduler's page about a pass that took a direct route, without waiting."""
        import time

        from .scheduler_plugin import DIRECT_QUERY_HANDLER

        client = self.client
        assert client is not None
        records = sorted(partial.records, key=lambda r: int(r["chunk"]))
        compute_s: dict[str, float] = {}
        for r in records:
            compute_s[str(r["worker"])] = compute_s.get(str(r["worker"]), 0.0) + float(
                r.get("kernel_s", 0.0)
            )
        finished = time.time()
        message = {
            "info": {
                **pass_info(lowered.spec.dataset, _pass_name(lowered), kind),
            },
            "workers": [str(r["worker"]) for r in records],
            "compute_s": compute_s,
            "started": finished - float(record.get("round_trip_s", 0.0)),
            "finished": finished,
        }

        async def send() -> None:
            try:
                await getattr(client.scheduler, DIRECT_QUERY_HANDLER)(**message)
            except Exception as exc:  # the page misses one query; the result is unaffected
                logger.debug("quantem-flow: direct query report not delivered: %s", exc)

        client.loop.add_callback(send)

    def _run_graph(
        self, indexed: list[tuple[int, LoweredPass]], progress: bool
    ) -> list[ChunkPartial]:
        """Submit passes as one graph, collect gathered pixels and the combined partials.

        ``indexed``: ``(index in the run, pass)``; gathered pixels go to :attr:`gathered`
        at that index.
        """
        assert self.client is not None
        from dask.highlevelgraph import HighLevelGraph
        from distributed import as_completed

        passes = [p for _, p in indexed]
        owner = {k: i for i, p in indexed for k in p.chunk_keys}
        # a task may run several chunks (graphs/pass_groups.py): the bar counts chunks
        n_covered = {k: len(c) for p in passes for k, c in zip(p.chunk_keys, p.covers, strict=True)}
        graph = HighLevelGraph.merge(*(p.graph for p in passes))
        graph, weights_keys = self._held_weights_out(graph, indexed)
        chunk_keys = [k for p in passes for k in p.chunk_keys]
        out_keys = [p.output_key for p in passes if p.output_key is not None]
        # passes without combine tasks: the chunk partials themselves, merged here
        merged_here = {k for p in passes if p.output_key is None for k in p.chunk_keys}
        events = self._begin()
        futures = self.client.get(graph, [*out_keys, *chunk_keys, *weights_keys], sync=False)
        futures, weights_futures = (
            futures[: len(futures) - len(weights_keys)],
            futures[len(futures) - len(weights_keys) :],
        )
        self._hold_weights(weights_futures, indexed)
        out_futures, chunk_futures = futures[: len(out_keys)], futures[len(out_keys) :]
        fetched: dict[Any, ChunkPartial] = {}
        try:
            watch = progress or any(s is not None for s in self.gathered)
            if watch and chunk_futures:
                tqdm = progress_bar_class()
                with (
                    self.client.as_current(),
                    tqdm(
                        total=sum(n_covered[f.key] for f in chunk_futures),
                        unit="chunk",
                        file=sys.stderr,
                        disable=not progress,
                    ) as bar,
                ):
                    for f in as_completed(chunk_futures):
                        i = owner[f.key]
                        if self.gathered[i] is not None:
                            part = f.result()
                            self._store(i, part)
                            if f.key in merged_here:
                                fetched[f.key] = _without_pixels(part)
                        if f.key not in merged_here or f.key in fetched:
                            f.release()
                        bar.update(n_covered[f.key])
            wanted = [*out_futures, *(f for f in chunk_futures if f.key in merged_here)]
            wanted = [f for f in wanted if f.key not in fetched]
            values = self.client.gather(wanted)
        finally:
            for f in [*futures, *self._pins]:  # the pins: the held weights this graph named
                f.release()
            self._pins = []
        by_key = dict(fetched)
        by_key.update({f.key: v for f, v in zip(wanted, values, strict=True)})
        results: list[ChunkPartial] = [
            by_key[p.output_key]
            if p.output_key is not None
            else _merged([by_key[k] for k in p.chunk_keys])
            for p in passes
        ]
        self._end(events, [_pass_name(p) for p in passes if p.chunk_keys])
        if self.departures:  # a worker left: the kept placement of resident chunks is stale
            for p in passes:
                resident = getattr(p.spec.dataset, "resident", None)
                if resident is not None and hasattr(resident, "forget_route"):
                    resident.forget_route()
        return results

    def _held_weights_out(
        self, graph: Any, indexed: list[tuple[int, LoweredPass]]
    ) -> tuple[Any, list[str]]:
        """The graph without the weights tasks the client holds; the keys of those it sends.

        Each held set the graph names is pinned (:meth:`HeldWeights.pin`) until the
        pass ends, so another thread cannot release it before the graph arrives.
        Sets :attr:`weights_travel` at each pass's index in the run.
        """
        from dask.highlevelgraph import HighLevelGraph

        from .held_weights import held_weights, held_weights_bytes

        assert self.client is not None
        held = held_weights(self.client)
        capacity = held_weights_bytes()
        held.trim(capacity)  # a capacity lowered since the last pass
        drop: set[str] = set()
        send: list[str] = []
        for i, p in indexed:
            key = p.weights_key if p.weights_task else None
            if key is None:
                continue
            if key not in drop and key not in send:
                pin = held.pin(key)
                if pin is not None:
                    self._pins.append(pin)
                    drop.add(key)
                else:
                    send.append(key)
            self.weights_travel[i] = (
                f"held on the cluster since an earlier pass (task {key})"
                if key in drop
                else f"in a task of their own (task {key})"
            )
        for _, p in indexed:
            if p.weights_key is not None and p.spec.weights.nbytes <= capacity:
                held.saw(p.weights_key)
        if not drop:
            return graph, send
        layers = {name: layer for name, layer in graph.layers.items() if name not in drop}
        deps = {name: set(d) - drop for name, d in graph.dependencies.items() if name in layers}
        return HighLevelGraph(layers, deps), send

    def _hold_weights(self, futures: list[Any], indexed: list[tuple[int, LoweredPass]]) -> None:
        """Keep the futures of the weights tasks this graph sends (:mod:`.held_weights`)."""
        if not futures:
            return
        from .held_weights import held_weights, held_weights_bytes

        assert self.client is not None
        held = held_weights(self.client)
        nbytes = {p.weights_key: int(p.spec.weights.nbytes) for _, p in indexed if p.weights_task}
        capacity = held_weights_bytes()
        kept = {f.key: held.keep(f, nbytes.get(f.key, 0), capacity_bytes=capacity) for f in futures}
        for i, p in indexed:
            if p.weights_task and kept.get(p.weights_key):
                self.weights_travel[i] = (
                    f"in a task of their own, held for later passes (task {p.weights_key})"
                )

    def _sink(self, lowered: LoweredPass) -> Any:
        spec = lowered.spec
        if spec.gather is None:
            return None
        import os
        import tempfile

        import numpy as np

        from .. import config

        R, C = spec.dataset.scan_shape
        shape = (int(spec.gather.size), R, C)
        dtype = spec.dataset.dtype
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes <= float(config.get("gather_memory_mib")) * 2**20:
            if self.client is None:  # tasks in this process write into it (huge pages)
                from ..runtimes.host_arrays import fresh_zeros

                return fresh_zeros(shape, dtype)
            from .gathered import GatheredPixels

            return GatheredPixels(shape[0], (R, C), dtype)  # the chunks' blocks, not copied
        folder = tempfile.mkdtemp(prefix="quantem-flow-gather-")
        self._temp.append(folder)
        path = os.path.join(folder, "gathered.dat")
        return np.memmap(path, mode="w+", dtype=dtype, shape=shape)

    def _store(self, i: int, part: ChunkPartial) -> None:
        sink = self.gathered[i]
        if sink is None:
            return
        from .gathered import GatheredPixels

        for (r0, r1), values in part.gathered:
            if not isinstance(sink, GatheredPixels):  # a disk-backed array
                sink[:, r0:r1, :] = values
            else:
                sink.add((r0, r1), values)

    def cleanup(self) -> None:
        """Delete disk-backed gathered arrays (after the results are finished)."""
        import shutil

        self.gathered = []
        for folder in self._temp:
            shutil.rmtree(folder, ignore_errors=True)
        self._temp = []


def _travel_in_process(lowered: LoweredPass) -> str:
    """How a pass's weight rows reach its tasks before any cluster decides otherwise."""
    if not lowered.weights_task:
        return "inside the pass spec"
    return "in a task of their own, in this process"


def _without_pixels(part: ChunkPartial) -> ChunkPartial:
    """``part`` without its gathered pixels (written to the pass's sink already)."""
    if not part.gathered:
        return part
    return dataclasses.replace(part, gathered=[])


def _merged(parts: list[ChunkPartial]) -> ChunkPartial:
    """The chunk partials of a pass without combine tasks, merged here (pixels already sunk)."""
    return combine_partials(*(_without_pixels(p) for p in parts))


def _restoration(d: dict[str, Any]) -> str:
    if d.get("restored"):
        return (
            f"restored: a worker of the same name joined at {d.get('restored_by')} "
            f"{float(d.get('restored_after_s') or 0):.1f} s later"
        )
    restart = d.get("restart") or {}
    if restart.get("restart") in ("gave-up", "failed"):
        return f"not restored: {restart.get('detail')}"
    if restart.get("restart") == "restarting":
        return "not restored by the end of the pass (its restart was under way)"
    return "not restored by the end of the pass"


def _describe_loss(d: dict[str, Any]) -> str:
    return f"{d.get('worker')} (name {d.get('name')!r}), {_restoration(d)}"


def _layer_name(key: Any) -> str:
    """The layer a task key belongs to (``qf-pass-...``, ``qf-load-...``): its first part."""
    return str(key[0]) if isinstance(key, tuple) else str(key)


def _pass_name(lowered: LoweredPass) -> str:
    return _layer_name(lowered.chunk_keys[0] if lowered.chunk_keys else lowered.output_key)


def _load_name(lowered: LoweredLoad) -> str:
    return _layer_name(lowered.keys[0] if lowered.keys else "qf-load")
