"""Builders shared by several test files (imported as a plain module: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch as th
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from sb3_plastic.networks import PlasticMLP
from sb3_plastic.run_info import RUN_INFO_FILE


def fill_adam_state(net: nn.Module, opt: th.optim.Optimizer, x: th.Tensor, seed: int = 99) -> None:
    """One Adam step of ``net`` on ``x``, then seeded random moments everywhere, so that zeroing entries is visible."""
    opt.zero_grad()
    net(x).square().mean().backward()
    opt.step()
    gen = th.Generator().manual_seed(seed)
    for state in opt.state.values():
        state["exp_avg"].copy_(th.randn(state["exp_avg"].shape, generator=gen))
        state["exp_avg_sq"].copy_(th.rand(state["exp_avg_sq"].shape, generator=gen) + 0.1)


def write_run(
    run_dir: Path,
    scalars: dict[str, list[float]],
    info: Optional[dict] = None,
    steps: tuple[int, ...] = (64, 128, 192),
) -> Path:
    """A TensorBoard run directory with ``scalars`` (one value per step) and, given ``info``, run metadata."""
    run_dir.mkdir(parents=True)
    writer = SummaryWriter(log_dir=str(run_dir))
    for tag, values in scalars.items():
        for step, value in zip(steps, values):
            writer.add_scalar(tag, value, step)
    writer.close()
    if info is not None:
        (run_dir / RUN_INFO_FILE).write_text(json.dumps(info))
    return run_dir


def shared_extractor_model(cls: type, steps: int = 80) -> Any:
    """An off-policy SB3 model (``cls``: SAC / TD3) on Pendulum whose actor and critics share one
    :class:`~sb3_plastic.networks.PlasticMLP` features extractor (8 -> 6), trained ``steps`` steps from seed 0."""
    policy_kwargs = dict(
        net_arch=[8],
        share_features_extractor=True,
        features_extractor_class=PlasticMLP,
        features_extractor_kwargs=dict(net_arch=(8, 6)),
    )
    model = cls("MlpPolicy", "Pendulum-v1", learning_starts=40, batch_size=16, policy_kwargs=policy_kwargs, seed=0)
    model.learn(steps)
    return model


def zoo_bandit_conf(
    tmp_path: Path, monkeypatch: Any, n_timesteps: int, env_kwargs: dict, with_cartpole: bool = False
) -> Path:
    """An rl_zoo3 yaml (``tmp_path / "conf.yml"``) with one plastic-PPO entry for the random-label bandit (2 copies,
    rollouts of 32 steps per copy, one epoch) with ``env_kwargs``, and, ``with_cartpole``, the same entry without
    them for CartPole-v1. Works in ``tmp_path`` (rl_zoo3 writes relative paths) with the plastic algorithms
    registered into rl_zoo3."""
    import yaml

    from sb3_plastic import zoo

    monkeypatch.chdir(tmp_path)
    zoo.register()
    entry = {
        "n_envs": 2,
        "n_timesteps": n_timesteps,
        "policy": "MlpPolicy",
        "n_steps": 32,
        "batch_size": 32,
        "n_epochs": 1,
        "env_kwargs": dict(env_kwargs),
    }
    conf = {"sb3_plastic/RandomLabelBandit-v0": entry}
    if with_cartpole:
        conf["CartPole-v1"] = {k: v for k, v in entry.items() if k != "env_kwargs"}
    path = tmp_path / "conf.yml"
    path.write_text(yaml.safe_dump(conf))
    return path
