"""Task switches seen through vector envs (audit): several env copies, copies that switch at different steps
(``at_episode_end=True``), DummyVecEnv against SubprocVecEnv, SB3's vector-env wrappers on top, task ids that come
back, and per-task returns of episodes that straddle a switch.

The toy env: copy ``i`` has episodes of a fixed length ``L_i`` and a reward of 1 per step, so with
``at_episode_end=True`` each copy switches at its own first reset at or after ``k * change_every`` steps, at steps
that can be computed by hand (:func:`_switch_steps`). An intervention "at every task switch" acts once per task
switch (at the first copy that reports the new task), not once per copy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor, VecNormalize, VecTransposeImage
from test_task_schedule_resume import TaskRecorder  # (num_timesteps, task ids of the copies) per step

from sb3_plastic import FIRE, LayerReset, PlasticityMonitor, PlasticPPO, ShrinkPerturb, TaskScheduleSync
from sb3_plastic.callbacks.base import TaskChangeWatch
from sb3_plastic.envs import ChannelPermutation, PiecewiseStationaryWrapper

PPO_KWARGS = dict(n_steps=4, batch_size=8, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")
DQN_KWARGS = dict(learning_starts=1000, buffer_size=200, batch_size=8, policy_kwargs=dict(net_arch=[8]), seed=0,
                  device="cpu")
LENGTHS = (3, 5)  # episode length of copy 0 and copy 1
CHANGE_EVERY = 6  # env steps of each copy


class Episodic(gym.Env):
    """Episodes of ``length`` steps, reward 1 per step (return = ``length``), a constant observation."""

    metadata: ClassVar[dict] = {"render_modes": []}
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int) -> None:
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= self.length, False, {}


def _copy(length: int, at_episode_end: bool = True, change_every: int = CHANGE_EVERY) -> gym.Env:
    return Monitor(PiecewiseStationaryWrapper(Episodic(length), change_every, at_episode_end=at_episode_end))


def _vec(lengths=LENGTHS, cls=DummyVecEnv, **kwargs: Any):
    fns = [lambda n=n: _copy(n) for n in lengths]
    return cls(fns, **kwargs)


def _switch_steps(length: int, change_every: int, steps: int) -> dict[int, int]:
    """``task -> step index`` at which a copy with episodes of ``length`` starts that task (``at_episode_end``)."""
    out: dict[int, int] = {}
    for start in range(0, steps, length):  # the resets after 0, L, 2L, ... steps
        out.setdefault(start // change_every, start)
    return out


def _first_timesteps(n_envs: int, steps: int) -> list[int]:
    """Model timesteps (``2 (n + 1)`` with 2 copies) at which the first copy reports each new task."""
    per_copy = [_switch_steps(n, CHANGE_EVERY, steps) for n in LENGTHS]
    tasks = sorted(set().union(*per_copy) - {0})
    return [n_envs * (min(s[k] for s in per_copy if k in s) + 1) for k in tasks]


class Capture(KVWriter):
    """Every dump as ``(step, {key: value})``."""

    def __init__(self) -> None:
        self.dumps: list[tuple[int, dict[str, Any]]] = []

    def write(self, key_values, key_excluded, step=0) -> None:
        self.dumps.append((step, dict(key_values)))

    def close(self) -> None:
        pass


def _logged(capture: Capture, prefix: str) -> list[tuple[int, str, float]]:
    return [(s, k, v) for s, kv in capture.dumps for k, v in kv.items() if k.startswith(prefix)]


# ------------------------------------------------------------------------------------------------ the toy schedule
def test_copies_switch_at_their_own_episode_ends():
    """The reference of the tests below: copy 0 (episodes of 3) starts task k at step 6k, copy 1 (episodes of 5)
    at its first reset at or after 6k: 10, 15, 20; model timesteps 2 (n + 1)."""
    recorder = TaskRecorder()
    DQN("MlpPolicy", _vec(), **DQN_KWARGS).learn(40, callback=recorder)
    ids = np.array([row[1] for row in recorder.rows])
    assert [int(np.argmax(ids[:, 0] == k)) for k in (1, 2, 3)] == [6, 12, 18]
    assert [int(np.argmax(ids[:, 1] == k)) for k in (1, 2)] == [10, 15] and ids[:, 1].max() == 2
    assert _switch_steps(5, CHANGE_EVERY, 20) == {0: 0, 1: 10, 2: 15}
    assert _first_timesteps(2, 20) == [14, 26, 38]


# ------------------------------------------------------------------------------------------------ TaskChangeWatch
def test_watch_acts_once_per_switch_when_copies_switch_at_different_steps():
    watch = TaskChangeWatch("X on_task_change=True", "act")
    state: dict = {}
    seq = [(0, 0), (1, 0), (1, 0), (1, 1), (2, 1), (2, 2), (2, 2)]
    assert [watch.changed([{"task_id": a}, {"task_id": b}], state) for a, b in seq] == [
        False, True, False, False, True, False, False]
    # the lagging copy leads the next switch: still one event
    assert [watch.changed([{"task_id": a}, {"task_id": b}], state) for a, b in [(2, 3), (3, 3)]] == [True, False]


def test_watch_sees_a_task_that_comes_back_and_a_copy_that_skips_a_task():
    watch = TaskChangeWatch("X", "act")
    state: dict = {}
    # ids A -> B -> A (a cycle of games named by the user): every switch acts once, the return to A too
    seq = [("A", "A"), ("B", "A"), ("B", "B"), ("A", "B"), ("A", "A"), ("B", "A")]
    assert [watch.changed([{"task_id": a}, {"task_id": b}], state) for a, b in seq] == [
        False, True, False, True, False, True]
    # a copy whose long episode jumped over a task (at_episode_end) does not act again when it catches up
    state = {}
    seq = [(0, 0), (1, 0), (2, 0), (2, 2), (3, 2), (3, 3)]
    assert [watch.changed([{"task_id": a}, {"task_id": b}], state) for a, b in seq] == [
        False, True, True, False, True, False]


def test_watch_in_lockstep_and_one_copy():
    watch = TaskChangeWatch("X", "act")
    state: dict = {}
    assert [watch.changed([{"task_id": k}] * 3, state) for k in (0, 0, 1, 1, 2)] == [False, False, True, False, True]
    state = {}
    assert [watch.changed([{"task_id": k}], state) for k in (0, 1, 0, 0)] == [False, True, True, False]


def test_watch_reads_a_state_saved_before_the_switch_counts():
    """A model saved by an earlier version keeps only ``task_ids``: its counts start at the load."""
    watch = TaskChangeWatch("X", "act")
    state = {"task_ids": [0, 0]}
    assert [watch.changed([{"task_id": a}, {"task_id": b}], state) for a, b in [(1, 0), (1, 1), (2, 1)]] == [
        True, False, True]
    assert state["task_changes"] == [2, 1]


# ------------------------------------------------------------------------------------------------ interventions
def test_off_policy_fire_once_per_switch_with_at_episode_end():
    fire = FIRE(on_task_change=True)
    DQN("MlpPolicy", _vec(), **DQN_KWARGS).learn(40, callback=fire)
    # copy 0 reaches tasks 1, 2, 3 at timesteps 14, 26, 38; copy 1's own switches (22, 32) are the same switches
    assert fire.fired_at == [14, 26, 38] == _first_timesteps(2, 20)


def test_on_policy_interventions_once_per_switch_with_at_episode_end():
    """PPO rollouts of 8 timesteps: copy 0 reports its switches at 14, 26, 38; the first and last start mid-rollout
    (its resets at 12 and 36) and act at the next rollout start (16) and at the end (40); the second starts with the
    rollout at 24 (copy 0's episode ended at its last step, so the reset already ran the new task) and acts at its
    start, 24 (``TaskChangeWatch.changed_before_rollout``). Copy 1's later switches (22: alone in the rollout
    16..24) do not act again."""
    fire, reset = FIRE(on_task_change=True), LayerReset(1, on_task_change=True)
    sp = ShrinkPerturb(mode="event", on_task_change=True)
    PPO("MlpPolicy", _vec(), **PPO_KWARGS).learn(40, callback=[fire, reset, sp])
    assert fire.fired_at == [16, 24, 40]
    assert reset.event_timesteps == [16, 24, 40]
    assert sp.state["events"] == 3 and not sp.state["pending"]


def test_churn_reduction_restarts_its_coefficient_once_per_switch():
    from sb3_plastic import ChurnReduction

    churn = ChurnReduction()
    calls = []
    model = PPO("MlpPolicy", _vec(), **PPO_KWARGS)
    original = churn._task_watch.changed

    def counting(infos, state):
        changed = original(infos, state)
        calls.append(changed)
        return changed

    churn._task_watch.changed = counting
    model.learn(40, callback=churn)
    assert sum(calls) == 3  # three switches, not five copy switches


@pytest.mark.parametrize("start_method", ["fork"])
def test_subproc_vec_env_gives_the_task_ids_and_events_of_dummy_vec_env(start_method):
    rows, fired = [], []
    for cls, kwargs in ((DummyVecEnv, {}), (SubprocVecEnv, dict(start_method=start_method))):
        env = _vec(cls=cls, **kwargs)
        recorder, fire = TaskRecorder(), FIRE(on_task_change=True)
        DQN("MlpPolicy", env, **DQN_KWARGS).learn(24, callback=[recorder, fire])
        env.close()
        rows.append(recorder.rows)
        fired.append(fire.fired_at)
    assert rows[0] == rows[1]
    assert all(type(i) is int for _, ids in rows[1] for i in ids)  # plain ints through the pipes
    assert fired[0] == fired[1] == [14]


# ------------------------------------------------------------------------------------------------ wrappers on top
class Image(gym.Env):
    """A 6x6 image of 3 channels valued 0, 1, 2 (channel-last uint8), episodes of 4 steps, reward 1."""

    metadata: ClassVar[dict] = {"render_modes": []}
    observation_space = spaces.Box(0, 255, (6, 6, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0
        self.frame = np.broadcast_to(np.arange(3, dtype=np.uint8), (6, 6, 3)).copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.frame.copy(), {}

    def step(self, action):
        self.t += 1
        return self.frame.copy(), 1.0, self.t >= 4, False, {}


def _image_copy() -> gym.Env:
    return ChannelPermutation(Image(), change_every=5, task_seed=2)


def _wrapped(n_envs: int = 2):
    venv = VecMonitor(DummyVecEnv([_image_copy] * n_envs))
    return VecTransposeImage(VecNormalize(venv, norm_obs=False, norm_reward=True))


def test_schedule_sync_and_task_ids_through_vecmonitor_vecnormalize_vectransposeimage(tmp_path):
    model = PPO("MlpPolicy", _wrapped(), **PPO_KWARGS)
    fire = FIRE(on_task_change=True)
    model.learn(24, callback=[TaskScheduleSync(), fire])
    assert fire.fired_at == [16, 24]  # switches at 12 and 22 (copy step 5, 10), between rollouts of 8
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=_wrapped(), device="cpu")
    sync, recorder = TaskScheduleSync(), TaskRecorder()
    first_obs = []

    class FirstObs(BaseCallback):
        def _on_step(self) -> bool:
            if not first_obs:
                first_obs.append(self.locals["obs_tensor"].numpy().copy())
            return True

    loaded.learn(16, callback=[sync, recorder, FirstObs()], reset_num_timesteps=False)
    assert sync.synced and sync.planned_tasks == (2, 3)
    assert recorder.rows == [(t, (((t // 2) - 1) // 5,) * 2) for t in range(26, 42, 2)]
    perm = _image_copy().permutation_for(2)  # task 2 (copy step 12) is in the first observation, channels first
    assert not np.array_equal(perm, np.arange(3))
    np.testing.assert_array_equal(first_obs[0][0, :, 0, 0], perm.astype(np.float32))


def test_monitor_per_task_returns_through_vecmonitor():
    model = PPO("MlpPolicy", _wrapped(), **PPO_KWARGS)
    capture = Capture()
    model.set_logger(Logger(None, [capture]))
    model.learn(32, callback=PlasticityMonitor(every=10_000, max_overhead=None, probe_size=8, ntk_probe_size=0))
    assert _logged(capture, "plasticity/task_id") == [(2, "plasticity/task_id", 0.0), (12, "plasticity/task_id", 1.0),
                                                      (22, "plasticity/task_id", 2.0), (32, "plasticity/task_id", 3.0)]
    returns = _logged(capture, "plasticity/return/")
    assert {k for _, k, _ in returns} == {f"plasticity/return/task_{k}" for k in range(4)}
    assert all(v == 4.0 for _, _, v in returns)  # VecMonitor's raw returns, not VecNormalize's scaled rewards


# ------------------------------------------------------------------------------------------------ per-task returns
class TaskPaid(PiecewiseStationaryWrapper):
    """Reward ``task + 1`` per step: an episode's return tells the tasks its steps ran under."""

    def apply_task(self, task_index, rng):
        self.pay = float(task_index + 1)

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, self.pay, terminated, truncated, info


