"""Run Stable-Baselines3's and sb3-contrib's own test files with the plastic classes patched in (issue #12).

Every test file is copied into a temporary directory next to a ``conftest.py`` that, before the test
modules are imported, replaces ``PPO, DQN, SAC`` (stable_baselines3) and ``QRDQN, TQC, CrossQ, RecurrentPPO,
MaskablePPO`` (sb3_contrib) with subclasses of ``PlasticPPO, PlasticDQN, PlasticSAC, PlasticQRDQN, PlasticTQC,
PlasticCrossQ, PlasticRecurrentPPO, PlasticMaskablePPO`` that carry the mode's keywords as defaults. The
subclasses keep the original class name (``type("PPO", (PlasticPPO,), {...})``), so ``isinstance`` checks,
``model.__class__.__name__`` and ``PPO.load`` in the tests see a "PPO". The replacement is done in every
already imported ``stable_baselines3*`` / ``sb3_contrib*`` module that holds the original class (the package,
``stable_baselines3.ppo``, ``stable_baselines3.ppo.ppo``, ...), which covers every place the tests import
them from; sb3_plastic's own modules keep the originals.

Modes:

* ``unpatched``: nothing is replaced (the baseline: a failure here is not ours).
* ``defaults``: the plastic classes as they are (library defaults).
* ``off``: ``isometry_mode="off", optimizer="adam"`` (documented to be SB3's algorithm bit for bit).
* ``maxmin``: ``activation="maxmin"`` with the default optimizer AdamO.

By default, parametrized test cases whose parameters contain an algorithm class that is not replaced
(A2C, TD3, DDPG, ARS, TRPO) are deselected in every mode (they do not exercise sb3_plastic and cost CPU;
``--all-algos`` keeps them), and so are SB3's ``expensive`` (a >2 GB model) and sb3-contrib's ``slow``
(an LSTM CartPole performance run) tests (``--markers ""`` keeps them). The same selection is used for
every mode, so the counts are comparable.

Sources (read at run time, not part of this repository): the ``tests`` folders of the two public
repositories. On a fresh machine::

    git clone --depth 1 --branch v2.9.2 https://github.com/DLR-RM/stable-baselines3 /tmp/sb3
    git clone --depth 1 --branch v2.9.2 https://github.com/Stable-Baselines-Team/stable-baselines3-contrib /tmp/sb3c
    python bench/sb3_suites.py --sb3-tests /tmp/sb3/tests --contrib-tests /tmp/sb3c/tests --mode unpatched \\
        --out bench/results/sb3_suites/unpatched.json

(use the tag matching the installed ``stable_baselines3`` / ``sb3_contrib`` versions). From a bare git
mirror: ``mkdir /tmp/sb3 && git --git-dir=<mirror> archive HEAD tests | tar -x -C /tmp/sb3``.

Output: a JSON file with the selection, the versions, per-file passed/failed/skipped counts and every test's
outcome (failures with the first line of the error), and a table on stdout. ``--compare BASELINE.json``
additionally lists the failures that do not also fail in the baseline. Run with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("unpatched", "defaults", "off", "maxmin")

SB3_FILES = (
    "test_run.py",
    "test_save_load.py",
    "test_identity.py",
    "test_cnn.py",
    "test_dict_env.py",
    "test_deterministic.py",
    "test_predict.py",
    "test_custom_policy.py",
    "test_train_eval_mode.py",
    "test_sde.py",
    "test_callbacks.py",
    "test_her.py",
    "test_spaces.py",
)
CONTRIB_FILES = (
    "test_run.py",
    "test_save_load.py",
    "test_identity.py",
    "test_cnn.py",
    "test_dict_env.py",
    "test_deterministic.py",
    "test_invalid_actions.py",
    "test_lstm.py",
    "test_train_eval_mode.py",
)

# SB3's and sb3-contrib's [tool.pytest.ini_options] (filterwarnings, markers)
PYTEST_INI = """[pytest]
filterwarnings =
    ignore::DeprecationWarning:multiprocessing.popen_fork
    ignore:You are trying to run (PPO|A2C) on the GPU
    ignore::DeprecationWarning:tensorboard
    ignore::UserWarning:gymnasium
    ignore::DeprecationWarning:gymnasium.envs.registration
    ignore:rich is experimental
markers =
    expensive: marks tests as expensive
    slow: marks tests as slow
