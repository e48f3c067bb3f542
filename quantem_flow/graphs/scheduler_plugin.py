"""The thin scheduler plugin that feeds :class:`Placement` and applies its decisions.

It turns scheduler callbacks into placement events and writes decisions into
task restrictions (``worker_restrictions`` with ``loose_restrictions=False``,
which work stealing respects; see DASK_NOTES).  A refused task is failed
loudly: its run spec is replaced by one that raises
:class:`~quantem_flow.errors.PlacementError` with the reason, so the client
sees the error instead of a task waiting forever in ``no-worker`` (failures
inside plugin hooks are otherwise only logged).

It also watches the cluster for the dashboard and for provenance:

* every worker that leaves is recorded (:attr:`PlacementSchedulerPlugin.departures`);
  one that leaves without announcing it (killed, crashed, unreachable) is a
  *loss*, logged at WARNING with its address, name, the work it had and what
  happens next, and marked *restored* when a worker of the same name joins
  again (a Nanny or the local cluster's restart supervisor, which also
  reports a restart that gives up: :data:`REPORT_HANDLER`);
* passes, registered when their graph arrives (the ``qf_pass`` annotation,
  :meth:`PlacementSchedulerPlugin.register_pass`: scan shape and chunk rows;
  each pass's departures cursor and every departure are published on
  :data:`PASS_EVENTS_TOPIC`, graphs/pass_watch.py), and every chunk task that
  finishes (worker, bytes, compute time), for per-worker throughput and the
  scan-shaped map.

The page ``/quantem-flow`` on the scheduler's HTTP server (the dashboard
port, bound to 127.0.0.1 by the engine) is a Bokeh document
(:mod:`quantem_flow.graphs.dashboard`) registered when the plugin starts,
with a plain HTML table when Bokeh is not installed;
``/quantem-flow/state.json`` serves the same state as JSON.
"""

from __future__ import annotations

import collections
import html
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
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
    TaskInfo,
    TasksForgotten,
    TasksSubmitted,
    WorkerJoined,
    WorkerLeft,
    tasks_from_annotations,
)
from .stuck_tasks import StuckTasks

try:  # distributed is a hard dependency; the guard keeps imports cheap to reason about
    from distributed.diagnostics.plugin import SchedulerPlugin
except ImportError:  # pragma: no cover
    SchedulerPlugin = object

__all__ = [
    "DIRECT_QUERY_HANDLER",
    "PASS_EVENTS_TOPIC",
    "PLUGIN_NAME",
    "REPORT_HANDLER",
    "PlacementSchedulerPlugin",
    "dashboard_state",
    "dask_setup",
    "ensure_placement",
]

