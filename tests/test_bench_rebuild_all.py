"""bench/rebuild_all.py: every results folder's rebuild command from its runs' recorded setting, and the byte-for-byte
check of a rebuild against the committed tables and figures (issue #29 part 5)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def rebuild_all():
    return load_bench("rebuild_all")


def test_flags_come_from_the_runs_recorded_setting(rebuild_all):
    default = asdict(rebuild_all.SETTINGS["slippery_ant_ppo"])
    assert rebuild_all.rebuild_flags("slippery_ant_ppo", default) == []
    longer = dict(default, change_every=125000, tasks=4, ppo=dict(default["ppo"], ent_coef=0.01, n_epochs=3))
    assert rebuild_all.rebuild_flags("slippery_ant_ppo", longer) == [
        "--tasks", "4", "--change-every", "125000", "--ppo-kwarg", "ent_coef=0.01", "--ppo-kwarg", "n_epochs=3"]
    missing = dict(default, ppo={k: v for k, v in default["ppo"].items() if k != "n_epochs"})
    with pytest.raises(ValueError, match="no algorithm keyword 'n_epochs'"):
        rebuild_all.rebuild_flags("slippery_ant_ppo", missing)


def _folder(rebuild_all, root: Path, name: str = "bandit_x") -> Path:
    """A results folder of the bandit setting with 6 tasks (not the default 10), 3 seeds of 2 methods, its
    runs recording that setting; tables and figures not built yet."""
    setting = replace(rebuild_all.SETTINGS["bandit"], tasks=6)
    rng = np.random.default_rng(3)
    folder = root / name
    for method, level in (("ppo", 0.5), ("ppo_l2", 0.8)):
        for seed in range(3):
            base = dict(method=method, seed=seed, device="cpu", wall_seconds=60.0, cpu_seconds=60.0,
                        setting=asdict(setting))
            scores = list(level * (0.8 + 0.01 * rng.standard_normal(6)))
            path = folder / "runs" / method / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(base, fresh_task=None, task=list(range(6)), end_reward=scores,
                                            end_return=scores, mean_reward=scores, diagnostics={})))
            for k in range(6):
                value = float(0.8 + 0.01 * rng.standard_normal())
                path = folder / "runs" / method / "fresh" / f"seed{seed}_task{k}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(dict(base, fresh_task=k, task=[k], end_reward=[value],
                                                end_return=[value], mean_reward=[value], diagnostics={})))
    return folder


def test_rebuild_then_check_finds_the_same_bytes_and_a_stale_file(rebuild_all, tmp_path, capsys):
    folder = _folder(rebuild_all, tmp_path)
    (folder / "summary.json").write_text(json.dumps({"setting": "bandit"}))  # a folder the tool lists
    assert rebuild_all.folder_command(str(folder))[-2:] == ["--tasks", "6"]
    assert rebuild_all.main(["--results", str(tmp_path)]) == 0
    assert "bandit_x: rebuilt" in capsys.readouterr().out
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["methods"]) == {"ppo", "ppo_l2"} and (folder / "end_of_task.png").exists()
    assert rebuild_all.main(["--results", str(tmp_path), "--check"]) == 0
    assert "bandit_x: the same, byte for byte" in capsys.readouterr().out
    # a stale table (a run added without a rebuild, or an edit by hand) is found and named
    (folder / "summary.md").write_text((folder / "summary.md").read_text() + "\n")
    assert rebuild_all.main(["--results", str(tmp_path), "--check", "--only", "bandit_x"]) == 1
    assert "bandit_x: DIFFERS: summary.md" in capsys.readouterr().out


def test_folders_without_runs_are_listed_and_unknown_names_refused(rebuild_all, tmp_path, capsys):
    old = tmp_path / "bandit_old"
    old.mkdir()
    (old / "summary.json").write_text(json.dumps({"setting": "bandit"}))
    assert rebuild_all.main(["--results", str(tmp_path), "--check"]) == 0
    assert "bandit_old: not rebuildable (no runs/" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        rebuild_all.main(["--results", str(tmp_path), "--only", "nope"])
    assert exc.value.code == 2
    assert "--only nope: no results folder with a summary.json; allowed: bandit_old" in capsys.readouterr().err
