"""The interactive explorer: virtual detectors dragged on the pattern, images that follow.

``qf.explore(ds)`` (or ``quantem-flow explore FILE``) persists a dataset on
the cluster and serves a Bokeh page on 127.0.0.1 behind a one-time token:
the mean or max pattern with draggable detectors (disk, annulus, rectangle,
polygon), the virtual image (or CoM, iDPC) computed by one persisted query
per change, the pattern at a tapped scan position, and an export of the
detectors as a YAML pipeline and a Python snippet that reproduce the images
exactly.  See docs/explore.md.
"""

from __future__ import annotations

from .detectors import KINDS, Detector, polygon_mask
from .export import InputSpec, export_files, input_spec_of, pipeline_mapping, python_snippet
from .server import Explorer, explore
from .session import VIEWS, ExplorerSession, ImageUpdate

__all__ = [
    "KINDS",
    "VIEWS",
    "Detector",
    "Explorer",
    "ExplorerSession",
    "ImageUpdate",
    "InputSpec",
    "explore",
    "export_files",
    "input_spec_of",
    "pipeline_mapping",
    "polygon_mask",
    "python_snippet",
]
