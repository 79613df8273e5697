"""PlasticityMonitor on PPO / DQN / SAC (and QR-DQN / TQC), read back from TensorBoard; ``sb3-plastic plot``."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import matplotlib.image as mpimg
import numpy as np
import pytest
import torch as th
from sb3_contrib import QRDQN, TQC
from stable_baselines3 import DQN, PPO, SAC, TD3
from stable_baselines3.common.env_util import make_vec_env
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from sb3_plastic import cli
from sb3_plastic.callbacks.monitor import PlasticityMonitor
from sb3_plastic.plot import aggregate, match_tags, switch_steps

# SB3 writes into policy_kwargs (SAC adds "use_sde"): every model gets fresh dicts
PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2)
DQN_FAST = dict(learning_starts=64, buffer_size=1000, train_freq=4)
SAC_FAST = dict(learning_starts=64, buffer_size=1000, batch_size=32)


def tiny(kwargs: dict, **policy_kwargs) -> dict:
    return dict(kwargs, policy_kwargs=dict(net_arch=[16, 16], **policy_kwargs))


LAYER_METRICS = ("dormant_fraction", "zero_fraction", "srank", "effective_rank", "feature_norm",
                   "feature_variance")
WEIGHT_METRICS = ("weight_norm", "dist_from_init", "dfi", "sigma_max", "sigma_min", "cond")
NETWORK_METRICS = ("dormant_fraction", "zero_fraction", "weight_norm", "dist_from_init", "dfi", "grad_norm")
NTK_METRICS = ("ntk_cond", "ntk_erank", "ntk_trace", "ntk_size")


class TaskCartPole(gym.Wrapper):
    """CartPole whose reward is multiplied by ``1 + task``; the task flips every ``switch`` env steps and is
    reported in ``info["task_id"]``."""

    def __init__(self, env: gym.Env, switch: int) -> None:
        super().__init__(env)
        self.switch = switch
        self.t = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        task = (self.t // self.switch) % 2
        self.t += 1
        info["task_id"] = task
        return obs, reward * (1 + task), terminated, truncated, info


def task_env(seed: int, switch: int):
    return make_vec_env(lambda: TaskCartPole(gym.make("CartPole-v1"), switch), n_envs=1, seed=seed)


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    (run,) = [p for p in log_dir.iterdir() if p.is_dir()]
    acc = EventAccumulator(str(run), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected_tags(model, prefix: str = "plasticity") -> set[str]:
    from sb3_plastic.common.surgery import find_networks

    tags = set()
    for spec in find_networks(model):
        tags |= {f"{prefix}/{spec.name}/{m}" for m in NETWORK_METRICS + NTK_METRICS}
        for hidden in spec.hidden_layers():
            tags |= {f"{prefix}/{spec.name}/{hidden.name}/{m}" for m in LAYER_METRICS}
        for layer in spec.weight_layers():
            tags |= {f"{prefix}/{spec.name}/{spec.layer_names[id(layer)]}/{m}" for m in WEIGHT_METRICS}
    return tags


@pytest.mark.parametrize(
    "algo, env_id, kwargs, steps",
    [(PPO, "CartPole-v1", PPO_FAST, 256), (DQN, "CartPole-v1", DQN_FAST, 300), (SAC, "Pendulum-v1", SAC_FAST, 200)],
)
def test_monitor_logs_every_metric_to_tensorboard(tmp_path, algo, env_id, kwargs, steps):
    model = algo("MlpPolicy", env_id, seed=0, tensorboard_log=str(tmp_path), **tiny(kwargs))
    monitor = PlasticityMonitor(every=64, max_overhead=None, probe_size=64, ntk_probe_size=8)
    model.learn(steps, callback=monitor)
    scalars = read_scalars(tmp_path)
    missing = expected_tags(model) - set(scalars)
    assert not missing, sorted(missing)
    assert "plasticity/monitor_seconds" in scalars
    for tag, points in scalars.items():
        if tag.startswith("plasticity/"):
            assert all(np.isfinite(v) for _, v in points), tag
    # several passes, at the monitor's own steps (the first as soon as a probe exists)
    passes = [step for step, _ in scalars[next(t for t in scalars if t.endswith("/ntk_cond"))]]
    assert len(passes) >= 2 and passes == sorted(passes)
    assert all(b - a >= 64 for a, b in itertools.pairwise(passes))
    # SB3's own logging is untouched (its pending train/ keys were set aside during the monitor's dumps)
    if algo is PPO:
        assert {"train/loss", "rollout/ep_rew_mean", "time/fps"} <= set(scalars)
    dist = [
        v for _, v in scalars[f"plasticity/{'policy' if algo is PPO else 'q_net' if algo is DQN else 'critic'}/dist_from_init"]
    ]
    assert dist[-1] > 0


@pytest.mark.parametrize("algo", [PPO, DQN])
def test_monitor_does_not_change_training(algo):
    kwargs = PPO_FAST if algo is PPO else DQN_FAST
    watched = algo("MlpPolicy", "CartPole-v1", seed=3, **tiny(kwargs))
    watched.learn(200, callback=PlasticityMonitor(every=32, max_overhead=None, probe_size=32, ntk_probe_size=4))
    plain = algo("MlpPolicy", "CartPole-v1", seed=3, **tiny(kwargs))
    plain.learn(200)
    for a, b in zip(watched.policy.parameters(), plain.policy.parameters()):
        assert th.equal(a, b)
    assert all(p.grad is None or th.isfinite(p.grad).all() for p in watched.policy.parameters())


def test_monitor_with_verbose_model_and_stdout(capsys):
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, verbose=1, **tiny(PPO_FAST))
    model.learn(128, callback=PlasticityMonitor(every=64, max_overhead=None, probe_size=32, ntk_probe_size=4, verbose=1))
    out = capsys.readouterr().out
    assert "PlasticityMonitor at step 64" in out
    assert "ep_rew_mean" in out and "plasticity/" not in out  # the console table is SB3's alone


def test_monitor_returns_per_task_and_task_switches(tmp_path):
    model = PPO("MlpPolicy", task_env(0, 128), seed=0, tensorboard_log=str(tmp_path), **tiny(PPO_FAST))
    model.learn(512, callback=PlasticityMonitor(every=128, max_overhead=None, probe_size=32, ntk_probe_size=4))
    scalars = read_scalars(tmp_path)
    assert {"plasticity/return/task_0", "plasticity/return/task_1", "plasticity/task_id"} <= set(scalars)
    assert [(s, v) for s, v in scalars["plasticity/task_id"]] == [(1, 0.0), (129, 1.0), (257, 0.0), (385, 1.0)]
    # task 1 pays 2 per step, task 0 pays 1: CartPole episodes of an untrained policy last >= 8 steps
    assert all(v >= 8 for _, v in scalars["plasticity/return/task_0"])
    assert np.mean([v for _, v in scalars["plasticity/return/task_1"]]) > np.mean(
        [v for _, v in scalars["plasticity/return/task_0"]]
    )


def test_monitor_state_survives_save_and_load(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **tiny(DQN_FAST))
    monitor = PlasticityMonitor(every=50, max_overhead=None, probe_size=32, ntk_probe_size=0)
    model.learn(150, callback=monitor)
    init = monitor.state["init"]["q_net"]
    assert monitor.state["events"] >= 2
    model.save(tmp_path / "m.zip")
    loaded = DQN.load(tmp_path / "m.zip", env=model.get_env())
    restored = loaded.plastic_state["PlasticityMonitor"]["init"]["q_net"]
    assert all(th.equal(restored[k], init[k]) for k in init)
    again = PlasticityMonitor(every=50, max_overhead=None, probe_size=32, ntk_probe_size=0)
    loaded.learn(100, callback=again, reset_num_timesteps=False)
    values = again.run()
    assert values["plasticity/q_net/dist_from_init"] > 0


@pytest.mark.parametrize(
    "algo, env_id, kwargs", [(QRDQN, "CartPole-v1", DQN_FAST), (TQC, "Pendulum-v1", SAC_FAST), (TD3, "Pendulum-v1", SAC_FAST)]
)
def test_monitor_on_qrdqn_tqc_and_td3(algo, env_id, kwargs):
    model = algo("MlpPolicy", env_id, seed=0, **tiny(kwargs))
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=2)
    model.learn(80, callback=monitor)
    values = monitor.run()
    nets = {"quantile_net"} if algo is QRDQN else {"actor", "critic"}
    assert {f"plasticity/{n}/ntk_cond" for n in nets} <= set(values)
    assert all(np.isfinite(v) for v in values.values())


def test_max_overhead_postpones_passes():
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **tiny(DQN_FAST))
    capped = PlasticityMonitor(every=10, probe_size=32, ntk_probe_size=2, max_overhead=1e-6)
    model.learn(200, callback=capped)
    assert capped.state["events"] == 1  # the next pass would wait for ~1e4 s of training


def test_monitor_validates_arguments():
    with pytest.raises(ValueError, match="every"):
        PlasticityMonitor(every=0)
    with pytest.raises(ValueError, match="tau"):
        PlasticityMonitor(tau=0)
    with pytest.raises(ValueError, match="ntk_probe_size"):
        PlasticityMonitor(ntk_probe_size=-1)
    with pytest.raises(ValueError, match="max_overhead"):
        PlasticityMonitor(max_overhead=1.5)


# ---------------------------------------------------------------------------------------------------
# sb3-plastic plot
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two methods x two seeds of tiny PPO runs (256 steps) on a two-task CartPole, with the monitor."""
    root = tmp_path_factory.mktemp("logs")
    th.set_num_threads(1)
    for method, activation in (("ppo_relu", th.nn.ReLU), ("ppo_tanh", th.nn.Tanh)):
        for seed in range(2):
            kwargs = tiny(PPO_FAST, activation_fn=activation)
            model = PPO("MlpPolicy", task_env(seed, 64), seed=seed, tensorboard_log=str(root / method), **kwargs)
            model.learn(
                256,
                callback=PlasticityMonitor(every=64, max_overhead=None, probe_size=32, ntk_probe_size=4),
                tb_log_name=f"seed{seed}",
            )
    return root


