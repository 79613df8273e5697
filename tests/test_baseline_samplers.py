"""Optuna search spaces of the isometry paper's baselines (issue #15): each sampled trial builds a plastic model with
the baseline on, and rl_zoo3's ``--trial-id`` path (optuna params -> hyperparameters) gives the same keywords."""

from __future__ import annotations

import gymnasium as gym
import optuna
import pytest
import torch as th

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.samplers import ACTIVATION_METHODS, BASELINE_SPACES, plastic_sampler_for

CASES = [("ppo", PlasticPPO, "CartPole-v1"), ("dqn", PlasticDQN, "CartPole-v1"), ("sac", PlasticSAC, "Pendulum-v1")]


@pytest.mark.parametrize("method", sorted([*BASELINE_SPACES, *ACTIVATION_METHODS]))
@pytest.mark.parametrize("base, cls, env_id", CASES)
def test_baseline_sampler_builds_the_model_and_round_trips(method, base, cls, env_id):
    sampler, converter = plastic_sampler_for(base, method=method)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2)).ask()
    env = gym.make(env_id)
    n_actions = env.action_space.shape[0] if env.action_space.shape else 0
    params = sampler(trial, n_actions, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert "isometry_coef" not in params and "replacement_rate" not in params  # the baseline's space only
    if method in ACTIVATION_METHODS:
        assert params["activation"] == method and trial.params["activation"] == method
    extra = {"buffer_size": 100} if base != "ppo" else {}
    fixed = {"isometry_mode": "off", "optimizer": "adam", **params}
    model = cls("MlpPolicy", env, **extra, **fixed)
    configs = model.intervention_configs
    if method == "l2_init":
        assert configs["l2_init"].l2_init_coef == trial.params["l2_init_coef"] > 0
    elif method == "spectral":
        assert configs["spectral"].spectral_coef == trial.params["spectral_coef"] > 0
    elif method in ACTIVATION_METHODS:
        assert model.isometry_config.activation == method
    elif method == "parseval":
        assert configs["parseval"].parseval_coef == trial.params["parseval_coef"] > 0
    elif method == "weight_clipping":
        config = configs["weight_clipping"]
        assert config.weight_clipping and config.weight_clipping_kappa == trial.params["weight_clipping_kappa"] >= 1
        assert [type(c).__name__ for c in model.intervention_callbacks()] == ["WeightClipping"]
    elif method == "plasticity_injection":
        config = configs["plasticity_injection"]
        assert config.plasticity_injection_at == trial.params["plasticity_injection_at"]
        assert config.plasticity_injection_layers == trial.params["plasticity_injection_layers"]
    elif method == "trac":
        optimizer = model.policy.optimizer if base != "sac" else model.critic.optimizer
        assert model.isometry_config.optimizer == "trac" and type(optimizer).__name__ == "TRACAdam"
    elif method == "churn_reduction":
        config = configs["churn_reduction"]
        assert config.churn_reduction and config.churn_reduction_target_scale == trial.params["churn_reduction_target_scale"]
    elif method == "layer_reset":
        config = configs["layer_reset"]
        assert config.layer_reset_layers == trial.params["layer_reset_layers"]
        assert config.layer_reset_every == trial.params["layer_reset_every"] >= 10_000
        assert [type(c).__name__ for c in model.intervention_callbacks()] == ["LayerReset"]
    elif method == "shrink_perturb":
        config = configs["shrink_perturb"]
        assert config.shrink_perturb == "event" and config.shrink_factor == trial.params["shrink_factor"]
        assert config.perturb_scale == trial.params["perturb_scale"]
        assert config.shrink_perturb_every == trial.params["shrink_perturb_every"] >= 10_000
        assert [type(c).__name__ for c in model.intervention_callbacks()] == ["ShrinkPerturb"]
    elif method == "shrink_perturb_continual":
        config = configs["shrink_perturb"]
        assert config.shrink_perturb == "continual" and config.perturb_noise_std == trial.params["perturb_noise_std"]
        assert config.shrink_weight_decay == trial.params["shrink_weight_decay"]
    elif method == "redo":
        config = configs["redo"]
        assert (config.redo_period, config.redo_tau) == (trial.params["redo_period"], trial.params["redo_tau"])
        assert [type(c).__name__ for c in model.intervention_callbacks()] == ["ReDo"]
    elif method == "fire":
        assert configs["fire"].fire_at == trial.params["fire_at"]
        assert [type(c).__name__ for c in model.intervention_callbacks()] == ["FIRE"]
    elif method == "adam_equal_betas":
        optimizer = model.policy.optimizer if base != "sac" else model.critic.optimizer
        beta1, beta2 = optimizer.param_groups[0]["betas"]
        assert model.isometry_config.optimizer == "adam_equal_betas" and beta1 == beta2
    elif method == "l2":
        optimizer = model.policy.optimizer if base != "sac" else model.critic.optimizer
        assert optimizer.param_groups[0]["weight_decay"] == trial.params["weight_decay"] > 0
        assert type(optimizer) is th.optim.Adam and model.intervention_callbacks() == []
    elif method == "layernorm":
        assert configs["nap"].nap and configs["nap"].nap_project == "none" == trial.params["nap_project"]
        assert model.policy.plastic_layer_norm and model.intervention_callbacks() == []
    else:
        assert configs["nap"].nap and configs["nap"].nap_project == trial.params["nap_project"]
        assert model.policy.plastic_layer_norm
    assert converter(trial.params) == params


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="shrinkage"):
        plastic_sampler_for("ppo", method="shrinkage")
