"""Whether the npm registry answers, and what a web/ test does when web/ is not built.

``scripts/build-web.sh`` skips the web/ build, saying ``web/ is not built: the npm
registry cannot be reached``, only where ``npm ping`` fails; the web/ tests ask the
registry the same way.  A missing build then skips with that reason; where the registry
answers, a missing build is a failure that says how to build it (nothing can excuse it).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
BUILD_HINT = "run `bash scripts/install-toolchains.sh` (npm ci && npm run build in web/)"


def npm_registry_answers(registry: str | None = None) -> tuple[bool, str]:
    """``(answers, what npm said)`` for ``npm ping`` without retries (a refusal comes at once).

    ``registry`` overrides ``npm_config_registry`` (tests point it at loopback ports).
    """
    return _ping(registry or os.environ.get("npm_config_registry", ""))  # noqa: SIM112 (npm's name)


@functools.cache
def _ping(registry: str) -> tuple[bool, str]:
    npm = shutil.which("npm")
    if npm is None:
        return False, "npm is not on PATH"
    env = dict(os.environ)
    if registry:
        env["npm_config_registry"] = registry
    try:
        run = subprocess.run(
            [npm, "ping", "--fetch-retries=0", "--fetch-timeout=15000"],
            capture_output=True,
            text=True,
            timeout=40,
            env=env,
            cwd=WEB if WEB.is_dir() else ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, "npm ping did not answer within 40 s"
    said = (run.stdout + run.stderr).strip().splitlines()
    lines = [s for s in said if "npm error code" in s or "PONG" in s] or said[-1:]
    return run.returncode == 0, "; ".join(lines)


def require_web_build(path: Path, *, what: str = "the web/ build") -> None:
    """Skip when ``path`` is missing because npm cannot be reached; fail when it is missing anyway.

    Parameters
    ----------
    path
        A file or folder the npm install or build makes (``web/node_modules``,
        ``web/dist/node-worker.js``).
    what
        What it is, for the message.
    """
    if path.exists():
        return
    answers, said = npm_registry_answers()
    if not answers and shutil.which("npm") is not None:
        pytest.skip(f"web/ is not built: the npm registry cannot be reached ({said}); {what}")
    pytest.fail(f"{path} is missing ({what}): {BUILD_HINT}; npm ping: {said}")
