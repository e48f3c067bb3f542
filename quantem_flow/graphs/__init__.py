"""Lowering to Dask, annotations, execution and the embedded cluster."""

from . import persist as _persist  # noqa: F401 - registers Dataset4D.persist
from .annotations import ANNOTATION_KEYS, validate_annotations
from .cluster import close_embedded_cluster, dashboard_url, embedded_client, start_local_cluster
from .execute import compute
from .lowering import LoweredPass, lower_pass

__all__ = [
    "ANNOTATION_KEYS",
    "LoweredPass",
    "close_embedded_cluster",
    "compute",
    "dashboard_url",
    "embedded_client",
    "lower_pass",
    "start_local_cluster",
    "validate_annotations",
]
