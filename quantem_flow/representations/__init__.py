"""Representations: how a chunk's payload is laid out (dense, encoded, paired, packed)."""

from .base import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    REPRESENTATION_REGISTRY,
    Payload,
    Representation,
    get_representation,
    representation_names,
)
from .chunk import (
    REPRESENTATIONS,
    RESIDENCIES,
    Chunk,
    check_representation,
    chunk_of,
    register_residency,
)
from .dense import DENSE_SCHEMA

__all__ = [
    "DENSE_SCHEMA",
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "REPRESENTATIONS",
    "REPRESENTATION_REGISTRY",
    "RESIDENCIES",
    "Chunk",
    "Payload",
    "Representation",
    "check_representation",
    "chunk_of",
    "get_representation",
    "register_residency",
    "representation_names",
]