PLUGIN_NAME = "quantem-flow-placement"
#: Scheduler handler a restart supervisor calls: ``report(name=, address=, restart=, detail=)``.
REPORT_HANDLER = "quantem_flow_worker_report"
#: Scheduler handler a client calls after a direct resident query (graphs/query_service).
DIRECT_QUERY_HANDLER = "quantem_flow_direct_query"
#: Scheduler event topic on which the plugin tells subscribed clients (graphs/pass_watch.py)
#: each registered pass's departures cursor (``{"pass": name, "cursor": seq}``) and every
#: departure, again whenever it changes (``{"departure": record}``): the client reads a
#: pass's departures without asking the scheduler after the pass.
PASS_EVENTS_TOPIC = "quantem-flow-passes"
#: Restriction of a task waiting for a capable worker (no worker has this address).
WAITING = "quantem-flow:waiting-for-a-capable-worker"
#: Chunk completions kept for the throughput chart.
MAX_COMPLETIONS = 20000
#: Passes kept for the progress bars and the scan map.
MAX_PASSES = 20
#: Departures kept.
MAX_DEPARTURES = 500
#: Worker statuses that announce a departure.
_ANNOUNCED = ("closing", "closing_gracefully", "closed")
#: Roles of the tasks that process one chunk.
_CHUNK_ROLES = ("pass", "kernel", "load")
#: Seconds between checks for tasks that no worker can run (see stuck_tasks).
STUCK_CHECK_S = 1.0
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
        #: every worker that left, in order (see :meth:`remove_worker`)
        self.departures: list[dict[str, Any]] = []
        #: registered passes by layer name (``qf-pass-...``/``qf-load-...``), oldest first
        self.passes: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        #: ``(stop time, worker, bytes, compute seconds)`` of every finished chunk task
        self.completions: collections.deque[tuple[float, str, int, float]] = collections.deque(
            maxlen=MAX_COMPLETIONS
        )
        #: the dashboard page: ``"bokeh"``, ``"html"`` (Bokeh missing) or ``None`` (no server)
        self.page: str | None = None
        self.page_note = ""
        self._closing = False
        self._announced: set[str] = set()
        self._remove_msgs: dict[str, dict[str, Any]] = {}
        self._reports: dict[str, dict[str, Any]] = {}
        self._names: dict[str, str] = {}
        self._log_stamped = 0
        from .. import config

        #: waiting tasks no worker can run: failed promptly, never left waiting forever
        self.stuck = StuckTasks(float(config.get("no_worker_timeout_s")))
        self._stuck_check: Any = None
        self._queued_since: dict[Any, float] = {}

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        """Remember the scheduler, feed its current workers, add the handler and the page."""
        self.scheduler = scheduler
        for address in list(scheduler.workers):
            self._add(address)
        handlers = getattr(scheduler, "handlers", None)
        if isinstance(handlers, dict):
            handlers[REPORT_HANDLER] = self.report
            handlers[DIRECT_QUERY_HANDLER] = self.direct_query
        self._add_routes(scheduler)
        from tornado.ioloop import PeriodicCallback

        self._stuck_check = PeriodicCallback(self.check_stuck, STUCK_CHECK_S * 1000)
        self._stuck_check.start()

    def _add_routes(self, scheduler: Any) -> None:
        app = getattr(scheduler, "http_application", None)
        if app is None:
            self.page = None
            self.page_note = "the scheduler has no HTTP server (dashboard disabled)"
            return
        from tornado.web import RequestHandler

        plugin = self

        class Page(RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", "text/html; charset=utf-8")
                self.write(plugin.render_html())

        class State(RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", "application/json")
                self.write(json.dumps(plugin.state(), default=str))

        # the JSON route always; the page is a Bokeh document when Bokeh is installed
        routes: list[Any] = [(r"/quantem-flow/state.json", State)]
        from .dashboard import register_page

        registered, note = register_page(scheduler, self)
        self.page = "bokeh" if registered else "html"
        self.page_note = note
        if not registered:
            routes.append((r"/quantem-flow/?", Page))
        app.add_handlers(r".*", routes)

    async def before_close(self) -> None:
        """The scheduler is closing: workers leaving now are not losses."""
        self._closing = True
        if self._stuck_check is not None:
            self._stuck_check.stop()
        items = getattr(self.scheduler, "_quantem_flow_items", None)
        if items is not None:  # the page's thread making its charts
            items.close()

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
        self._names[address] = str(ws.name)
        self._announced.discard(address)
        self.stuck.joined(address, str(ws.name))
        self._sample_memory(address, ws)
        self._apply(self._handle(WorkerJoined(caps)), stimulus_id="qf-worker-joined")
        self._restored(address, str(ws.name))

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker registered: read its advertised capabilities."""
        self.scheduler = scheduler
        self._add(worker)

    def log_event(self, topic: Any, msg: Any) -> None:
        """Watch the scheduler's events: announced departures and removal details."""
        if not isinstance(msg, dict):
            return
        action = msg.get("action")
        if action == "worker-status-change" and isinstance(topic, str):
            if str(msg.get("status")) in _ANNOUNCED:
                self._announced.add(topic)
        elif action == "remove-worker" and topic == "all" and "worker" in msg:
            self._remove_msgs[str(msg["worker"])] = msg

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        """A worker left: re-place what it held, run what waited for it, record and report it."""
        self.scheduler = scheduler
        stimulus = str(kwargs.get("stimulus_id", "qf-worker-left"))
        held = sum(1 for a in self.placement.planned.values() if a == worker)
        self._apply(self._handle(WorkerLeft(worker)), stimulus_id=stimulus)
        self._record_departure(worker, stimulus, held)

    # -- departures -----------------------------------------------------------------------
    def _record_departure(self, worker: str, stimulus: str, held: int) -> None:
        msg = self._remove_msgs.pop(worker, {})
        announced = worker in self._announced or bool(msg.get("expected"))
        self._announced.discard(worker)
        name = self._names.pop(worker, None)
        running = [str(k) for k in msg.get("processing-tasks", ())]
        recompute = [str(k) for k in msg.get("lost-computed-tasks", ())]
        ours = sum(1 for k in running if "qf-" in k)
        left = len(getattr(self.scheduler, "workers", {}) or {})
        lost = not announced and not self._closing
        if lost:
            what_next = (
                f"{len(running)} running task(s) ({ours} quantem-flow chunk task(s)) will run "
                f"again on the {left} remaining worker(s); {len(recompute)} result(s) it held "
                f"will be recomputed; {held} resident chunk(s) re-placed"
            )
            if left == 0:
                what_next += (
                    "; no worker is left: tasks wait for a restart, and fail with the workers' "
                    "exit history if none comes (qf.config no_worker_timeout_s)"
                )
        else:
            what_next = "it announced its departure (closed or retired)"
        record: dict[str, Any] = {
            "seq": self.next_departure(),
            "time": time.time(),
            "worker": worker,
            "name": name,
            "lost": lost,
            "announced": announced,
            "stimulus_id": stimulus,
            "tasks_running": len(running),
            "chunk_tasks_running": ours,
            "results_recomputed": len(recompute),
            "resident_chunks_replaced": held,
            "workers_left": left,
            "what_next": what_next,
            "restored": False,
            "restored_by": None,
            "restored_after_s": None,
            "restart": None,
        }
        report = self._reports.pop(worker, None) or (
            self._reports.pop(name, None) if name else None
        )
        if report is not None:
            record["restart"] = report
        self.stuck.left(worker, name, lost=lost)
        self.departures.append(record)
        del self.departures[:-MAX_DEPARTURES]
        self._publish({"departure": dict(record)})
        if lost:
            logger.warning(
                "quantem-flow: worker %s (name %r) was lost (it left without closing: killed, "
                "crashed or unreachable; %s): %s. It is restored if a worker named %r joins "
                "again (a Nanny or the local cluster restarts it); the pass provenance records it",
                worker,
                name,
                stimulus,
                what_next,
                name,
            )
        else:
            logger.info("quantem-flow: worker %s (name %r) left: %s", worker, name, what_next)

    def _restored(self, address: str, name: str) -> None:
        for r in reversed(self.departures):
            if r["lost"] and not r["restored"] and r["name"] == name:
                r["restored"] = True
                r["restored_by"] = address
                r["restored_after_s"] = time.time() - float(r["time"])
                self._publish({"departure": dict(r)})
                logger.warning(
                    "quantem-flow: lost worker %s (name %r) is restored: a worker of that name "
                    "joined at %s, %.1f s later",
                    r["worker"],
                    name,
                    address,
                    r["restored_after_s"],
                )
                return

    def report(
        self,
        name: Any = None,
        address: Any = None,
        restart: str = "",
        detail: str = "",
        **ignored: Any,
    ) -> str:
        """Take a restart supervisor's report about a worker that died (a scheduler handler).

        Parameters
        ----------
        name, address
            The worker's name and last address.
        restart
            ``"restarting"``, ``"gave-up"`` or ``"failed"``.
        detail
            What happened, in words (exit status, restarts within the window).
        ignored
            ``exits``: ``[(wall time, exit status), ...]`` of the worker program's
            unexpected exits (its exit history); other members are ignored.

        Returns
        -------
        str
            ``"recorded"`` when the departure was known, ``"pending"`` otherwise.
        """
        info = {"restart": str(restart), "detail": str(detail), "time": time.time()}
        exits = ignored.get("exits") or ()
        who = str(name if name is not None else address)
        self.stuck.report(who, str(restart), str(detail), exits)
        if restart in ("gave-up", "failed"):
            logger.error(
                "quantem-flow: worker %s (name %r) will not be restored: %s",
                address,
                name,
                detail,
            )
        for r in reversed(self.departures):
            if r["worker"] == address or (name is not None and r["name"] == str(name)):
                if not r["restored"]:
                    r["restart"] = info
                    self._publish({"departure": dict(r)})
                return "recorded"
        self._reports[str(address if address is not None else name)] = info
        return "pending"

    # -- tasks no worker can run -----------------------------------------------------------
    def check_stuck(self) -> None:
        """Fail the waiting quantem-flow tasks no worker will run (every STUCK_CHECK_S)."""
        sched = self.scheduler
        if sched is None or self._closing:
            return
        try:
            for address, ws in sched.workers.items():
                self._sample_memory(address, ws)
            ours = self.placement.tasks
            waiting = {
                ts.key: float(since) for ts, since in sched.unrunnable.items() if ts.key in ours
            }
            if not sched.workers:
                # with no worker at all, the small tasks a pass depends on (its spec...) wait
                # in the queue, and the pass behind them: they wait for the same worker
                now = time.monotonic()
                for ts in sched.queued:
                    if ts.key in ours or any(d.key in ours for d in ts.dependents):
                        waiting[ts.key] = self._queued_since.setdefault(ts.key, now)
            stale = set(self._queued_since) - set(waiting)
            for key in stale:
                del self._queued_since[key]
            if not waiting:
                return
            offered = {a: sorted(w.runtimes) for a, w in sorted(self.placement.workers.items())}
            needs = {}
            for key in waiting:
                task = ours.get(key)
                if task is None:
                    needs[key] = "any worker"
                    continue
                need = f"runtime {task.runtime!r}"
                if task.need:
                    need += " and " + ", ".join(
                        f"{n / 2**20:.0f} MiB of {pool}" for pool, n in sorted(task.need.items())
                    )
                needs[key] = need
            verdicts = self.stuck.check(
                waiting,
                refused=self.placement.refused,
                n_workers=len(sched.workers),
                offered=f"runtimes {offered}",
                needs=needs,
                now=time.monotonic(),
            )
            for verdict in verdicts:
                self.fail_waiting(verdict.keys, verdict.reason)
        except Exception:  # never let the check break the scheduler; say so loudly
            logger.exception("quantem-flow: the check for tasks no worker can run failed")

    def _sample_memory(self, address: str, ws: Any) -> None:
        """Keep the memory a worker reported last (at registration, then every check)."""
        metrics = getattr(ws, "metrics", None)
        memory = metrics.get("memory") if isinstance(metrics, dict) else None
        self.stuck.heartbeat(address, memory, getattr(ws, "memory_limit", None) or None)

    def fail_waiting(self, keys: Any, reason: str) -> list[Any]:
        """Fail tasks waiting in ``no-worker`` or ``queued`` with :class:`PlacementError`.

        Their dependents fail with them (Dask propagates the error), so the client's
        compute raises ``reason`` at once.
        """
        import pickle

        sched = self.scheduler
        stimulus_id = f"qf-no-worker-can-run-{time.time()}"
        exception = pickle.dumps(PlacementError(reason))
        recommendations: dict[Any, Any] = {}
        failed = []
        for key in keys:
            ts = sched.tasks.get(key)
            if ts is None or ts.state not in ("no-worker", "queued"):
                continue
            recommendations.update(
                sched.transition(
                    key, "erred", exception=exception, cause=key, stimulus_id=stimulus_id
                )
            )
            failed.append(key)
        if failed:
            logger.error(
                "quantem-flow: %d task(s) failed, no worker can run them: %s", len(failed), reason
            )
            sched.transitions(recommendations, stimulus_id=stimulus_id)
        return failed

    def _publish(self, msg: dict[str, Any]) -> None:
        """Send ``msg`` to the clients subscribed to :data:`PASS_EVENTS_TOPIC`."""
        sched = self.scheduler
        if sched is None or not hasattr(sched, "log_event"):
            return
        try:
            sched.log_event(PASS_EVENTS_TOPIC, msg)
        except Exception as exc:  # the page and provenance miss one event; nothing else
            logger.debug("quantem-flow: pass event not published: %s", exc)

    def departures_since(self, seq: int) -> list[dict[str, Any]]:
        """Departures recorded at or after sequence number ``seq``."""
        return [dict(r) for r in self.departures if int(r["seq"]) >= seq]

    # -- passes and throughput -------------------------------------------------------------
    def register_pass(self, info: Mapping[str, Any]) -> int:
        """Remember a pass the client submits (name, label, scan shape, chunk rows, row bytes).

        Returns the departures' next sequence number, the runner's cursor.
        """
        name = str(info["name"])
        chunks = [(int(a), int(b)) for a, b in info.get("chunks", ())]
        self.passes[name] = {
            "name": name,
            "kind": str(info.get("kind", "pass")),
            "label": str(info.get("label", name)),
            "scan_shape": [int(x) for x in info.get("scan_shape", (0, 0))],
            "chunks": chunks,
            "row_bytes": int(info.get("row_bytes", 0)),
            "started": time.time(),
            "finished": None,
            "done": {},
            "running": {},
        }
        while len(self.passes) > MAX_PASSES:
            self.passes.popitem(last=False)
        return self.next_departure()

    def direct_query(
        self,
        info: Mapping[str, Any] | None = None,
        workers: Sequence[str] | None = None,
        compute_s: Mapping[str, float] | None = None,
        started: float = 0.0,
        finished: float = 0.0,
        **ignored: Any,
    ) -> None:
        """Take a client's report of a query that went straight to the workers (a handler).

        The page shows it like a pass whose tasks ran: every chunk done on
        its worker (``workers``, chunk order) and one completion per worker
        for the throughput chart.
        """
        if not info or not workers:
            return
        self.register_pass(info)
        p = self.passes[str(info["name"])]
        p["started"], p["finished"] = float(started), float(finished)
        nbytes: dict[str, int] = {}
        for j, worker in enumerate(workers):
            p["done"][j] = str(worker)
            if j < len(p["chunks"]):
                r0, r1 = p["chunks"][j]
                nbytes[str(worker)] = nbytes.get(str(worker), 0) + (r1 - r0) * p["row_bytes"]
        for worker, n in nbytes.items():
            seconds = float((compute_s or {}).get(worker, 0.0))
            self.completions.append((float(finished), worker, int(n), seconds))

    def next_departure(self) -> int:
        """Sequence number the next departure will get."""
        return int(self.departures[-1]["seq"]) + 1 if self.departures else 0

    def _chunk_task(self, key: Any, info: TaskInfo, finish: str, kwargs: Mapping[str, Any]) -> None:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int)):
            return
        p = self.passes.get(str(key[0]))
        i = key[1]
        ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
        # a task may run several chunks (qf_chunks): a group of unpersisted chunks
        # (graphs/pass_groups.py) or every resident chunk of one worker (lowering.resident_groups)
        covered = list(info.chunks) or [i]
        if finish == "processing":
            ws = getattr(ts, "processing_on", None)
            if p is not None and ws is not None:
                for j in covered:
                    p["running"][j] = ws.address
            return
        worker = kwargs.get("worker")
        if worker is None and ts is not None and ts.who_has:
            worker = next(iter(ts.who_has)).address
        if worker is None:
            return
        worker = str(worker)
        nbytes = 0
        if p is not None:
            for j in covered:
                p["running"].pop(j, None)
                p["done"][j] = worker
                if 0 <= j < len(p["chunks"]):
                    r0, r1 = p["chunks"][j]
                    nbytes += (r1 - r0) * p["row_bytes"]
            if len(p["done"]) >= len(p["chunks"]) and p["finished"] is None:
                p["finished"] = time.time()
        else:
            nbytes = info.nbytes
        compute_s = 0.0
        for ss in kwargs.get("startstops", ()) or ():
            if isinstance(ss, dict) and ss.get("action") == "compute":
                compute_s += float(ss.get("stop", 0)) - float(ss.get("start", 0))
        self.completions.append((time.time(), worker, int(nbytes), compute_s))

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Track resident chunks landing, chunk tasks running and finishing, tasks leaving."""
        info = self.placement.tasks.get(key)
        if info is None:
            return
        if info.role in _CHUNK_ROLES and (
            finish == "processing" or (finish == "memory" and start == "processing")
        ):
            self._chunk_task(key, info, finish, kwargs)
        if finish == "memory" and info.role == "load":
            ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
            worker = kwargs.get("worker")
            if worker is None and ts is not None and ts.who_has:
                worker = next(iter(ts.who_has)).address
            if worker is not None:
                nbytes = ts.nbytes if ts is not None and ts.nbytes and ts.nbytes > 0 else None
                self._apply(
                    self._handle(ChunkInMemory(key, str(worker), nbytes)),
                    stimulus_id="qf-chunk-in-memory",
                )
        elif finish == "forgotten":
            self._handle(TasksForgotten((key,)))

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
        announced = annotations.get("qf_pass") or {}
        for info in {
            str(v["name"]): v for v in announced.values() if isinstance(v, Mapping)
        }.values():
            cursor = self.next_departure()
            self.register_pass(info)
            self._publish({"pass": str(info["name"]), "cursor": cursor})
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
                self._handle(TasksSubmitted(tuple(infos))),
                stimulus_id=str(kwargs.get("stimulus_id", "qf-update-graph")),
            )

    # -- applying decisions ---------------------------------------------------------------
    def _handle(self, event: Any) -> list[Decision]:
        """Feed one event to placement; stamp the log entries it adds with the time."""
        decisions = self.placement.handle(event)
        log = self.placement.log
        now = time.time()
        for entry in log[self._log_stamped :]:
            entry.setdefault("time", now)
        if len(log) > 5000:  # keep the log bounded on a long-lived scheduler
            del log[:-2000]
        self._log_stamped = len(log)
        return decisions

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
                if d.resources is not None and ts.state != "processing":
                    # the task's memory need, held on the worker while it runs (admission)
                    ts.resource_restrictions = dict(d.resources)
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
    def state(self, *, window_s: float = 300.0) -> dict[str, Any]:
        """Return the state the dashboard page draws (JSON-ready).

        Parameters
        ----------
        window_s
            Seconds of throughput history returned (1 s bins).
        """
        p = self.placement
        resident = p.resident_by_worker()
        by_runtime: dict[str, dict[str, int]] = {}
        for k, a in p.planned.items():
            t = p.tasks.get(k)
            if t is None:
                continue
            cat = f"{t.runtime}/{t.representation}"
            per = by_runtime.setdefault(a, {})
            per[cat] = per.get(cat, 0) + p.charged.get(k, 0)
        workers = []
        for address, caps in sorted(p.workers.items()):
            held = sorted(repr(k) for k, a in p.holder.items() if a == address)
            planned = sorted(repr(k) for k, a in p.planned.items() if a == address)
            workers.append(
                {
                    **caps.to_dict(),
                    "resident_bytes": resident.get(address, {}),
                    "resident_bytes_by_runtime": by_runtime.get(address, {}),
                    "chunks_in_memory": held,
                    "chunks_planned": planned,
                }
            )
        return {
            "plugin": PLUGIN_NAME,
            "time": time.time(),
            "uptime_s": time.time() - self.started,
            "decisions": self.n_decisions,
            "page": self.page,
            "page_note": self.page_note,
            "workers": workers,
            "refused": {repr(k): v for k, v in p.refused.items()},
            "log": p.log[-200:],
            "departures": [dict(r) for r in self.departures[-50:]],
            "passes": [self._pass_summary(x) for x in self.passes.values()],
            "throughput": self.throughput(window_s=window_s),
        }

    @staticmethod
    def _pass_summary(p: Mapping[str, Any]) -> dict[str, Any]:
        n = len(p["chunks"])
        holder = [p["done"].get(i) or p["running"].get(i) for i in range(n)]
        status = [
            "done" if i in p["done"] else "running" if i in p["running"] else "waiting"
            for i in range(n)
        ]
        return {
            "name": p["name"],
            "kind": p["kind"],
            "label": p["label"],
            "scan_shape": list(p["scan_shape"]),
            "chunks": [list(c) for c in p["chunks"]],
            "worker": holder,
            "status": status,
            "n_chunks": n,
            "n_done": len(p["done"]),
            "started": p["started"],
            "finished": p["finished"],
            "bytes": p["row_bytes"] * sum(r1 - r0 for r0, r1 in p["chunks"]),
        }

    def throughput(self, *, window_s: float = 300.0, bin_s: float = 1.0) -> dict[str, Any]:
        """Per-worker throughput: bytes of finished chunk tasks per ``bin_s`` (GB/s).

        Returns ``{"bin_s", "start", "workers": {address: [GB/s per bin]}, "total_bytes"}``
        over the last ``window_s`` seconds that had any completion (empty when none).
        """
        if not self.completions:
            return {"bin_s": bin_s, "start": None, "workers": {}, "total_bytes": {}}
        now = time.time()
        first = max(self.completions[0][0], now - window_s)
        start = first - (first % bin_s) - bin_s
        n = int((now - start) // bin_s) + 2
        series: dict[str, list[float]] = {}
        totals: dict[str, int] = {}
        for t, w, nbytes, _ in self.completions:
            if t < start:
                continue
            bins = series.setdefault(w, [0.0] * n)
            i = min(int((t - start) // bin_s), n - 1)
            bins[i] += nbytes / 1e9 / bin_s
            totals[w] = totals.get(w, 0) + nbytes
        return {"bin_s": bin_s, "start": start, "workers": series, "total_bytes": totals}

    def render_html(self) -> str:
        """Return the plain page (served when Bokeh is not installed)."""
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
        log = "\n".join(html.escape(json.dumps(e, default=str)) for e in st["log"][-40:])
        refused = "".join(
            f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in st["refused"].items()
        )
        lost = "".join(
            f"<li>{html.escape(str(d['worker']))} ({html.escape(str(d['name']))}): "
            + ("restored by " + html.escape(str(d["restored_by"])) if d["restored"] else "lost")
            + "; "
            + f"{html.escape(str(d['what_next']))}</li>"
            for d in st["departures"]
            if d["lost"]
        )
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='2'><title>quantem-flow placement</title>"
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px}"
            "table{border-collapse:collapse}</style></head><body>"
            "<h1>quantem-flow placement</h1>"
            f"<p><em>{html.escape(self.page_note)}</em></p>"
            f"<p>{len(st['workers'])} worker(s), {st['decisions']} decision(s)</p>"
            "<table><tr><th>worker</th><th>name</th><th>runtimes</th><th>budgets</th>"
            "<th>resident bytes by representation</th><th>chunks in memory</th>"
            "<th>chunk placement</th></tr>"
            + "".join(rows)
            + "</table>"
            + (f"<h2>workers lost</h2><ul>{lost}</ul>" if lost else "")
            + (f"<h2>refused</h2><ul>{refused}</ul>" if refused else "")
            + f"<h2>recent decisions</h2><pre>{log}</pre></body></html>"
        )


def _has_plugin(dask_scheduler: Any) -> bool:
    return PLUGIN_NAME in dask_scheduler.plugins


_installed: set[str] = set()
_installing = threading.Lock()


def ensure_placement(client: Any) -> None:
    """Install the placement plugin on a client's scheduler once (threads computing at once)."""
    address = str(client.scheduler.address)
    if address in _installed:
        return
    with _installing:
        if address in _installed:
            return
        if not client.run_on_scheduler(_has_plugin):
            client.register_plugin(PlacementSchedulerPlugin(), name=PLUGIN_NAME)
        _installed.add(address)


def _plugin(dask_scheduler: Any) -> PlacementSchedulerPlugin | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin if isinstance(plugin, PlacementSchedulerPlugin) else None


def dashboard_state(dask_scheduler: Any = None) -> dict[str, Any] | None:
    """Return the plugin's dashboard state (``client.run_on_scheduler``), ``None`` without it."""
    plugin = _plugin(dask_scheduler)
    return None if plugin is None else plugin.state()


def dask_setup(scheduler: Any) -> None:
    """Install the plugin from ``dask scheduler --preload quantem_flow.graphs.scheduler_plugin``."""
    scheduler.add_plugin(PlacementSchedulerPlugin(), name=PLUGIN_NAME)
