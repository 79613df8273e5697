"""Every ``python`` block of the README runs as printed (issue #31), with each ``learn()`` capped at
:data:`CAP` timesteps so the suite stays fast: the blocks' API (imports, constructors, keywords, callbacks, save /
load, the files they read back) is checked here; what the full budgets print is recorded in the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

README = Path(__file__).resolve().parents[1] / "README.md"
#: timesteps each learn() call of a snippet is capped at (the continual snippet evaluates every 1 000)
CAP = 2_000


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_readme_has_its_three_python_blocks():
    blocks = python_blocks()
    assert len(blocks) == 3
    assert "SwitchingMinAtar" in blocks[0] and "FIRE(at=0.5)" in blocks[1] and "RandomLabelBandit" in blocks[2]


@pytest.mark.parametrize("index", range(3), ids=["intro", "interventions", "continual"])
def test_readme_python_block_runs(index, tmp_path, monkeypatch, capsys):
    for cls in (OnPolicyAlgorithm, OffPolicyAlgorithm):
        original = cls.learn

        def capped(self, total_timesteps, *args, _original=original, **kwargs):
            return _original(self, min(int(total_timesteps), CAP), *args, **kwargs)

        monkeypatch.setattr(cls, "learn", capped)
    monkeypatch.chdir(tmp_path)
    exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
    if index == 2:
        out = capsys.readouterr().out
        assert re.search(r"1000 timesteps  task 0  evaluation +\d+\.\d", out)
        assert (tmp_path / "model.zip").exists() and (tmp_path / "evals" / "evaluations.npz").exists()
