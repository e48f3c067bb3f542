"""The worker's TLS flags and the README's secure cluster commands (issue 11, item 11)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantem_flow.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_worker_passes_tls_files_to_dask_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {}
    for name in ("ca.pem", "worker.pem", "worker.key"):
        files[name] = tmp_path / name
        files[name].write_text("-----BEGIN TEST-----\n")
    argv = [
        "worker",
        "tls://127.0.0.1:8786",
        "--runtimes",
        "cpu",
        "--tls-ca-file",
        str(files["ca.pem"]),
        "--tls-cert",
        str(files["worker.pem"]),
        "--tls-key",
        str(files["worker.key"]),
        "--dry-run",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"--tls-ca-file {files['ca.pem']}" in out
    assert f"--tls-cert {files['worker.pem']}" in out
    assert f"--tls-key {files['worker.key']}" in out


def test_worker_tls_mistakes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    base = ["worker", "--runtimes", "cpu", "--dry-run"]
    assert main([*base[:1], "tls://127.0.0.1:8786", *base[1:]]) != 0
    assert "speaks TLS but no certificates" in capsys.readouterr().err
    assert main([*base[:1], "tcp://127.0.0.1:8786", *base[1:], "--tls-ca-file", str(ca)]) != 0
    assert "at least --tls-ca-file and --tls-cert" in capsys.readouterr().err
    argv = [*base[:1], "tcp://127.0.0.1:8786", *base[1:], "--tls-ca-file", str(ca)]
    assert main([*argv, "--tls-cert", str(ca)]) != 0
    assert "is not tls://" in capsys.readouterr().err
    argv = [*base[:1], "tls://127.0.0.1:8786", *base[1:], "--tls-ca-file", str(ca)]
    assert main([*argv, "--tls-cert", str(tmp_path / "missing.pem")]) != 0
    assert "is not a readable file" in capsys.readouterr().err


def test_readme_scheduler_commands_bind_one_interface_and_show_tls() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"dask scheduler[^\n]*", text)
    assert commands, "the README shows no dask scheduler command"
    assert all("--host" in c for c in commands), commands
    assert "--tls-ca-file" in text and "--tls-cert" in text and "--tls-key" in text
    assert "plain HTTP" in text
