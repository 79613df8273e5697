"""The ``plasticity/...`` TensorBoard keys are a stable interface: a small PPO run with the monitor and the
interventions logs exactly the keys the callbacks' docstrings name (a renamed or new key fails here)."""

import csv

from stable_baselines3.common.logger import configure

from sb3_plastic import PlasticPPO
from sb3_plastic.callbacks import (
    FIRE,
    ChurnReduction,
    ContinualBackprop,
    L2Init,
    LayerReset,
    ParsevalRegularisation,
    PlasticityInjection,
    PlasticityMonitor,
    SpectralRegularisation,
    WeightClipping,
)

LAYERS = ("mlp_extractor.policy_net.0", "mlp_extractor.value_net.0")
HEADS = ("action_net", "value_net")
WEIGHT_METRICS = ("weight_norm", "dist_from_init", "dfi", "dfi_floor", "dfi_ceiling", "sigma_max", "sigma_min", "cond")
FEATURE_METRICS = ("dormant_fraction", "zero_fraction", "srank", "effective_rank", "feature_norm",
                   "feature_variance")
NETWORK_METRICS = (
    "dormant_fraction", "zero_fraction", "weight_norm", "dist_from_init", "dfi", "dfi_hidden", "dfi_free", "dfi_free_hidden",
    "dfi_floor", "dfi_ceiling", "dfi_floor_hidden", "dfi_ceiling_hidden", "grad_norm",
    "ntk_cond", "ntk_log10_cond", "ntk_erank", "ntk_trace", "ntk_size",
)

EXPECTED = (
    {f"plasticity/policy/{layer}/{m}" for layer in LAYERS for m in FEATURE_METRICS + WEIGHT_METRICS}
    | {f"plasticity/policy/{head}/{m}" for head in HEADS for m in WEIGHT_METRICS}
    | {f"plasticity/policy/{m}" for m in NETWORK_METRICS}
    | {"plasticity/monitor_seconds", "plasticity/skipped_passes"}
    | {f"plasticity/cbp/policy/{layer}/replaced" for layer in LAYERS}
    | {"plasticity/cbp/replaced"}
    | {"plasticity/churn_reduction/coef", "plasticity/churn_reduction/reg_loss"}
    | {"plasticity/fire/dfi_before", "plasticity/fire/dfi_after", "plasticity/fire/seconds", "plasticity/fire/count"}
    | {"plasticity/l2_init/distance"}
    | {"plasticity/layer_reset/count", "plasticity/layer_reset/parameters"}
    # ReDo and ShrinkPerturb enabled through the algorithm's keywords (callbacks named "auto"): unprefixed keys
    | {f"plasticity/redo/policy/{layer}/{m}" for layer in LAYERS for m in ("dormant_fraction", "resets")}
    | {"plasticity/redo/dormant_fraction", "plasticity/redo/resets", "plasticity/redo/total_resets",
       "plasticity/redo/events"}
    | {"plasticity/shrink_perturb/events"}
    | {"plasticity/weight_clipping/at_bound"}
)


def test_ppo_logs_exactly_the_documented_plasticity_keys(tmp_path):
    model = PlasticPPO(
        "MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16]),
        seed=0, device="cpu", redo_period=2, redo_probe_size=64, shrink_perturb="event", shrink_perturb_every=64,
    )
    model.set_logger(configure(str(tmp_path), ["csv"]))
    callbacks = [
        PlasticityMonitor(every=64, max_overhead=None),
        FIRE(at=128),
        ContinualBackprop(maturity_threshold=2, replacement_rate=0.1),
        LayerReset(every=64),
        ChurnReduction(),
        L2Init(coef=1e-3),
        WeightClipping(),
    ]
    model.learn(256, callback=callbacks)
    with open(tmp_path / "progress.csv", newline="") as f:
        header = next(csv.reader(f))
    logged = {k for k in header if k.startswith("plasticity/")}
    assert logged == EXPECTED, (sorted(logged - EXPECTED), sorted(EXPECTED - logged))


def _logged(model, tmp_path, callbacks, steps=256):
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(steps, callback=callbacks)
    with open(tmp_path / "progress.csv", newline="") as f:
        return {k for k in next(csv.reader(f)) if k.startswith("plasticity/")}


def test_named_callbacks_of_one_class_log_apart(tmp_path):
    """Two named callbacks of one class on one model (a policy-head and a value-head reset, two FIRE points...)
    write their own keys, ``<group>_<name>/``, for every class; an unnamed one keeps the plain group."""
    model = PlasticPPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1,
                       policy_kwargs=dict(net_arch=[16]), seed=0, device="cpu")
    callbacks = [
        FIRE(at=128, name="a"), FIRE(at=192, name="b"),
        ContinualBackprop(maturity_threshold=2, replacement_rate=0.1, name="a"),
        LayerReset(every=64, layers=("action_net",), name="policy"),
        LayerReset(every=128, layers=("value_net",), name="value"),
        ChurnReduction(name="a"), L2Init(coef=1e-3, name="a"), WeightClipping(name="a"),
        ParsevalRegularisation(coef=1e-3, name="a"), SpectralRegularisation(coef=1e-3, name="a"),
    ]
    logged = _logged(model, tmp_path, callbacks)
    groups = {k.split("/")[1] for k in logged}
    assert groups == {"fire_a", "fire_b", "cbp_a", "layer_reset_policy", "layer_reset_value", "churn_reduction_a",
                      "l2_init_a", "weight_clipping_a", "parseval_a", "spectral_a"}, sorted(groups)
    for group in ("fire_a", "fire_b"):
        assert {f"plasticity/{group}/{k}" for k in ("dfi_before", "dfi_after", "seconds", "count")} <= logged
    assert {"plasticity/layer_reset_policy/count", "plasticity/layer_reset_value/parameters"} <= logged


def test_named_injection_logs_under_its_name(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1,
                       policy_kwargs=dict(net_arch=[16]), seed=0, device="cpu")
    logged = _logged(model, tmp_path, [PlasticityInjection(at=128, name="x")])
    assert logged == {"plasticity/injection_x/count", "plasticity/injection_x/parameters"}, sorted(logged)
