"""Options that cannot act say so (audit): intervention options set without their switch, a continual Shrink &
Perturb that changes nothing, an S&P ``every`` beyond the call, an on-policy S&P event due at the end of ``learn()``,
FIRE's ``at`` plan in verbose mode, and NaP next to an activation it does not know."""

from __future__ import annotations

import warnings

import pytest
import torch as th
from stable_baselines3 import PPO
from torch import nn

from sb3_plastic import FIRE, PlasticPPO, ShrinkPerturb
from sb3_plastic.callbacks.cbp import ContinualBackpropConfig
from sb3_plastic.callbacks.fire import FIREConfig
from sb3_plastic.callbacks.nap import NaPConfig, insert_layer_norms_
from sb3_plastic.callbacks.regularisers import SpectralRegularisationConfig
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturbConfig

PPO_KWARGS = dict(n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[8]))


def _no_warning(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return make()


# ---------------------------------------------------------------------------------------------------
# 1. options without their switch
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, kwargs, pattern",
    [
        (ShrinkPerturbConfig, dict(shrink_perturb_every=100), r"shrink_perturb_every=100.*shrink_perturb is None"),
        (ShrinkPerturbConfig, dict(shrink_factor=0.5), r"shrink_factor=0.5.*shrink_perturb is None"),
        (ShrinkPerturbConfig, dict(shrink_perturb_on_task_change=True), "shrink_perturb_on_task_change=True"),
        (ShrinkPerturbConfig, dict(perturb_noise_std=1e-3), "perturb_noise_std=0.001"),
        (
            ShrinkPerturbConfig,
            dict(shrink_perturb="event", shrink_perturb_every=10, perturb_noise_std=1e-3),
            r"perturb_noise_std=0.001.*only.*'continual'",
        ),
        (
            ShrinkPerturbConfig,
            dict(shrink_perturb="continual", perturb_scale=0.3),
            r"perturb_scale=0.3.*only.*'event'",
        ),
        (FIREConfig, dict(fire_layers="hidden"), r"fire_layers='hidden'.*no FIRE trigger"),
        (FIREConfig, dict(fire_iterations=10), r"fire_iterations=10"),
        (FIREConfig, dict(fire_head_scale="reference"), r"fire_head_scale='reference'"),
        (NaPConfig, dict(nap_project="all"), r"nap_project='all'.*nap=False"),
        (SpectralRegularisationConfig, dict(spectral_exponent=1.0), r"spectral_exponent=1.0.*spectral_coef"),
        (SpectralRegularisationConfig, dict(spectral_layers="hidden"), r"spectral_layers='hidden'"),
        # issue #31: Continual Backprop's options without replacement_rate
        (ContinualBackpropConfig, dict(maturity_threshold=100), r"maturity_threshold=100.*replacement_rate is 0"),
        (ContinualBackpropConfig, dict(cbp_decay_rate=0.9), r"cbp_decay_rate=0.9.*replacement_rate is 0"),
        (ContinualBackpropConfig, dict(cbp_utility="adaptable_contribution"), r"cbp_utility='adaptable_contribution'"),
    ],
)
def test_option_without_its_switch_warns(cls, kwargs, pattern):
    with pytest.warns(UserWarning, match=pattern):
        cls(**kwargs)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (ShrinkPerturbConfig, {}),
        (ShrinkPerturbConfig, dict(shrink_perturb="event", shrink_perturb_every=10, shrink_factor=0.5)),
        (ShrinkPerturbConfig, dict(shrink_perturb="continual", perturb_noise_std=1e-3)),
        (FIREConfig, {}),
        (FIREConfig, dict(fire_at=0.5, fire_layers="hidden", fire_iterations=10, fire_head_scale="reference")),
        (NaPConfig, {}),
        (NaPConfig, dict(nap=True, nap_project="all")),
        (SpectralRegularisationConfig, {}),
        (SpectralRegularisationConfig, dict(spectral_coef=1e-3, spectral_exponent=1.0)),
        (ContinualBackpropConfig, {}),
        (ContinualBackpropConfig, dict(replacement_rate=1e-4, maturity_threshold=100, cbp_decay_rate=0.9)),
    ],
)
def test_defaults_and_switched_on_options_are_silent(cls, kwargs):
    _no_warning(lambda: cls(**kwargs))


def test_plastic_ppo_warns_for_an_option_without_its_switch():
    with pytest.warns(UserWarning, match="shrink_perturb_every"):
        model = PlasticPPO("MlpPolicy", "CartPole-v1", shrink_perturb_every=100, **PPO_KWARGS)
    assert model.intervention_callbacks() == []
    # load() builds the model without user keywords: no warning there
    _no_warning(lambda: PlasticPPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(isometry_coef=0.1), r"isometry_coef=0.1 is ignored: isometry_mode='off'"),
        (dict(isometry_layers="all"), r"isometry_layers='all' is ignored: isometry_mode='off'"),
        (dict(isometry_interval=4), r"isometry_interval=4 is ignored"),
    ],
)
def test_isometry_options_with_the_penalty_off_warn(kwargs, pattern):
    """Issue #31: ``isometry_coef`` with ``isometry_mode="off"`` was silently ignored. The warning points at the
    caller's line."""
    with pytest.warns(UserWarning, match=pattern) as record:
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", optimizer="adam", **kwargs, **PPO_KWARGS)
    assert any(w.filename == __file__ for w in record)
    _no_warning(lambda: PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", optimizer="adam", **PPO_KWARGS))
    _no_warning(lambda: PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs, **PPO_KWARGS))


