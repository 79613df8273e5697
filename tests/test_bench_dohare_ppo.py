"""Slippery Ant at Dohare et al.'s design (issue #28): their PPO's advantage normalisation, once over each 2048-step
batch (bench/dohare_ppo.py), and gym 0.23's terminal time limit (``TruncationAsTermination``), checked against their
formula written out with torch and against the rollout buffer SB3 fills."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from test_bench_continual_protocol import _tiny_bandit


def _their_normalisation(advantages: np.ndarray) -> np.ndarray:
    """lop/algos/rl/ppo.py's ``get_rets_advs`` with ``u_adv_scl`` (written out here): centre, then divide by torch's
    (unbiased) std unless it is 0 or NaN."""
    advs = th.as_tensor(advantages.reshape(-1, 1), dtype=th.float64)
    advs = advs - advs.mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that one sample has no unbiased std (NaN)
        if advs.std() != 0 and not th.isnan(advs.std()):
            advs /= advs.std()
    return advs.numpy().reshape(advantages.shape)


@pytest.fixture
def dohare_ppo(continual):
    import dohare_ppo  # bench/ is on sys.path once bench/continual.py is loaded

    return dohare_ppo


def test_normalise_over_rollout_is_their_formula(dohare_ppo):
    rng = np.random.default_rng(3)
    advantages = (rng.standard_normal((512, 4)) * 7 + 2).astype(np.float32)
    out = dohare_ppo.normalise_over_rollout(advantages)
    assert out.dtype == np.float32 and out.shape == (512, 4)
    np.testing.assert_allclose(out, _their_normalisation(advantages), rtol=1e-6, atol=1e-6)
    assert abs(float(out.mean())) < 1e-6 and float(out.astype(np.float64).std(ddof=1)) == pytest.approx(1, rel=1e-6)
    # the whole batch, not each env copy's column: the columns keep their differences
    shifted = advantages.copy()
    shifted[:, 1] += 10
    assert dohare_ppo.normalise_over_rollout(shifted)[:, 1].mean() > 0.5  # per column it would be ~0
    # a constant batch is centred and left undivided; one sample has no std (NaN): centred only
    np.testing.assert_array_equal(dohare_ppo.normalise_over_rollout(np.full((8, 2), 3.0)), np.zeros((8, 2)))
    np.testing.assert_array_equal(dohare_ppo.normalise_over_rollout(np.array([[5.0]])), [[0.0]])
    np.testing.assert_array_equal(_their_normalisation(np.array([[5.0]])), [[0.0]])


class _Advantages(BaseCallback):
    """The rollout buffer's advantages at this callback's on_rollout_end."""

    def _on_training_start(self) -> None:
        self.seen: list[np.ndarray] = []

    def _on_rollout_end(self) -> None:
        self.seen.append(self.model.rollout_buffer.advantages.copy())

    def _on_step(self) -> bool:
        return True


def test_the_callback_normalises_each_rollout_once_and_turns_sb3s_off(dohare_ppo):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16, n_epochs=1, seed=0)
    assert model.normalize_advantage
    before, after = _Advantages(), _Advantages()
    model.learn(192, callback=[before, dohare_ppo.rollout_advantage_norm(), after])
    assert model.normalize_advantage is False and len(before.seen) == len(after.seen) == 3
    for raw, trained in zip(before.seen, after.seen):
        assert np.abs(raw).max() > 0 and not np.allclose(raw, trained)
        np.testing.assert_allclose(trained, _their_normalisation(raw), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="normalises a PPO model's advantages, got DQN"):
        from stable_baselines3 import DQN

        DQN("MlpPolicy", "CartPole-v1", learning_starts=0).learn(8, callback=dohare_ppo.rollout_advantage_norm())


def test_a_setting_with_rollout_normalisation_adds_it_to_every_method(continual, dohare_ppo, tmp_path, monkeypatch):
    """``advantage_norm="rollout"`` puts the callback into the run of every method (a plastic class included) and
    ahead of the method's own callbacks; the default leaves SB3's per-minibatch normalisation on."""
    added = []

    def counting():
        callback = original()
        added.append(callback)
        return callback

    original = dohare_ppo.rollout_advantage_norm
    monkeypatch.setattr(dohare_ppo, "rollout_advantage_norm", counting)
    base = _tiny_bandit(continual, tasks=1)
    setting = replace(base, advantage_norm="rollout")
    for method in ("ppo", "plastic_relu"):
        continual.run_one(method, 0, setting, continual.MethodParams(), str(tmp_path / method), "cpu", 1)
        assert added and added[-1].model.normalize_advantage is False
    assert len(added) == 2
    continual.run_one("ppo", 0, base, continual.MethodParams(), str(tmp_path / "plain"), "cpu", 1)
    assert len(added) == 2
    for name, value, allowed in (("advantage_norm", "batch", "'minibatch', 'rollout'"),
                                 ("time_limit_terminal", 1, None)):
        with pytest.raises(ValueError, match=f"{name} must be") as info:
            replace(base, **{name: value})
        assert repr(value) in str(info.value) and (allowed is None or allowed in str(info.value))
    with pytest.raises(ValueError, match="advantage_norm='rollout' normalises PPO's advantages; the setting's algo is 'dqn'"):
        replace(continual.SETTINGS["cminatar"], advantage_norm="rollout")


def test_time_limit_terminal_wraps_every_copy_outside_the_monitor(continual):
    from stable_baselines3.common.monitor import Monitor

    from sb3_plastic.envs import TruncationAsTermination

    setting = replace(_tiny_bandit(continual, tasks=1), time_limit_terminal=True)
    env = continual.make_env(setting, 0)
    assert len(env.envs) == 4
    for copy in env.envs:
        assert isinstance(copy, TruncationAsTermination) and isinstance(copy.env, Monitor)
    plain = continual.make_env(_tiny_bandit(continual, tasks=1), 0)
    assert all(isinstance(copy, Monitor) for copy in plain.envs)
    # with a reward scale too: both outside the Monitor, the scaled reward inside the time-limit wrapper
    from gymnasium.wrappers import TransformReward

    both = continual.make_env(replace(setting, reward_scale=20.0), 0)
    for copy in both.envs:
        assert isinstance(copy, TruncationAsTermination) and isinstance(copy.env, TransformReward)
        assert isinstance(copy.env.env, Monitor)
    both.reset()
    _, reward, _, _ = both.step(np.zeros(4, dtype=np.int64))
    for k, copy in enumerate(both.envs):  # the Monitor records the env's reward, the agent gets it / 20
        assert copy.env.env.rewards[-1] == pytest.approx(20 * reward[k])
    assert not continual.SETTINGS["slippery_ant_ppo"].time_limit_terminal
    assert continual.SETTINGS["slippery_ant_ppo"].advantage_norm == "minibatch"


def test_cbp_at_his_design_replaces_units_as_his_gnt(continual):
    """``ppo_cbp_dohare`` on ``slippery_ant_dohare`` (his design, ``init="lecun"``): his cbp.yml (rate 1e-4, maturity
    10 000, Adam betas 0.99 / 0.99, weight decay 1e-4) and his gnt.py's replacement (LeCun new units, the stochastic
    count, plain Adam's state left alone); on ``minatar_intensive`` the library's replacement defaults, as its seed 0."""
    pytest.importorskip("mujoco")
    from sb3_plastic import ContinualBackprop

    expected = {"slippery_ant_dohare": ("lecun", "stochastic", False), "minatar_intensive": (None, "accumulate", True)}
    for name, (unit_init, rule, restart) in expected.items():
        model, callbacks = continual.build_model("ppo_cbp_dohare", continual.SETTINGS[name], continual.MethodParams(),
                                                 0, "cpu", None)
        (cbp,) = callbacks
        assert isinstance(cbp, ContinualBackprop)
        assert (cbp.replacement_rate, cbp.maturity_threshold) == (1e-4, 10_000)
        assert (cbp.unit_init, cbp.replacement_rule, cbp.optimizer_restart) == (unit_init, rule, restart)
        (group,) = model.policy.optimizer.param_groups
        assert group["betas"] == (0.99, 0.99) and group["weight_decay"] == 1e-4
        model.env.close()


def test_the_cbp_control_is_the_cbp_arm_without_its_replacement(continual):
    """``ppo_cbp_dohare_no_replace`` builds ``ppo_cbp_dohare``'s model exactly (same initial weights, same optimizer
    groups: betas 0.99 / 0.99, weight decay 1e-4) and no callback, on the MinAtar grid, (DQN) C-MinAtar and Slippery
    Ant at his design (his LeCun init on both)."""
    import torch as th

    for name in ("minatar_intensive", "cminatar", "slippery_ant_dohare"):
        setting = continual.SETTINGS[name]
        arm, arm_callbacks = continual.build_model(continual.method_name("ppo_cbp_dohare", setting.algo), setting,
                                                   continual.MethodParams(), 0, "cpu", None)
        control, callbacks = continual.build_model(continual.method_name("ppo_cbp_dohare_no_replace", setting.algo),
                                                   setting, continual.MethodParams(), 0, "cpu", None)
        assert len(arm_callbacks) == 1 and callbacks == []
        strip = lambda g: {k: v for k, v in g.items() if k != "params"}  # noqa: E731
        assert [strip(g) for g in control.policy.optimizer.param_groups] == \
            [strip(g) for g in arm.policy.optimizer.param_groups]
        assert control.policy.optimizer.param_groups[0]["weight_decay"] == 1e-4
        assert control.policy.optimizer.param_groups[0]["betas"] == (0.99, 0.99)
        for a, b in zip(arm.policy.state_dict().values(), control.policy.state_dict().values()):
            assert th.equal(a, b)
        arm.env.close()
        control.env.close()


def test_the_time_limit_ablation_differs_from_his_design_in_that_field_only(continual):
    design, ablation = continual.SETTINGS["slippery_ant_dohare"], continual.SETTINGS["slippery_ant_dohare_bootstrap"]
    assert design.time_limit_terminal and not ablation.time_limit_terminal and ablation.advantage_norm == "rollout"
    assert replace(ablation, time_limit_terminal=True, description=design.description) == design
