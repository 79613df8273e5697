"""FIRE: Newton–Schulz polar factor against SVD, in-place surgery on every supported algorithm, rollout
boundaries for on-policy algorithms, triggers, argument errors and persistence across save -> load."""

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import QRDQN, TQC
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from torch import nn

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.callbacks.fire import FIRE, FIREConfig, fire_, fire_scale, fire_weight, newton_schulz_polar
from sb3_plastic.common.surgery import find_networks

NET = dict(net_arch=[32, 32])
PPO_FAST = dict(n_steps=32, batch_size=32, n_epochs=2, seed=0, policy_kwargs=NET)
OFF_FAST = dict(learning_starts=50, buffer_size=2000, seed=0, policy_kwargs=NET)
SAC_FAST = dict(learning_starts=50, buffer_size=2000, seed=0, policy_kwargs=NET)


def fast(kwargs, **overrides):
    """A fresh copy: SB3's SAC and sb3-contrib's QRDQN write into the policy_kwargs dict they are given."""
    return {**copy.deepcopy(kwargs), **overrides}


# ------------------------------------------------------------------------------------------------------
# Newton–Schulz against the SVD polar factor
# ------------------------------------------------------------------------------------------------------


def well_conditioned(m, n, generator, low=0.5, high=1.5):
    k = min(m, n)
    u, _ = th.linalg.qr(th.randn(m, k, generator=generator, dtype=th.float64))
    v, _ = th.linalg.qr(th.randn(n, k, generator=generator, dtype=th.float64))
    s = th.rand(k, generator=generator, dtype=th.float64) * (high - low) + low
    return (u * s) @ v.T


def svd_polar(w):
    u, _, vh = th.linalg.svd(w.double(), full_matrices=False)
    return u @ vh


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("shape", [(48, 24), (24, 48), (32, 32), (64, 16)])
def test_newton_schulz_matches_svd_polar(shape):
    g = th.Generator().manual_seed(0)
    w = well_conditioned(*shape, g).float()
    polar = newton_schulz_polar(w)
    assert polar.dtype == th.float32 and polar.shape == w.shape
    assert rel_err(polar, svd_polar(w)) < 1e-3
    # with the reference scaling sqrt(out/in) (Linear)
    expected = svd_polar(w) * math.sqrt(shape[0] / shape[1])
    assert rel_err(fire_weight(w), expected) < 1e-3
    assert fire_scale(w.shape) == pytest.approx(math.sqrt(shape[0] / shape[1]))
    # an isometry up to the scale: singular values all equal
    sv = th.linalg.svdvals(fire_weight(w).double())
    assert th.allclose(sv, th.full_like(sv, math.sqrt(shape[0] / shape[1])), rtol=1e-3)


@pytest.mark.parametrize("shape", [(16, 8, 3, 3), (8, 16, 2, 3), (12, 12, 1, 1)])
def test_newton_schulz_conv_per_tap(shape):
    out_c, in_c, kh, kw = shape
    g = th.Generator().manual_seed(1)
    w = th.zeros(shape)
    for i in range(kh):
        for j in range(kw):
            w[:, :, i, j] = well_conditioned(out_c, in_c, g).float()
    result = fire_weight(w)
    scale = math.sqrt(out_c / in_c) / (kh * kw)
    assert fire_scale(shape) == pytest.approx(scale)
    for i in range(kh):
        for j in range(kw):
            assert rel_err(result[:, :, i, j], svd_polar(w[:, :, i, j]) * scale) < 1e-3


