"""The thin scheduler plugin that feeds :class:`Placement` and applies its decisions.

It turns scheduler callbacks into placement events and writes decisions into
task restrictions (``worker_restrictions`` with ``loose_restrictions=False``,
which work stealing respects; see DASK_NOTES).  A refused task is failed
loudly: its run spec is replaced by one that raises
:class:`~quantem_flow.errors.PlacementError` with the reason, so the client
sees the error instead of a task waiting forever in ``no-worker`` (failures
inside plugin hooks are otherwise only logged).

It also serves a small page on the scheduler's HTTP server (the dashboard
port, bound to 127.0.0.1 by the engine): ``/quantem-flow`` (HTML) and
``/quantem-flow/state.json``, showing each worker's runtimes and budgets,
resident bytes per representation, and where every resident chunk is.
"""

from __future__ import annotations

import html
import json
import logging
import time
from typing import Any

from dask.task_spec import Task

from ..errors import PlacementError
from .capabilities import parse_resources
from .placement import (
    ChunkInMemory,
    Decision,
    Placement,
    Refuse,
    Restrict,
    TasksForgotten,
    TasksSubmitted,
    WorkerJoined,
    WorkerLeft,
    tasks_from_annotations,
)

try:  # distributed is a hard dependency; the guard keeps imports cheap to reason about
    from distributed.diagnostics.plugin import SchedulerPlugin
except ImportError:  # pragma: no cover
    SchedulerPlugin = object

__all__ = ["PLUGIN_NAME", "PlacementSchedulerPlugin", "dask_setup", "ensure_placement"]

PLUGIN_NAME = "quantem-flow-placement"
#: Restriction of a task waiting for a capable worker (no worker has this address).
WAITING = "quantem-flow:waiting-for-a-capable-worker"
logger = logging.getLogger("quantem_flow.placement")


def _raise_placement_error(reason: str) -> None:
    raise PlacementError(reason)


