"""The embedded default works unchanged wherever a user types it (issue 12, item 1).

No ``if __name__ == "__main__":`` guard: a plain script, code piped on stdin,
an interactive interpreter and a Jupyter notebook each start the embedded
local cluster, compute, and leave no worker process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
LINES = [
    "import os, json",
    "import quantem_flow as qf",
    "data, _ = qf.synthetic_dataset(scan_shape=(8, 8), detector_shape=(24, 24), probe_radius_px=4)",
    "ds = qf.open(data)",
    "bf, com = qf.compute(qf.virtual_bf(ds), qf.center_of_mass(ds))",
    "pids = sorted(qf.embedded_client().run(os.getpid).values())",
    "print('RESULT ' + json.dumps({'kind': type(bf).__name__, 'shape': list(bf.shape), "
    "'scheduler': bf.provenance.execution['scheduler'], 'pids': pids, 'me': os.getpid()}))",
]
SCRIPT = "\n".join(LINES) + "\n"
TIMEOUT_S = 240


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["QUANTEM_FLOW_LOCAL_WORKERS"] = "2"
    env["QUANTEM_FLOW_PROGRESS"] = "0"
    return env


def _result(text: str) -> dict[str, object]:
    lines = [ln for ln in text.splitlines() if "RESULT " in ln]
    assert lines, text[-3000:]
    return json.loads(lines[-1].split("RESULT ", 1)[1])  # type: ignore[no-any-return]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids: list[int], wait_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.2)
    return alive


def _check(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Nanny failed to start" not in out
    assert "bootstrapping phase" not in out
    res = _result(proc.stdout)
    assert res["kind"] == "ScanImage" and res["shape"] == [8, 8]
    assert str(res["scheduler"]).startswith("embedded local cluster")
    pids = res["pids"]
    assert isinstance(pids, list) and len(pids) == 2 and res["me"] not in pids
    assert _gone(pids) == [], "worker processes outlived the interpreter"
    return res


def test_plain_script_without_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "analysis.py"
    script.write_text(SCRIPT + "print('the script body ran', flush=True)\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(proc)
    # the workers never re-imported the script: its body ran exactly once
    assert proc.stdout.count("the script body ran") == 1


def test_code_piped_on_stdin(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-"],
        input=SCRIPT,
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(proc)


def test_interactive_interpreter(tmp_path: Path) -> None:
    # python -i reads statements one by one as a REPL does (no __file__ in __main__)
    proc = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=SCRIPT + "exit()\n",
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert ">>>" in proc.stderr  # it really was the interactive loop
    _check(proc)


def test_jupyter_notebook(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("\n".join(LINES[:4])),
        nbformat.v4.new_code_cell("\n".join(LINES[4:])),
        nbformat.v4.new_code_cell("bf"),
        nbformat.v4.new_code_cell("fig = bf.plot()\nfig.axes[0].get_xlabel()"),
        nbformat.v4.new_code_cell("ds"),
        nbformat.v4.new_code_cell(
            "from quantem_flow.graphs.runner import progress_bar_class\n"
            "(adf,) = qf.compute(qf.virtual_adf(ds), progress=True)\n"
            "print('BAR ' + progress_bar_class().__module__)"
        ),
    ]
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    env = _env()
    with pytest.MonkeyPatch.context() as mp:
        for key in ("PYTHONPATH", "QUANTEM_FLOW_LOCAL_WORKERS", "QUANTEM_FLOW_PROGRESS"):
            mp.setenv(key, env[key])
        client.execute()
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", output
            texts.append(output.get("text") or output.get("data", {}).get("text/plain", ""))
    joined = "\n".join(texts)
    res = _result(joined)
    assert res["kind"] == "ScanImage"
    assert str(res["scheduler"]).startswith("embedded local cluster")
    assert "ScanImage(name='bf'" in joined
    assert "'scan column (px)'" in joined
    assert "Nanny failed to start" not in joined
    # rich output: a result's thumbnail and summary, a dataset's summary (nothing read)
    bf_html = nb.cells[2]["outputs"][0]["data"]["text/html"]
    assert 'src="data:image/png;base64,' in bf_html and "ScanImage" in bf_html
    assert "counts" in bf_html and "virtual_bf" in bf_html
    assert "lazy: nothing read" in nb.cells[4]["outputs"][0]["data"]["text/html"]
    # the progress bar is a widget, and tqdm warns of nothing
    bar_outputs = nb.cells[5]["outputs"]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in bar_outputs)
    assert "BAR tqdm.notebook" in joined
    assert "TqdmWarning" not in joined and "IProgress not found" not in joined
    pids = res["pids"]
    assert isinstance(pids, list) and len(pids) == 2
    assert _gone(pids) == [], "worker processes outlived the kernel"


def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(
        SCRIPT + "import time\nprint('READY', flush=True)\ntime.sleep(600)\n", encoding="utf-8"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("READY"):
                break
        res = _result("".join(lines))
        pids = res["pids"]
        assert isinstance(pids, list) and len(pids) == 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no atexit, no clean shutdown
        proc.wait(30)
    assert _gone(pids, wait_s=20) == []


def test_worker_program_rejects_a_bad_spec() -> None:
    from quantem_flow.graphs.local_worker import main

    assert main(["{not json"]) == 2
    assert main([json.dumps({"name": "x"})]) == 2
    assert main([json.dumps({"scheduler": "tcp://127.0.0.1:1", "colour": 1})]) == 2


def test_worker_program_failure_is_loud(tmp_path: Path) -> None:
    from distributed import LocalCluster

    from quantem_flow.graphs.cluster import WorkerProgram

    with pytest.raises(RuntimeError, match=r"exited with status|did not register") as err:
        LocalCluster(
            n_workers=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            worker_class=WorkerProgram,
            runtimes=["no-such-runtime"],
            silence_logs=40,
        )
    assert "stderr ended with" in str(err.value)
