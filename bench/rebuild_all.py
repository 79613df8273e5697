"""Rebuild the tables and figures of every results folder of ``bench/continual.py`` from its committed run JSONs,
or check that a rebuild gives the committed files byte for byte (issue #29 part 5: "a fresh clone rebuilds every
table"). Each folder's flags come from its runs' own recorded setting: the task length (``--change-every``), the
number of tasks (``--tasks``) and every algorithm keyword that differs from the setting's default
(``--ppo-kwarg``), so a folder like ``slippery_ant_ppo_500k`` or ``cartpole_obs_ent0.01`` needs no hand-written
command.

    python bench/rebuild_all.py                 # rebuild every folder in place (minutes per folder)
    python bench/rebuild_all.py --check         # rebuild each in a scratch copy, compare, exit 1 on a difference
    python bench/rebuild_all.py --check --only cartpole_obs minatar_intensive

A folder without ``runs/`` (written before the run JSONs were committed) is listed as not rebuildable; the six of
the old bandit protocol, superseded by issue #14's, are kept for the record under ``superseded_bandit/``, which this
tool does not read. A folder whose summary.json is missing has no finished run yet.
"""

from __future__ import annotations

import argparse
import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from continual_settings import SETTINGS

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "continual")
#: what a rebuild writes at the top of a folder (``plots/`` of ``--tb-plots`` needs the uncommitted events)
OUTPUTS = ("summary.json", "summary.md", "end_of_task.png", "plasticity.png", "diagnostics.png")


def rebuild_flags(setting_name: str, recorded: dict[str, Any]) -> list[str]:
    """The ``bench/continual.py`` flags that give ``setting_name``'s setting the task geometry and algorithm
    keywords of a run's ``recorded`` setting (the ``setting`` of its JSON)."""
    default = asdict(SETTINGS[setting_name])
    flags: list[str] = []
    for field, flag in (("tasks", "--tasks"), ("change_every", "--change-every")):
        if field in recorded and recorded[field] != default[field]:
            flags += [flag, str(recorded[field])]
    for key, value in sorted(recorded.get("ppo", {}).items()):
        if default["ppo"].get(key, object()) != value:
            flags += ["--ppo-kwarg", f"{key}={json.dumps(value)}"]
    for key in sorted(set(default["ppo"]) - set(recorded.get("ppo", {}))):
        raise ValueError(f"the runs' setting has no algorithm keyword {key!r} that {setting_name!r} sets: no flag "
                         "removes a keyword")
    return flags


def folder_command(folder: str) -> Optional[list[str]]:
    """``bench/continual.py``'s arguments that rebuild ``folder``; ``None`` when it holds no run JSON."""
    with open(os.path.join(folder, "summary.json")) as f:
        setting_name = json.load(f)["setting"]
    runs = sorted(glob.glob(os.path.join(folder, "runs", "*", "seed*.json")))
    if not runs:
        return None
    with open(runs[0]) as f:
        recorded = json.load(f).get("setting")
    flags = rebuild_flags(setting_name, recorded) if isinstance(recorded, dict) else []
    return ["--setting", setting_name, "--out", folder, "--plot-only", *flags]


def rebuild(args: list[str]) -> None:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "continual.py")
    subprocess.run([sys.executable, script, *args], check=True, stdout=subprocess.DEVNULL)


def check(folder: str, args: list[str]) -> list[str]:
    """Rebuild a scratch copy of ``folder`` (its runs only) and return the outputs that differ from the committed
    ones (a committed output the rebuild does not write counts as differing)."""
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copytree(os.path.join(folder, "runs"), os.path.join(scratch, "runs"))
        rebuild([scratch if a == folder else a for a in args])
        return [name for name in OUTPUTS if os.path.exists(os.path.join(folder, name))
                and not (os.path.exists(os.path.join(scratch, name))
                         and filecmp.cmp(os.path.join(folder, name), os.path.join(scratch, name), shallow=False))]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare a scratch rebuild with the committed files")
    p.add_argument("--only", nargs="+", metavar="FOLDER", help="folder names under bench/results/continual/")
    p.add_argument("--results", default=RESULTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    folders = sorted(os.path.dirname(s) for s in glob.glob(os.path.join(args.results, "*", "summary.json")))
    if args.only:
        known = {os.path.basename(f): f for f in folders}
        wrong = [name for name in args.only if name not in known]
        if wrong:
            p.error(f"--only {' '.join(wrong)}: no results folder with a summary.json; allowed: {', '.join(known)}")
        folders = [known[name] for name in args.only]
    differing = 0
    for folder in folders:
        command = folder_command(folder)
        name = os.path.basename(folder)
        if command is None:
            print(f"{name}: not rebuildable (no runs/: written before the run JSONs were committed)", flush=True)
            continue
        shown = " ".join(a if a != folder else os.path.relpath(folder) for a in command)
        if not args.check:
            rebuild(command)
            print(f"{name}: rebuilt (bench/continual.py {shown})", flush=True)
            continue
        diff = check(folder, command)
        differing += bool(diff)
        print(f"{name}: " + (f"DIFFERS: {', '.join(diff)}" if diff else "the same, byte for byte")
              + f" (bench/continual.py {shown})", flush=True)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