class PlacementSchedulerPlugin(SchedulerPlugin):  # type: ignore[misc]
    """Device- and residency-aware placement for quantem-flow graphs."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.placement = Placement()
        self.scheduler: Any = None
        self.started = time.time()
        self.n_decisions = 0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        """Remember the scheduler, feed its current workers, add the HTTP routes."""
        self.scheduler = scheduler
        for address in list(scheduler.workers):
            self._add(address)
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            from tornado.web import RequestHandler

            plugin = self

            class Page(RequestHandler):
                def get(self) -> None:
                    self.set_header("Content-Type", "text/html; charset=utf-8")
                    self.write(plugin.render_html())

            class State(RequestHandler):
                def get(self) -> None:
                    self.set_header("Content-Type", "application/json")
                    self.write(json.dumps(plugin.state()))

            app.add_handlers(
                r".*", [(r"/quantem-flow/?", Page), (r"/quantem-flow/state.json", State)]
            )

    def _add(self, address: str) -> None:
        ws = self.scheduler.workers.get(address)
        if ws is None:
            return
        caps = parse_resources(
            address,
            dict(ws.resources),
            nthreads=ws.nthreads,
            memory_limit=ws.memory_limit or None,
            name=str(ws.name),
        )
        self._apply(self.placement.handle(WorkerJoined(caps)), stimulus_id="qf-worker-joined")

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker registered: read its advertised capabilities."""
        self.scheduler = scheduler
        self._add(worker)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        """A worker left: re-place what it held, then run what was waiting for it."""
        self.scheduler = scheduler
        stimulus = str(kwargs.get("stimulus_id", "qf-worker-left"))
        self._apply(self.placement.handle(WorkerLeft(worker)), stimulus_id=stimulus)

    def update_graph(
        self,
        scheduler: Any,
        *,
        keys: Any = None,
        tasks: Any = None,
        annotations: Any = None,
        **kwargs: Any,
    ) -> None:
        """Read the annotations of a new graph and restrict its tasks before they run."""
        self.scheduler = scheduler
        annotations = annotations or {}
        if "qf_role" not in annotations:
            return
        new_keys = list(tasks or [])
        deps = {
            k: [d.key for d in scheduler.tasks[k].dependencies]
            for k in new_keys
            if k in scheduler.tasks
        }
        infos = tasks_from_annotations(
            new_keys,
            annotations,
            deps,
            loads=[k for k, t in self.placement.tasks.items() if t.role == "load"],
        )
        if infos:
            self._apply(
                self.placement.handle(TasksSubmitted(tuple(infos))),
                stimulus_id=str(kwargs.get("stimulus_id", "qf-update-graph")),
            )

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Track resident chunks landing and tasks leaving."""
        info = self.placement.tasks.get(key)
        if info is None:
            return
        if finish == "memory" and info.role == "load":
            ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
            worker = kwargs.get("worker")
            if worker is None and ts is not None and ts.who_has:
                worker = next(iter(ts.who_has)).address
            if worker is not None:
                nbytes = ts.nbytes if ts is not None and ts.nbytes and ts.nbytes > 0 else None
                self._apply(
                    self.placement.handle(ChunkInMemory(key, str(worker), nbytes)),
                    stimulus_id="qf-chunk-in-memory",
                )
        elif finish == "forgotten":
            self.placement.handle(TasksForgotten((key,)))

    # -- applying decisions ---------------------------------------------------------------
    def _apply(self, decisions: list[Decision], *, stimulus_id: str) -> None:
        if not decisions or self.scheduler is None:
            return
        self.n_decisions += len(decisions)
        kick: list[Any] = []
        for d in decisions:
            ts = self.scheduler.tasks.get(d.key)
            if ts is None:
                continue
            if isinstance(d, Restrict):
                # an empty set would mean "anywhere" to Dask: wait on a name no worker has
                ts.worker_restrictions = set(d.workers) or {WAITING}
                ts.loose_restrictions = False
            elif isinstance(d, Refuse):
                logger.error("quantem-flow placement refused %r: %s", d.key, d.reason)
                ts.run_spec = Task(d.key, _raise_placement_error, d.reason)
                ts.worker_restrictions = None
                ts.loose_restrictions = False
            if ts.state == "no-worker":
                kick.append(d.key)
        if kick:
            # tasks that waited for a worker that is gone can run now
            self.scheduler.transitions({k: "processing" for k in kick}, stimulus_id=stimulus_id)

    # -- observability ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Return the placement state for the dashboard page (JSON-ready)."""
        p = self.placement
        resident = p.resident_by_worker()
        workers = []
        for address, caps in sorted(p.workers.items()):
            held = sorted(repr(k) for k, a in p.holder.items() if a == address)
            planned = sorted(repr(k) for k, a in p.planned.items() if a == address)
            workers.append(
                {
                    **caps.to_dict(),
                    "resident_bytes": resident.get(address, {}),
                    "chunks_in_memory": held,
                    "chunks_planned": planned,
                }
            )
        return {
            "plugin": PLUGIN_NAME,
            "uptime_s": time.time() - self.started,
            "decisions": self.n_decisions,
            "workers": workers,
            "refused": {repr(k): v for k, v in p.refused.items()},
            "log": p.log[-200:],
        }

    def render_html(self) -> str:
        """Return the dashboard page."""
        st = self.state()
        rows = []
        for w in st["workers"]:
            res = ", ".join(f"{k}: {v / 2**20:.1f} MiB" for k, v in w["resident_bytes"].items())
            budgets = ", ".join(f"{k}: {v / 2**30:.2f} GiB" for k, v in w["budgets"].items())
            rows.append(
                "<tr>"
                f"<td>{html.escape(w['address'])}</td><td>{html.escape(w['name'])}</td>"
                f"<td>{html.escape(', '.join(w['runtimes']))}</td><td>{html.escape(budgets)}</td>"
                f"<td>{html.escape(res or '0')}</td><td>{len(w['chunks_in_memory'])}</td>"
                f"<td>{html.escape(' '.join(w['chunks_in_memory'][:50]))}</td>"
                "</tr>"
            )
        log = "\n".join(html.escape(json.dumps(e)) for e in st["log"][-40:])
        refused = "".join(
            f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in st["refused"].items()
        )
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='2'><title>quantem-flow placement</title>"
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px}"
            "table{border-collapse:collapse}</style></head><body>"
            "<h1>quantem-flow placement</h1>"
            f"<p>{len(st['workers'])} worker(s), {st['decisions']} decision(s)</p>"
            "<table><tr><th>worker</th><th>name</th><th>runtimes</th><th>budgets</th>"
            "<th>resident bytes by representation</th><th>chunks in memory</th>"
            "<th>chunk placement</th></tr>"
            + "".join(rows)
            + "</table>"
            + (f"<h2>refused</h2><ul>{refused}</ul>" if refused else "")
            + f"<h2>recent decisions</h2><pre>{log}</pre></body></html>"
        )


def _has_plugin(dask_scheduler: Any) -> bool:
    return PLUGIN_NAME in dask_scheduler.plugins


_installed: set[str] = set()


def ensure_placement(client: Any) -> None:
    """Install the placement plugin on a client's scheduler once."""
    address = str(client.scheduler.address)
    if address in _installed:
        return
    if not client.run_on_scheduler(_has_plugin):
        client.register_plugin(PlacementSchedulerPlugin(), name=PLUGIN_NAME)
    _installed.add(address)


def dask_setup(scheduler: Any) -> None:
    """Install the plugin from ``dask scheduler --preload quantem_flow.graphs.scheduler_plugin``."""
    scheduler.add_plugin(PlacementSchedulerPlugin(), name=PLUGIN_NAME)
