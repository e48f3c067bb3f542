"""Running lowered graphs on a distributed client or synchronously in this process."""

from __future__ import annotations

import logging
import sys
from typing import Any

from ..errors import ParameterError
from .lowering import LoweredLoad, LoweredPass
from .scheduler_plugin import ensure_placement, pass_events, register_pass
from .tasks import ChunkPartial

logger = logging.getLogger("quantem_flow.runner")

__all__ = ["Runner", "progress_default"]


def progress_default() -> bool:
    """Whether ``progress=None`` shows a bar: ``config.get("progress")`` and a terminal or notebook.

    Turn bars off with ``qf.config.set(progress=False)`` or the environment
    variable ``QUANTEM_FLOW_PROGRESS=0``.  In a Jupyter kernel the bar is a
    notebook widget (``tqdm.auto``; text when ipywidgets is missing).
    """
    from .. import config

    if not config.get("progress"):
        return False
    if "ipykernel" in sys.modules:
        return True
    return bool(sys.stderr.isatty())


class Runner:
    """Runs graphs on a distributed client or synchronously in this process.

    Parameters
    ----------
    client
        ``None`` (the embedded local cluster), a ``distributed.Client`` or
        ``"synchronous"``.  On a distributed client the placement plugin is
        installed on the scheduler once.

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
        self.gathered: list[Any] = []
        self._temp: list[str] = []
        self.departures: list[dict[str, Any]] = []
        self.synchronous = isinstance(client, str) and client == "synchronous"
        if isinstance(client, str) and not self.synchronous:
            raise ParameterError(
                f"client must be None, a distributed.Client or 'synchronous', got {client!r}"
            )
        if self.synchronous:
            self.client = None
            self._where = "synchronous (in this process, no workers)"
            return
        if client is None:
            from .cluster import embedded_client

            client = embedded_client()
            self._where = "embedded local cluster"
        else:
            self._where = "given distributed.Client"
        self.client = client
        self._where += f" at {client.scheduler.address}"
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

    def _begin(self, infos: list[dict[str, Any]]) -> int | None:
        """Register passes with the scheduler plugin; return the departures' cursor."""
        assert self.client is not None
        self.departures = []
        result: int | None = self.client.run_on_scheduler(register_pass, infos)
        return result

    def _end(self, cursor: int | None) -> None:
        """Collect (and log) the workers that left since ``cursor``."""
        if cursor is None or self.client is None:
            return
        self.departures = list(self.client.run_on_scheduler(pass_events, cursor))
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
    def scheduler_address(self) -> str | None:
        """Address of the scheduler, ``None`` when synchronous."""
        return None if self.client is None else str(self.client.scheduler.address)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run one small function on the cluster (or here) and return its value."""
        if self.client is None:
            return fn(*args)
        return self.client.submit(fn, *args, pure=False).result()

    def load(self, lowered: LoweredLoad) -> list[Any]:
        """Run load tasks and return what keeps them resident.

        Returns futures on a cluster (held: the chunks stay on the workers)
        or the chunks themselves when synchronous.
        """
        if self.client is None:
            from dask.local import get_sync

            dsk = dict(lowered.graph)
            return list(get_sync(dsk, lowered.keys))
        from distributed import wait

        cursor = self._begin([_load_info(lowered)])
        futures = self.client.get(lowered.graph, lowered.keys, sync=False)
        with self.client.as_current():
            wait(futures)
        self._end(cursor)
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
        owner = {k: i for i, p in enumerate(passes) for k in p.chunk_keys}
        if self.client is None:
            from dask.local import get_sync

            out = []
            for i, p in enumerate(passes):
                values = get_sync(dict(p.graph), [p.output_key, *p.chunk_keys])
                for part in values[1:]:
                    self._store(i, part)
                out.append(values[0])
            return out
        from dask.highlevelgraph import HighLevelGraph
        from distributed import as_completed

        graph = HighLevelGraph.merge(*(p.graph for p in passes))
        chunk_keys = [k for p in passes for k in p.chunk_keys]
        out_keys = [p.output_key for p in passes]
        cursor = self._begin([_pass_info(p) for p in passes if p.chunk_keys])
        futures = self.client.get(graph, [*out_keys, *chunk_keys], sync=False)
        out_futures, chunk_futures = futures[: len(out_keys)], futures[len(out_keys) :]
        try:
            watch = progress or any(s is not None for s in self.gathered)
            if watch and chunk_futures:
                from tqdm.auto import tqdm

                with (
                    self.client.as_current(),
                    tqdm(
                        total=len(chunk_futures),
                        unit="chunk",
                        file=sys.stderr,
                        disable=not progress,
                    ) as bar,
                ):
                    for f in as_completed(chunk_futures):
                        i = owner[f.key]
                        if self.gathered[i] is not None:
                            self._store(i, f.result())
                        f.release()
                        bar.update(1)
            results: list[ChunkPartial] = self.client.gather(out_futures)
        finally:
            for f in futures:
                f.release()
        self._end(cursor)
        return results

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
            return np.zeros(shape, dtype=dtype)
        folder = tempfile.mkdtemp(prefix="quantem-flow-gather-")
        self._temp.append(folder)
        path = os.path.join(folder, "gathered.dat")
        return np.memmap(path, mode="w+", dtype=dtype, shape=shape)

    def _store(self, i: int, part: ChunkPartial) -> None:
        sink = self.gathered[i]
        if sink is None:
            return
        for (r0, r1), values in part.gathered:
            sink[:, r0:r1, :] = values

    def cleanup(self) -> None:
        """Delete disk-backed gathered arrays (after the results are finished)."""
        import shutil

        self.gathered = []
        for folder in self._temp:
            shutil.rmtree(folder, ignore_errors=True)
        self._temp = []


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


def _dataset_info(ds: Any, name: str, kind: str) -> dict[str, Any]:
    R, C = (int(x) for x in ds.scan_shape)
    kr, kc = (int(x) for x in ds.detector_shape)
    return {
        "name": name,
        "kind": kind,
        "label": f"{R}x{C} scan, {len(ds.chunks)} chunks, {ds.representation}",
        "scan_shape": [R, C],
        "chunks": [[int(a), int(b)] for a, b in ds.chunks],
        "row_bytes": C * kr * kc * int(ds.dtype.itemsize),
    }


def _pass_info(lowered: LoweredPass) -> dict[str, Any]:
    key = lowered.chunk_keys[0]
    name = str(key[0]) if isinstance(key, tuple) else str(key)
    ds = lowered.spec.dataset
    return _dataset_info(
        ds, name, "resident pass" if getattr(ds, "is_persisted", False) else "pass"
    )


def _load_info(lowered: LoweredLoad) -> dict[str, Any]:
    key = lowered.keys[0] if lowered.keys else "qf-load"
    name = str(key[0]) if isinstance(key, tuple) else str(key)
    for layer_name, layer in lowered.graph.layers.items():
        if str(layer_name).startswith("qf-dataset-"):
            node = layer[layer_name]
            return _dataset_info(node.value, name, "persist")
    return {"name": name, "kind": "persist", "label": name, "chunks": []}
