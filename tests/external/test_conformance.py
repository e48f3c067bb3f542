"""The shared runtime conformance suite over the bridge: reference worker, webgpu, webgpu-browser.

The cases are those :mod:`quantem_flow.testing` makes for every declared
``(operation, representation, dtype)``; they reach the workers only through
the payload contract (put, run_frame_pass, run_gather, release), over
``qf-worker/1``.  ``webgpu`` needs Node and ``web/dist`` (``cd web && npm ci
&& npm run build``), ``webgpu-browser`` also Chromium.  A missing ``web/dist``
skips only where the npm registry cannot be reached (:mod:`tests.npm_registry`);
anywhere else it fails, as does a worker that does not start.
"""

from __future__ import annotations

import pytest

testing = pytest.importorskip(
    "quantem_flow.testing", reason="the conformance suite is not in quantem_flow.testing yet"
)

from quantem_flow.runtimes.external.spec import register_requested  # noqa: E402
from quantem_flow.runtimes.external.workers import (  # noqa: E402
    WebGpuBrowserRuntime,
    web_dist,
)
from quantem_flow.runtimes.registry import unregister_runtime  # noqa: E402
from tests.npm_registry import require_web_build  # noqa: E402

_EXTERNAL = ["external-reference", "webgpu", "webgpu-browser"]
# The cases are made at collection; the runtimes are registered only while this module
# runs (see the fixture), so other modules that enumerate the registry never see them.
register_requested(_EXTERNAL)
_REFERENCE_CASES = testing.conformance_params(
    ["external-reference"], operations=["frame_pass", "gather"]
)
_NODE_CASES = testing.conformance_params(["webgpu"], operations=["frame_pass", "gather"])
_BROWSER_CASES = testing.conformance_params(["webgpu-browser"])
for _name in _EXTERNAL:
    unregister_runtime(_name)


@pytest.fixture(autouse=True, scope="module")
def _registered(_registry_restored: None) -> None:
    register_requested(_EXTERNAL)  # removed again by conftest's _registry_restored


@pytest.mark.parametrize("case", _REFERENCE_CASES)
def test_reference_worker_conforms(case: object) -> None:
    testing.run_case(case)


@pytest.mark.parametrize("case", _NODE_CASES)
def test_webgpu_node_conforms(case: object) -> None:
    require_web_build(web_dist() / "node-worker.js", what="the Node WebGPU worker")
    testing.run_case(case, skip_unavailable=False)


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
        for p in _BROWSER_CASES
        if (p.values[0].operation, p.values[0].representation, p.values[0].dtype) in _BROWSER
    ],
)
def test_webgpu_browser_conforms(case: object) -> None:
    require_web_build(WebGpuBrowserRuntime.page_dir() / "index.html", what="the WebGPU page")
    testing.run_case(case, skip_unavailable=False)