def test_an_episode_that_straddles_a_switch_counts_for_the_task_of_its_last_step():
    """One copy, episodes of 4 steps, immediate switches every 6 steps: the episode of steps 4..7 runs 2 steps of
    task 0 and 2 of task 1 (return 1 + 1 + 2 + 2 = 6) and counts for task 1 (the documented rule)."""
    env = DummyVecEnv([lambda: Monitor(TaskPaid(Episodic(4), change_every=6))])
    model = PPO("MlpPolicy", env, **{**PPO_KWARGS, "n_steps": 16})
    capture = Capture()
    model.set_logger(Logger(None, [capture]))
    model.learn(16, callback=PlasticityMonitor(every=10_000, max_overhead=None, probe_size=8, ntk_probe_size=0))
    returns = [(s, k.rsplit("/", 1)[1], v) for s, k, v in _logged(capture, "plasticity/return/")]
    # written at each switch of copy 0 (timesteps 7, 13) and at the monitor's pass at the rollout end (16); episodes
    # end at timesteps 4, 8, 12, 16
    assert returns == [(7, "task_0", 4.0), (13, "task_1", 7.0), (16, "task_2", 12.0)]


def test_plastic_algorithm_switch_in_the_last_rollout_is_not_acted_on_twice():
    """A switch pending at the end of one learn() acts at its end; the next learn(reset_num_timesteps=False) on the
    same model does not act on it again (same events as one uninterrupted call)."""
    whole = PlasticPPO("MlpPolicy", _vec(), fire_on_task_change=True, **PPO_KWARGS)
    whole.learn(48)
    chunks = PlasticPPO("MlpPolicy", _vec(), fire_on_task_change=True, **PPO_KWARGS)
    chunks.learn(40)
    chunks.learn(8, reset_num_timesteps=False)
    # switches at 14, 26 (starting with the rollout at 24), 38 (inside the last rollout of learn(40)); copy 1's at
    # 22, 32, 42 act no more
    assert whole.plastic_state["FIRE:auto"]["timesteps"] == chunks.plastic_state["FIRE:auto"]["timesteps"] == [16, 24, 40]


