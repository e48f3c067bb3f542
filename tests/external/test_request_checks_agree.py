"""Every worker over pipes answers the same ill-formed requests with the reference's codes.

The reference worker (Python), ``qf-vulkan-worker`` (android/) and ``qf-swift-worker``
(native/) get the same byte stream: a hello, then requests whose id is a string, negative
or missing, an unknown type with a bad id (the type is checked first), and a good ping;
each answers with exactly one reply per request, the same type, code and id.
(``qf-vulkan-worker`` once echoed ``{"type":"ping","id":"x"}`` as a ping with id null.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from quantem_flow.runtimes.external import protocol as pr
from quantem_flow.runtimes.external.swift import swift_worker_path
from quantem_flow.runtimes.external.vulkan import vulkan_worker_path
from tests.swift_toolchain import require_swift_build

REQUESTS = [
    pr.hello_request(client="t"),
    pr.Message({"type": "ping", "id": "x"}),
    pr.Message({"type": "ping", "id": -1}),
    pr.Message({"type": "stats"}),
    pr.Message({"type": "pong", "id": "x"}),
    pr.Message({"type": "release", "id": 4, "handles": ["a"]}),
    pr.ping(id=7),
]


def _replies(argv: list[str]) -> list[tuple[str, object, object]]:
    data = b"".join(pr.encode(m) for m in REQUESTS)
    run = subprocess.run(argv, input=data, capture_output=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    replies = pr.FrameDecoder().feed(run.stdout)
    return [(m.type, m.header.get("id"), m.header.get("code")) for m in replies]


def _reference() -> list[tuple[str, object, object]]:
    return _replies([sys.executable, "-m", "quantem_flow.runtimes.external.reference_worker"])


def test_the_reference_answers_every_request_once() -> None:
    got = _reference()
    assert [t for t, _, _ in got] == ["hello", "error", "error", "error", "error", "error", "ping"]
    assert got[1:6] == [
        ("error", None, "bad_request"),
        ("error", -1, "bad_request"),
        ("error", None, "bad_request"),
        ("error", None, "unsupported"),
        ("error", 4, "bad_request"),
    ]


@pytest.mark.parametrize("worker", ["vulkan", "swift"])
def test_native_workers_answer_as_the_reference(worker: str) -> None:
    if worker == "swift":
        require_swift_build()
        argv = [str(swift_worker_path()), "--device", "cpu"]
    else:
        path = vulkan_worker_path()
        assert path.is_file(), f"{path} is missing: run `bash scripts/install-toolchains.sh`"
        argv = [str(path)]
    got = _replies(argv)
    ref = _reference()
    assert [(t, i, c) for t, i, c in got] == ref, (got, ref)
