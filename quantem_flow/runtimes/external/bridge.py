"""The bridge runtime: the quantem-flow payload contract over ``qf-worker/1``.

:class:`ExternalRuntime` is a :class:`~quantem_flow.runtimes.base.Runtime`
whose payloads live in an external worker (a child process, a browser page).
``put(chunk)`` sends the payload once and returns a chunk whose payload is a
small :class:`ExternalHandle` (residency ``external:<runtime>``);
``run_frame_pass`` / ``run_gather`` send only handles and weights and get
small results back; ``release`` frees the worker's copy.

Crash handling and re-placement (see ``docs/external-workers.md``): when the
worker dies, the request in flight raises
:class:`~quantem_flow.errors.ExternalWorkerLostError` inside the session,
and every handle of the dead generation is stale.  A handle that carries a
**reload recipe** (a zero-argument callable returning the host payload,
given to :meth:`ExternalRuntime.put` by the graph layer) is re-placed
transparently: the runtime restarts the worker, puts the payload again under
a new handle (updating the same :class:`ExternalHandle` object, so every
chunk holding it follows) and re-runs the request once.  Every restart and
re-placement is recorded in :attr:`ExternalRuntime.events` and in
:meth:`ExternalRuntime.describe`.  A handle without a recipe raises
:class:`~quantem_flow.errors.StaleHandleError`: the graph layer must then
load the chunk again.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import hashlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ...errors import (
    ExternalWorkerLostError,
    ExternalWorkerTimeoutError,
    ParameterError,
    RuntimeUnavailableError,
    StaleHandleError,
    UnsupportedOperationError,
)
from ...representations.chunk import Chunk
from ..base import RELEASED, FramePassResult, Precision, Runtime
from . import protocol as pr
from .session import ExternalSession
from .transport import Connection

__all__ = ["ExternalHandle", "ExternalRuntime"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class ExternalHandle:
    """A chunk payload held by an external worker (what a resident chunk carries).

    The object is updated in place when the payload is re-placed after a
    worker restart, so every chunk holding it follows.

    Attributes
    ----------
    runtime
        The runtime name (``"webgpu"``...).
    bridge
        Identity of the bridge (runtime instance) that holds it.
    generation
        The worker session it belongs to.
    handle
        The worker's handle, ``None`` once released.
    nbytes
        Bytes the worker holds for it (from its reply).
    representation, storage_schema
        The payload's representation and layout.
    value_dtype
        The data's dtype.
    shape
        ``(rows, cols, k_r, k_c)``.
    scan_slice
        The chunk's half-open scan rows and columns.
    reload
        Zero-argument callable returning the host payload again (the
        re-placement recipe), or ``None``.  Must be picklable if the chunk
        may travel.
    replaced
        How many times the payload was re-placed after a loss.
    """

    runtime: str
    bridge: str
    generation: int
    handle: int | None
    nbytes: int
    representation: str
    storage_schema: str
    value_dtype: np.dtype[Any]
    shape: tuple[int, int, int, int]
    scan_slice: tuple[tuple[int, int], tuple[int, int]]
    reload: Callable[[], Any] | None = None
    replaced: int = 0

    @property
    def dtype(self) -> np.dtype[Any]:
        """The data's dtype."""
        return self.value_dtype

    @property
    def scan_shape(self) -> tuple[int, int]:
        """``(rows, cols)``."""
        return self.shape[0], self.shape[1]

    @property
    def frame_shape(self) -> tuple[int, int]:
        """``(k_r, k_c)``."""
        return self.shape[2], self.shape[3]

    @property
    def n_frames(self) -> int:
        """Frames in the chunk."""
        return self.shape[0] * self.shape[1]

    @property
    def n_pixels(self) -> int:
        """Pixels per frame."""
        return self.shape[2] * self.shape[3]

    @property
    def released(self) -> bool:
        """Whether the payload was released."""
        return self.handle is None

    def __repr__(self) -> str:
        return (
            f"ExternalHandle({self.runtime}#{self.handle} gen {self.generation}, "
            f"{self.representation} {self.value_dtype} {list(self.shape)}, {self.nbytes} B"
            + (f", re-placed {self.replaced}x" if self.replaced else "")
            + ")"
        )