# ------------------------------------------------------------------------------------------------ counts and units
def _immediate(n_envs: int, length: int = 50, change_every: int = 4):
    return DummyVecEnv([lambda: _copy(length, at_episode_end=False, change_every=change_every)] * n_envs)


@pytest.mark.parametrize(
    "algo, kwargs, fired",
    [
        (PPO, dict(PPO_KWARGS, n_steps=5, batch_size=15), [15, 30, 45]),  # rollouts of 15: acted at their starts
        (DQN, dict(DQN_KWARGS, train_freq=2), [15, 27, 39]),  # off-policy: at the switching step
    ],
)
def test_three_copies_and_a_total_that_is_no_multiple_of_the_rollout(algo, kwargs, fired):
    """n_envs=3, change_every=4 per copy (a task is 12 timesteps), learn(37): PPO stops at 45 (3 rollouts of 15),
    DQN at 42 (chunks of 2 x 3); the planned tasks are the ones the copies report, the switches (copy step 4, 8, 12:
    timesteps 15, 27, 39) act once each."""
    sync, recorder, fire = TaskScheduleSync(), TaskRecorder(), FIRE(on_task_change=True)
    model = algo("MlpPolicy", _immediate(3), **kwargs)
    model.learn(37, callback=[sync, recorder, fire])
    assert model.num_timesteps == (45 if algo is PPO else 42)
    seen = sorted({i for _, ids in recorder.rows for i in ids})
    assert sync.planned_tasks == (seen[0], seen[-1]) == (0, 3)
    assert all(len(set(ids)) == 1 for _, ids in recorder.rows)  # the three copies in lockstep
    assert fire.fired_at == fired


def test_off_policy_train_freq_in_episodes_acts_at_the_switching_step():
    """SB3 allows train_freq in episodes with one env only; the switches (copy steps 6, 12: timesteps 7, 13) act at
    once, whatever the episode boundaries (episodes of 5 steps straddle both switches)."""
    fire = FIRE(on_task_change=True)
    model = DQN("MlpPolicy", _immediate(1, length=5, change_every=6), **dict(DQN_KWARGS, train_freq=(1, "episode")))
    model.learn(15, callback=fire)
    assert model.num_timesteps == 15 and fire.fired_at == [7, 13]
