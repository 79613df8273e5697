"""Audit of the diagnostics: nothing crashes training and nothing is silent (non-finite weights, the NTK row cap,
layers or heads that never ran, initial weights of another shape, the condition number of an all-zero matrix)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch as th
from sb3_contrib import QRDQN
from stable_baselines3 import DQN, PPO

from sb3_plastic.common.surgery import find_networks
from sb3_plastic.diagnostics import COND_CAP, capped_ratio, kernel_stats, network_diagnostics, spec_parameters, weight_spectrum

DQN_FAST = dict(learning_starts=64, buffer_size=1000, train_freq=4, policy_kwargs=dict(net_arch=[16, 16]))


def dqn(algo=DQN, **kwargs):
    return algo("MlpPolicy", "CartPole-v1", seed=0, **dict(DQN_FAST, **kwargs))


def probe(model, n: int = 16) -> th.Tensor:
    return th.as_tensor(np.random.default_rng(0).normal(size=(n, 4)), dtype=th.float32)


def run(model, spec, obs, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = network_diagnostics(model, spec, obs, **kwargs)
    return values, [str(w.message) for w in caught]


@pytest.mark.parametrize("where", ["hidden", "head"])
def test_non_finite_weight_logs_nan_and_warns_instead_of_crashing(where):
    model = dqn()
    spec = find_networks(model)[0]
    layers = spec.weight_layers()
    layer = layers[0] if where == "hidden" else spec.heads()[0]
    name = spec.layer_names[id(layer)]
    with th.no_grad():
        layer.weight[0, 0] = float("nan")
    values, messages = run(model, spec, probe(model), ntk_size=4)
    for key in ("sigma_max", "sigma_min", "cond", "dfi_floor", "dfi_ceiling"):
        assert np.isnan(values[f"{name}/{key}"])
    assert np.isnan(values["dfi_floor"]) and np.isnan(values["dfi_ceiling"])
    assert np.isnan(values["dfi_floor_hidden"]) == (where == "hidden")
    assert np.isnan(values["ntk_cond"]) and np.isnan(values["ntk_erank"])
    assert any("non-finite" in m and name in m and spec.name in m for m in messages)
    # the other layers' spectra are still computed
    other = spec.layer_names[id(layers[-1] if where == "hidden" else layers[0])]
    assert np.isfinite(values[f"{other}/sigma_max"]) and np.isfinite(values[f"{other}/dfi_ceiling"])
    if where == "hidden":  # NaN features downstream: their rank metrics are NaN too
        hidden = [h.name for h in spec.hidden_layers()]
        assert np.isnan(values[f"{hidden[0]}/srank"])


def test_ntk_row_cap_exceeded_on_one_sample_warns():
    model = dqn(QRDQN)  # 2 actions x 200 quantiles = 400 outputs per sample > 256 rows
    spec = find_networks(model)[0]
    values, messages = run(model, spec, probe(model), ntk_size=4, ntk_max_rows=256)
    assert values["ntk_size"] == 1.0
    assert any("ntk_max_rows=256" in m and "400" in m for m in messages)
    values, messages = run(model, spec, probe(model), ntk_size=4, ntk_max_rows=800)
    assert values["ntk_size"] == 2.0 and not any("ntk_max_rows" in m for m in messages)


def test_initial_weights_of_another_shape_warn():
    model = dqn()
    spec = find_networks(model)[0]
    initial = {k: v.clone() for k, v in spec_parameters(spec).items()}
    first = spec.layer_names[id(spec.weight_layers()[0])]
    wname = next(k for k in initial if k.endswith("weight"))
    initial[wname] = th.zeros(3, 3)
    values, messages = run(model, spec, probe(model), ntk_size=0, initial=initial)
    assert f"{first}/dist_from_init" not in values
    assert any("shape" in m and wname in m for m in messages)


def test_layer_without_activations_and_head_that_never_ran_warn():
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, n_steps=64, policy_kwargs=dict(net_arch=[16, 16]))
    spec = find_networks(model)[0]
    value_layers = [h.name for h in spec.hidden_layers() if "value" in h.name]
    head = spec.layer_names[id(model.policy.value_net)]
    assert value_layers and head
    # the value branch (its hidden layers and the value head) never runs on the probe
    model.policy.predict_values = lambda obs: th.zeros(obs.shape[0], 1)
    try:
        values, messages = run(model, spec, probe(model), ntk_size=2)
    finally:
        del model.policy.predict_values
    assert not any(f"{n}/srank" in values for n in value_layers)
    assert any(value_layers[0] in m and "activation" in m for m in messages)
    assert any(f"'{head}'" in m and "head" in m and "NTK" in m for m in messages)
    assert values["ntk_size"] == 2.0  # the NTK of the action head alone: 2 samples x 2 logits


def test_condition_number_of_an_all_zero_matrix_is_the_cap():
    assert capped_ratio(0.0, 0.0) == COND_CAP
    assert weight_spectrum(th.zeros(3, 3))["cond"] == COND_CAP
    assert kernel_stats(th.zeros(4, 4))["cond"] == COND_CAP
    assert capped_ratio(2.0, 1.0) == 2.0
    assert np.isnan(capped_ratio(float("nan"), 1.0))
