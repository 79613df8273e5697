"""The plastic machinery on a GPU: diagnostics, monitor and every intervention with the model on CUDA.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``.
"""

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN, PPO, SAC

from sb3_plastic import FIRE, ContinualBackprop, PlasticityMonitor, PlasticPPO, PlasticSAC, ReDo, ShrinkPerturb
from sb3_plastic.diagnostics import srank

pytestmark = pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")


def test_srank_on_cuda_matches_cpu():
    features = th.randn(64, 16, generator=th.Generator().manual_seed(0))
    assert srank(features.cuda()) == srank(features)


@pytest.mark.parametrize("plastic", [False, True])
def test_ppo_monitor_and_interventions_on_cuda(plastic):
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cuda", policy_kwargs=dict(net_arch=[32, 32]))
    model = PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs) if plastic else PPO("MlpPolicy", "CartPole-v1", **kwargs)
    assert model.device.type == "cuda"
    before = [p.detach().cpu().clone() for p in model.policy.parameters()]
    callbacks = [
        PlasticityMonitor(every=64, max_overhead=None),
        ContinualBackprop(replacement_rate=0.05, maturity_threshold=2),
        ReDo(period=4, tau=0.5),
        ShrinkPerturb("event", every=128),
        FIRE(at=0.5),
    ]
    model.learn(320, callback=callbacks)
    assert callbacks[1].counts() and sum(callbacks[1].counts().values()) > 0
    assert all(p.device.type == "cuda" for p in model.policy.parameters())
    assert any(not th.equal(b, p.detach().cpu()) for b, p in zip(before, model.policy.parameters()))
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


@pytest.mark.parametrize("cls", [DQN, SAC, PlasticSAC])
def test_off_policy_monitor_and_interventions_on_cuda(cls):
    env = "CartPole-v1" if cls is DQN else "Pendulum-v1"
    model = cls(
        "MlpPolicy", env, learning_starts=64, batch_size=32, seed=0, device="cuda", policy_kwargs=dict(net_arch=[32, 32])
    )
    callbacks = [PlasticityMonitor(every=50, probe_size=32, max_overhead=None), ContinualBackprop(1e-2, 2), FIRE(at=0.5)]
    model.learn(200, callback=callbacks)
    params = list(model.policy.parameters())
    assert all(p.device.type == "cuda" and th.isfinite(p).all() for p in params)
    obs = model.observation_space.sample()
    action, _ = model.predict(np.asarray(obs), deterministic=True)
    assert model.action_space.contains(action if cls is not DQN else int(action))
