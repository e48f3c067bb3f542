"""A worker data mapping that never spills device payloads to disk.

Distributed's default :class:`distributed.spill.SpillBuffer` pickles the
least recently used values to disk once the worker's managed memory passes
its target.  For a payload resident on a GPU (a CuPy or MLX array, or a
:class:`~quantem_flow.representations.chunk.Chunk` whose residency is not
``"host"``) that would copy device memory to the host, pickle it and write
it out, which is never wanted: the payload belongs to the device budget the
placement plugin manages.  :class:`ResidentAwareData` keeps such payloads
in a plain dict and hands everything else to a ``SpillBuffer``, so host data
still spills as usual (the pattern of dask-cuda's ``DeviceHostFile``).

Use it as ``Worker(data=(ResidentAwareData, {"memory_limit": ...}))``;
distributed passes ``worker_local_directory`` itself.

Forgetting a resident chunk frees it: when Dask deletes (or replaces) a
:class:`~quantem_flow.representations.chunk.Chunk` whose residency is not
``"host"``, the mapping calls ``release`` of the runtime that holds it
(``chunk.runtime``), so device memory is freed as soon as Dask lets the
chunk go.  A release that fails is logged as a warning; it never breaks
Dask's bookkeeping.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Hashable, Iterator, Mapping, MutableMapping
from typing import Any

from ..errors import ParameterError
from ..representations.chunk import Chunk

__all__ = [
    "ResidentAwareData",
    "device_modules",
    "is_device_payload",
    "payload_nbytes",
    "release_resident",
]

logger = logging.getLogger(__name__)


def device_modules() -> tuple[str, ...]:
    """Top-level packages whose objects live in device memory (``("cupy", "mlx")``).

    Derived from the runtime declarations: the dependency of every runtime
    whose residency is not ``"host"``.
    """
    from ..runtimes.registry import device_modules as declared

    return declared()


def __getattr__(name: str) -> Any:
    if name == "DEVICE_MODULES":  # the former constant, now derived from the declarations
        return device_modules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_device_payload(value: object) -> bool:
    """Whether ``value`` lives in device memory and must never be pickled to disk.

    Parameters
    ----------
    value
        A task result.

    Returns
    -------
    bool
        True for a :class:`~quantem_flow.representations.chunk.Chunk` whose
        residency is not ``"host"`` and for objects whose type is defined in
        a package of :func:`device_modules` (CuPy, MLX arrays).
    """
    if isinstance(value, Chunk):
        return value.residency != "host"
    module = type(value).__module__ or ""
    return module.split(".", 1)[0] in device_modules()


def payload_nbytes(value: object) -> int:
    """Return the bytes ``value`` occupies: its ``nbytes`` if it has one, else ``sizeof``."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    from distributed.sizeof import safe_sizeof

    return int(safe_sizeof(value))


def _label(value: object) -> str:
    """Representation label for :meth:`ResidentAwareData.resident_bytes`."""
    if isinstance(value, Chunk):
        return value.representation
    module = (type(value).__module__ or "").split(".", 1)[0]
    if module in device_modules():
        return f"{module}-array"
    return "other"


def _residency(value: object) -> str:
    if isinstance(value, Chunk):
        return value.residency
    from ..runtimes.registry import residency_of_module

    prefix = residency_of_module((type(value).__module__ or "").split(".", 1)[0])
    if prefix is None:
        return "host"
    device = getattr(getattr(value, "device", None), "id", None)
    return f"{prefix}:{device}" if isinstance(device, int) else prefix


def release_resident(value: object) -> bool:
    """Free ``value`` if it is a resident chunk of a device runtime; return whether it was one.

    Calls ``get_runtime(value.runtime).release(value)`` for a
    :class:`~quantem_flow.representations.chunk.Chunk` whose residency is not
    ``"host"``.  A failure is logged as a warning with the chunk and the
    runtime, never raised.
    """
    if not isinstance(value, Chunk) or value.residency == "host":
        return False
    try:
        from ..runtimes import get_runtime

        get_runtime(value.runtime).release(value)
    except Exception as exc:  # never break Dask's deletion: report it
        logger.warning(
            "quantem-flow: releasing the %s chunk of rows %s on %s (runtime %r) failed: %s: %s",
            value.representation,
            value.scan_slice[0],
            value.residency,
            value.runtime,
            type(exc).__name__,
            exc,
        )
    return True