def _payload_shape(
    representation: str, payload: Any
) -> tuple[np.dtype[Any], tuple[int, int, int, int]]:
    if representation == "dense":
        arr = np.asarray(payload)
        if arr.ndim != 4:
            raise ParameterError(
                f"a dense payload is (rows, cols, k_r, k_c), got shape {arr.shape}"
            )
        r, c, a, b = (int(s) for s in arr.shape)
        return arr.dtype, (r, c, a, b)
    rows, cols = (int(v) for v in payload.scan_shape)
    kr, kc = (int(v) for v in payload.frame_shape)
    return np.dtype(payload.dtype), (rows, cols, kr, kc)


#: Bridges alive in this process, closed at exit (a browser must not outlive us).
_LIVE: weakref.WeakSet[ExternalRuntime] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for runtime in list(_LIVE):
        with contextlib.suppress(Exception):
            runtime.close()


class ExternalRuntime(Runtime):
    """A runtime whose payloads and kernels live in an external ``qf-worker/1`` worker.

    Subclasses say how to reach the worker (:meth:`connect`) and whether it
    can run here (:meth:`available`, cheap: no process is started).  The
    worker is started on first use (or by :meth:`start`); its ``hello``
    gives the kernels, the budget and the accumulation.

    Parameters
    ----------
    connect
        Makes a new connection to the worker (default: :meth:`connect`).
    name
        The runtime name (default: the class's :attr:`name`).
    timeout
        Seconds a reply may take beyond the time its bytes need (default
        ``qf.config`` ``external_timeout_s``; :meth:`ExternalSession.deadline`).
    hello_timeout
        Seconds to wait for the worker to start and answer ``hello`` (default
        ``external_hello_timeout_s``).
    weights_cache
        Distinct weight arrays kept resident (least recently used released).

    A worker that stalls (no reply within its deadline, or its process stopped) is
    handled as one that died: killed, restarted, the chunk re-placed and the request
    re-run once; the stall is counted in :meth:`describe` (``stalls``) and
    :attr:`events`.
    """

    name: ClassVar[str] = "external"

    def __init__(
        self,
        *,
        connect: Callable[[], Connection] | None = None,
        name: str | None = None,
        timeout: float | None = None,
        hello_timeout: float | None = None,
        weights_cache: int = 8,
    ) -> None:
        if name is not None:
            setattr(self, "name", name)  # noqa: B010 - per-instance name over the ClassVar
        self.bridge_id = uuid.uuid4().hex
        self._connect_fn = connect
        self.session = ExternalSession(
            self._make_connection, name=self.name, timeout=timeout, hello_timeout=hello_timeout
        )
        self._lock = threading.RLock()
        self._release_lock = threading.Lock()
        self._pending_release: list[tuple[int, int]] = []
        _LIVE.add(self)
        self._weights: collections.OrderedDict[tuple[str, tuple[int, ...]], tuple[int, int]] = (
            collections.OrderedDict()
        )
        self._weights_cache = int(weights_cache)
        #: Restarts, losses and re-placements, oldest first (bounded).
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=256)
        self.replaced = 0
        #: Requests whose worker stalled (killed, restarted, re-run).
        self.stalls = 0
        self.last_accumulation: str | None = None

    # ---------------------------------------------------------------- subclass hooks
    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether the worker program exists here (cheap; starts nothing)."""
        return True, "an external worker reached through qf-worker/1"

    def connect(self) -> Connection:
        """Make a new connection to the worker (subclasses override)."""
        raise RuntimeUnavailableError(
            f"external runtime {self.name!r} has no way to reach its worker: pass connect= or "
            "use a subclass that defines connect()"
        )

    def _make_connection(self) -> Connection:
        if self._connect_fn is not None:
            return self._connect_fn()
        return self.connect()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> pr.HelloInfo:
        """Start the worker if needed and return its ``hello`` (sends queued releases)."""
        with self._lock:
            generation = self.session.generation
            info = self.session.start()
            if self.session.generation != generation:
                self._weights.clear()
                if generation:
                    self._event("restarted", generation=self.session.generation)
            if self._pending_release:
                self._flush_releases()
            return info

    @property
    def hello(self) -> pr.HelloInfo:
        """The worker's ``hello`` (starts the worker if needed)."""
        return self.start()

    @property
    def residency(self) -> str:  # the declared prefix plus the runtime name
        """``"external:<runtime name>"``."""
        return f"external:{self.name}"

    @property
    def budget_bytes(self) -> int:
        """Payload bytes the worker admits (``memory_budget_bytes`` of its hello)."""
        return self.hello.memory_budget_bytes

    @property
    def kernels(self) -> frozenset[tuple[str, str, str]]:
        """``(operation, representation, dtype)`` triples the worker offers."""
        return frozenset(self.hello.kernels)

    def supports(self, operation: str, representation: str, dtype: Any = None) -> bool:
        """Whether the worker offers ``operation`` on ``representation`` (and ``dtype``)."""
        kernels = self.kernels
        if dtype is None:
            return any(op == operation and rep == representation for op, rep, _ in kernels)
        return (operation, representation, np.dtype(dtype).name) in kernels

    def precision(self) -> Precision:
        """How the worker accumulates (its hello's ``accumulation``)."""
        acc = self.hello.accumulation
        return Precision(integer=acc["integer"], real=acc["real"])

    def close(self) -> None:
        """Say ``bye`` and stop the worker (idempotent; also run at interpreter exit)."""
        with self._lock:
            self._weights.clear()
            self._pending_release.clear()
            self.session.close()
            _LIVE.discard(self)

    def stats(self) -> dict[str, Any]:
        """The worker's ``stats`` (handles, resident bytes per representation, budget)."""
        with self._lock:
            self.start()  # sends queued releases first
            return self.session.stats()

    def _event(self, kind: str, **details: Any) -> None:
        record = {"event": kind, "time": time.time(), "runtime": self.name, **details}
        self.events.append(record)
        logger.warning("external runtime %r: %s %s", self.name, kind, details)

    # ---------------------------------------------------------------- the payload contract
    def _check_kernel(self, operation: str, representation: str, dtype: np.dtype[Any]) -> None:
        info = self.hello
        schema = pr.STORAGE_SCHEMAS.get(representation)
        if schema is None or schema not in info.storage_schemas:
            raise UnsupportedOperationError(
                f"external runtime {self.name!r} ({info.implementation}) cannot hold the "
                f"{representation!r} representation; it accepts {list(info.storage_schemas)}"
            )
        if (operation, representation, dtype.name) not in info.kernels:
            offered = sorted(f"{r}/{d}" for op, r, d in info.kernels if op == operation)
            raise UnsupportedOperationError(
                f"external runtime {self.name!r} ({info.implementation}) has no {operation!r} "
                f"kernel for {representation} {dtype.name}; it offers {operation} on {offered}"
            )

    def put(self, chunk: Chunk, *, reload: Callable[[], Any] | None = None) -> Chunk:
        """Place a host chunk's payload in the worker; return the resident chunk.

        Parameters
        ----------
        chunk
            A chunk whose payload is on the host (dense array, paired or
            packed payload).  A chunk already resident here is returned as is.
        reload
            Zero-argument callable returning the same host payload again,
            used to re-place the chunk after the worker restarts.  Without
            it a restart makes the chunk stale (``StaleHandleError``).

        Returns
        -------
        Chunk
            Same representation and scan slice, ``residency`` of this
            runtime, payload an :class:`ExternalHandle` whose ``nbytes`` is
            what the worker holds.

        Raises
        ------
        UnsupportedOperationError
            The worker cannot hold this representation or run the frame
            pass on its dtype.
        ExternalWorkerError
            The worker refused it (``budget``: it does not fit).
        """
        if not isinstance(chunk, Chunk):
            raise ParameterError(f"put() takes a Chunk, got {type(chunk).__name__}")
        payload = chunk.payload
        if payload is RELEASED:
            raise ParameterError(
                f"put() on a released chunk (rows {chunk.scan_slice[0]}); load and put it again"
            )
        if not isinstance(payload, ExternalHandle) and chunk.residency != "host":
            raise ParameterError(
                f"put() takes host chunks; this one is resident on {chunk.residency!r}. Moving "
                "payloads between devices is never done silently: load it again for "
                f"runtime {self.name!r}"
            )
        if isinstance(payload, ExternalHandle):
            if payload.bridge == self.bridge_id and not payload.released:
                if reload is not None and payload.reload is None:
                    payload.reload = reload
                return chunk
            raise StaleHandleError(
                f"chunk {chunk.scan_slice} is resident in another external runtime "
                f"({payload!r}); load it from its source to put it here",
                worker=self.name,
                handle=payload.handle,
            )
        dtype, shape = _payload_shape(chunk.representation, payload)
        with self._lock:
            self._check_kernel("frame_pass", chunk.representation, dtype)
            handle, generation, nbytes = self.session.put(
                representation=chunk.representation, payload=payload, scan_slice=chunk.scan_slice
            )
            ext = ExternalHandle(
                runtime=self.name,
                bridge=self.bridge_id,
                generation=generation,
                handle=handle,
                nbytes=nbytes,
                representation=chunk.representation,
                storage_schema=chunk.storage_schema,
                value_dtype=dtype,
                shape=shape,
                scan_slice=chunk.scan_slice,
                reload=reload,
            )
        kwargs: dict[str, Any] = {
            "representation": chunk.representation,
            "residency": self.residency,
            "scan_slice": chunk.scan_slice,
            "payload": ext,
            "storage_schema": chunk.storage_schema,
        }
        kwargs["runtime"] = self.name
        return Chunk(**kwargs)

    def release(self, chunk: Chunk) -> None:
        """Free a resident chunk in the worker; idempotent and never blocking.

        The chunk's payload becomes :data:`~quantem_flow.runtimes.base.RELEASED`
        (running it raises) at once.  The ``release`` message is sent now if
        the bridge is idle, otherwise just before its next request (Dask calls
        this from its event loop when it forgets a key: it must not wait for a
        kernel in flight).  A handle of a worker that has since ended needs
        nothing sent.  Host chunks hold nothing here: a no-op.
        """
        if not isinstance(chunk, Chunk):
            raise ParameterError(f"release() takes a Chunk, got {type(chunk).__name__}")
        with self._release_lock:
            h = chunk.payload
            if not isinstance(h, ExternalHandle):
                return
            chunk.payload = RELEASED
            if h.released or h.bridge != self.bridge_id:
                return
            assert h.handle is not None
            self._pending_release.append((h.handle, h.generation))
            h.handle = None
            h.reload = None
        if self._lock.acquire(blocking=False):
            try:
                self._flush_releases()
            finally:
                self._lock.release()

    def _flush_releases(self) -> None:
        """Send the releases queued by :meth:`release` (called with the lock held)."""
        with self._release_lock:
            pending, self._pending_release = self._pending_release, []
        by_generation: dict[int, list[int]] = {}
        for handle, generation in pending:
            by_generation.setdefault(generation, []).append(handle)
        for generation, handles in by_generation.items():
            with contextlib.suppress(ExternalWorkerLostError):
                self.session.release(handles, generation=generation)

    def _release_handle(self, h: ExternalHandle) -> None:
        if h.released or h.bridge != self.bridge_id:
            return
        handle, generation = h.handle, h.generation
        h.handle = None
        h.reload = None
        if handle is not None:
            with contextlib.suppress(ExternalWorkerLostError):
                self.session.release([handle], generation=generation)

    def _ensure(self, h: ExternalHandle) -> None:
        """Make ``h`` valid in the current worker generation (re-place it if needed)."""
        self.start()
        if h.bridge == self.bridge_id and h.generation == self.session.generation:
            if h.handle is None:
                raise StaleHandleError(
                    f"external runtime {self.name!r}: {h!r} was released; put the chunk again",
                    worker=self.name,
                )
            return
        if h.reload is None:
            raise StaleHandleError(
                f"external runtime {self.name!r}: {h!r} belongs to a worker that has ended "
                f"(generation {h.generation}, now {self.session.generation}) and has no reload "
                "recipe; load the chunk again (put(chunk, reload=...) re-places automatically)",
                worker=self.name,
                handle=h.handle,
            )
        payload = h.reload()
        dtype, shape = _payload_shape(h.representation, payload)
        if shape != h.shape or dtype != h.value_dtype:
            raise StaleHandleError(
                f"external runtime {self.name!r}: the reload recipe of {h!r} gave "
                f"{dtype} {list(shape)}, not the chunk's {h.value_dtype} {list(h.shape)}",
                worker=self.name,
                handle=h.handle,
            )
        old = (h.generation, h.handle)
        handle, generation, nbytes = self.session.put(
            representation=h.representation, payload=payload, scan_slice=h.scan_slice
        )
        h.bridge, h.generation, h.handle, h.nbytes = self.bridge_id, generation, handle, nbytes
        h.replaced += 1
        self.replaced += 1
        self._event(
            "re-placed",
            scan_slice=[list(h.scan_slice[0]), list(h.scan_slice[1])],
            old_generation=old[0],
            old_handle=old[1],
            generation=generation,
            handle=handle,
            resident_bytes=nbytes,
        )

    def _weights_handle(self, weights: np.ndarray) -> int:
        w = np.ascontiguousarray(weights, dtype=np.float64)
        key = (hashlib.sha1(w.tobytes()).hexdigest(), tuple(int(s) for s in w.shape))
        generation = self.session.generation
        cached = self._weights.get(key)
        if cached is not None and cached[1] == generation:
            self._weights.move_to_end(key)
            return cached[0]
        handle, generation, _, _ = self.session.put_weights(w)
        self._weights[key] = (handle, generation)
        while len(self._weights) > self._weights_cache:
            _, (old, gen) = self._weights.popitem(last=False)
            with contextlib.suppress(ExternalWorkerLostError):
                self.session.release([old], generation=gen)
        return handle

    def _resident(self, chunk: Any) -> tuple[ExternalHandle, bool]:
        """Return the chunk's handle, putting a host chunk temporarily (True) if needed."""
        if not isinstance(chunk, Chunk):
            raise ParameterError(
                f"external runtime {self.name!r} runs kernels on a Chunk, got "
                f"{type(chunk).__name__}"
            )
        if chunk.payload is RELEASED:
            raise ParameterError(
                f"a kernel on a released chunk (rows {chunk.scan_slice[0]} of runtime "
                f"{chunk.runtime!r}); its payload was freed. Load and put it again"
            )
        if isinstance(chunk.payload, ExternalHandle):
            if chunk.payload.runtime != self.name:
                raise ParameterError(
                    f"runtime {self.name!r} got a chunk resident on {chunk.residency!r}; run it "
                    f"on {chunk.payload.runtime!r}"
                )
            return chunk.payload, False
        payload = chunk.payload
        resident = self.put(chunk, reload=lambda: payload)
        assert isinstance(resident.payload, ExternalHandle)
        return resident.payload, True

    def _with_replacement(self, chunk: Any, op: Callable[[ExternalHandle], Any], what: str) -> Any:
        with self._lock:
            h, transient = self._resident(chunk)
            try:
                for attempt in (0, 1):
                    try:
                        self._ensure(h)
                        return op(h)
                    except ExternalWorkerLostError as exc:
                        self._event(
                            "lost",
                            during=what,
                            handle=h.handle,
                            generation=h.generation,
                            exit_code=exc.exit_code,
                            stderr_tail=exc.stderr_tail[-2000:],
                        )
                        if attempt or h.reload is None:
                            raise
                    except ExternalWorkerTimeoutError as exc:
                        # a stall is a loss: the session killed the worker; restart, re-run
                        self.stalls += 1
                        self._event(
                            "stalled",
                            during=what,
                            handle=h.handle,
                            generation=h.generation,
                            reason=str(exc)[:500],
                        )
                        if attempt or h.reload is None:
                            raise
            finally:
                if transient:
                    self._release_handle(h)
        raise AssertionError("unreachable")  # pragma: no cover

    def run_frame_pass(
        self, chunk: Chunk, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Run the fused pass on a resident chunk (a host chunk is put for the call).

        After a worker restart a stale chunk with a reload recipe is re-placed
        and the pass re-run once; the result is the same as without the loss.

        Raises
        ------
        StaleHandleError
            The worker restarted and the chunk has no reload recipe.
        ExternalWorkerLostError
            The worker died again on the retry (or the chunk has no recipe).
        UnsupportedOperationError
            The worker has no frame-pass kernel for the chunk.
        """
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.ndim != 2:
            raise ParameterError(f"weights must be (n_weights, k_r * k_c), got shape {w.shape}")

        def op(h: ExternalHandle) -> FramePassResult:
            if w.shape[1] != h.n_pixels:
                raise ParameterError(
                    f"weights have {w.shape[1]} columns but the chunk's frames have "
                    f"{h.n_pixels} pixels"
                )
            self._check_kernel("frame_pass", h.representation, h.value_dtype)
            wh = self._weights_handle(w)
            assert h.handle is not None
            out = self.session.run_frame_pass(
                chunk=h.handle,
                weights=wh,
                generation=h.generation,
                n_frames=h.n_frames,
                n_weights=int(w.shape[0]),
                n_pixels=h.n_pixels,
                dtype=h.value_dtype,
                want_sum=want_sum,
                want_max=want_max,
                work_bytes=h.nbytes,
            )
            self.last_accumulation = out.accumulation
            return FramePassResult(
                per_frame=out.per_frame, pattern_sum=out.pattern_sum, pattern_max=out.pattern_max
            )

        result: FramePassResult = self._with_replacement(chunk, op, "run frame_pass")
        return result

    def run_gather(self, chunk: Chunk, indices: np.ndarray) -> np.ndarray:
        """Values of flat detector pixels ``indices`` for every frame: ``(n_frames, n)``.

        Re-placement after a loss as for :meth:`run_frame_pass`.
        """
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)

        def op(h: ExternalHandle) -> np.ndarray:
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= h.n_pixels):
                raise ParameterError(
                    f"gather indices must lie in [0, {h.n_pixels}), got {int(idx.min())} .. "
                    f"{int(idx.max())}"
                )
            self._check_kernel("gather", h.representation, h.value_dtype)
            assert h.handle is not None
            return self.session.run_gather(
                chunk=h.handle,
                generation=h.generation,
                indices=idx,
                n_frames=h.n_frames,
                dtype=h.value_dtype,
                work_bytes=h.nbytes,
            )

        values: np.ndarray = self._with_replacement(chunk, op, "run gather")
        return values

    def frame_pass(
        self, frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Run the fused pass over host frames ``(n_frames, K)`` (put for the call)."""
        arr = np.ascontiguousarray(frames)
        if arr.ndim != 2:
            raise ParameterError(f"frames must be (n_frames, k_r * k_c), got shape {arr.shape}")
        block = arr.reshape(1, arr.shape[0], 1, arr.shape[1])
        chunk = Chunk(
            representation="dense",
            residency="host",
            scan_slice=((0, 1), (0, arr.shape[0])),
            payload=block,
            storage_schema=pr.STORAGE_SCHEMAS["dense"],
        )
        return self.run_frame_pass(chunk, weights, want_sum=want_sum, want_max=want_max)

    def to_host_array(self, array: Any) -> Any:
        """External payloads cannot be viewed on the host: refuse clearly."""
        if isinstance(array, ExternalHandle):
            raise UnsupportedOperationError(
                f"external runtime {self.name!r}: {array!r} lives in the worker; run a kernel "
                "on it (frame_pass, gather) instead of reading it back"
            )
        return array

    def describe(self) -> dict[str, Any]:
        """Implementation, device, accumulation and restarts, for provenance."""
        info = self.hello
        out: dict[str, Any] = {
            "runtime": self.name,
            "protocol": pr.PROTOCOL,
            "worker_runtime": info.runtime,
            "implementation": info.implementation,
            "device": dict(info.device),
            "accumulation": dict(info.accumulation),
            "memory_budget_bytes": info.memory_budget_bytes,
            "generation": self.session.generation,
            "restarts": max(0, self.session.generation - 1),
            "re_placed_chunks": self.replaced,
            "stalls": self.stalls,
            "timeouts": {
                "reply_s": self.session.timeout,
                "min_mib_s": self.session.min_mib_s,
                "hello_s": self.session.hello_timeout,
            },
        }
        if self.last_accumulation is not None:
            out["last_run_accumulation"] = self.last_accumulation
        pid = self.session.pid
        if pid is not None:
            out["worker_pid"] = pid
        out["bridge_pid"] = os.getpid()
        return out
