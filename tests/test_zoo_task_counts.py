"""Every continual zoo_configs/ entry gives the number of tasks its comment states, and the unit behind the count.

A continual entry is one whose gymnasium id is made by a function taking ``change_every`` (the
``sb3_plastic/...`` piecewise-stationary envs). ``change_every`` counts env steps of each of the ``n_envs``
copies, so the entry's run sees ``n_timesteps / (change_every * n_envs)`` tasks (rl_zoo3's default ``n_envs``
is 1). The count stated in the comment on the entry's ``n_timesteps`` line (``# 20 tasks of ...``) must equal
it, be a whole number, and be at least 2. Short real runs (a vector env, and ``sb3-plastic train`` with and
without ``-i``) check that the formula is what the copies actually do.
"""

from __future__ import annotations

import csv
import inspect
import re
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from gymnasium.envs.registration import load_env_creator
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic import PlasticPPO, zoo

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "zoo_configs"
STATED = re.compile(r"^\s+n_timesteps:.*#\s*(\d+) tasks\b")
BANDIT = "sb3_plastic/RandomLabelBandit-v0"


def _change_every_default(env_id: str):
    """The ``change_every`` default of the id's maker; ``None`` when the id is not continual."""
    if env_id not in gym.registry:
        return None
    spec = gym.registry[env_id]
    maker = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    parameter = inspect.signature(maker).parameters.get("change_every")
    if parameter is None:
        return None
    return spec.kwargs.get("change_every", parameter.default)


def _stated_counts(text: str) -> dict[str, list[int]]:
    """``{entry: [task counts stated on its n_timesteps line]}`` from the yaml text (comments are not yaml)."""
    counts: dict[str, list[int]] = {}
    entry = None
    for line in text.splitlines():
        top = re.match(r"^([^\s#][^:]*):\s*(#.*)?$", line)
        if top:
            entry = top.group(1).strip().strip("'\"")
            counts.setdefault(entry, [])
            continue
        match = STATED.match(line)
        if match and entry is not None:
            counts[entry].append(int(match.group(1)))
    return counts


def _continual_entries() -> list[tuple[str, str, dict, list[int]]]:
    found = []
    for path in sorted(CONFIGS.glob("*.yml")):
        text = path.read_text()
        config = yaml.load(text, Loader=yaml.UnsafeLoader)  # as rl_zoo3 reads it
        stated = _stated_counts(text)
        for env_id, entry in config.items():
            if "change_every" in (entry.get("env_kwargs") or {}) or _change_every_default(env_id) is not None:
                found.append((path.name, env_id, entry, stated.get(env_id, [])))
    return found


ENTRIES = _continual_entries()


def test_the_continual_entries_are_found():
    # 11 + the baselines of #15 (3) + PerturbedCartPole + the field's methods of #30 (7) + Perturbed Acrobot and
    # LunarLander (#29) + weight clipping on Slippery Ant (#30) + S&P at every switch on QR-DQN's permuted SpaceInvaders
    assert len(ENTRIES) == 26
    for path in CONFIGS.glob("*.yml"):  # every sb3_plastic/ id but the stationary masking env is continual
        for env_id in yaml.load(path.read_text(), Loader=yaml.UnsafeLoader):
            if env_id.startswith("sb3_plastic/") and env_id != "sb3_plastic/InvalidActionDiscrete-v0":
                assert (path.name, env_id) in {(name, e) for name, e, _, _ in ENTRIES}
    ids = {(name, env_id) for name, env_id, _, _ in ENTRIES}
    assert ("plastic_ppo.yml", "sb3_plastic/PermutedMinAtar-Breakout-v0") in ids
    assert ("plastic_ppo.yml", "sb3_plastic/SwitchingAtari-v0") in ids  # no change_every in old entry: the default counts
    assert ("plastic_sac.yml", "sb3_plastic/SlipperyHalfCheetah-v0") in ids


@pytest.mark.parametrize("name, env_id, entry, stated", ENTRIES, ids=[f"{e[0]}:{e[1]}" for e in ENTRIES])
def test_entry_gives_the_stated_task_count(name, env_id, entry, stated):
    change_every = (entry.get("env_kwargs") or {}).get("change_every", _change_every_default(env_id))
    n_envs = entry.get("n_envs", 1)
    tasks = float(entry["n_timesteps"]) / (float(change_every) * n_envs)
    assert len(stated) == 1, f"{name} [{env_id}]: state the task count as '# N tasks' on the n_timesteps line"
    assert tasks == stated[0], f"{name} [{env_id}]: {entry['n_timesteps']} / ({change_every} x {n_envs}) = {tasks}"
    assert tasks >= 2