"""

PATCH_MODULE = '''"""Written by bench/sb3_suites.py: replaces SB3's / sb3-contrib's algorithm classes by plastic subclasses."""
import os
import sys

from stable_baselines3.common.base_class import BaseAlgorithm

MODE_KWARGS = {
    "unpatched": None,
    "defaults": {},
    "off": {"isometry_mode": "off", "optimizer": "adam"},
    "maxmin": {"activation": "maxmin", "optimizer": "adamo"},
}
#: original name -> (module of the original, plastic class name)
REPLACED = {
    "PPO": ("stable_baselines3", "PlasticPPO"),
    "DQN": ("stable_baselines3", "PlasticDQN"),
    "SAC": ("stable_baselines3", "PlasticSAC"),
    "QRDQN": ("sb3_contrib", "PlasticQRDQN"),
    "TQC": ("sb3_contrib", "PlasticTQC"),
    "CrossQ": ("sb3_contrib", "PlasticCrossQ"),
    "RecurrentPPO": ("sb3_contrib", "PlasticRecurrentPPO"),
    "MaskablePPO": ("sb3_contrib", "PlasticMaskablePPO"),
}
PATCHED = {}  # name -> list of "module.attr" that were replaced
CONSTRUCTED = {}  # name -> number of models built through the replacement (evidence the patch took effect)


def _factory(name, plastic_cls, mode_kwargs):
    def __init__(self, *args, **kwargs):
        CONSTRUCTED[name] = CONSTRUCTED.get(name, 0) + 1
        for key, value in mode_kwargs.items():
            kwargs.setdefault(key, value)
        plastic_cls.__init__(self, *args, **kwargs)

    cls = type(name, (plastic_cls,), {"__init__": __init__, "__module__": __name__, "__qualname__": name})
    cls.__doc__ = plastic_cls.__doc__
    return cls


def install(mode):
    """Idempotent; also runs when a subprocess (SubprocVecEnv worker) imports this module to unpickle a class."""
    kwargs = MODE_KWARGS[mode]
    if kwargs is None or PATCHED:
        return
    import importlib

    import sb3_contrib  # noqa: F401
    import stable_baselines3  # noqa: F401

    import sb3_plastic

    for name, (package, plastic_name) in REPLACED.items():
        original = getattr(importlib.import_module(package), name)
        plastic_cls = getattr(sb3_plastic, plastic_name)
        assert issubclass(plastic_cls, original), (plastic_cls, original)
        replacement = _factory(name, plastic_cls, kwargs)
        globals()[name] = replacement
        PATCHED[name] = []
        for mod_name, module in list(sys.modules.items()):
            if module is None or not (mod_name == package or mod_name.startswith(package + ".")):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, replacement)
                    PATCHED[name].append(f"{mod_name}.{attr}")


# A SubprocVecEnv worker that unpickles a test's env factory (a closure over e.g. ``model_class``) imports
# this module to resolve ``_sb3_suites_patch.DQN``: install the same replacement there.
if os.environ.get("SB3_SUITES_MODE"):
    install(os.environ["SB3_SUITES_MODE"])


def non_replaced_algorithm(value):
    """True for an SB3 / sb3-contrib algorithm class that this script does not replace (A2C, TD3, ...)."""
    return isinstance(value, type) and issubclass(value, BaseAlgorithm) and value.__name__ not in REPLACED
'''

CONFTEST = '''"""Written by bench/sb3_suites.py."""
import json
import os

import pytest

import _sb3_suites_patch

_sb3_suites_patch.install(os.environ["SB3_SUITES_MODE"])
_RESULTS = []


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SB3_SUITES_ALL_ALGOS") == "1":
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        values = []
        for value in params.values():
            values.extend(value if isinstance(value, (list, tuple)) else [value])
        (drop if any(_sb3_suites_patch.non_replaced_algorithm(v) for v in values) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _first_line(report):
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # skip: (path, lineno, reason)
        return str(longrepr[2]).splitlines()[0] if str(longrepr[2]) else ""
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0][:500] if lines else ""


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome
        if report.when != "call" and outcome == "failed":
            outcome = "error"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        _RESULTS.append(
            {"nodeid": report.nodeid, "when": report.when, "outcome": outcome,
             "duration": round(report.duration, 3), "message": _first_line(report) if outcome != "passed" else ""}
        )


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["SB3_SUITES_REPORT"], "w") as f:
        json.dump({"results": _RESULTS, "patched": _sb3_suites_patch.PATCHED,
                   "constructed": _sb3_suites_patch.CONSTRUCTED, "exitstatus": int(exitstatus)}, f)
'''


def _versions() -> dict:
    import sb3_contrib
    import stable_baselines3
    import torch

    return {
        "python": sys.version.split()[0],
        "stable_baselines3": stable_baselines3.__version__,
        "sb3_contrib": sb3_contrib.__version__,
        "torch": torch.__version__,
    }


def _git_head(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "describe", "--tags", "--always"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def run_suite(suite: str, tests_dir: Path, files: list[str], mode: str, args: argparse.Namespace) -> dict:
    """Copy ``tests_dir`` into a temp dir with the patching conftest and run pytest on ``files``."""
    with tempfile.TemporaryDirectory(prefix=f"sb3_suites_{suite}_") as tmp:
        root = Path(tmp)
        shutil.copytree(tests_dir, root / "tests", ignore=shutil.ignore_patterns("__pycache__", "conftest.py"))
        (root / "pytest.ini").write_text(PYTEST_INI)
        (root / "_sb3_suites_patch.py").write_text(PATCH_MODULE)
        (root / "conftest.py").write_text(CONFTEST)
        report = root / "report.json"
        env = dict(os.environ, SB3_SUITES_MODE=mode, SB3_SUITES_REPORT=str(report), PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        env.setdefault("OMP_NUM_THREADS", "1")
        if args.all_algos:
            env["SB3_SUITES_ALL_ALGOS"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", f"--tb={args.tb}"]
        cmd += [f"tests/{name}" for name in files]
        if args.markers:
            cmd += ["-m", args.markers]
        if args.k:
            cmd += ["-k", args.k]
        print(f"[{suite}/{mode}] {' '.join(cmd[1:])}", flush=True)
        start = time.time()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            (args.log_dir / f"{suite}_{mode}.log").write_text(proc.stdout + proc.stderr)
        elapsed = time.time() - start
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print(f"[{suite}/{mode}] rc={proc.returncode} {elapsed:.0f}s: {' | '.join(tail)}", flush=True)
        if not report.exists():
            raise RuntimeError(f"pytest wrote no report (rc={proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
        data = json.loads(report.read_text())
    for result in data["results"]:
        result["nodeid"] = f"{suite}/{result['nodeid']}"
    return {
        "results": data["results"],
        "patched": data["patched"],
        "constructed": data["constructed"],
        "seconds": round(elapsed, 1),
        "rc": proc.returncode,
    }


def summarise(results: list[dict]) -> dict:
    per_file: dict[str, dict[str, int]] = {}
    for result in results:
        file = result["nodeid"].split("::")[0]
        counts = per_file.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0})
        outcome = {"error": "failed", "xfailed": "skipped", "xpassed": "passed"}.get(result["outcome"], result["outcome"])
        counts[outcome] = counts.get(outcome, 0) + 1
    total = {key: sum(c[key] for c in per_file.values()) for key in ("passed", "failed", "skipped")}
    return {"per_file": per_file, "total": total}


def failing(results: list[dict]) -> dict[str, str]:
    return {r["nodeid"]: r["message"] for r in results if r["outcome"] in ("failed", "error")}


def print_table(summary: dict, mode: str) -> None:
    width = max([len(f) for f in summary["per_file"]] + [10])
    print(f"\n{'file (' + mode + ')':<{width}}  passed  failed  skipped")
    for file, c in sorted(summary["per_file"].items()):
        print(f"{file:<{width}}  {c['passed']:>6}  {c['failed']:>6}  {c['skipped']:>7}")
    t = summary["total"]
    print(f"{'total':<{width}}  {t['passed']:>6}  {t['failed']:>6}  {t['skipped']:>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sb3-tests", type=Path, help="SB3's tests/ folder")
    parser.add_argument("--contrib-tests", type=Path, help="sb3-contrib's tests/ folder")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument(
        "--files", nargs="+", help="subset, as sb3/test_x.py or contrib/test_x.py (default: the 13 + 9 files above)"
    )
    parser.add_argument("-k", default=None, help="pytest -k expression applied to both suites")
    parser.add_argument("--markers", default="not expensive and not slow", help="pytest -m expression ('' = all)")
    parser.add_argument("--all-algos", action="store_true", help="keep cases parametrized with A2C/TD3/DDPG/ARS/TRPO")
    parser.add_argument("--compare", type=Path, help="baseline JSON (e.g. the unpatched run): list new failures")
    parser.add_argument("--tb", default="no", help="pytest --tb style (e.g. short, with --log-dir to read tracebacks)")
    parser.add_argument("--log-dir", type=Path, help="write each suite's pytest output to DIR/<suite>_<mode>.log")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    wanted = {"sb3": list(SB3_FILES), "contrib": list(CONTRIB_FILES)}
    if args.files:
        wanted = {"sb3": [], "contrib": []}
        for item in args.files:
            suite, _, name = item.partition("/")
            if suite not in wanted or not name:
                parser.error(f"--files entries look like sb3/test_run.py or contrib/test_run.py, got {item!r}")
            wanted[suite].append(name)
    dirs = {"sb3": args.sb3_tests, "contrib": args.contrib_tests}

    results: list[dict] = []
    runs = {}
    for suite, files in wanted.items():
        if not files:
            continue
        if dirs[suite] is None:
            parser.error(f"--{suite.replace('contrib', 'contrib')}-tests is needed for {files}")
        run = run_suite(suite, dirs[suite], files, args.mode, args)
        results += run.pop("results")
        runs[suite] = {"tests_dir": str(dirs[suite]), "source": _git_head(dirs[suite]), "files": files, **run}

    summary = summarise(results)
    out = {
        "mode": args.mode,
        "versions": _versions(),
        "selection": {"markers": args.markers, "k": args.k, "all_algos": args.all_algos},
        "runs": runs,
        "summary": summary,
        "failures": failing(results),
        "results": results,
    }
    if args.compare:
        base = json.loads(args.compare.read_text())
        base_outcome = {r["nodeid"]: r["outcome"] for r in base["results"]}
        out["new_failures"] = {
            nodeid: msg for nodeid, msg in out["failures"].items() if base_outcome.get(nodeid) not in ("failed", "error")
        }
        out["compared_to"] = str(args.compare)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")

    print_table(summary, args.mode)
    if out["failures"]:
        print("\nfailures:")
        for nodeid, msg in out["failures"].items():
            new = " [not in baseline]" if nodeid in out.get("new_failures", {}) else ""
            print(f"  {nodeid}{new}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
