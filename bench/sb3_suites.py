"""Run Stable-Baselines3's and sb3-contrib's own test files with the plastic classes patched in (issues #12, #31).

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

**Sources.** ``--sdists DIR`` takes the tests of the source distributions of the *installed* versions
(``stable_baselines3-<version>.tar.gz``, ``sb3_contrib-<version>.tar.gz`` in DIR; missing ones are fetched with
``pip download --no-deps --no-binary :all: <name>==<version>``); a version that differs from the installed one is
an error. ``--sb3-tests`` / ``--contrib-tests`` take a ``tests/`` folder instead. The JSON records the source of
each suite: the sdist's file name, sha256 and ``PKG-INFO`` version, or the folder (with its ``PKG-INFO`` version or
``git describe``).

**Selection.** Every test file that builds one of the eight replaced algorithms (its source names one of them);
the other files are listed in the JSON under ``excluded`` with the reason (no algorithm at all, or only A2C / TD3 /
DDPG / ARS / TRPO, which are not replaced). Within the files, parametrized cases whose parameters hold an algorithm
class that is not replaced are deselected in every mode (``--all-algos`` keeps them), and so are SB3's
``expensive`` (a >2 GB model) and sb3-contrib's ``slow`` (an LSTM CartPole performance run) tests (``--markers ""``
keeps them). The pytest options (``filterwarnings``, ``markers``) are the sdist's own ``[tool.pytest.ini_options]``.

**Order.** pytest-randomly (installed with the ``test`` extra) is switched off (``-p no:randomly``): the tests run
in the order of the file list and pytest's collection order within a file, the same in every mode, and the JSON
lists every test's outcome in that order. Some upstream tests depend on what ran before them (the global random
generators are not reseeded between tests without pytest-randomly), so an order-dependent upstream failure shows
in the unpatched run too.

**Which tests used a plastic model.** The conftest counts the models built through the replacement during each
test (setup, call and teardown), so the counts separate passes that built a plastic model from passes that never
did (tests of buffers, env wrappers, ...).

**Upstream failures.** ``--compare UNPATCHED.json`` (an unpatched run of the same selection, in the same order)
marks every failure that also fails unpatched as ``upstream``; a baseline with another test order is an error.
``--recheck`` reruns each failure that is not upstream alone, once unpatched and once in the mode, and records both
outcomes (an order-dependent flake passes alone).

Output: a JSON file with the selection, the versions, the sources, per-file counts and every test's outcome
(failures with the first line of the error), and a table on stdout. Run with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

MODES = ("unpatched", "defaults", "off", "maxmin")
SUITES = {"sb3": ("stable_baselines3", "stable-baselines3"), "contrib": ("sb3_contrib", "sb3-contrib")}
#: the algorithms the harness replaces, and the ones it does not
REPLACED_NAMES = ("PPO", "DQN", "SAC", "QRDQN", "TQC", "CrossQ", "RecurrentPPO", "MaskablePPO")
OTHER_NAMES = ("A2C", "TD3", "DDPG", "ARS", "TRPO")

# used when a tests folder has no pyproject.toml next to it (SB3's and sb3-contrib's options as of 2.9)
FALLBACK_INI = {
    "filterwarnings": [
        "ignore::DeprecationWarning:multiprocessing.popen_fork",
        "ignore:You are trying to run (PPO|A2C) on the GPU",
        "ignore::DeprecationWarning:tensorboard",
        "ignore::UserWarning:gymnasium",
        "ignore::DeprecationWarning:gymnasium.envs.registration",
        "ignore:rich is experimental",
    ],
    "markers": ["expensive: marks tests as expensive", "slow: marks tests as slow"],
}

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


def constructed_total():
    return sum(CONSTRUCTED.values())


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
_BUILT = {}  # nodeid -> models built through the replacement during the test (setup, call, teardown)


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _sb3_suites_patch.constructed_total()
    yield
    _BUILT[item.nodeid] = _sb3_suites_patch.constructed_total() - before


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
    for result in _RESULTS:
        result["built_plastic"] = _BUILT.get(result["nodeid"], 0)
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


def _pkg_info_version(text: str) -> str | None:
    match = re.search(r"^Version:\s*(\S+)", text, flags=re.MULTILINE)
    return match.group(1) if match else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sdist_tests(suite: str, sdists: Path, work: Path, version: str) -> tuple[Path, dict, dict]:
    """The ``tests`` folder, pytest options and source record of the sdist of ``suite`` at ``version`` (fetched with
    pip into ``sdists`` when it is not there), extracted under ``work``.

    :raises RuntimeError: when the sdist cannot be had or its ``PKG-INFO`` names another version.
    """
    module, dist = SUITES[suite]
    archive = sdists / f"{module}-{version}.tar.gz"
    if not archive.exists():
        sdists.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"{dist}=={version}",
               "-d", str(sdists)]
        print(f"[{suite}] fetching the sdist: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    if not archive.exists():
        raise RuntimeError(f"no {archive.name} in {sdists} after pip download")
    with tarfile.open(archive) as tar:
        infos = [m.name for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        if not infos:
            raise RuntimeError(f"{archive.name} has no top-level PKG-INFO: not an sdist")
        root = infos[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{root}/tests/") or m.name in
                   (f"{root}/PKG-INFO", f"{root}/pyproject.toml")]
        tar.extractall(work / suite, members=members, filter="data")
    base = work / suite / root
    found = _pkg_info_version((base / "PKG-INFO").read_text())
    if found != version:
        raise RuntimeError(f"{archive.name}: PKG-INFO says version {found}, the installed {module} is {version}")
    source = {"sdist": archive.name, "sha256": _sha256(archive), "version": found}
    return base / "tests", _ini_options(base / "pyproject.toml"), source


def folder_tests(tests_dir: Path) -> tuple[Path, dict, dict]:
    """A ``tests`` folder given on the command line: its pytest options (its parent's pyproject.toml) and source
    record (its parent's PKG-INFO version, else ``git describe``)."""
    parent = tests_dir.resolve().parent
    version = _pkg_info_version((parent / "PKG-INFO").read_text()) if (parent / "PKG-INFO").exists() else None
    source = {"folder": str(tests_dir), "version": version, "git": None if version else _git_head(tests_dir)}
    return tests_dir, _ini_options(parent / "pyproject.toml"), source


def _ini_options(pyproject: Path) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:
        tomllib = None
    if not pyproject.exists() or tomllib is None:
        return dict(FALLBACK_INI)
    options = tomllib.loads(pyproject.read_text()).get("tool", {}).get("pytest", {}).get("ini_options", {})
    return {key: list(options.get(key, [])) for key in ("filterwarnings", "markers")}


def pytest_ini(options: dict, markers: str) -> str:
    """A pytest.ini with the suite's ``filterwarnings`` and ``markers`` (plus the markers the selection uses)."""
    names = {m.split(":")[0].strip() for m in options.get("markers", [])}
    extra = [f"{m}: (declared by bench/sb3_suites.py)" for m in re.findall(r"[A-Za-z_]+", markers)
             if m not in {"not", "and", "or"} and m not in names]
    lines = ["[pytest]", "filterwarnings ="]
    lines += [f"    {entry}" for entry in options.get("filterwarnings", [])]
    lines += ["markers ="] + [f"    {entry}" for entry in [*options.get("markers", []), *extra]]
    return "\n".join(lines) + "\n"


def select_files(tests_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The test files that build one of the replaced algorithms (their source names one), sorted; and every other
    ``test_*.py`` with the reason it is left out."""
    included, excluded = [], {}
    for path in sorted(tests_dir.glob("test_*.py")):
        text = path.read_text()
        if any(re.search(rf"\b{name}\b", text) for name in REPLACED_NAMES):
            included.append(path.name)
            continue
        others = [name for name in OTHER_NAMES if re.search(rf"\b{name}\b", text)]
        excluded[path.name] = (
            f"builds only {' / '.join(others)}, which the harness does not replace" if others
            else "builds no algorithm (no algorithm class is named in the file)"
        )
    return included, excluded


def run_pytest(suite: str, tests_dir: Path, ini: str, nodes: list[str], mode: str, args: argparse.Namespace,
               label: str) -> dict:
    """Copy ``tests_dir`` into a temp dir with the patching conftest and run pytest on ``nodes`` (files or node ids,
    relative to ``tests/``), in that order."""
    with tempfile.TemporaryDirectory(prefix=f"sb3_suites_{suite}_") as tmp:
        root = Path(tmp)
        shutil.copytree(tests_dir, root / "tests", ignore=shutil.ignore_patterns("__pycache__", "conftest.py"))
        (root / "pytest.ini").write_text(ini)
        (root / "_sb3_suites_patch.py").write_text(PATCH_MODULE)
        (root / "conftest.py").write_text(CONFTEST)
        report = root / "report.json"
        env = dict(os.environ, SB3_SUITES_MODE=mode, SB3_SUITES_REPORT=str(report), PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        env.setdefault("OMP_NUM_THREADS", "1")
        if args.all_algos:
            env["SB3_SUITES_ALL_ALGOS"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rN",
               f"--tb={args.tb}"]
        cmd += [f"tests/{node}" for node in nodes]
        if args.markers:
            cmd += ["-m", args.markers]
        if args.k:
            cmd += ["-k", args.k]
        shown = cmd[1:] if len(cmd) < 40 else [*cmd[1:12], f"... ({len(nodes)} nodes)"]
        print(f"[{suite}/{mode}{label}] {' '.join(shown)}", flush=True)
        start = time.time()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            (args.log_dir / f"{suite}_{mode}{label}.log").write_text(proc.stdout + proc.stderr)
        elapsed = time.time() - start
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print(f"[{suite}/{mode}{label}] rc={proc.returncode} {elapsed:.0f}s: {' | '.join(tail)}", flush=True)
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


def _outcome(result: dict) -> str:
    return {"error": "failed", "xfailed": "skipped", "xpassed": "passed"}.get(result["outcome"], result["outcome"])


def summarise(results: list[dict]) -> dict:
    """Per-file and total counts; passes split by whether the test built a model through the replacement."""
    per_file: dict[str, dict[str, int]] = {}
    for result in results:
        file = result["nodeid"].split("::")[0]
        counts = per_file.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0, "passed_plastic": 0})
        outcome = _outcome(result)
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "passed" and result.get("built_plastic", 0) > 0:
            counts["passed_plastic"] += 1
    keys = ("passed", "failed", "skipped", "passed_plastic")
    total = {key: sum(c[key] for c in per_file.values()) for key in keys}
    total["built_plastic"] = len({r["nodeid"] for r in results if r.get("built_plastic", 0) > 0})
    return {"per_file": per_file, "total": total}


def failing(results: list[dict]) -> dict[str, str]:
    return {r["nodeid"]: r["message"] for r in results if r["outcome"] in ("failed", "error")}


def test_order(results: list[dict]) -> list[str]:
    """The node ids in the order they ran (each once)."""
    return list(dict.fromkeys(r["nodeid"] for r in results))


def mark_upstream(out: dict, base: dict) -> None:
    """Mark the failures that also fail in the unpatched baseline ``base`` (same selection, same order)."""
    if test_order(base["results"]) != test_order(out["results"]):
        raise SystemExit(
            "--compare: the baseline ran other tests or another order; rerun the unpatched mode with the same "
            "sources, files and options"
        )
    base_failed = set(failing(base["results"]))
    for result in out["results"]:
        if result["outcome"] in ("failed", "error"):
            result["upstream"] = result["nodeid"] in base_failed
    out["upstream_failures"] = sorted(n for n in out["failures"] if n in base_failed)
    out["new_failures"] = {n: m for n, m in out["failures"].items() if n not in base_failed}


def print_table(summary: dict, mode: str) -> None:
    width = max([len(f) for f in summary["per_file"]] + [10])
    print(f"\n{'file (' + mode + ')':<{width}}  passed  (plastic)  failed  skipped")
    for file, c in sorted(summary["per_file"].items()):
        print(f"{file:<{width}}  {c['passed']:>6}  {c['passed_plastic']:>9}  {c['failed']:>6}  {c['skipped']:>7}")
    t = summary["total"]
    print(f"{'total':<{width}}  {t['passed']:>6}  {t['passed_plastic']:>9}  {t['failed']:>6}  {t['skipped']:>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdists", type=Path, help="folder of the installed versions' sdists (fetched if missing)")
    parser.add_argument("--sb3-tests", type=Path, help="SB3's tests/ folder (instead of --sdists)")
    parser.add_argument("--contrib-tests", type=Path, help="sb3-contrib's tests/ folder (instead of --sdists)")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--files", nargs="+", help="subset, as sb3/test_x.py or contrib/test_x.py (default: every file "
                        "that builds a replaced algorithm)")
    parser.add_argument("-k", default=None, help="pytest -k expression applied to both suites")
    parser.add_argument("--markers", default="not expensive and not slow", help="pytest -m expression ('' = all)")
    parser.add_argument("--all-algos", action="store_true", help="keep cases parametrized with A2C/TD3/DDPG/ARS/TRPO")
    parser.add_argument("--compare", type=Path, help="unpatched JSON of the same selection: marks upstream failures")
    parser.add_argument("--recheck", action="store_true", help="rerun each non-upstream failure alone, unpatched and "
                        "in the mode")
    parser.add_argument("--tb", default="no", help="pytest --tb style (e.g. short, with --log-dir to read tracebacks)")
    parser.add_argument("--log-dir", type=Path, help="write each suite's pytest output to DIR/<suite>_<mode>.log")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.sdists is None and args.sb3_tests is None and args.contrib_tests is None:
        parser.error("give --sdists DIR (recommended) or --sb3-tests / --contrib-tests")

    versions = _versions()
    wanted: dict[str, list[str] | None] = {"sb3": None, "contrib": None}
    if args.files:
        wanted = {"sb3": [], "contrib": []}
        for item in args.files:
            suite, _, name = item.partition("/")
            if suite not in wanted or not name:
                parser.error(f"--files entries look like sb3/test_run.py or contrib/test_run.py, got {item!r}")
            wanted[suite].append(name)  # type: ignore[union-attr]

    results: list[dict] = []
    runs = {}
    with tempfile.TemporaryDirectory(prefix="sb3_suites_src_") as work:
        sources = {}
        for suite, folder in (("sb3", args.sb3_tests), ("contrib", args.contrib_tests)):
            if wanted[suite] == []:
                continue
            if folder is not None:
                sources[suite] = folder_tests(folder)
            elif args.sdists is not None:
                sources[suite] = sdist_tests(suite, args.sdists, Path(work), versions[SUITES[suite][0]])
        for suite, (tests_dir, options, source) in sources.items():
            included, excluded = select_files(tests_dir)
            files = wanted[suite] if wanted[suite] is not None else included
            ini = pytest_ini(options, args.markers or "")
            run = run_pytest(suite, tests_dir, ini, files, args.mode, args, "")
            run_results = run.pop("results")
            results += run_results
            runs[suite] = {"source": source, "files": files, "excluded": excluded if wanted[suite] is None else {},
                           "ini": options, **run}
        out = {
            "mode": args.mode,
            "versions": versions,
            "selection": {"markers": args.markers, "k": args.k, "all_algos": args.all_algos,
                          "order": "files as listed, pytest's collection order within a file; -p no:randomly"},
            "runs": runs,
            "summary": summarise(results),
            "failures": failing(results),
            "results": results,
        }
        if args.compare:
            mark_upstream(out, json.loads(args.compare.read_text()))
            out["compared_to"] = str(args.compare)
        if args.recheck and args.mode != "unpatched":
            out["rechecked"] = recheck(out, sources, args)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")

    print_table(out["summary"], args.mode)
    if out["failures"]:
        print("\nfailures:")
        for nodeid, msg in out["failures"].items():
            tag = ""
            if "new_failures" in out:
                tag = " [upstream: fails unpatched too]" if nodeid not in out["new_failures"] else " [not in baseline]"
            again = out.get("rechecked", {}).get(nodeid)
            if again:
                tag += f" [alone: unpatched {again['unpatched']}, {args.mode} {again[args.mode]}]"
            print(f"  {nodeid}{tag}: {msg}")
    return 0


def recheck(out: dict, sources: dict, args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Each failure that is not upstream, run alone unpatched and in the mode: ``{nodeid: {mode: outcome}}``."""
    pending = out.get("new_failures", out["failures"])
    checked: dict[str, dict[str, str]] = {}
    for nodeid in pending:
        suite, _, node = nodeid.partition("/")
        tests_dir, options, _ = sources[suite]
        ini = pytest_ini(options, args.markers or "")
        node = node.removeprefix("tests/")
        checked[nodeid] = {}
        for mode in ("unpatched", args.mode):
            run = run_pytest(suite, tests_dir, ini, [node], mode, args, "_alone")
            outcomes = [r["outcome"] for r in run["results"] if r["nodeid"] == nodeid]
            failed = {"failed", "error"} & set(outcomes)
            checked[nodeid][mode] = "failed" if failed else (outcomes[0] if outcomes else "not run")
    return checked


if __name__ == "__main__":
    sys.exit(main())