def _host_target(memory_limit: int | None) -> int:
    """Managed host bytes before spilling, computed as distributed does."""
    import dask

    if not memory_limit:
        return sys.maxsize
    target = dask.config.get("distributed.worker.memory.target")
    if not target:
        # as distributed: without a target only the memory monitor's evict() spills
        return sys.maxsize
    return int(memory_limit * float(target))


def _parse_memory_limit(memory_limit: int | float | str | None) -> int | None:
    if memory_limit is None:
        return None
    if isinstance(memory_limit, bool):
        raise ParameterError(
            f"memory_limit must be bytes (int), a string such as '2 GiB', 'auto' or None, "
            f"got {memory_limit!r}"
        )
    import logging

    from distributed.worker_memory import parse_memory_limit

    try:
        parsed = parse_memory_limit(
            memory_limit, 1, 1, logger=logging.getLogger("quantem_flow.graphs.worker_data")
        )
    except (ValueError, TypeError) as exc:
        raise ParameterError(
            f"memory_limit must be bytes (int), a string such as '2 GiB', 'auto' or None, "
            f"got {memory_limit!r}: {exc}"
        ) from exc
    return None if parsed is None else int(parsed)


_MISSING = object()


class ResidentAwareData(MutableMapping[Hashable, Any]):
    """Worker data that keeps device payloads in memory and spills only host data.

    Parameters
    ----------
    worker_local_directory
        The worker's local directory (distributed passes it); host data
        spills to ``<worker_local_directory>/storage`` like the default.
    memory_limit
        The worker's memory limit (bytes, a string such as ``"2 GiB"``,
        ``"auto"`` for the whole machine, or None).  Host data spills once
        its managed size passes ``memory_limit *
        distributed.worker.memory.target``.  None: no target until
        :meth:`set_memory_limit` is called (the quantem-flow worker plugin
        calls it with the worker's limit).
    max_spill
        Most bytes to write to disk (default
        ``distributed.worker.memory.max-spill``); False for no limit.
    spill_directory
        Override the spill folder.

    Attributes
    ----------
    device
        ``{key: payload}`` of device payloads; never pickled.
    host
        The :class:`distributed.spill.SpillBuffer` with everything else.
    """

    def __init__(
        self,
        worker_local_directory: str | os.PathLike[str],
        *,
        memory_limit: int | float | str | None = None,
        max_spill: int | str | bool | None = None,
        spill_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        import dask
        from dask.utils import parse_bytes
        from distributed.spill import SpillBuffer

        if spill_directory is None:
            spill_directory = os.path.join(os.fspath(worker_local_directory), "storage")
        if max_spill is None:
            max_spill = dask.config.get("distributed.worker.memory.max-spill")
        if max_spill is True:
            raise ParameterError(
                "max_spill must be bytes, a string such as '10 GiB', or False for no limit; "
                "got True"
            )
        max_spill_bytes: int | bool = False if max_spill is False else parse_bytes(max_spill)
        self.memory_limit: int | None = _parse_memory_limit(memory_limit)
        self.spill_directory = os.fspath(spill_directory)
        self.device: dict[Hashable, Any] = {}
        self.host: Any = SpillBuffer(
            self.spill_directory, target=_host_target(self.memory_limit), max_spill=max_spill_bytes
        )
        self._meta: dict[Hashable, tuple[str, str, int]] = {}
        self._lock = threading.RLock()

    # -- memory limit ------------------------------------------------------------------------
    @property
    def target(self) -> int:
        """Managed host bytes before host data spills (``sys.maxsize``: never by size)."""
        return int(self.host.n)

    def set_memory_limit(self, memory_limit: int | float | str | None) -> None:
        """Set the worker's memory limit and recompute the host spill target.

        Parameters
        ----------
        memory_limit
            Bytes, a string such as ``"2 GiB"``, ``"auto"`` or None (no target).
        """
        with self._lock:
            self.memory_limit = _parse_memory_limit(memory_limit)
            self.host.n = _host_target(self.memory_limit)
            self.host.evict_until_below_target()

    # -- MutableMapping ----------------------------------------------------------------------
    def __setitem__(self, key: Hashable, value: Any) -> None:
        with self._lock:
            replaced = self.device.get(key)
            if replaced is not None and replaced is not value:
                release_resident(replaced)
            if is_device_payload(value):
                if key in self.host:
                    del self.host[key]
                self.device[key] = value
                self._meta[key] = (_residency(value), _label(value), payload_nbytes(value))
            else:
                self.device.pop(key, None)
                self._meta[key] = ("host", _label(value), payload_nbytes(value))
                try:
                    self.host[key] = value
                except BaseException:
                    self._meta.pop(key, None)
                    raise

    def __getitem__(self, key: Hashable) -> Any:
        if key in self.device:
            return self.device[key]
        return self.host[key]

    def __delitem__(self, key: Hashable) -> None:
        with self._lock:
            value = self.device.pop(key, _MISSING)
            if value is _MISSING:
                del self.host[key]
            self._meta.pop(key, None)
        if value is not _MISSING:
            release_resident(value)  # Dask forgot a resident chunk: free its device memory

    def __contains__(self, key: object) -> bool:
        # Never unspill to answer membership (MutableMapping would call __getitem__).
        return key in self.device or key in self.host

    def __iter__(self) -> Iterator[Hashable]:
        yield from list(self.device)
        yield from list(self.host)

    def __len__(self) -> int:
        return len(self.device) + len(self.host)

    def __repr__(self) -> str:
        return (
            f"<ResidentAwareData: {len(self.device)} device, {len(self.host.fast)} host, "
            f"{len(self.host.slow)} spilled; target {self.target}>"
        )

    # -- what the memory manager and metrics duck-type ---------------------------------------
    @property
    def fast(self) -> Mapping[Hashable, Any]:
        """Host values in memory: what :meth:`evict` can move to disk."""
        return self.host.fast  # type: ignore[no-any-return]

    @property
    def slow(self) -> Mapping[Hashable, Any]:
        """Host values spilled to disk."""
        return self.host.slow  # type: ignore[no-any-return]

    @property
    def memory(self) -> Mapping[Hashable, Any]:
        """Alias of :attr:`fast` (as on ``SpillBuffer``)."""
        return self.fast

    @property
    def disk(self) -> Mapping[Hashable, Any]:
        """Alias of :attr:`slow` (as on ``SpillBuffer``)."""
        return self.slow

    @property
    def spilled_total(self) -> Any:
        """``SpilledSize(memory, disk)`` of the host data on disk."""
        return self.host.spilled_total

    @property
    def cumulative_metrics(self) -> Any:
        """Spill and unspill counters of the host buffer (for Prometheus)."""
        return self.host.cumulative_metrics

    def evict(self) -> int:
        """Spill the least recently used host value; return its size or -1 (never raises).

        Device payloads are never evicted.
        """
        if not self.host.fast:
            return -1
        return int(self.host.evict())

    # -- observability -----------------------------------------------------------------------
    def resident_bytes(self) -> dict[str, int]:
        """Return bytes held per ``"<residency>/<representation>"``.

        Residency is ``host`` (host memory), ``disk`` (host data spilled),
        ``mps``, ``cuda:<n>`` or ``external:<w>``; representation is the
        chunk's (``dense``...), ``cupy-array``/``mlx-array`` for raw device
        arrays, or ``other``.  Sizes are the payloads' ``nbytes`` when they
        have one, else ``sizeof``, taken when stored.
        """
        out: dict[str, int] = {}
        with self._lock:
            in_memory = set(self.host.fast)
            for key, (residency, label, nbytes) in self._meta.items():
                if residency == "host" and key not in in_memory:
                    residency = "disk"
                name = f"{residency}/{label}"
                out[name] = out.get(name, 0) + nbytes
        return out