def test_newton_schulz_details():
    g = th.Generator().manual_seed(2)
    w = well_conditioned(20, 10, g)
    # float64 stays float64; a batch is a batch of independent polar factors
    assert newton_schulz_polar(w).dtype == th.float64
    batch = th.stack([w, 3.0 * w, well_conditioned(20, 10, g)])
    polar = newton_schulz_polar(batch)
    for k in range(3):
        assert rel_err(polar[k], svd_polar(batch[k])) < 1e-3
    # scale invariance (Frobenius normalisation) and the zero matrix
    assert th.allclose(newton_schulz_polar(w), newton_schulz_polar(100.0 * w), atol=1e-6)
    assert th.equal(newton_schulz_polar(th.zeros(4, 3)), th.zeros(4, 3))
    # fewer iterations: not converged yet (small singular values still grow ~1.5x per step)
    assert rel_err(newton_schulz_polar(w.float(), iterations=2), svd_polar(w)) > 1e-2
    assert th.allclose(fire_weight(w, iterations=10, scaled=False), newton_schulz_polar(w))
    with pytest.raises(ValueError, match="iterations"):
        newton_schulz_polar(w, iterations=0)
    with pytest.raises(ValueError, match="shape"):
        fire_weight(th.zeros(3, 3, 3))


def test_fire_in_place_keeps_parameters_and_biases():
    th.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.Tanh(), nn.Linear(16, 4))
    params = list(net.parameters())
    ids = [id(p) for p in params]
    before = [p.detach().clone() for p in params]
    done = fire_(net)
    assert len(done) == 3
    assert [id(p) for p in net.parameters()] == ids
    for (name, p), old in zip(net.named_parameters(), before):
        if name.endswith("bias"):
            assert th.equal(p, old), name
        else:
            assert th.allclose(p, fire_weight(old), atol=1e-6), name
            assert not th.allclose(p, old), name
    # only the given layers
    head_before = net[5].weight.detach().clone()
    fire_([net[0]])
    assert th.equal(net[5].weight, head_before)
    with pytest.raises(TypeError, match="ReLU"):
        fire_([nn.ReLU()])


