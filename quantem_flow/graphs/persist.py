"""``Dataset4D.persist()``: load every chunk once and keep it resident."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..dataset import Dataset4D, register_persist
from ..runtimes import BackendChoice, resolve_backend
from .capabilities import RUNTIME_PREFIX
from .lowering import lower_load
from .runner import Runner

__all__ = ["ResidentChunks", "persist"]


@dataclasses.dataclass
class ResidentChunks:
    """The resident chunks of a persisted dataset.

    Attributes
    ----------
    refs
        One entry per chunk: a held ``distributed.Future`` on a cluster, or
        the :class:`~quantem_flow.representations.Chunk` itself in-process.
    runtime
        Runtime the chunks are resident for.
    representation, storage_schema
        Layout of the payloads.
    backend
        How the runtime was chosen.
    scheduler
        Scheduler address, ``None`` in-process.
    client
        The client holding the futures (``None`` in-process).
    loaded_bytes
        Logical source bytes read to make the chunks resident.
    resident_bytes
        Bytes of the payloads as held.
    load_s
        Seconds the loading took.
    """

    refs: list[Any]
    runtime: str
    representation: str
    storage_schema: str
    backend: BackendChoice
    scheduler: str | None
    client: Any
    loaded_bytes: int
    resident_bytes: int
    load_s: float
    released: bool = False
    _placed: dict[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def keys(self) -> list[Any]:
        """Keys of the resident chunks on the cluster (empty in-process)."""
        return [getattr(r, "key") for r in self.refs if hasattr(r, "key")]  # noqa: B009

    def graph_refs(self) -> list[Any]:
        """What a lowered pass references: keys on a cluster, chunks in-process."""
        return self.keys if self.client is not None else list(self.refs)

    def holders(self) -> dict[str, list[str]]:
        """``{chunk key: [worker addresses]}`` from the scheduler (empty in-process)."""
        if self.client is None:
            return {}
        who = self.client.who_has(self.refs)
        return {str(k): list(v) for k, v in who.items()}

    def _placement(self) -> dict[str, Any] | None:
        """The scheduler's ``who_has`` and thread counts, taken once and kept (one round trip)."""
        if self.client is None or not self.refs:
            return None
        if self._placed is None:
            self._placed = self.client.run_on_scheduler(_placement_of, [r.key for r in self.refs])
        return self._placed

    def forget_route(self) -> None:
        """Drop the kept placement: the next query asks the scheduler again."""
        self._placed = None

    def route(self) -> dict[str, list[list[int]]] | None:
        """``{worker: [chunk indices of each of its threads]}`` for direct queries, or ``None``.

        From the kept placement (:meth:`task_groups`); ``None`` in-process,
        when a chunk's holder is unknown or when a holder does not run the
        quantem-flow worker plugin (whose query handler a direct query needs).
        """
        placed = self._placement()
        groups = self.task_groups()
        if placed is None or groups is None:
            return None
        served = set(placed.get("served", ()))
        keys = [str(r.key) for r in self.refs]
        out: dict[str, list[list[int]]] = {}
        for group in groups:
            worker = sorted(placed["who_has"][keys[group[0]]])[0]
            if worker not in served:
                return None
            out.setdefault(worker, []).append(group)
        return out

    def task_groups(self) -> list[list[int]] | None:
        """Chunk indices grouped for one kernel task per worker thread, or ``None``.

        Each worker's chunks (from the scheduler's ``who_has``, in chunk
        order) are cut into as many contiguous groups as the worker has
        threads, so a query keeps every thread busy with the fewest tasks.
        ``None`` in-process, or when a chunk's holder is unknown.  The
        placement is asked of the scheduler once and kept until
        :meth:`forget_route` (a worker left, a direct query found a chunk
        elsewhere).
        """
        placed = self._placement()
        if placed is None:
            return None
        keys = [r.key for r in self.refs]
        per_worker: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            workers = placed["who_has"].get(str(key))
            if not workers:
                self._placed = None  # a chunk being reloaded: ask again next time
                return None
            per_worker.setdefault(sorted(workers)[0], []).append(i)
        groups: list[list[int]] = []
        for worker, chunks in per_worker.items():
            n = max(1, min(int(placed["nthreads"].get(worker, 1)), len(chunks)))
            groups.extend(
                chunks[j * len(chunks) // n : (j + 1) * len(chunks) // n] for j in range(n)
            )
        return sorted((g for g in groups if g), key=lambda g: g[0])

    def release(self) -> None:
        """Release the chunks and the device memory they hold.

        Futures are dropped (the workers' data mappings then release device
        payloads through their runtime); chunks held in process are released
        through their runtime here.
        """
        from ..representations import Chunk
        from .worker_data import release_resident

        for r in self.refs:
            if isinstance(r, Chunk):
                release_resident(r)
                continue
            release = getattr(r, "release", None)
            if release is not None:
                release()
        self.refs = []
        self.released = True

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description for provenance."""
        return {
            "runtime": self.runtime,
            "representation": self.representation,
            "storage_schema": self.storage_schema,
            "backend": self.backend.to_dict(),
            "scheduler": self.scheduler or "in-process",
            "n_chunks": len(self.refs),
            "loaded_bytes": self.loaded_bytes,
            "resident_bytes": self.resident_bytes,
            "load_s": self.load_s,
        }


def _placement_of(keys: list[Any], dask_scheduler: Any = None) -> dict[str, Any]:
    """``who_has`` of ``keys`` and every worker's thread count (on the scheduler)."""
    # ``who_has`` is ``None`` while a lost worker's chunk waits to be reloaded:
    # its holder is then unknown (the caller falls back to one task per chunk)
    who_has = {
        str(k): [ws.address for ws in (dask_scheduler.tasks[k].who_has or ())]
        for k in keys
        if k in dask_scheduler.tasks
    }
    nthreads = {ws.address: int(ws.nthreads) for ws in dask_scheduler.workers.values()}
    served = [  # workers running the quantem-flow plugin (it installs the query handler)
        ws.address
        for ws in dask_scheduler.workers.values()
        if any(
            str(r).startswith(RUNTIME_PREFIX) and q > 0
            for r, q in (getattr(ws, "resources", None) or {}).items()
        )
    ]
    return {"who_has": who_has, "nthreads": nthreads, "served": served}


def _held_nbytes(keys: list[Any], dask_scheduler: Any = None) -> int:
    return int(
        sum(max(dask_scheduler.tasks[k].nbytes, 0) for k in keys if k in dask_scheduler.tasks)
    )


def _resident_bytes(runner: Runner, refs: list[Any]) -> int:
    """Physical bytes of the resident payloads (what the workers hold)."""
    if runner.client is None:
        return int(sum(chunk.nbytes for chunk in refs))
    return int(runner.client.run_on_scheduler(_held_nbytes, [r.key for r in refs]))


def persist(ds: Dataset4D, *, client: Any = None, backend: str = "auto") -> Dataset4D:
    """Load every chunk of ``ds`` once and keep it resident (see :meth:`Dataset4D.persist`).

    Each chunk's content digest is computed by its load task
    (:func:`~quantem_flow.graphs.tasks.load_resident_chunk`) and kept with the
    resident chunk, so passes over it record the digest without hashing again
    (docs/data-integrity.md).
    """
    if ds.is_persisted:
        return ds
    choice = resolve_backend(backend, representation=ds.representation, dtype=ds.dtype)
    runner = Runner(client)
    t0 = time.perf_counter()
    lowered = lower_load(ds, runtime=choice.chosen)
    refs = runner.load(lowered)
    load_s = time.perf_counter() - t0
    resident = ResidentChunks(
        refs=refs,
        runtime=choice.chosen,
        representation=ds.representation,
        storage_schema=ds.storage_schema,
        backend=choice,
        scheduler=runner.scheduler_address,
        client=runner.client,
        loaded_bytes=ds.read_nbytes,
        resident_bytes=_resident_bytes(runner, refs),
        load_s=load_s,
    )
    return ds._with_resident(resident)


register_persist(persist)