def test_stated_count_parser():
    text = "a/B-v0:\n  n_envs: 8\n  n_timesteps: !!float 2e7   # 20 tasks of 1M timesteps\nC-v1:\n  n_timesteps: 5\n"
    assert _stated_counts(text) == {"a/B-v0": [20], "C-v1": []}


class TaskRecorder(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: set = set()

    def _on_step(self) -> bool:
        self.tasks.update(info["task_id"] for info in self.locals["infos"])
        return True


def test_formula_matches_a_vector_env_run():
    """n_timesteps / (change_every * n_envs) tasks: 36 / (4 * 3) = 3 with 3 copies, where one copy would see 9."""
    env = make_vec_env(BANDIT, n_envs=3, seed=0, env_kwargs=dict(change_every=4, n_contexts=8, obs_dim=4))
    recorder = TaskRecorder()
    PPO("MlpPolicy", env, n_steps=4, batch_size=12, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0,
        device="cpu").learn(36, callback=recorder)
    assert recorder.tasks == set(range(36 // (4 * 3)))


def _monitor_task_ids(run: Path) -> list[list[int]]:
    """``task_id`` of every finished episode, per env copy, from rl_zoo3's Monitor files."""
    rows = []
    for path in sorted(run.glob("*.monitor.csv")):
        with path.open() as f:
            f.readline()  # the Monitor's json header
            rows.append([int(float(r["task_id"])) for r in csv.DictReader(f)])
    return rows


def test_zoo_run_and_continued_run_see_the_stated_tasks(tmp_path, monkeypatch):
    """A yaml entry run through ``sb3-plastic train``: 3 copies, change_every 4, 36 timesteps -> 3 tasks (episodes
    of 2 steps, so Monitor logs the task of every second step of each copy). Continued with ``-i`` for 24
    more timesteps, the run goes on from num_timesteps 36 with tasks 3 and 4, not task 0."""
    monkeypatch.chdir(tmp_path)
    zoo.register()
    entry = {
        "n_envs": 3,
        "n_timesteps": 36,
        "policy": "MlpPolicy",
        "n_steps": 4,
        "batch_size": 12,
        "n_epochs": 1,
        "policy_kwargs": "dict(net_arch=[8])",
        "env_kwargs": {"change_every": 4, "n_contexts": 8, "obs_dim": 4, "episode_length": 2},
        "monitor_kwargs": "dict(info_keywords=('task_id',))",
    }
    conf = tmp_path / "conf.yml"
    conf.write_text(yaml.safe_dump({BANDIT: entry}).replace("n_timesteps: 36\n", "n_timesteps: 36  # 3 tasks\n"))
    assert _stated_counts(conf.read_text())[BANDIT] == [3]
    base = ["--num-threads", "1", "--verbose", "0", "--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(conf),
            "--eval-freq", "-1", "-f", "logs", "--seed", "0"]
    zoo.train(base)
    name = BANDIT.replace("/", "-")  # rl_zoo3's folder and file names
    run = tmp_path / "logs" / "plastic_ppo" / f"{name}_1"
    per_copy = _monitor_task_ids(run)
    assert len(per_copy) == 3
    # episode j of a copy ends at its step 2j+1: task (2j+1) // 4
    assert all(ids == [(2 * j + 1) // 4 for j in range(6)] for ids in per_copy)
    assert {t for ids in per_copy for t in ids} == set(range(3))

    model_path = run / f"{name}.zip"
    zoo.train([*base, "-i", str(model_path), "-n", "24"])
    second = tmp_path / "logs" / "plastic_ppo" / f"{name}_2"
    continued = PlasticPPO.load(second / f"{name}.zip", device="cpu")
    assert continued.num_timesteps == 60
    per_copy = _monitor_task_ids(second)
    # the copies resume at their step 12 (num_timesteps 36 // 3): episode j ends at step 12 + 2j + 1
    assert all(ids == [(13 + 2 * j) // 4 for j in range(4)] for ids in per_copy)
    assert sorted({t for ids in per_copy for t in ids}) == [3, 4]
