"""Bad input audit: every public keyword a user plausibly mistypes gets a ``ValueError`` naming the keyword, the value
given and what is allowed, or a warning where the value is legal but does nothing.

Part 1 pins the validation that already held (the cases the other test files do not reach: NaN / inf, bools for
ints, floats for ints, strings for numbers, case typos); part 2 holds the audit's findings, each of which failed before
its fix (a value accepted silently, a crash inside the library with an unhelpful message, or a message naming the
wrong keyword or allowed set)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
import torch as th

from sb3_plastic import (
    FIRE,
    ChurnReduction,
    ContinualBackprop,
    ContinualEvalCallback,
    L2Init,
    LayerReset,
    NormalizeAndProject,
    ParsevalRegularisation,
    PlasticityInjection,
    PlasticityMonitor,
    PlasticPPO,
    ReDo,
    ShrinkPerturb,
    SpectralRegularisation,
    WeightClipping,
)
from sb3_plastic.callbacks import TaskScheduleSync
from sb3_plastic.callbacks.cbp import ContinualBackpropConfig
from sb3_plastic.callbacks.churn_reduction import ChurnReductionConfig
from sb3_plastic.callbacks.fire import FIREConfig
from sb3_plastic.callbacks.layer_reset import LayerResetConfig
from sb3_plastic.callbacks.nap import NaPConfig
from sb3_plastic.callbacks.parseval import ParsevalConfig
from sb3_plastic.callbacks.plasticity_injection import PlasticityInjectionConfig
from sb3_plastic.callbacks.redo import ReDoConfig
from sb3_plastic.callbacks.regularisers import L2InitConfig, SpectralRegularisationConfig
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturbConfig
from sb3_plastic.callbacks.weight_clipping import WeightClippingConfig
from sb3_plastic.config import IsometryConfig
from sb3_plastic.envs import TaskSchedule
from sb3_plastic.envs.bandit_envs import make_random_label_bandit
from sb3_plastic.envs.control_envs import make_perturbed_control
from sb3_plastic.optim import AdamO
from sb3_plastic.trac import TRACAdam

NAN, INF = float("nan"), float("inf")
PPO_KWARGS = dict(n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[8]))


def names_all(*parts: str) -> str:
    """A ``match=`` pattern that needs every one of ``parts`` (literally, in any order) in the message."""
    return "(?s)" + "".join(f"(?=.*{re.escape(p)})" for p in parts)


def build(make: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``make(**kwargs)`` with the warnings of options set without their switch silenced (they are tested elsewhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(**kwargs)


def _params() -> list[th.nn.Parameter]:
    return [th.nn.Parameter(th.randn(4, 4))]


# ---------------------------------------------------------------------------------------------------------------------
# 1. validation that holds: keyword, value and allowed set in the message
# ---------------------------------------------------------------------------------------------------------------------
CONFIG_CASES = [
    # (config, switch-on keywords, keyword, bad value, text of what is allowed)
    (IsometryConfig, {}, "isometry_coef", NAN, "finite number >= 0"),
    (IsometryConfig, {}, "isometry_coef", "0.1", "finite number >= 0"),
    (IsometryConfig, {}, "isometry_scale", INF, "finite number > 0"),
    (IsometryConfig, {}, "isometry_interval", True, "int >= 1 or 'auto'"),
    (IsometryConfig, {}, "isometry_interval", 2.0, "int >= 1 or 'auto'"),
    (IsometryConfig, {}, "isometry_interval", "Auto", "int >= 1 or 'auto'"),
    (IsometryConfig, {}, "isometry_layers", "hiden", "['hidden', 'all']"),
    (IsometryConfig, {}, "isometry_layers", [1], "list of patterns"),
    (IsometryConfig, {}, "isometry_mode", "Decoupled", "['decoupled', 'coupled', 'off']"),
    (IsometryConfig, {}, "optimizer", "Adam", "['adamo', 'adam', 'adam_equal_betas', 'trac']"),
    (IsometryConfig, {}, "isometry_rect_scale", 1, "True or False"),
    (IsometryConfig, {}, "activation", "gelu", "'maxmin'"),
    (FIREConfig, {}, "fire_at", NAN, "(0, 1)"),
    (FIREConfig, {}, "fire_at", True, "int timestep >= 1"),
    (FIREConfig, {}, "fire_every", 0.5, "int >= 1"),
    (FIREConfig, {"fire_at": 0.5}, "fire_iterations", 0, "int >= 1"),
    (FIREConfig, {"fire_at": 0.5}, "fire_head_scale", "unit", "['init', 'reference']"),
    (FIREConfig, {}, "fire_on_task_change", "yes", "True or False"),
    (ContinualBackpropConfig, {}, "replacement_rate", NAN, "[0, 1]"),
    (ContinualBackpropConfig, {"replacement_rate": 1e-4}, "maturity_threshold", 0.5, "integer >= 0"),
    (ContinualBackpropConfig, {"replacement_rate": 1e-4}, "cbp_decay_rate", 1.0, "[0, 1)"),
    (ContinualBackpropConfig, {"replacement_rate": 1e-4}, "cbp_replacement_rule", "random", "['accumulate', 'stochastic']"),
    (ContinualBackpropConfig, {"replacement_rate": 1e-4}, "cbp_bias_absorption", 1, "True or False"),
    (ReDoConfig, {}, "redo_period", 0, "integer > 0"),
    (ReDoConfig, {"redo_period": 10}, "redo_tau", -0.1, "(0, 1]"),
    (ReDoConfig, {"redo_period": 10}, "redo_probe_size", 2.5, "integer > 0"),
    (ShrinkPerturbConfig, {"shrink_perturb_every": 10}, "shrink_perturb", "Event", "['event', 'continual'] or None"),
    (ShrinkPerturbConfig, {"shrink_perturb": "event", "shrink_perturb_every": 10}, "shrink_factor", 1.5, "(0, 1]"),
    (ShrinkPerturbConfig, {"shrink_perturb": "event"}, "shrink_perturb_every", 0, "integer > 0"),
    (ShrinkPerturbConfig, {"shrink_perturb": "continual"}, "shrink_weight_decay_mode", "decoupeld",
     "['coupled', 'decoupled']"),
    (ShrinkPerturbConfig, {"shrink_perturb": "continual"}, "perturb_noise_std", NAN, "finite number >= 0"),
    (L2InitConfig, {}, "l2_init_coef", "1e-3", "finite number >= 0"),
    (SpectralRegularisationConfig, {}, "spectral_coef", INF, "finite number >= 0"),
    (SpectralRegularisationConfig, {"spectral_coef": 1e-3}, "spectral_exponent", 0, "finite number > 0"),
    (SpectralRegularisationConfig, {"spectral_coef": 1e-3}, "spectral_power_iterations", 0, "integer >= 1"),
    (NaPConfig, {}, "nap", "yes", "True or False"),
    (NaPConfig, {"nap": True}, "nap_project_affine", None, "True or False"),
    (LayerResetConfig, {"layer_reset_every": 100}, "layer_reset_layers", "head", "'heads'"),
    (LayerResetConfig, {}, "layer_reset_at", 1.0, "(0, 1)"),
    (LayerResetConfig, {}, "layer_reset_every", -5, "int >= 1"),
    (ChurnReductionConfig, {"churn_reduction": True}, "churn_reduction_coef", NAN, "finite number >= 0"),
    (ChurnReductionConfig, {"churn_reduction": True}, "churn_reduction_window", 0, "int >= 1"),
    (ChurnReductionConfig, {"churn_reduction": True}, "churn_reduction_batch_size", 32.0, "int >= 1"),
    (ChurnReductionConfig, {}, "churn_reduction", 1, "True or False"),
    (PlasticityInjectionConfig, {"plasticity_injection_at": 0.5}, "plasticity_injection_layers", True, "int >= 1"),
    (PlasticityInjectionConfig, {}, "plasticity_injection_every", 0, "int >= 1"),
    (ParsevalConfig, {"parseval_coef": 1e-3}, "parseval_layers", "heads", "['hidden', 'all']"),
    (WeightClippingConfig, {}, "weight_clipping", "on", "True or False"),
    (WeightClippingConfig, {"weight_clipping": True}, "weight_clipping_kappa", 0, "finite number > 0"),
    (WeightClippingConfig, {"weight_clipping": True}, "weight_clipping_heads", None, "True or False"),
]


@pytest.mark.parametrize(
    "config_cls, switch, keyword, value, allowed",
    CONFIG_CASES,
    ids=[f"{c[2]}={c[3]!r}" for c in CONFIG_CASES],
)
def test_plastic_keyword_bad_value_names_it(config_cls, switch, keyword, value, allowed):
    """The keywords of the eight plastic algorithms (their config dataclasses validate them)."""
    with pytest.raises(ValueError, match=names_all(keyword, repr(value), allowed)):
        build(config_cls, {**switch, keyword: value})


CONSTRUCTOR_CASES = [
    # (callable, keywords, keyword, bad value, text of what is allowed)
    (FIRE, {}, "every", 0.5, "int >= 1"),
    (FIRE, {"at": 0.5}, "layers", "heads", "['all', 'hidden']"),
    (ReDo, {}, "tau", NAN, "(0, 1]"),
    (ShrinkPerturb, {"every": 10}, "shrink", 0, "(0, 1]"),
    (ShrinkPerturb, {"mode": "continual"}, "weight_decay", -1.0, "finite number >= 0"),
    (LayerReset, {"layers": "heads"}, "every", 2.5, "int >= 1"),
    (LayerReset, {"every": 10}, "layers", [], "non-empty list of layer-name patterns"),
    (PlasticityInjection, {}, "layers", 0, "int >= 1"),
    (L2Init, {}, "coef", INF, "finite number >= 0"),
    (SpectralRegularisation, {"coef": 1e-3}, "power_iterations", 1.5, "integer >= 1"),
    (WeightClipping, {}, "kappa", NAN, "finite number > 0"),
    (WeightClipping, {}, "heads", "yes", "True or False"),
    (NormalizeAndProject, {}, "project", "hidden", "['normalized', 'all']"),
    (ContinualBackprop, {}, "utility", "Contribution", "['contribution', 'adaptable_contribution']"),
    (ChurnReduction, {}, "warmup", -1, "int >= 0"),
    (ChurnReduction, {}, "reset_on_task_change", "yes", "None, True or False"),
    (PlasticityMonitor, {}, "probe_size", 1.5, "integer > 0"),
    (PlasticityMonitor, {}, "max_overhead", 1.0, "(0, 1) or None"),
    (TaskScheduleSync, {}, "min_tasks", 0, "int >= 1"),
    (make_random_label_bandit, {}, "change_every", "1000", "positive integer"),
    (make_random_label_bandit, {}, "n_contexts", 0, "positive integer"),
    (make_random_label_bandit, {}, "task_seed", -1, "non-negative integer"),
    (make_perturbed_control, {"base": "CartPole-v1"}, "scale", NAN, "finite number > 0"),
    (TaskSchedule, {}, "change_every", 1.5, "positive integer"),
    (TRACAdam, {"params": None}, "trac_eps", "1e-8", "finite number > 0"),
]


@pytest.mark.parametrize(
    "make, base, keyword, value, allowed",
    CONSTRUCTOR_CASES,
    ids=[f"{getattr(c[0], '__name__', c[0])}-{c[2]}={c[3]!r}" for c in CONSTRUCTOR_CASES],
)
def test_constructor_bad_value_names_it(make, base, keyword, value, allowed):
    """Callbacks, env constructors and optimizers built directly."""
    base = {k: (_params() if k == "params" else v) for k, v in base.items()}
    with pytest.raises(ValueError, match=names_all(keyword, repr(value), allowed)):
        build(make, {**base, keyword: value})


# ---------------------------------------------------------------------------------------------------------------------
# 2. the audit's findings
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["False", "yes", 1, None])
def test_at_episode_end_must_be_a_bool(value):
    """``at_episode_end="False"`` was taken as True (``bool("False")``): every env switched tasks at episode ends only."""
    pattern = names_all("at_episode_end", repr(value), "True or False")
    with pytest.raises(ValueError, match=pattern):
        TaskSchedule(100, at_episode_end=value)
    with pytest.raises(ValueError, match=pattern):
        make_random_label_bandit(change_every=100, at_episode_end=value)
    with pytest.raises(ValueError, match=pattern):
        make_perturbed_control("CartPole-v1", change_every=100, at_episode_end=value)


def test_switching_minatar_idle_episode_steps_is_named():
    """The message named ``max_steps`` (the wrapper's keyword), not the ``idle_episode_steps`` the user typed."""
    pytest.importorskip("minatar")
    from sb3_plastic.envs.minatar_envs import make_switching_minatar

    with pytest.raises(ValueError, match=names_all("idle_episode_steps=0", "integer >= 1", "None")):
        make_switching_minatar(games=["breakout", "freeway"], change_every=100, idle_episode_steps=0)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_monitor_resample_must_be_a_bool(value):
    """``PlasticityMonitor(resample="no")`` resampled (``bool("no")``)."""
    with pytest.raises(ValueError, match=names_all("resample", repr(value), "True or False")):
        PlasticityMonitor(resample=value)


@pytest.mark.parametrize("value", ["100", 10.5, True])
def test_continual_eval_freq_must_be_an_int(value):
    """``eval_freq="100"`` crashed with ``'<=' not supported between 'str' and 'int'``; ``10.5`` evaluated every 21
    calls (SB3's ``n_calls % eval_freq == 0``)."""
    with pytest.raises(ValueError, match=names_all("eval_freq", repr(value), "an int")):
        ContinualEvalCallback(gym.make("CartPole-v1"), eval_freq=value)


@pytest.mark.parametrize("value", [0.99, "abc", None])
def test_trac_betas_must_be_a_sequence(value):
    """``trac_betas=0.99`` crashed with ``'float' object is not iterable``; ``"abc"`` with a float conversion error."""
    with pytest.raises(ValueError, match=names_all("trac_betas", repr(value), "non-empty sequence of numbers in [0, 1)")):
        TRACAdam(_params(), trac_betas=value)


@pytest.mark.parametrize("keyword", ["isometry_coef", "isometry_scale"])
def test_adamo_rejects_bool_numbers(keyword):
    """``AdamO(isometry_coef=True)`` was taken as 1 (``IsometryConfig`` already refused a bool)."""
    with pytest.raises(ValueError, match=names_all(keyword, "True", "finite number")):
        AdamO(_params(), **{keyword: True})


@pytest.mark.parametrize("value", [0, 1, 0.0, "yes"])
def test_orthogonal_init_must_be_a_bool_or_none(value):
    """``orthogonal_init=0`` / ``1`` passed (``0 in (None, True, False)``), unlike every other bool keyword."""
    with pytest.raises(ValueError, match=names_all("orthogonal_init", repr(value), "True, False or None")):
        IsometryConfig(orthogonal_init=value)


@pytest.mark.parametrize("make", [ParsevalRegularisation, lambda scale: ParsevalConfig(parseval_coef=1e-3,
                                                                                      parseval_scale=scale)])
def test_parseval_negative_scale_states_the_allowed_range(make):
    """A negative scale said ``must be a finite number >= 0`` (the coefficient's range), while 0 is refused too."""
    with pytest.raises(ValueError, match=names_all("scale", "-1.0", "finite number > 0")):
        make(scale=-1.0)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(isometry_coef=0, isometry_layers="all"), r"isometry_layers='all' is ignored: isometry_coef=0"),
        (dict(isometry_coef=0.0, isometry_interval=4), r"isometry_interval=4 is ignored: isometry_coef=0"),
    ],
)
def test_isometry_options_with_a_zero_coef_warn(kwargs, pattern):
    """``isometry_mode="off"`` warned about isometry options it ignores, ``isometry_coef=0`` (the penalty off too)
    did not."""
    with pytest.warns(UserWarning, match=pattern):
        PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs, **PPO_KWARGS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_coef=0, **PPO_KWARGS)


def test_churn_reduction_that_changes_nothing_warns():
    """C-CHAIN with a zero coefficient that never adapts (``target_scale=0``) computed its regulariser every update and
    applied it with weight 0, silently."""
    with pytest.warns(UserWarning, match=r"coef=0 and target_scale=0 changes nothing"):
        ChurnReduction(coef=0.0, target_scale=0.0)
    with pytest.warns(UserWarning, match=r"churn_reduction_coef=0 and churn_reduction_target_scale=0 changes nothing"):
        ChurnReductionConfig(churn_reduction=True, churn_reduction_coef=0, churn_reduction_target_scale=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ChurnReduction(coef=0.0)  # adapts from 0 with the agent's target scale
        ChurnReduction(coef=1.0, target_scale=0.0)  # a fixed coefficient
