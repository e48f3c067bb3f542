"""Dtype name sets runtime declarations share (NumPy names, byte order ignored)."""

from __future__ import annotations

__all__ = ["ALL_NUMERIC", "FLOATS", "INTEGERS", "triples"]

#: Every integer dtype name a reader produces.
INTEGERS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
#: Every real dtype name a reader produces.
FLOATS = ("float16", "float32", "float64")
#: Integers and reals.
ALL_NUMERIC = INTEGERS + FLOATS


def triples(
    operation: str, representation: str, dtypes: tuple[str, ...]
) -> set[tuple[str, str, str]]:
    """Return ``{(operation, representation, dtype)}`` for every dtype name in ``dtypes``."""
    return {(operation, representation, d) for d in dtypes}
