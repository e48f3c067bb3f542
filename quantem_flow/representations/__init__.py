"""Representations: how a chunk's payload is laid out (dense, encoded, paired, packed)."""

from .chunk import REPRESENTATIONS, RESIDENCIES, Chunk, check_representation
from .dense import DENSE_SCHEMA

__all__ = ["DENSE_SCHEMA", "REPRESENTATIONS", "RESIDENCIES", "Chunk", "check_representation"]
