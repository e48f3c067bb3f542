"""Weight maps kept on a cluster between passes, so a pass that repeats them sends their key.

A pass's weight rows (``(n_weights, k_r * k_c)`` float64: 0.66 MB for BF +
ADF + CoM on a 128 x 128 detector) are a data task of their own in its graph,
keyed by their content (:func:`weights_task_key`), and every chunk task
takes them from it.  The runner keeps the future of that task (this
module), newest last, up to ``held_weights_mib`` and :data:`HELD_SETS` sets
per client.  A later pass with the same rows leaves the data task out of
its graph and names the held key: no bytes, and no task to wait for before
its chunk tasks start.  The key is a task's, not scattered data, so a
worker lost with it computes it again elsewhere (its data is its own
definition, kept by the scheduler).

Clusters others run keep the same rule: the futures are the client's.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any

import numpy as np

from ..errors import ParameterError

__all__ = ["HELD_SETS", "HeldWeights", "held_weights", "held_weights_bytes", "weights_task_key"]

#: Most weight sets a client keeps on its cluster.
HELD_SETS = 8

#: Prefix of the key of a pass's weights task.
WEIGHTS_PREFIX = "qf-weights-"


def weights_task_key(weights: np.ndarray) -> str:
    """The key of the data task holding ``weights``.

    Parameters
    ----------
    weights
        The pass's stacked weight rows.

    Returns
    -------
    str
        ``qf-weights-`` and the XXH3-128 of their shape, dtype and bytes (C order).
    """
    import xxhash

    w = np.ascontiguousarray(weights)
    h = xxhash.xxh3_128(repr((w.shape, w.dtype.str)).encode())
    h.update(w.data.cast("B") if w.size else b"")
    return WEIGHTS_PREFIX + h.hexdigest()


def held_weights_bytes(value: Any = None) -> int:
    """The capacity for held weights in bytes.

    Parameters
    ----------
    value
        MiB; ``None`` reads ``qf.config`` ``held_weights_mib``.

    Returns
    -------
    int
        Bytes (0: every pass sends its weight maps).

    Raises
    ------
    ParameterError
        For a negative, non-finite or non-numeric value.
    """
    from .. import config

    raw = config.get("held_weights_mib") if value is None else value
    try:
        mib = float(raw)
    except (TypeError, ValueError):
        mib = math.nan
    if not math.isfinite(mib) or mib < 0:
        raise ParameterError(
            f"held_weights_mib must be a finite number of MiB >= 0 (0: every pass sends its "
            f"weight maps), got {raw!r}; set it with qf.config.set(held_weights_mib=...)"
        )
    return int(mib * 2**20)


def _another_reference(future: Any) -> Any:
    """A new future of ``future``'s key on its client: one more reference, taken now."""
    from distributed import Future

    return Future(future.key, future.client)


class HeldWeights:
    """The futures of one client's held weights tasks, least recently used first.

    Parameters
    ----------
    capacity_sets
        Most sets held (:data:`HELD_SETS`).
    """

    def __init__(self, capacity_sets: int = HELD_SETS) -> None:
        self.capacity_sets = int(capacity_sets)
        self._held: collections.OrderedDict[str, tuple[Any, int]] = collections.OrderedDict()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def saw(self, key: str | None) -> None:
        """Note that a pass used the weights ``key`` (the last ``capacity_sets`` are kept)."""
        if key is None:
            return
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > self.capacity_sets:
                self._seen.popitem(last=False)

    def seen(self, key: str) -> bool:
        """Whether one of the last ``capacity_sets`` passes used the weights ``key``."""
        with self._lock:
            return key in self._seen

    def holds(self, key: str) -> bool:
        """Whether ``key``'s task is held (marked most recent); see :meth:`pin`."""
        return self._usable(key, pin=False) is not None

    def pin(self, key: str) -> Any | None:
        """A reference of the pass's own to ``key``'s held task, or ``None`` if it is not held.

        Taken under the lock, so another thread evicting the set cannot release
        the task before the graph naming it reaches the scheduler; the pass
        releases it when it ends.  A pending task (sent by a pass still running)
        is held; a lost, erred or cancelled one (its worker died and its client
        was told, or its client closed) is released and forgotten.
        """
        return self._usable(key, pin=True)

    def _usable(self, key: str, *, pin: bool) -> Any | None:
        gone = None
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                return None
            future = entry[0]
            if future.status in ("finished", "pending"):
                self._held.move_to_end(key)
                return _another_reference(future) if pin else future
            del self._held[key]
            gone = future
        gone.release()
        return None

    def trim(self, capacity_bytes: int) -> None:
        """Release the oldest sets beyond ``capacity_bytes`` and :attr:`capacity_sets`."""
        released: list[Any] = []
        with self._lock:
            total = sum(n for _, n in self._held.values())
            while self._held and (len(self._held) > self.capacity_sets or total > capacity_bytes):
                _, (gone, n) = self._held.popitem(last=False)
                total -= n
                released.append(gone)
        for f in released:
            f.release()

    def keep(self, future: Any, nbytes: int, *, capacity_bytes: int) -> bool:
        """Hold ``future`` (a weights task of ``nbytes``); release the oldest beyond capacity.

        Returns
        -------
        bool
            Whether it is held: a set larger than ``capacity_bytes`` is not (its
            future is released).
        """
        released: list[Any] = []
        with self._lock:
            old = self._held.pop(future.key, None)
            if old is not None and old[0] is not future:
                released.append(old[0])
            kept = nbytes <= capacity_bytes
            if kept:
                self._held[future.key] = (future, int(nbytes))
            else:
                released.append(future)
        for f in released:
            f.release()
        self.trim(capacity_bytes)
        return kept

    def keys(self) -> list[str]:
        """The held keys, least recently used first."""
        with self._lock:
            return list(self._held)

    def clear(self) -> None:
        """Release every held future."""
        with self._lock:
            gone = [f for f, _ in self._held.values()]
            self._held.clear()
        for f in gone:
            f.release()


#: Per client id: the client and what it holds (a held future keeps its client alive, so
#: the entries of closed clients are dropped at the next look-up).
_BY_CLIENT: dict[str, tuple[Any, HeldWeights]] = {}
_BY_CLIENT_LOCK = threading.Lock()


def held_weights(client: Any) -> HeldWeights:
    """The weights ``client`` holds on its cluster (made on first use).

    Parameters
    ----------
    client
        A ``distributed.Client``.

    Returns
    -------
    HeldWeights
        The same object for the same client while it runs.
    """
    with _BY_CLIENT_LOCK:
        for cid in [c for c, (cl, _) in _BY_CLIENT.items() if cl.status in ("closing", "closed")]:
            del _BY_CLIENT[cid]  # their futures went with the client
        key = str(getattr(client, "id", id(client)))
        entry = _BY_CLIENT.get(key)
        if entry is None or entry[0] is not client:
            entry = _BY_CLIENT[key] = (client, HeldWeights())
        return entry[1]
