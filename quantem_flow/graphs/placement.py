"""Placement as a pure state machine: events in, decisions out.

No networking and no Dask here: the scheduler plugin
(:mod:`quantem_flow.graphs.scheduler_plugin`) turns scheduler callbacks into
events, feeds them to :class:`Placement`, and writes the returned decisions
into task restrictions.  Tests drive the machine directly, deterministically.

Rules
-----
* A task runs only on workers that advertise its runtime (``qf_runtime``);
  ``"any"`` runs anywhere.  A worker never receives a task whose runtime it
  cannot run.
* ``load`` tasks (a chunk that stays resident) go to one capable worker:
  the one with the most free budget for that runtime after the chunks
  already placed there, ties broken by fewer chunks, then by address.
  Admission: a chunk larger than the free budget of every capable worker
  is refused with a clear reason; when the natural choice is full the chunk
  goes to another capable worker with room and the record says so.
* ``kernel`` tasks that read a resident chunk are pinned to the chunk's
  holder (or its planned holder before it is in memory), with no loose
  restrictions, so work stealing cannot move them.  When the chunk lands
  on another worker, or its worker leaves and it is re-placed, the
  dependents follow.
* ``pass`` tasks (load and kernels fused, nothing resident) carry their
  memory need per pool (``qf_need``: payload, staging buffer, decode and
  transform scratch, kernel working memory, the partial; computed on the
  client by :func:`quantem_flow.graphs.lowering.task_memory_need`).  A task
  whose need exceeds the pool of every capable worker is refused up front,
  with the need broken down, the budgets and a chunk size that fits.  On
  workers that advertise their pools as Dask resources
  (``qf-memory-<pool>``) the task requests its need from them, so a worker
  with several threads runs at once only the tasks whose needs fit its
  budget (Dask's worker enforces resources; DASK_NOTES).
* Memory pools are counted once: ``cpu`` and ``mps`` payloads share the
  ``host`` pool, so a worker advertising both never admits more than that
  RAM (resident chunks of both runtimes are charged to the one pool).
* A worker leaving re-places the resident chunks it held or was planned to
  hold.  When no capable worker is left (or none has joined yet) tasks wait,
  restricted to no worker, until a capable one joins (a nanny restarting a
  killed worker, say); a graph submitted to a cluster whose workers exist
  but cannot run its runtime is refused at once.

Every decision is also appended to :attr:`Placement.log` for provenance and
the dashboard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from .capabilities import MEMORY_PREFIX, WorkerCapabilities, memory_pool

__all__ = [
    "ChunkForgotten",
    "ChunkInMemory",
    "Event",
    "Placement",
    "Refuse",
    "Restrict",
    "TaskInfo",
    "TasksForgotten",
    "TasksSubmitted",
    "WorkerJoined",
    "WorkerLeft",
]

Key = Hashable


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What placement needs to know about one task.

    Attributes
    ----------
    key
        The task key.
    role
        ``"load"``, ``"kernel"``, ``"pass"``, ``"combine"`` or ``"probe"``.
    runtime
        Runtime the task needs, or ``"any"``.
    representation
        Representation of the payload it reads or makes.
    resident
        For ``kernel`` tasks: the key of the resident chunk they read.
    nbytes
        For ``load`` and ``pass`` tasks: bytes of the chunk held on the device.
    need
        ``{pool: bytes}`` the task needs at its peak while it runs (empty:
        ``nbytes`` in its runtime's pool).
    need_detail
        The ``qf_need`` annotation (breakdown, bytes per scan row, chunk
        rows) for refusal messages.
    chunks
        For chunk tasks: the indices of the chunks the task runs (``qf_chunks``).
    """

    key: Key
    role: str
    runtime: str = "any"
    representation: str = "dense"
    resident: Key | None = None
    nbytes: int = 0
    need: Mapping[str, int] = dataclasses.field(default_factory=dict)
    need_detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    chunks: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class WorkerJoined:
    """A worker registered with its capabilities."""

    worker: WorkerCapabilities


@dataclasses.dataclass(frozen=True)
class WorkerLeft:
    """A worker left or died."""

    address: str


@dataclasses.dataclass(frozen=True)
class TasksSubmitted:
    """A graph was submitted; ``tasks`` are the annotated ones."""

    tasks: tuple[TaskInfo, ...]


