"""bench/device_runs.sh (bench/continual.py runs on a lent machine's CPU cores): the fresh agents it trains come back
packed in $OUT/runs.tgz, and stopping them at the time limit stops its own runs only, not another process whose
command line names bench/continual.py (its first version's ``pkill -f`` stopped the local grid workers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_fresh_agents_come_back_packed_and_only_its_own_runs_are_stopped(tmp_path):
    name = f"_device_runs_test_{os.getpid()}"
    out = ROOT / "bench" / "results" / "continual" / name
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1200)", "bench/continual.py"])
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    try:
        started = time.monotonic()
        done = subprocess.run(
            # a limit the runs never reach (they take ~20 s on a quiet machine; the call returns when they end): a
            # loaded machine (the full suite beside grid workers) once needed more than the 60 s this had
            ["bash", str(ROOT / "bench" / "device_runs.sh"), "400", "--quick", "--methods", "ppo", "--fresh", "all",
             "--fresh-only", "--jobs", "2", "--out", str(out.relative_to(ROOT))],
            env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        # the call returns when its runs end, not at the limit: the watchdog's sleep once outlived the script and held
        # its output open, so every call (a lent machine's device time included) lasted the whole limit
        assert time.monotonic() - started < 300
        with tarfile.open(tmp_path / "out" / "runs.tgz") as tar:
            names = sorted(tar.getnames())
        prefix = f"bench/results/continual/{name}/runs/ppo/fresh/"
        assert names == [prefix + "seed0_task0.json", prefix + "seed0_task1.json"]
        assert not (out / "runs" / "ppo" / "seed0.json").exists()  # --fresh-only: no continual run
        log = (tmp_path / "out" / "session.log").read_text()
        assert "2 run JSONs in runs.tgz" in log and "runs finished (exit 0)" in log and "limit" not in log
        assert decoy.poll() is None  # another process naming bench/continual.py is still running
        # a limit shorter than the runs: they are stopped, the call returns, nothing half-written is packed
        shutil.rmtree(out)
        stopped = subprocess.run(
            ["bash", str(ROOT / "bench" / "device_runs.sh"), "1", "--quick", "--methods", "ppo", "--fresh", "all",
             "--fresh-only", "--out", str(out.relative_to(ROOT))],
            env=env, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0
        log = (tmp_path / "out" / "session.log").read_text()
        assert "0 run JSONs in runs.tgz" in log
        assert "runs stopped at the 1 s limit" in log  # said as such, not as a clean exit
        assert decoy.poll() is None
    finally:
        decoy.kill()
        shutil.rmtree(out, ignore_errors=True)