@pytest.mark.parametrize("eval_freq", [0, -1])
def test_continual_eval_callback_that_never_evaluates_warns(eval_freq):
    """Issue #31: ``ContinualEvalCallback(eval_freq=0)`` never evaluated, silently."""
    import gymnasium as gym

    from sb3_plastic import ContinualEvalCallback

    with pytest.warns(UserWarning, match=rf"ContinualEvalCallback\(eval_freq={eval_freq}\) never evaluates"):
        ContinualEvalCallback(gym.make("CartPole-v1"), eval_freq=eval_freq)
    _no_warning(lambda: ContinualEvalCallback(gym.make("CartPole-v1"), eval_freq=10))


def test_shrink_perturb_rejects_mode_none():
    with pytest.raises(ValueError, match=r"mode None.*\['event', 'continual'\]"):
        ShrinkPerturb(mode=None)


def test_continual_shrink_perturb_that_changes_nothing_warns():
    with pytest.warns(UserWarning, match=r"noise_std=0.*weight_decay=0.*changes nothing"):
        ShrinkPerturb("continual", noise_std=0.0, weight_decay=0.0)
    with pytest.warns(UserWarning, match=r"perturb_noise_std=0.*shrink_weight_decay=0"):
        ShrinkPerturbConfig(shrink_perturb="continual", perturb_noise_std=0.0, shrink_weight_decay=0.0)
    _no_warning(lambda: ShrinkPerturb("continual", noise_std=0.0))


# ---------------------------------------------------------------------------------------------------
# 2. S&P every beyond the call
# ---------------------------------------------------------------------------------------------------
def test_shrink_perturb_every_beyond_the_call_warns():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    sp = ShrinkPerturb(every=10**6)
    with pytest.warns(UserWarning, match=r"ShrinkPerturb every=1000000.*num_timesteps 0 -> 256"):
        model.learn(256, callback=sp)
    assert sp.state["events"] == 0


def test_shrink_perturb_every_within_the_call_is_silent():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    sp = ShrinkPerturb(every=128)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.learn(256, callback=sp)
    assert sp.state["events"] >= 1


def test_fire_every_beyond_the_call_still_warns():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    with pytest.warns(UserWarning, match=r"FIRE every=100000 \(fire_every\).*num_timesteps 0 -> 128"):
        model.learn(128, callback=FIRE(every=100_000))


# ---------------------------------------------------------------------------------------------------
# 3. on-policy S&P event due at the end of learn()
# ---------------------------------------------------------------------------------------------------
def test_on_policy_event_due_at_the_end_is_applied_like_fire():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    sp, fire = ShrinkPerturb(every=128, perturb=0.0), FIRE(every=128)
    model.learn(128, callback=[sp, fire])
    assert fire.fire_count == 1
    assert sp.state["events"] == 1 and sp.state["pending"] is False
    assert sp.state["steps_since_event"] == 0


def test_new_run_restarts_the_counters_and_resume_continues():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    sp = ShrinkPerturb(every=192, perturb=0.0)
    model.learn(128, callback=sp)  # 128 of 192 steps counted
    assert sp.state["events"] == 0 and sp.state["steps_since_event"] == 128
    model.learn(64, callback=sp, reset_num_timesteps=True)  # a new run: nothing carried over, nothing due
    assert sp.state["events"] == 0 and sp.state["steps_since_event"] == 64
    assert model.num_timesteps == 64
    # resume: the count continues and the event comes at 192 steps of this run
    model.learn(128, callback=sp, reset_num_timesteps=False)
    assert sp.state["events"] == 1 and sp.state["steps_since_event"] == 0


def test_stale_pending_event_is_dropped_by_a_new_run():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    sp = ShrinkPerturb(every=10**6, perturb=0.0)
    with pytest.warns(UserWarning):
        model.learn(64, callback=sp)
    sp.state["pending"] = True  # as an old save could hold it
    sp.state["steps_since_event"] = 50
    with pytest.warns(UserWarning):
        model.learn(64, callback=sp)  # reset_num_timesteps=True: a new run
    assert sp.state["events"] == 0 and sp.state["steps_since_event"] == 64


# ---------------------------------------------------------------------------------------------------
# 6. FIRE's plan in verbose mode, NaP and unknown activations
# ---------------------------------------------------------------------------------------------------
def test_fire_verbose_prints_the_planned_point(capsys):
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_KWARGS)
    model.learn(256, callback=FIRE(at=0.5, verbose=1))
    out = capsys.readouterr().out
    assert "FIRE at=0.5 planned at num_timesteps 128" in out
    assert "fraction of the run" in out


def test_nap_warns_for_an_activation_it_does_not_know():
    net = nn.Sequential(nn.Linear(4, 8), nn.SELU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match=r"SELU.*NONLINEARITIES"):
        inserted = insert_layer_norms_(net)
    assert len(inserted) == 1  # only the ReLU's layer
    known = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    _no_warning(lambda: insert_layer_norms_(known))


def test_nap_with_selu_activation_fn_warns():
    with pytest.warns(UserWarning, match="SELU"):
        PlasticPPO(
            "MlpPolicy",
            "CartPole-v1",
            nap=True,
            n_steps=64,
            batch_size=32,
            seed=0,
            policy_kwargs=dict(net_arch=[8], activation_fn=th.nn.SELU),
        )