# ------------------------------------------------------------------------------------------------------
# Argument errors and the config
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(at=1.5), "1.5"),
        (dict(at=0.0), "0.0"),
        (dict(at=1.0), r"\(0, 1\)"),
        (dict(at=-3), "-3"),
        (dict(at=0), "int timestep >= 1"),
        (dict(at=True), "True"),
        (dict(at=float("nan")), "nan"),
        (dict(at="half"), "half"),
        (dict(every=0), "every must be an int >= 1, got 0"),
        (dict(every=-5), "-5"),
        (dict(every=2.5), "2.5"),
        (dict(iterations=0), r"iterations must be None \(the exact polar factor\) or an int >= 1.*got 0"),
        (dict(layers="heads"), r"'heads'.*\['all', 'hidden'\]"),
        (dict(on_task_change="yes"), "on_task_change"),
        (dict(at=None), "needs a trigger"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FIRE(**kwargs)


def test_config():
    assert not FIREConfig().enabled
    with pytest.raises(ValueError, match="no trigger"):
        FIREConfig().make_callback()
    for kwargs in (dict(fire_at=0.5), dict(fire_at=1000), dict(fire_every=10), dict(fire_on_task_change=True)):
        assert FIREConfig(**kwargs).enabled
    cb = FIREConfig(fire_at=0.25, fire_every=100, fire_iterations=7, fire_layers="hidden").make_callback()
    assert isinstance(cb, FIRE)
    assert (cb.at, cb.every, cb.on_task_change, cb.iterations, cb.layers) == (0.25, 100, False, 7, "hidden")
    assert cb.state_key == "FIRE:config"
    for kwargs, match in [
        (dict(fire_at=1.5), "fire_at=1.5"),
        (dict(fire_every=0), "fire_every"),
        (dict(fire_iterations=0), "fire_iterations"),
        (dict(fire_layers="x"), "fire_layers"),
    ]:
        with pytest.raises(ValueError, match=match):
            FIREConfig(**kwargs)
    # defaults of the callback
    assert FIRE().at == 0.5 and FIRE().layers == "all"
    assert FIRE(every=10).at is None and FIRE(on_task_change=True).at is None
    assert FIRE(at=0.3, every=10).at == 0.3


# ------------------------------------------------------------------------------------------------------
# The surgery on every algorithm
# ------------------------------------------------------------------------------------------------------


class Snapshot(BaseCallback):
    """Placed before FIRE: copies every parameter at each hook FIRE can fire in."""

    def __init__(self):
        super().__init__()
        self.weights = {}

    def _snap(self):
        self.weights = {id(p): p.detach().clone() for p in self.model.policy.parameters()}

    def _on_step(self):
        self._snap()
        return True

    def _on_rollout_start(self):
        self._snap()

    def _on_training_end(self):
        self._snap()


class Checker(BaseCallback):
    """Placed after FIRE: when FIRE has just fired, checks the surgery."""

    def __init__(self, fire, snapshot):
        super().__init__()
        self.fire, self.snapshot = fire, snapshot
        self.events = []
        self.seen = 0

    def _on_training_start(self):
        self.ids = [id(p) for p in self.model.policy.parameters()]

    def _check(self, hook):
        if self.fire.fire_count == self.seen:
            return
        self.seen = self.fire.fire_count
        self.events.append((hook, self.model.num_timesteps))
        assert [id(p) for p in self.model.policy.parameters()] == self.ids
        layers = self.fire.selected_layers()
        assert layers
        for spec in self.fire.networks:
            opt = spec.optimizer
            for layer in spec.weight_layers():
                pre = self.snapshot.weights[id(layer.weight)]
                if not any(layer is chosen for chosen in layers):
                    assert th.equal(layer.weight, pre)  # not selected (layers="hidden": a head): untouched
                    continue
                assert th.allclose(layer.weight, fire_weight(pre, scale=self.fire.layer_scale(layer)), atol=1e-6)
                assert not th.allclose(layer.weight, pre)
                assert layer.weight not in opt.state  # moments of the rewritten weight dropped
                if layer.bias is not None:
                    assert th.equal(layer.bias, self.snapshot.weights[id(layer.bias)])
                    assert layer.bias in opt.state  # biases were not touched: their state stays
            if spec.target is not None:
                online, target = spec.module.state_dict(), spec.target.state_dict()
                for key, value in target.items():
                    assert th.equal(value, online[key]), key
        logged = self.logger.name_to_value
        for key in ("dfi_before", "dfi_after", "seconds", "count"):
            assert f"plasticity/fire/{key}" in logged
        assert logged["plasticity/fire/count"] == self.fire.fire_count

    def _on_step(self):
        self._check("step")
        return True

    def _on_rollout_start(self):
        self._check("rollout_start")

    def _on_training_end(self):
        self._check("training_end")


class LogProbConsistency(BaseCallback):
    """At each rollout end, the stored log-probs must be those of the current policy (no fire mid-rollout)."""

    def __init__(self):
        super().__init__()
        self.rollouts = 0

    def _on_step(self):
        return True

    def _on_rollout_end(self):
        buf = self.model.rollout_buffer
        obs = th.as_tensor(buf.observations.reshape(-1, *buf.obs_shape))
        actions = th.as_tensor(buf.actions.reshape(-1)).long()
        with th.no_grad():
            _, log_prob, _ = self.model.policy.evaluate_actions(obs, actions)
        assert th.allclose(log_prob, th.as_tensor(buf.log_probs.reshape(-1)), atol=1e-5)
        self.rollouts += 1


def run_with_checks(model, steps, fire, extra=()):
    snapshot = Snapshot()
    checker = Checker(fire, snapshot)
    model.learn(steps, callback=CallbackList([snapshot, fire, checker, *extra]))
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    return checker


@pytest.mark.parametrize(
    "cls, env_id, kwargs, steps",
    [
        (DQN, "CartPole-v1", OFF_FAST, 300),
        (PlasticDQN, "CartPole-v1", OFF_FAST, 300),
        (QRDQN, "CartPole-v1", OFF_FAST, 300),
        (SAC, "Pendulum-v1", SAC_FAST, 200),
        (PlasticSAC, "Pendulum-v1", SAC_FAST, 200),
        (TQC, "Pendulum-v1", dict(SAC_FAST, policy_kwargs=dict(net_arch=[32, 32], n_critics=2)), 200),
    ],
)
def test_fire_off_policy(cls, env_id, kwargs, steps):
    model = cls("MlpPolicy", env_id, **fast(kwargs))
    fire = FIRE(at=0.5)
    checker = run_with_checks(model, steps, fire)
    assert checker.events == [("step", steps // 2)]
    assert fire.fired_at == [steps // 2] and fire.fire_count == 1
    n_layers = sum(len(spec.weight_layers()) for spec in find_networks(model))
    assert len(fire.selected_layers()) == n_layers  # layers="all": heads included
    assert model.num_timesteps == steps


@pytest.mark.parametrize("cls", [PPO, PlasticPPO])
def test_fire_ppo_once_between_rollouts(cls):
    n_envs, n_steps = 2, 32
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = cls("MlpPolicy", env, **fast(PPO_FAST))
    fire = FIRE(at=0.45)  # due at 288, inside the 5th rollout (256..320): fires when the 6th starts
    consistency = LogProbConsistency()
    checker = run_with_checks(model, 640, fire, extra=[consistency])
    assert checker.events == [("rollout_start", 320)]
    assert fire.fire_count == 1 and fire.fired_at == [320]
    assert fire.fired_at[0] % (n_steps * n_envs) == 0
    assert consistency.rollouts == 10


class MidRolloutFIRE(FIRE):
    """The mistake FIRE avoids: surgery in _on_step of an on-policy algorithm."""

    def _on_training_start(self):
        super()._on_training_start()
        self._on_policy = False


def test_log_prob_check_catches_a_mid_rollout_fire():
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    with pytest.raises(AssertionError):
        model.learn(128, callback=[MidRolloutFIRE(at=0.3), LogProbConsistency()])


def test_fire_hidden_layers_leave_heads():
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    head = model.q_net.q_net[-1]
    fire = FIRE(at=100, layers="hidden")
    checker = run_with_checks(model, 150, fire)  # checks that the head is untouched at the fire
    assert checker.events == [("step", 100)]
    assert all(layer is not head for layer in fire.selected_layers())
    assert len(fire.selected_layers()) == 2


def test_fire_cnn_ppo_rollout_boundary_at_training_end():
    # one rollout covers the whole call: the midpoint is due inside it and fires when learn() ends
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    small_cnn = dict(features_extractor_kwargs=dict(features_dim=32))
    model = PPO("CnnPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=small_cnn)
    fire = FIRE()
    checker = run_with_checks(model, 20, fire)
    assert checker.events == [("training_end", 32)]
    conv = model.policy.features_extractor.cnn[0]
    assert conv in fire.selected_layers()


# ------------------------------------------------------------------------------------------------------
# Triggers
# ------------------------------------------------------------------------------------------------------


class TaskEnv(gym.Env):
    """A trivial env whose ``info["task_id"]`` is ``t // switch_every`` (t counts steps over episodes)."""

    def __init__(self, switch_every=50):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.switch_every = switch_every
        self.t = 0
        self.ep = 0

    def _obs(self):
        return np.array([self.ep / 10.0, (self.t // self.switch_every) % 2], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ep = 0
        return self._obs(), {"task_id": self.t // self.switch_every}

    def step(self, action):
        self.t += 1
        self.ep += 1
        reward = float(action == (self.t // self.switch_every) % 2)
        return self._obs(), reward, False, self.ep >= 10, {"task_id": self.t // self.switch_every}


def test_task_change_trigger_off_policy():
    model = DQN("MlpPolicy", TaskEnv(), **fast(OFF_FAST, learning_starts=20))
    fire = FIRE(on_task_change=True)
    assert fire.at is None
    checker = run_with_checks(model, 220, fire)
    assert fire.fired_at == [50, 100, 150, 200]
    assert [hook for hook, _ in checker.events] == ["step"] * 4
    assert all("task_change" in r for r in fire.state["reasons"])


def test_task_change_trigger_on_policy():
    model = PPO("MlpPolicy", TaskEnv(), **fast(PPO_FAST))
    fire = FIRE(on_task_change=True)
    consistency = LogProbConsistency()
    checker = run_with_checks(model, 256, fire, extra=[consistency])
    # changes at 50, 100, 150, 200, 250: at the next rollout boundary; the last one when learn() ends
    assert fire.fired_at == [64, 128, 160, 224, 256]
    assert [hook for hook, _ in checker.events] == ["rollout_start"] * 4 + ["training_end"]
    assert consistency.rollouts == 8


def test_every_and_absolute_triggers():
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    every = FIRE(every=100, name="every")
    model.learn(350, callback=every)
    assert every.fired_at == [100, 200, 300]
    absolute = FIRE(at=123, name="absolute")
    model.learn(200, callback=absolute, reset_num_timesteps=False)  # 350 .. 550: 123 has passed
    assert absolute.fire_count == 0
    model.learn(200, callback=absolute)  # a new run from 0
    assert absolute.fired_at == [123]
    # coalescing on-policy: several multiples inside one rollout -> one fire at the next boundary
    ppo = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    fire = FIRE(every=20)
    ppo.learn(128, callback=fire)
    assert fire.fired_at == [32, 64, 96, 128]


# ------------------------------------------------------------------------------------------------------
# Persistence across save -> load -> learn
# ------------------------------------------------------------------------------------------------------


def test_save_load_does_not_fire_again(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    model.learn(200, callback=FIRE())
    assert model.plastic_state["FIRE"]["timesteps"] == [100]
    model.save(tmp_path / "fired")
    loaded = DQN.load(tmp_path / "fired", env=model.get_env())
    fire = FIRE()
    loaded.learn(200, callback=fire, reset_num_timesteps=False)
    assert fire.fire_count == 1 and fire.fired_at == [100]  # the run's midpoint was already served
    # a new run (reset_num_timesteps=True) has its own midpoint
    loaded.learn(100, callback=fire)
    assert fire.fired_at == [100, 50]


class SaveAt(BaseCallback):
    def __init__(self, when, path):
        super().__init__()
        self.when, self.path = when, path

    def _on_step(self):
        if self.num_timesteps == self.when:
            self.model.save(self.path)
        return True


def test_checkpoint_before_fire_fires_at_planned_point(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    path = tmp_path / "ckpt"
    model.learn(300, callback=[FIRE(), SaveAt(100, path)])  # plan: 150
    loaded = DQN.load(path, env=model.get_env())
    assert loaded.num_timesteps == 100 and loaded.plastic_state["FIRE"]["count"] == 0
    fire = FIRE()
    loaded.learn(200, callback=fire, reset_num_timesteps=False)  # the resumed run fires at 150, not at 200
    assert fire.fired_at == [150]


def test_pending_on_policy_fire_survives_checkpoint(tmp_path):
    # PPO: due at 48 inside the rollout 32..64; a checkpoint taken at step 50 holds the pending fire
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    path = tmp_path / "ckpt"
    model.learn(96, callback=[FIRE(), SaveAt(50, path)])
    loaded = PPO.load(path, env=model.get_env())
    assert loaded.plastic_state["FIRE"]["pending"] and loaded.plastic_state["FIRE"]["count"] == 0
    fire = FIRE()
    loaded.learn(64, callback=fire, reset_num_timesteps=False)
    assert fire.fire_count == 1 and fire.state["pending"] == []