@dataclasses.dataclass(frozen=True)
class ChunkInMemory:
    """A ``load`` task's chunk is in memory on ``worker``."""

    key: Key
    worker: str
    nbytes: int | None = None


@dataclasses.dataclass(frozen=True)
class ChunkForgotten:
    """A resident chunk was released everywhere."""

    key: Key


@dataclasses.dataclass(frozen=True)
class TasksForgotten:
    """Tasks left the scheduler (finished and released, or cancelled)."""

    keys: tuple[Key, ...]


Event = WorkerJoined | WorkerLeft | TasksSubmitted | ChunkInMemory | ChunkForgotten | TasksForgotten


@dataclasses.dataclass(frozen=True)
class Restrict:
    """Run ``key`` only on ``workers`` (no loose restrictions)."""

    key: Key
    workers: frozenset[str]
    reason: str
    #: Dask resources the task requests (``{"qf-memory-<pool>": bytes}``), or None
    resources: Mapping[str, float] | None = None


@dataclasses.dataclass(frozen=True)
class Refuse:
    """``key`` cannot be placed; the plugin must fail it loudly with ``reason``."""

    key: Key
    reason: str


Decision = Restrict | Refuse


class Placement:
    """The placement state machine.  Feed events with :meth:`handle`."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerCapabilities] = {}
        self.tasks: dict[Key, TaskInfo] = {}
        #: load key -> worker chosen for it (before and after it is in memory)
        self.planned: dict[Key, str] = {}
        #: load key -> worker that holds it in memory
        self.holder: dict[Key, str] = {}
        #: load key -> bytes counted against the worker's budget
        self.charged: dict[Key, int] = {}
        #: chunk key -> kernel keys reading it
        self.dependents: dict[Key, set[Key]] = {}
        #: current restriction of every placed task
        self.restrictions: dict[Key, frozenset[str]] = {}
        self.refused: dict[Key, str] = {}
        #: tasks waiting for a capable worker to join
        self.pending: dict[Key, TaskInfo] = {}
        self.log: list[dict[str, Any]] = []

    # -- queries -----------------------------------------------------------------------
    def capable(self, task: TaskInfo) -> list[str]:
        """Workers that can run ``task``'s runtime, sorted by address."""
        if task.runtime == "any":
            return sorted(self.workers)
        return sorted(a for a, w in self.workers.items() if task.runtime in w.runtimes)

    def used(self, address: str, runtime: str) -> int:
        """Bytes of ``runtime`` chunks charged to ``address``."""
        return sum(
            self.charged.get(k, 0)
            for k, a in self.planned.items()
            if a == address and self.tasks[k].runtime == runtime
        )

    def used_pool(self, address: str, pool: str) -> int:
        """Bytes of resident chunks of every runtime in ``pool`` charged to ``address``."""
        return sum(
            self.charged.get(k, 0)
            for k, a in self.planned.items()
            if a == address and memory_pool(self.tasks[k].runtime) == pool
        )

    def free(self, address: str, runtime: str) -> float:
        """Budget left on ``address`` for ``runtime`` chunks (inf when no budget is set).

        The smaller of the runtime's own budget and its memory pool's room:
        chunks of runtimes sharing a pool (``cpu`` and ``mps``) count once.
        """
        w = self.workers[address]
        budget = w.budgets.get(runtime)
        if budget is None:
            return float("inf")
        own = budget - self.used(address, runtime)
        pool = memory_pool(runtime)
        size = w.pools.get(pool)
        if size is None:
            return own
        return min(own, size - self.used_pool(address, pool))

    def need_of(self, task: TaskInfo) -> dict[str, int]:
        """``{pool: bytes}`` ``task`` needs while it runs."""
        if task.need:
            return {p: int(n) for p, n in task.need.items() if n}
        if task.nbytes and task.runtime != "any":
            return {memory_pool(task.runtime): task.nbytes}
        return {}

    def limit(self, address: str, runtime: str, pool: str) -> float:
        """Bytes one task of ``runtime`` may need from ``pool`` on ``address`` (inf: unknown)."""
        w = self.workers[address]
        size: float = w.pools.get(pool, float("inf"))
        if runtime != "any" and memory_pool(runtime) == pool and runtime in w.budgets:
            size = min(size, w.budgets[runtime])
        return size

    def fits(self, address: str, task: TaskInfo) -> bool:
        """Whether ``task``'s need fits the budgets of ``address`` (alone)."""
        return all(
            n <= self.limit(address, task.runtime, pool) for pool, n in self.need_of(task).items()
        )

    def resident_by_worker(self) -> dict[str, dict[str, int]]:
        """``{worker: {representation: bytes}}`` of chunks held or planned."""
        out: dict[str, dict[str, int]] = {a: {} for a in self.workers}
        for k, a in self.planned.items():
            rep = self.tasks[k].representation
            per = out.setdefault(a, {})
            per[rep] = per.get(rep, 0) + self.charged.get(k, 0)
        return out

    # -- the machine ---------------------------------------------------------------------
    def handle(self, event: Event) -> list[Decision]:
        """Apply one event and return the decisions it causes."""
        if isinstance(event, WorkerJoined):
            return self._joined(event.worker)
        if isinstance(event, WorkerLeft):
            return self._left(event.address)
        if isinstance(event, TasksSubmitted):
            return self._submitted(event.tasks)
        if isinstance(event, ChunkInMemory):
            return self._in_memory(event)
        if isinstance(event, ChunkForgotten):
            self._forget_chunk(event.key)
            return []
        if isinstance(event, TasksForgotten):
            for k in event.keys:
                self._forget_task(k)
            return []
        raise TypeError(f"unknown placement event {event!r}")

    def handle_all(self, events: Iterable[Event]) -> list[Decision]:
        """Apply several events in order."""
        out: list[Decision] = []
        for e in events:
            out.extend(self.handle(e))
        return out

    # -- event handlers ----------------------------------------------------------------
    def _joined(self, worker: WorkerCapabilities) -> list[Decision]:
        self.workers[worker.address] = worker
        self.log.append(
            {
                "event": "worker-joined",
                "worker": worker.address,
                "runtimes": sorted(worker.runtimes),
            }
        )
        # nothing placed moves; tasks waiting for a capable worker are placed now
        decisions: list[Decision] = []
        waiting = [
            t
            for k, t in sorted(self.pending.items(), key=lambda kv: repr(kv[0]))
            if worker.address in self.capable(t)
        ]
        for task in sorted(waiting, key=lambda t: (t.role != "load", repr(t.key))):
            if self.pending.pop(task.key, None) is None:
                continue  # placed already, with the chunk it reads
            decisions.extend(self._place(task, why="capable worker joined"))
        return decisions

    def _left(self, address: str) -> list[Decision]:
        if address not in self.workers:
            return []
        del self.workers[address]
        self.log.append({"event": "worker-left", "worker": address})
        decisions: list[Decision] = []
        lost = sorted((k for k, a in self.planned.items() if a == address), key=repr)
        for k in lost:
            del self.planned[k]
            self.holder.pop(k, None)
            self.charged.pop(k, None)
        for k in lost:
            decisions.extend(self._place(self.tasks[k], why="re-placed: worker left"))
        # any other task restricted to the departed worker
        for k, workers in list(self.restrictions.items()):
            if address in workers and k not in lost and k not in self.refused:
                decisions.extend(self._place(self.tasks[k], why="worker left"))
        return decisions

    def _submitted(self, tasks: Iterable[TaskInfo]) -> list[Decision]:
        decisions: list[Decision] = []
        ordered = sorted(tasks, key=lambda t: (t.role != "load", repr(t.key)))
        for task in ordered:
            if task.role == "load" and task.key in self.planned:
                continue  # already placed (resubmitted key)
            self.tasks[task.key] = task
            if task.role == "kernel" and task.resident is not None:
                self.dependents.setdefault(task.resident, set()).add(task.key)
            decisions.extend(self._place(task, why=None, submitted=True))
        return decisions

    def _place(self, task: TaskInfo, *, why: str | None, submitted: bool = False) -> list[Decision]:
        if not self.workers or (not submitted and not self.capable(task)):
            return self._wait(task)
        if task.role == "load":
            return self._place_load(task, why=why or "most free budget")
        if task.role == "kernel" and task.resident is not None:
            return self._pin_kernel(task, why=why or "pinned to the chunk's holder")
        if task.role == "pass":
            return self._admit_pass(task, why=why or "capable workers")
        if task.runtime != "any":
            return self._restrict_capable(task, why=why or "capable workers")
        return []

    def _wait(self, task: TaskInfo) -> list[Decision]:
        self.pending[task.key] = task
        self.log.append(
            {
                "event": "waiting",
                "key": repr(task.key),
                "runtime": task.runtime,
                "reason": "no capable worker is connected",
            }
        )
        return self._restrict(task, [], "waiting for a capable worker")

    def _in_memory(self, event: ChunkInMemory) -> list[Decision]:
        key = event.key
        if key not in self.tasks or self.tasks[key].role != "load":
            return []
        self.holder[key] = event.worker
        previous = self.planned.get(key)
        self.planned[key] = event.worker
        if event.nbytes is not None:
            self.charged[key] = int(event.nbytes)
        decisions: list[Decision] = []
        if previous != event.worker:
            self.log.append(
                {
                    "event": "chunk-landed-elsewhere",
                    "key": repr(key),
                    "planned": previous,
                    "worker": event.worker,
                }
            )
            for dep in sorted(self.dependents.get(key, ()), key=repr):
                if dep in self.tasks:
                    decisions.extend(self._pin_kernel(self.tasks[dep], why="chunk landed"))
        return decisions

    def _forget_chunk(self, key: Key) -> None:
        self.planned.pop(key, None)
        self.holder.pop(key, None)
        self.charged.pop(key, None)

    def _forget_task(self, key: Key) -> None:
        task = self.tasks.pop(key, None)
        self.restrictions.pop(key, None)
        self.refused.pop(key, None)
        self.pending.pop(key, None)
        if task is None:
            return
        if task.role == "load":
            self._forget_chunk(key)
            self.dependents.pop(key, None)
        elif task.resident is not None:
            deps = self.dependents.get(task.resident)
            if deps is not None:
                deps.discard(key)

    # -- decisions -----------------------------------------------------------------------
    def _restrict(
        self,
        task: TaskInfo,
        workers: Iterable[str],
        why: str,
        resources: Mapping[str, float] | None = None,
    ) -> list[Decision]:
        ws = frozenset(workers)
        self.restrictions[task.key] = ws
        return [Restrict(task.key, ws, why, resources)]

    def _refuse(self, task: TaskInfo, reason: str) -> list[Decision]:
        self.refused[task.key] = reason
        self.restrictions.pop(task.key, None)
        self.log.append({"event": "refused", "key": repr(task.key), "reason": reason})
        return [Refuse(task.key, reason)]

    def _no_capable(self, task: TaskInfo) -> str:
        have = {a: sorted(w.runtimes) for a, w in sorted(self.workers.items())}
        return (
            f"no worker can run runtime {task.runtime!r} for task {task.key!r}; workers and "
            f"their runtimes: {have or 'none'}. Start a worker with that runtime "
            "(quantem-flow worker --runtimes ...) or choose another backend"
        )

    def _restrict_capable(self, task: TaskInfo, *, why: str) -> list[Decision]:
        capable = self.capable(task)
        if not capable:
            return self._refuse(task, self._no_capable(task))
        return self._restrict(task, capable, why)

    def _admit_pass(self, task: TaskInfo, *, why: str) -> list[Decision]:
        capable = self.capable(task)
        if not capable:
            return self._refuse(task, self._no_capable(task))
        need = self.need_of(task)
        if not need:
            return self._restrict(task, capable, why)
        fitting = [a for a in capable if self.fits(a, task)]
        if not fitting:
            return self._refuse(task, self._too_big(task, capable))
        # Workers that advertise their pools as resources enforce the need per task, so
        # the tasks running at once on a worker never need more than its budget.
        enforcing = [a for a in fitting if self.workers[a].pool_resources]
        if enforcing:
            # only pools every chosen worker advertises: a resource one of them lacks would
            # leave the task waiting for a worker that has it
            resources = {
                MEMORY_PREFIX + pool: float(n)
                for pool, n in sorted(need.items())
                if all(pool in self.workers[a].pool_resources for a in enforcing)
            }
            return self._restrict(
                task,
                enforcing,
                f"{why}; memory need {_mib(sum(need.values()))}",
                resources or None,
            )
        return self._restrict(task, fitting, why)

    def _too_big(self, task: TaskInfo, capable: list[str]) -> str:
        """The refusal of a task whose need fits no capable worker, with a chunk size that fits."""
        need = self.need_of(task)
        detail = task.need_detail
        short = {
            pool: max(self.limit(a, task.runtime, pool) for a in capable)
            for pool, n in need.items()
            if any(n > self.limit(a, task.runtime, pool) for a in capable)
        }
        budgets = {
            a: {pool: _mib(self.limit(a, task.runtime, pool)) for pool in need} for a in capable
        }
        baselines = [
            f"{self.workers[a].name or a}: its own process (interpreter, libraries, compiled "
            f"kernels) takes {_mib(self.workers[a].reserve_bytes)}"
            + (
                f" of its {_mib(self.workers[a].memory_limit or 0)} memory limit"
                if self.workers[a].memory_limit
                else ""
            )
            for a in capable
            if self.workers[a].reserve_bytes and "host" in need
        ]
        parts = detail.get("parts") or {}
        breakdown = " + ".join(f"{name} {_mib(n)}" for name, n in parts.items() if n)
        pools = ", ".join(
            f"{_mib(n)} ({n} bytes) of {pool} memory" for pool, n in sorted(need.items())
        )
        text = (
            f"admission refused before reading any chunk: a {task.runtime} chunk task "
            f"({task.key!r}, {detail.get('rows', '?')} scan rows, representation "
            f"{task.representation!r}) needs {pools}"
            + (f" ({breakdown})" if breakdown else "")
            + f", which does not fit the budget of any capable worker (per worker: {budgets}"
            + (f"; {'; '.join(baselines)}, left out of the host budget" if baselines else "")
            + "). "
        )
        fixed = detail.get("fixed") or {}
        per_row = detail.get("per_row") or {}
        rows_fit: int | None = None
        for pool, room in short.items():
            slope = int(per_row.get(pool, 0))
            if slope <= 0:
                continue
            fit = int((room - int(fixed.get(pool, 0))) // slope)
            rows_fit = fit if rows_fit is None else min(rows_fit, fit)
        row_bytes = int(detail.get("source_row_bytes", 0))
        if rows_fit is not None and rows_fit >= 1:
            mib = rows_fit * row_bytes / 2**20
            text += (
                f"Use chunks of at most {rows_fit} scan rows: qf.open(..., chunk_rows={rows_fit}) "
                f"or ds.rechunk(rows={rows_fit})"
                + (f" (chunk_mib={mib:.1f} or less)" if row_bytes else "")
                + ", or give the workers more memory (memory_limit, budget_fraction)"
            )
        elif rows_fit is not None:
            text += (
                "Even one scan row does not fit: crop or bin the detector, or give the workers "
                "more memory (memory_limit, budget_fraction)"
            )
        else:
            text += (
                "Use smaller chunks (chunk_rows=... or chunk_mib=...) or workers with more memory"
            )
        return text

    def _place_load(self, task: TaskInfo, *, why: str) -> list[Decision]:
        capable = self.capable(task)
        if not capable:
            return self._refuse(task, self._no_capable(task))
        n_planned = {a: sum(1 for x in self.planned.values() if x == a) for a in capable}

        def rank(a: str) -> tuple[float, int, str]:
            # ranked by the runtime's own budget left (identical workers tie and take turns:
            # their pools differ by the few bytes their processes differ); pools only admit
            budget = self.workers[a].budgets.get(task.runtime)
            own = float("inf") if budget is None else budget - self.used(a, task.runtime)
            return (-own, n_planned[a], a)

        ordered = sorted(capable, key=rank)
        if task.need and not any(self.fits(a, task) for a in ordered):
            return self._refuse(task, self._too_big(task, ordered))
        fitting = [
            a
            for a in ordered
            if self.free(a, task.runtime) >= task.nbytes and (not task.need or self.fits(a, task))
        ]
        if not fitting:
            frees = {a: self.free(a, task.runtime) for a in ordered}
            return self._refuse(
                task,
                f"admission refused: chunk {task.key!r} needs {task.nbytes} bytes of "
                f"{task.runtime} memory but the capable workers have {frees} bytes free; "
                "release persisted data, use smaller chunks, or add workers",
            )
        chosen = fitting[0]
        record: dict[str, Any] = {
            "event": "placed",
            "key": repr(task.key),
            "worker": chosen,
            "reason": why,
            "nbytes": task.nbytes,
            "free_before": self.free(chosen, task.runtime),
        }
        if chosen != ordered[0]:
            record["note"] = f"{ordered[0]} had no room; placed on {chosen}"
        self.log.append(record)
        self.planned[task.key] = chosen
        self.charged[task.key] = task.nbytes
        decisions = self._restrict(task, [chosen], why)
        for dep in sorted(self.dependents.get(task.key, ()), key=repr):
            if dep in self.tasks:
                self.pending.pop(dep, None)
                decisions.extend(self._pin_kernel(self.tasks[dep], why="chunk placed"))
        return decisions

    def _pin_kernel(self, task: TaskInfo, *, why: str) -> list[Decision]:
        assert task.resident is not None
        holder = self.holder.get(task.resident) or self.planned.get(task.resident)
        if holder is None:
            if task.resident in self.pending:
                return self._wait(task)  # pinned when its chunk is placed
            return self._restrict_capable(task, why="resident chunk unknown: capable workers")
        w = self.workers.get(holder)
        if w is None:
            return self._wait(task)
        if task.runtime != "any" and task.runtime not in w.runtimes:
            return self._refuse(
                task,
                f"conflict: chunk {task.resident!r} is resident on {holder} (runtimes "
                f"{sorted(w.runtimes)}) but kernel {task.key!r} needs runtime "
                f"{task.runtime!r}; persist the dataset for that runtime instead",
            )
        return self._restrict(task, [holder], why)


def tasks_from_annotations(
    keys: Iterable[Key],
    annotations: Mapping[str, Mapping[Key, Any]],
    dependencies: Mapping[Key, Iterable[Key]],
    loads: Iterable[Key] = (),
) -> list[TaskInfo]:
    """Build :class:`TaskInfo` for the annotated keys of a submitted graph.

    Parameters
    ----------
    keys
        Keys of the new tasks.
    annotations
        ``{annotation: {key: value}}`` as the scheduler passes them.
    dependencies
        ``{key: dependency keys}``; a kernel's resident chunk is its
        dependency that is a known ``load`` (unless ``qf_resident`` names it).
    loads
        Keys of ``load`` tasks known from earlier graphs.
    """
    roles = annotations.get("qf_role", {})
    runtimes = annotations.get("qf_runtime", {})
    reps = annotations.get("qf_representation", {})
    resident = annotations.get("qf_resident", {})
    nbytes = annotations.get("qf_nbytes", {})
    needs = annotations.get("qf_need", {})
    covers = annotations.get("qf_chunks", {})
    known_loads = set(loads) | {k for k, r in roles.items() if r == "load"}
    out: list[TaskInfo] = []
    for k in keys:
        role = roles.get(k)
        if role is None:
            continue
        res: Key | None = resident.get(k) or None
        if role == "kernel" and res is None:
            deps = [d for d in dependencies.get(k, ()) if d in known_loads]
            res = deps[0] if len(deps) == 1 else None
        out.append(
            TaskInfo(
                key=k,
                role=str(role),
                runtime=str(runtimes.get(k, "any")),
                representation=str(reps.get(k, "dense")),
                resident=res,
                nbytes=int(nbytes.get(k, 0)),
                need=_need_pools(needs.get(k)),
                need_detail=dict(needs.get(k) or {}),
                chunks=tuple(int(i) for i in covers.get(k) or ()),
            )
        )
    return out


def _need_pools(detail: Any) -> dict[str, int]:
    if not isinstance(detail, Mapping):
        return {}
    total = detail.get("total")
    if not isinstance(total, Mapping):
        return {}
    return {str(p): int(n) for p, n in total.items()}


def _mib(nbytes: float) -> str:
    if nbytes == float("inf"):
        return "unlimited"
    return f"{nbytes / 2**20:.1f} MiB"
