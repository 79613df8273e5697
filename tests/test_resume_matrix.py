"""The resume matrix: ``learn(N)`` -> ``save`` -> ``load`` -> ``learn(N, reset_num_timesteps=False)`` trains exactly as one
uninterrupted ``learn(2N)``, for every stateful feature of the library.

Reference in every test: the uninterrupted run of the same seeded model (parameters, every optimizer's state and the
plastic state, bit for bit). The zip carries the model and its plastic state; what SB3 keeps outside the zip is carried
by hand, as a user who wants a bit-identical resume does (README, "Resuming"): the same env object (its step counts and
random state: ``load(..., env=env, force_reset=False)``), the replay buffer (``save_replay_buffer`` /
``load_replay_buffer``) and the global random states (``random``, numpy, torch and the action space's, which SB3's
``load`` re-seeds with the model's ``seed``). Schedules are constant (SB3's schedules are fractions of each ``learn()``
call), so that every difference left would be plastic state lost in the zip.

Features already covered elsewhere (not repeated here): the task sequence after a resume on a fresh env
(``tests/test_task_schedule_resume.py``, ``tests/test_envs_resume.py``), FIRE's fractional ``at`` across calls
(``tests/test_fire.py``), save -> load against an in-memory continuation for L2-init, spectral regularisation and NaP
(``tests/test_regularisers.py``, ``tests/test_nap.py``), old and foreign zips (``tests/test_model_zips.py``).
"""

from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable
from typing import Any, Optional

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401  (registers the sb3_plastic/ ids)
from sb3_plastic import (
    ContinualEvalCallback,
    PlasticCrossQ,
    PlasticDQN,
    PlasticityMonitor,
    PlasticMaskablePPO,
    PlasticPPO,
    PlasticQRDQN,
    PlasticRecurrentPPO,
    PlasticSAC,
    PlasticTQC,
)
from sb3_plastic import callbacks as cbs
from sb3_plastic.envs import ChannelPermutation, GameSwitchingEnv, PhysicsParameterSchedule

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
#: 2 copies x 24 steps: a task lasts 48 timesteps, so a 128-step run sees tasks 0, 1 and 2 and the split at 64 is inside
#: task 1
BANDIT_KWARGS = dict(change_every=24, n_contexts=8, obs_dim=4)
PPO_KW = dict(n_steps=16, batch_size=16, n_epochs=2, learning_rate=3e-3, policy_kwargs=dict(net_arch=[16, 16]))
OFF_KW = dict(learning_starts=8, train_freq=2, batch_size=8, buffer_size=200, policy_kwargs=dict(net_arch=[16, 16]))
DQN_KW = dict(OFF_KW, exploration_initial_eps=0.2, exploration_final_eps=0.2, target_update_interval=10)
RECURRENT_KW = dict(PPO_KW, policy_kwargs=dict(net_arch=[16], lstm_hidden_size=8))
N_ON, N_OFF = 64, 48  # half runs: multiples of a PPO rollout (2 x 16) and of DQN's train_freq x copies (2 x 2)


def bandit(seed: int = 0) -> Any:
    """The random-label bandit, 2 copies (tasks change inside the runs)."""
    return make_vec_env(BANDIT, n_envs=2, seed=seed, env_kwargs=BANDIT_KWARGS)


def pendulum() -> Any:
    """Pendulum, one copy (the SAC family)."""
    return make_vec_env("Pendulum-v1", n_envs=1, seed=0)


def _random_states(model: Any) -> tuple:
    """The random states SB3's ``load`` re-seeds (``set_random_seed``): ``random``, numpy, torch, the action space."""
    return (random.getstate(), np.random.get_state(), th.get_rng_state(),
            copy.deepcopy(model.action_space.np_random.bit_generator.state))


def _set_random_states(states: tuple, model: Any) -> None:
    random.setstate(states[0])
    np.random.set_state(states[1])
    th.set_rng_state(states[2])
    model.action_space.np_random.bit_generator.state = states[3]


