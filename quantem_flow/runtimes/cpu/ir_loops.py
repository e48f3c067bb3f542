"""Counted loops for the kernels written as LLVM IR (:mod:`.dot_ir`, :mod:`.xxh3_ir`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Loop", "open_loop"]


@dataclass
class Loop:
    """A loop being emitted: its counter, carried values and blocks (see :func:`open_loop`)."""

    counter: Any
    carried: list[Any]
    head: Any
    body: Any
    done: Any

    def close(self, b: Any, step: Any, carried: Sequence[Any] = ()) -> None:
        """Branch back to the head with ``counter + step`` and the new carried values."""
        self.counter.add_incoming(b.add(self.counter, step), b.block)
        for phi, value in zip(self.carried, carried, strict=True):
            phi.add_incoming(value, b.block)
        b.branch(self.head)
        b.position_at_end(self.done)


def open_loop(
    b: Any,
    fn: Any,
    tag: str,
    start: Any,
    limit: Any,
    carried: Sequence[tuple[Any, Any]] = (),
) -> Loop:
    """Emit a loop head (``counter`` from ``start`` while ``< limit``) and enter its body.

    ``carried``: ``(type, initial value)`` of values the loop carries (phis);
    the caller emits the body, then calls :meth:`Loop.close`, after which the
    builder is at the loop's exit (where the phis hold the final values).
    """
    pre = b.block
    head = fn.append_basic_block(tag)
    body = fn.append_basic_block(f"{tag}_body")
    done = fn.append_basic_block(f"{tag}_done")
    b.branch(head)
    b.position_at_end(head)
    counter = b.phi(start.type, f"{tag}_i")
    counter.add_incoming(start, pre)
    phis = []
    for k, (ty, init) in enumerate(carried):
        phi = b.phi(ty, f"{tag}_v{k}")
        phi.add_incoming(init, pre)
        phis.append(phi)
    b.cbranch(b.icmp_signed("<", counter, limit), body, done)
    b.position_at_end(body)
    return Loop(counter, phis, head, body, done)
