"""The shared runtime conformance suite over the bridge: reference worker, webgpu, webgpu-browser.

The cases are those :mod:`quantem_flow.testing` makes for every declared
``(operation, representation, dtype)``; they reach the workers only through
the payload contract (put, run_frame_pass, run_gather, release), over
``qf-worker/1``.  ``webgpu`` needs Node and ``web/dist`` (``cd web && npm ci
&& npm run build``), ``webgpu-browser`` also Chromium; when they are missing
the cases skip and say why (a skip is not evidence).
"""

from __future__ import annotations

import pytest

testing = pytest.importorskip(
    "quantem_flow.testing", reason="the conformance suite is not in quantem_flow.testing yet"
)

from quantem_flow.runtimes.external.spec import register_requested  # noqa: E402

register_requested(["external-reference", "webgpu", "webgpu-browser"])


@pytest.mark.parametrize(
    "case", testing.conformance_params(["external-reference"], operations=["frame_pass", "gather"])
)
def test_reference_worker_conforms(case: object) -> None:
    testing.run_case(case)


@pytest.mark.parametrize(
    "case", testing.conformance_params(["webgpu"], operations=["frame_pass", "gather"])
)
def test_webgpu_node_conforms(case: object) -> None:
    testing.run_case(case)


#: The same source runs in the page; SwiftShader takes ~35 s a case on 2 cores, so the
#: browser runs one dtype per representation (and the real path) instead of all 32.
_BROWSER = {
    ("frame_pass", "dense", "uint16"),
    ("frame_pass", "dense", "float32"),
    ("frame_pass", "paired", "uint16"),
    ("frame_pass", "packed", "uint16"),
    ("gather", "dense", "uint16"),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        p
        for p in testing.conformance_params(["webgpu-browser"])
        if (p.values[0].operation, p.values[0].representation, p.values[0].dtype) in _BROWSER
    ],
)
def test_webgpu_browser_conforms(case: object) -> None:
    testing.run_case(case)