def resumed_and_whole(
    make: Callable[[], Any],
    n: int,
    tmp_path: Any,
    callbacks: Callable[[], Any] = lambda: None,
    loader: Optional[Callable[..., Any]] = None,
    drop: tuple[str, ...] = (),
) -> tuple[Any, Any, dict]:
    """Train ``make()`` for ``2 n`` steps in one ``learn()``, and another ``make()`` for ``n`` steps, saved, loaded
    (``loader``, default the model's class ``load``) and continued for ``n`` steps with ``reset_num_timesteps=False``;
    ``callbacks()`` gives the callbacks of each ``learn()`` call (new instances every call, as after a restart).

    :param drop: plastic-state keys removed from the loaded model before it continues (a control: state lost).
    :return: the uninterrupted model, the resumed one, and a deep copy of the plastic state at the save.
    """
    whole = make()
    whole.learn(2 * n, callback=callbacks())
    split = make()
    split.learn(n, callback=callbacks())
    split.save(tmp_path / "model.zip")
    at_save = copy.deepcopy(getattr(split, "plastic_state", None))
    off_policy = hasattr(split, "replay_buffer")
    if off_policy:
        split.save_replay_buffer(tmp_path / "buffer.pkl")
    states = _random_states(split)
    load = loader or type(whole).load
    loaded = load(tmp_path / "model.zip", env=split.get_env(), force_reset=False, device="cpu")
    if off_policy:
        loaded.load_replay_buffer(tmp_path / "buffer.pkl")
    for key in drop:
        loaded.plastic_state.data.pop(key)
    _set_random_states(states, loaded)
    loaded.learn(n, callback=callbacks(), reset_num_timesteps=False)
    assert loaded.num_timesteps == whole.num_timesteps == 2 * n
    return whole, loaded, at_save.data if at_save is not None else {}


def _optimizers(model: Any) -> dict[str, th.optim.Optimizer]:
    """Every optimizer SB3 saves with ``model`` (``policy.optimizer``, SAC's actor / critic / entropy ones, ...)."""
    names = model._get_torch_save_params()[0]
    found = {}
    for name in names:
        obj = model
        for part in name.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, th.optim.Optimizer):
            found[name] = obj
    return found


