"""bench/stop_workers.sh: the end of a working session. A worker script's runs are asked to checkpoint and stop
(SIGUSR1, which bench/continual.py turns into a checkpoint at the next rollout start), the worker starts no further
run, and what ignores the request is ended after the timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("pgrep") is None,
                                reason="needs setsid and pgrep (util-linux, procps)")

# a run that stops on the signal (as bench/continual.py does: marks it and exits), or that ignores it
CHILD = """
import signal, sys, time
from pathlib import Path
mark = Path(sys.argv[1])
def stop(*_):
    mark.write_text("checkpointed")
    sys.exit(3)
signal.signal(signal.SIGUSR1, stop if sys.argv[2] == "obey" else signal.SIG_IGN)
Path(str(mark) + ".started").write_text("")
while True:
    time.sleep(0.05)
"""


def _worker(tmp_path: Path, name: str, mode: str) -> subprocess.Popen:
    """A grid worker like bench/card_envs_grid.sh: a script that runs one run after the other (|| true)."""
    script = tmp_path / name
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    script.write_text(f"#!/usr/bin/env bash\n"
                      f"{sys.executable} {child} {tmp_path / 'first'} {mode} || true\n"
                      f"{sys.executable} {child} {tmp_path / 'second'} {mode} || true\n")
    script.chmod(0o755)
    worker = subprocess.Popen(["setsid", str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if (tmp_path / "first.started").exists():
            return worker
        time.sleep(0.05)
    raise AssertionError("the worker's first run did not start")


def _stop(timeout: int, pattern: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "bench" / "stop_workers.sh"), str(timeout), pattern],
                          capture_output=True, text=True, timeout=120)


def test_a_worker_is_stopped_after_its_run_checkpoints_and_starts_no_other_run(tmp_path):
    name = f"fake_grid_{os.getpid()}.sh"
    worker = _worker(tmp_path, name, "obey")
    done = _stop(60, name.replace(".", "[.]"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every worker stopped" in done.stdout
    assert (tmp_path / "first").read_text() == "checkpointed"
    assert worker.wait(timeout=10) is not None
    time.sleep(0.5)
    assert not (tmp_path / "second.started").exists()  # the script ended with its run: no next run
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).returncode == 1  # nothing left


def test_a_run_that_ignores_the_request_is_ended_after_the_timeout(tmp_path):
    name = f"fake_grid_stubborn_{os.getpid()}.sh"
    _worker(tmp_path, name, "ignore")
    done = _stop(2, name.replace(".", "[.]"))
    assert done.returncode == 1
    assert "still running after 2 s, ended with SIGTERM" in done.stdout
    time.sleep(0.5)
    assert not (tmp_path / "first").exists() and not (tmp_path / "second.started").exists()
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).returncode == 1


def test_no_worker_running_is_said_as_such():
    done = _stop(1, f"no_such_worker_{os.getpid()}[.]sh")
    assert done.returncode == 0 and "no worker running" in done.stdout