def assert_good_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.stat().st_size > 15_000, (path, path.stat().st_size)
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    assert float(image[..., :3].var()) > 1e-3  # not blank


def test_plot_cli_in_process(runs, tmp_path, capsys):
    out = tmp_path / "plots"
    status = cli.main(
        ["plot", str(runs), "--out", str(out), "--metrics", "plasticity/*/ntk_cond", "plasticity/policy/**/srank"]
    )
    assert status == 0
    names = {p.name for p in out.iterdir()}
    assert {"return_curve.png", "return_per_task.png", "metric_plasticity__policy__ntk_cond.png"} <= names
    assert sum(n.endswith("__srank.png") for n in names) == 4  # 2 policy + 2 value hidden layers
    for name in names:
        assert_good_png(out / name)
    printed = capsys.readouterr().out.split()
    assert len(printed) == len(names)


def test_plot_cli_subprocess_with_switch_every_and_group_by(runs, tmp_path):
    out = tmp_path / "plots"
    group_and_metric = ["--group-by", r"ppo_(\w+?)/", "--metrics", "plasticity/policy/dormant_fraction"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    result = subprocess.run(
        [sys.executable, "-m", "sb3_plastic", "plot", str(runs), "--out", str(out), "--switch-every", "64", *group_and_metric],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"return_curve.png", "return_per_task.png", "metric_plasticity__policy__dormant_fraction.png"}
    for name in names:
        assert_good_png(out / name)


def test_plot_cli_errors_clearly_without_event_files(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "no TensorBoard event files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["plot", str(tmp_path), "--switch-every", "0"])


def test_plot_helpers():
    tags = ["plasticity/policy/ntk_cond", "plasticity/policy/a.0/srank", "plasticity/critic/b/c/srank", "rollout/x"]
    assert match_tags(tags, ["plasticity/*/ntk_cond"]) == ["plasticity/policy/ntk_cond"]
    assert match_tags(tags, ["plasticity/*/*/srank"]) == ["plasticity/policy/a.0/srank"]
    assert match_tags(tags, ["plasticity/**/srank"]) == ["plasticity/critic/b/c/srank", "plasticity/policy/a.0/srank"]
    # mean +- std on the union of steps, each run interpolated in its own range
    a = (np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    b = (np.array([0.0, 5.0, 10.0]), np.array([2.0, 7.0, np.inf]))
    steps, mean, std = aggregate([a, b])
    assert steps.tolist() == [0.0, 5.0, 10.0]
    assert mean.tolist() == [1.0, 6.0, 10.0]  # b's inf is dropped: b covers [0, 5] only
    assert std.tolist() == [1.0, 1.0, 0.0]
    assert switch_steps([], 100) == []