def _same_state(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths at which two nests of dicts / lists / tensors / numbers differ (NaN equal to NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in _same_state(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same_state(x, y, f"{path}[{i}]")]
    if isinstance(a, th.Tensor) or isinstance(b, th.Tensor):
        same = isinstance(a, th.Tensor) and isinstance(b, th.Tensor) and a.shape == b.shape and th.equal(a, b)
        return [] if same else [path]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) else [path]
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def assert_same_training_state(whole: Any, resumed: Any) -> None:
    """Bit-identical parameters and buffers of the policy, optimizer states and plastic state (except the monitor's
    wall-clock seconds)."""
    sa, sb = whole.policy.state_dict(), resumed.policy.state_dict()
    assert list(sa) == list(sb)
    different = [key for key in sa if not th.equal(sa[key], sb[key])]
    assert not different, different
    opt_a, opt_b = _optimizers(whole), _optimizers(resumed)
    assert list(opt_a) == list(opt_b) and opt_a
    for name in opt_a:
        da, db = opt_a[name].state_dict(), opt_b[name].state_dict()
        assert not _same_state(da["state"], db["state"]), name
        groups = [{k: v for k, v in g.items() if k != "params"} for g in da["param_groups"]]
        assert groups == [{k: v for k, v in g.items() if k != "params"} for g in db["param_groups"]], name
    if hasattr(whole, "plastic_state"):
        def strip(data: dict) -> dict:
            return {k: {f: v for f, v in s.items() if f != "seconds"} for k, s in data.items()}

        assert not _same_state(strip(whole.plastic_state.data), strip(resumed.plastic_state.data))


# ---------------------------------------------------------------------------------------------------------- algorithms
ALGORITHMS = {
    "ppo-adamo": (PlasticPPO, "bandit", {}),
    "ppo-interval-3": (PlasticPPO, "bandit", dict(isometry_interval=3)),  # 8 updates per half: the split is mid-window
    "ppo-coupled": (PlasticPPO, "bandit", dict(isometry_mode="coupled", optimizer="adam")),
    "ppo-trac": (PlasticPPO, "bandit", dict(optimizer="trac", isometry_mode="off")),
    "ppo-adam-equal-betas": (PlasticPPO, "bandit", dict(optimizer="adam_equal_betas", isometry_mode="coupled")),
    "ppo-maxmin": (PlasticPPO, "bandit", dict(activation="maxmin")),
    "ppo-crelu": (PlasticPPO, "bandit", dict(activation="crelu")),
    "ppo-fourier": (PlasticPPO, "bandit", dict(activation="fourier")),
    "ppo-nap": (PlasticPPO, "bandit", dict(nap=True)),
    "dqn-adamo": (PlasticDQN, "bandit", {}),
    "dqn-double-q-mse": (PlasticDQN, "bandit", dict(double_q=True, td_loss="mse")),
    "qrdqn": (PlasticQRDQN, "bandit", {}),
    "sac": (PlasticSAC, "pendulum", {}),
    "tqc": (PlasticTQC, "pendulum", {}),
    "crossq": (PlasticCrossQ, "pendulum", {}),
    "recurrent-ppo": (PlasticRecurrentPPO, "bandit", {}),
    "maskable-ppo": (PlasticMaskablePPO, "masked", {}),
}


def build(cls: type, env: str, **kwargs: Any) -> Any:
    """A small seeded plastic model of ``cls`` on ``env`` (``"bandit"``, ``"pendulum"`` or ``"masked"``)."""
    if cls is PlasticRecurrentPPO:
        return cls("MlpLstmPolicy", bandit(), seed=0, device="cpu", **RECURRENT_KW, **kwargs)
    if env == "masked":
        vec = make_vec_env("sb3_plastic/InvalidActionDiscrete-v0", n_envs=2, seed=0)
        return cls("MlpPolicy", vec, seed=0, device="cpu", **PPO_KW, **kwargs)
    if cls in (PlasticSAC, PlasticTQC, PlasticCrossQ):
        return cls("MlpPolicy", pendulum(), seed=0, device="cpu", **OFF_KW, **kwargs)
    if cls in (PlasticDQN, PlasticQRDQN):
        return cls("MlpPolicy", bandit(), seed=0, device="cpu", **DQN_KW, **kwargs)
    return cls("MlpPolicy", bandit(), seed=0, device="cpu", **PPO_KW, **kwargs)


def half(cls: type) -> int:
    return N_OFF if cls in (PlasticDQN, PlasticQRDQN, PlasticSAC, PlasticTQC, PlasticCrossQ) else N_ON


@pytest.mark.parametrize("case", list(ALGORITHMS))
def test_every_algorithm_optimizer_and_activation_resumes_exactly(tmp_path, case):
    """The isometry optimizers (AdamO, its amortised interval, coupled Adam, TRAC, Adam beta1 = beta2), the activations
    and NaP's norms, DQN's double Q / MSE and every plastic algorithm: the resumed run is the uninterrupted one."""
    cls, env, kwargs = ALGORITHMS[case]
    whole, resumed, _ = resumed_and_whole(lambda: build(cls, env, **kwargs), half(cls), tmp_path)
    assert_same_training_state(whole, resumed)


# -------------------------------------------------------------------------------------------- intervention keywords
def _cbp_replaced(state: dict) -> int:
    return sum(int(v["replaced"]) for layers in state.values() if isinstance(layers, dict) and "seed" not in layers
               for v in layers.values())


#: keyword -> (plastic-state key, what counts its actions); the count must grow after the split, so each case shows
#: its intervention acting in the resumed half
INTERVENTIONS: dict[str, tuple[dict, str, Callable[[dict], float]]] = {
    "fire-every+task": (dict(fire_every=40, fire_on_task_change=True), "FIRE:auto", lambda s: s["count"]),
    "fire-at-int": (dict(fire_at=90), "FIRE:auto", lambda s: s["count"]),
    "fire-newton-schulz": (dict(fire_every=40, fire_iterations=3), "FIRE:auto", lambda s: s["count"]),
    "cbp": (dict(replacement_rate=0.05, maturity_threshold=2), "ContinualBackprop:auto", _cbp_replaced),
    "cbp-stochastic": (dict(replacement_rate=0.05, maturity_threshold=2, cbp_replacement_rule="stochastic"),
                       "ContinualBackprop:auto", _cbp_replaced),
    "redo": (dict(redo_period=3, redo_tau=0.9, redo_probe_size=16), "ReDo:auto", lambda s: s["total_resets"]),
    "shrink-perturb-every": (dict(shrink_perturb="event", shrink_perturb_every=40), "ShrinkPerturb:auto",
                             lambda s: s["events"]),
    "shrink-perturb-task": (dict(shrink_perturb="event", shrink_perturb_on_task_change=True), "ShrinkPerturb:auto",
                            lambda s: s["events"]),
    "shrink-perturb-continual": (dict(shrink_perturb="continual", perturb_noise_std=1e-3), "ShrinkPerturb:auto",
                                 lambda s: s["noise_steps"]),
    "shrink-perturb-decoupled": (dict(shrink_perturb="continual", shrink_weight_decay_mode="decoupled"),
                                 "ShrinkPerturb:auto", lambda s: s["noise_steps"]),
    "l2-init": (dict(l2_init_coef=0.5), "L2Init:auto", lambda s: 0),
    "spectral": (dict(spectral_coef=0.5), "SpectralRegularisation:auto", lambda s: 0),
    "layer-reset-every": (dict(layer_reset_every=40), "LayerReset:auto", lambda s: s["count"]),
    "layer-reset-task": (dict(layer_reset_on_task_change=True, layer_reset_layers=1), "LayerReset:auto",
                         lambda s: s["count"]),
    "churn-reduction": (dict(churn_reduction=True), "ChurnReduction:auto", lambda s: 0),
    "injection-every": (dict(plasticity_injection_every=40), "PlasticityInjection:auto", lambda s: s["count"]),
    "injection-at": (dict(plasticity_injection_at=40), "PlasticityInjection:auto", lambda s: 0),  # before the split
    "injection-task": (dict(plasticity_injection_on_task_change=True), "PlasticityInjection:auto", lambda s: s["count"]),
    "parseval": (dict(parseval_coef=0.01), "ParsevalRegularisation:auto", lambda s: 0),
    "weight-clipping": (dict(weight_clipping=True, weight_clipping_kappa=1.0), "WeightClipping:auto",
                        lambda s: s["steps"]),
    "nap": (dict(nap=True), "NormalizeAndProject:auto", lambda s: s["projections"]),
}


@pytest.mark.parametrize("cls", [PlasticPPO, PlasticDQN], ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", list(INTERVENTIONS))
def test_every_intervention_keyword_resumes_exactly(tmp_path, cls, case):
    kwargs, key, acted = INTERVENTIONS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "maturity_threshold is large against this run": not the subject here
        whole, resumed, at_save = resumed_and_whole(lambda: build(cls, "bandit", **kwargs), half(cls), tmp_path)
    assert_same_training_state(whole, resumed)
    assert acted(resumed.plastic_state[key]) >= acted(at_save[key])
    if acted(whole.plastic_state[key]) or case in ("cbp", "fire-every+task", "injection-every", "layer-reset-task"):
        assert acted(resumed.plastic_state[key]) > acted(at_save[key]), "the intervention did not act after the split"


SAC_INTERVENTIONS = {
    "churn-reduction": dict(churn_reduction=True),
    "cbp": dict(replacement_rate=0.05, maturity_threshold=2),
    "redo": dict(redo_period=3, redo_tau=0.9, redo_probe_size=8),
    "fire": dict(fire_every=30),
    "layer-reset": dict(layer_reset_every=30),
    "injection": dict(plasticity_injection_every=30),
}


@pytest.mark.parametrize("case", list(SAC_INTERVENTIONS))
def test_sac_interventions_resume_exactly(tmp_path, case):
    """The SAC family's own paths (CHAIN's critic churn, actor and critic resets, target re-syncs, the entropy
    coefficient's optimizer)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, resumed, _ = resumed_and_whole(lambda: build(PlasticSAC, "pendulum", **SAC_INTERVENTIONS[case]), N_OFF,
                                              tmp_path)
    assert_same_training_state(whole, resumed)


@pytest.mark.parametrize("kwargs", [dict(replacement_rate=0.05, maturity_threshold=2),
                                    dict(redo_period=3, redo_tau=0.9, redo_probe_size=16), dict(fire_every=40)],
                         ids=["cbp", "redo", "fire"])
def test_recurrent_ppo_unit_resets_resume_exactly(tmp_path, kwargs):
    """RecurrentPPO's LSTM cells replaced / re-made (and its LSTM states at the save, SB3's ``_last_lstm_states``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, resumed, _ = resumed_and_whole(lambda: build(PlasticRecurrentPPO, "bandit", **kwargs), N_ON, tmp_path)
    assert_same_training_state(whole, resumed)


#: stateful interventions whose state, dropped at the load, changes the resumed run: the matrix would see a loss
LOSSES = {
    "cbp": (dict(replacement_rate=0.05, maturity_threshold=2), "ContinualBackprop:auto"),
    "layer-reset-rng": (dict(layer_reset_every=40), "LayerReset:auto"),
    "shrink-perturb-rng": (dict(shrink_perturb="continual", perturb_noise_std=1e-3), "ShrinkPerturb:auto"),
    "churn-previous-network": (dict(churn_reduction=True), "ChurnReduction:auto"),
}


@pytest.mark.parametrize("case", list(LOSSES))
def test_the_matrix_sees_a_lost_state(tmp_path, case):
    """The control: the same resume with the intervention's plastic state removed after the load ends elsewhere."""
    kwargs, key = LOSSES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, lost, _ = resumed_and_whole(lambda: build(PlasticPPO, "bandit", **kwargs), N_ON, tmp_path, drop=(key,))
    assert any(not th.equal(a, b) for a, b in zip(whole.policy.parameters(), lost.policy.parameters()))


# -------------------------------------------------------------------------- callbacks passed by hand to plain SB3
USER_CALLBACKS: dict[str, Callable[[], Any]] = {
    "FIRE": lambda: cbs.FIRE(every=40, on_task_change=True),
    "ContinualBackprop": lambda: cbs.ContinualBackprop(replacement_rate=0.05, maturity_threshold=2),
    "ReDo": lambda: cbs.ReDo(period=3, tau=0.9, probe_size=16),
    "ShrinkPerturb": lambda: cbs.ShrinkPerturb(every=40, on_task_change=True),
    "ShrinkPerturb-continual": lambda: cbs.ShrinkPerturb(mode="continual", noise_std=1e-3),
    "LayerReset": lambda: cbs.LayerReset(every=40),
    "ChurnReduction": lambda: cbs.ChurnReduction(),
    "PlasticityInjection": lambda: cbs.PlasticityInjection(every=40),
    "L2Init": lambda: cbs.L2Init(0.5),
    "SpectralRegularisation": lambda: cbs.SpectralRegularisation(0.5),
    "ParsevalRegularisation": lambda: cbs.ParsevalRegularisation(0.01),
    "WeightClipping": lambda: cbs.WeightClipping(kappa=1.0),
    "three-at-once": lambda: [cbs.FIRE(every=40), cbs.L2Init(0.5), cbs.WeightClipping(kappa=1.0)],
}


#: the DQN column keeps the callbacks with a DQN path of their own (target re-sync, Q-value churn, buffer probes)
USER_CASES = [(PPO, name) for name in USER_CALLBACKS] + [
    (DQN, name) for name in ("FIRE", "ContinualBackprop", "ReDo", "ChurnReduction", "PlasticityInjection")]


@pytest.mark.parametrize("sb3_cls, name", USER_CASES, ids=[f"{c.__name__}-{n}" for c, n in USER_CASES])
def test_callbacks_on_plain_sb3_resume_exactly(tmp_path, sb3_cls, name):
    """A plain SB3 model with the callback passed to each ``learn()`` (a new instance after the restart): its state
    rides in the SB3 zip; after a plasticity injection SB3's ``load`` is :func:`~sb3_plastic.callbacks.load_injected`
    (README)."""
    kwargs = PPO_KW if sb3_cls is PPO else DQN_KW
    loader = None
    if name == "PlasticityInjection":
        def loader(path, **kw):
            return cbs.load_injected(sb3_cls, path, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, resumed, _ = resumed_and_whole(
            lambda: sb3_cls("MlpPolicy", bandit(), seed=0, device="cpu", **kwargs),
            N_ON if sb3_cls is PPO else N_OFF, tmp_path, callbacks=USER_CALLBACKS[name], loader=loader)
    assert_same_training_state(whole, resumed)


# ---------------------------------------------------------------------------- diagnostics and evaluation callbacks
class _RecordingMonitor(PlasticityMonitor):
    """A monitor that keeps every pass's values by step (:attr:`passes`)."""

    def __init__(self, passes: dict, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.passes = passes

    def run(self) -> dict[str, float]:
        values = super().run()
        if values:
            self.passes[self.num_timesteps] = values
        return values


#: a monitor's values that do not depend on its probe batch
PROBE_FREE = ("/weight_norm", "/dist_from_init", "/dfi", "/dfi_hidden", "/sigma_max", "/sigma_min")


@pytest.mark.parametrize("cls", [PlasticPPO, PlasticDQN, PlasticSAC])
def test_monitor_resumes_its_schedule_origin_and_probe(tmp_path, cls):
    """After a resume the monitor's passes fall at the uninterrupted run's steps and every diagnostic it writes (the
    activation, gradient and NTK diagnostics on its probe batch, saved in the zip, as the weight diagnostics from the
    initial weights saved there) is the uninterrupted run's bit for bit; only its own wall-clock time differs.
    On-policy the probe is drawn from a rollout, off-policy from the replay buffer (with the critics' actions)."""
    whole_passes: dict = {}
    resumed_passes: dict = {}
    sink = [whole_passes]
    every = 32 if cls is PlasticPPO else 12

    def monitor() -> PlasticityMonitor:
        return _RecordingMonitor(sink[0], every=every, max_overhead=None, probe_size=16, ntk_probe_size=4)

    def make() -> Any:
        model = build(cls, "bandit")
        sink[0] = whole_passes if not whole_passes else resumed_passes
        return model

    n = half(cls)
    whole, resumed, at_save = resumed_and_whole(make, n, tmp_path, callbacks=monitor)
    assert_same_training_state(whole, resumed)
    assert sorted(whole_passes) == sorted(resumed_passes)
    after = [step for step in whole_passes if step > n]
    assert len(after) >= 2 and any(step <= n for step in whole_passes)
    key = next(k for k in at_save if k.endswith("Monitor"))
    assert at_save[key]["probe"]["observations"].shape[0] == 16  # the zip holds the probe batch
    for step in after:
        measured = {k: v for k, v in whole_passes[step].items() if not k.endswith("/monitor_seconds")}
        assert {k: resumed_passes[step][k] for k in measured} == measured
        probed = [k for k in measured if k.endswith(("/dormant_fraction", "/feature_rank", "/grad_norm", "/ntk_cond"))]
        assert len(probed) >= 3, sorted(measured)
        assert measured[next(k for k in measured if k.endswith("/dist_from_init"))] > 0


def test_monitor_without_its_saved_probe_measures_other_samples(tmp_path):
    """The control: with the probe batch dropped from the loaded state (a zip of the previous version), the resumed
    run draws a new one, and the probe diagnostics after the resume differ from the uninterrupted run's (the test above
    can fail), while the weight diagnostics do not."""
    whole_passes: dict = {}
    resumed_passes: dict = {}
    sink = [whole_passes]

    def monitor() -> PlasticityMonitor:
        return _RecordingMonitor(sink[0], every=32, max_overhead=None, probe_size=16, ntk_probe_size=0)

    def make() -> Any:
        model = build(PlasticPPO, "bandit")
        sink[0] = whole_passes if not whole_passes else resumed_passes
        return model

    def drop_probe(path: Any, **kwargs: Any) -> Any:
        loaded = PlasticPPO.load(path, **kwargs)
        for state in loaded.plastic_state.data.values():
            state.pop("probe", None)
        return loaded

    whole, resumed, _ = resumed_and_whole(make, N_ON, tmp_path, callbacks=monitor, loader=drop_probe)
    sa, sb = whole.policy.state_dict(), resumed.policy.state_dict()
    assert all(th.equal(sa[k], sb[k]) for k in sa)  # training is unchanged: only the measurement moved
    for step in (96, 128):  # after the resume
        free = {k: v for k, v in whole_passes[step].items() if k.endswith(PROBE_FREE)}
        assert len(free) > 10 and free == {k: resumed_passes[step][k] for k in free}
    probe = "plasticity/policy/grad_norm"
    assert whole_passes[64][probe] == resumed_passes[64][probe]  # before the resume: the same probe
    assert any(whole_passes[s][k] != resumed_passes[s][k] for s in (96, 128) for k in whole_passes[s]
               if k.endswith(("/dormant_fraction", "/feature_rank", "/grad_norm")))


def test_continual_eval_resumes_on_its_grid(tmp_path):
    """``ContinualEvalCallback`` keeps no state in the zip: a new callback after the resume evaluates at the
    uninterrupted run's steps when the resume falls on its grid (``eval_freq * n_envs``), on the same tasks, with the
    same results; the two parts' ``evaluations.npz`` (written to two log paths: a resumed callback writes only its own
    evaluations, as SB3's ``EvalCallback``) concatenate to the uninterrupted run's."""
    def eval_env() -> Any:
        return make_vec_env(BANDIT, n_envs=1, seed=1, env_kwargs=BANDIT_KWARGS)

    shared = {"whole": eval_env(), "split": eval_env()}
    paths = iter([tmp_path / "whole", tmp_path / "first", tmp_path / "second"])
    which = iter(["whole", "split", "split"])

    def callback() -> ContinualEvalCallback:
        return ContinualEvalCallback(shared[next(which)], eval_freq=16, n_eval_episodes=2, log_path=str(next(paths)),
                                     verbose=0)

    resumed_and_whole(lambda: build(PlasticPPO, "bandit"), N_ON, tmp_path, callbacks=callback)
    whole = np.load(tmp_path / "whole" / "evaluations.npz")
    first, second = np.load(tmp_path / "first" / "evaluations.npz"), np.load(tmp_path / "second" / "evaluations.npz")
    assert list(whole["timesteps"]) == [32, 64, 96, 128]
    assert list(whole["task_ids"]) == [0, 1, 1, 2]
    for key in ("timesteps", "task_ids", "results", "ep_lengths"):
        np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), whole[key])


# ------------------------------------------------------------------------------------- the task-switching envs
def _stepped(env: gym.Env, steps: int) -> gym.Env:
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return env


def _positioned(env: gym.Env, steps: int) -> gym.Env:
    env.reset(seed=5)  # another seed: only the schedule may carry the task
    env.get_wrapper_attr("set_env_steps")(steps)
    env.reset()
    return env


ENV_TASKS: dict[str, tuple[Callable[[], gym.Env], Callable[[gym.Env], Any]]] = {
    "bandit-labels": (lambda: gym.make(BANDIT, change_every=10, n_contexts=8, obs_dim=4),
                      lambda e: e.unwrapped.labels.copy()),
    "perturbed-offset": (lambda: gym.make("sb3_plastic/PerturbedCartPole-v0", change_every=10),
                         lambda e: e.get_wrapper_attr("current_offset").copy()),
    "channel-permutation": (lambda: ChannelPermutation(gym.make("CartPole-v1"), change_every=10, axis=0, task_seed=3),
                            lambda e: e.current_permutation.copy()),
    "game-switching": (lambda: GameSwitchingEnv([lambda: gym.make("CartPole-v1")] * 3, change_every=10),
                       lambda e: e.env.index),
    "physics-parameters": (lambda: PhysicsParameterSchedule(
        gym.make("CartPole-v1"), change_every=10, at_episode_end=False,
        sample_fn=lambda rng: {"length": float(rng.uniform(0.3, 1.0))},
        apply_fn=lambda env, p: setattr(env, "length", p["length"])),
        lambda e: (e.parameters, e.unwrapped.length)),
}


@pytest.mark.parametrize("kind", list(ENV_TASKS))
def test_a_positioned_fresh_env_runs_the_uninterrupted_task(kind):
    """What a resume on a fresh env gets (``TaskScheduleSync`` calls ``set_env_steps``): the task of the uninterrupted
    env at the same step, with its content (labels, offset, permutation, game, physics), which depends only on
    ``(task_seed, k)``."""
    make, content = ENV_TASKS[kind]
    for steps in (7, 23, 35):
        uninterrupted = _stepped(make(), steps)
        fresh = _positioned(make(), steps)
        assert fresh.get_wrapper_attr("task_id") == uninterrupted.get_wrapper_attr("task_id") == steps // 10
        a, b = content(uninterrupted), content(fresh)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b
