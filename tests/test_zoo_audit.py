"""Audit of the rl_zoo3 path (yaml -> rl_zoo3 -> plastic model, optuna samplers, ``train -i``), beyond tests/test_zoo.py.

* every sampler of :func:`sb3_plastic.samplers.plastic_sampler_for` (each plastic algorithm x each method) gives,
  over several seeded trials, values inside the documented ranges that the plastic configs accept, never a
  contradicting combination, and a converter round trip; the combinations an algorithm refuses raise at once;
* RecurrentPPO with a width-doubling activation (CReLU / Fourier, the samplers' ``crelu`` / ``fourier`` methods) trains;
* a yaml entry's plastic keywords reach the model with their types (ints, lists, ``"auto"``, schedules, a
  ``policy_kwargs`` string), its ``env_kwargs`` reach the training and eval envs; an intervention keyword inside
  ``policy_kwargs`` is refused naming the top level;
* ``train -i`` carries Continual Backprop's state and the task position (``--eval-freq`` evaluations on the tasks
  being trained), and keeps a trained model's NaP setting as it keeps its network settings;
* the shipped entries and sampler ranges hold the reference settings of the design (Dohare et al.'s CBP + PPO).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import optuna
import pytest
import yaml

from sb3_plastic import PlasticPPO, PlasticRecurrentPPO, samplers, zoo
from sb3_plastic.callbacks.continual_eval import TaskFollowingEvalMixin
from sb3_plastic.common.plastic_algorithm import intervention_config_classes, intervention_keys
from sb3_plastic.config import ISOMETRY_KEYS, IsometryConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "zoo_configs"
BANDIT = "sb3_plastic/RandomLabelBandit-v0"
BASES = ("ppo", "dqn", "sac", "qrdqn", "tqc", "crossq", "ppo_lstm", "ppo_mask")
METHODS = (None, *samplers.BASELINE_SPACES, *samplers.ACTIVATION_METHODS)
#: per base: (n_actions the rl_zoo3 sampler gets: 0 for discrete actions, the action dim otherwise)
N_ACTIONS = {"ppo": 0, "dqn": 0, "qrdqn": 0, "ppo_lstm": 0, "ppo_mask": 0, "sac": 1, "tqc": 1, "crossq": 1}
ADDITIONAL = {"using_her_replay_buffer": False, "her_kwargs": {}}
#: (base, method) pairs whose algorithm refuses the method in learn() (checked below against the algorithms)
REFUSED = (("crossq", "churn_reduction"), ("crossq", "plasticity_injection"), ("ppo_lstm", "churn_reduction"))

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    zoo.register()


def _sampled(base: str, method, n_trials: int = 5, seed: int = 0) -> list[tuple[dict, dict]]:
    """``(sampled hyperparameters, trial.params)`` of ``n_trials`` trials of a seeded random-sampler study."""
    sampler, _ = samplers.plastic_sampler_for(base, method=method)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n_trials):
        trial = study.ask()
        out.append((sampler(trial, N_ACTIONS[base], 1, ADDITIONAL), dict(trial.params)))
    return out


def _supported() -> list[tuple[str, object]]:
    return [(b, m) for b in BASES for m in METHODS if (b, m) not in REFUSED]


# --------------------------------------------------------------------------- samplers: ranges, validity, exclusivity
@pytest.mark.parametrize("base, method", _supported(), ids=[f"{b}-{m}" for b, m in _supported()])
def test_sampled_values_are_inside_the_documented_ranges_and_valid(base, method):
    """Five seeded trials of each sampler: every plastic value lies in its documented range (the module's constants),
    the plastic configs accept the sampled keywords as given, the isometry settings never contradict each other
    (a non-AdamO optimizer with the decoupled penalty), an activation that doubles widths never comes with a unit
    reset, and rl_zoo3's ``--trial-id`` converter gives back the same keywords."""
    _, converter = samplers.plastic_sampler_for(base, method=method)
    on_policy = base in ("ppo", "ppo_lstm", "ppo_mask")
    for params, trial_params in _sampled(base, method):
        plastic = {k: v for k, v in params.items() if k in set(ISOMETRY_KEYS) | set(intervention_keys())}
        # nothing plastic left inside policy_kwargs (the algorithms refuse it there)
        assert not (set(params.get("policy_kwargs") or {}) & (set(ISOMETRY_KEYS) | set(intervention_keys())))
        assert "activation_fn" not in (params.get("policy_kwargs") or {})
        activation = plastic["activation"]
        if method in samplers.ACTIVATION_METHODS:
            assert activation == method and set(plastic) == {"activation"}
        else:
            assert activation in (samplers.ON_POLICY_ACTIVATIONS if on_policy else samplers.OFF_POLICY_ACTIVATIONS)
        if method is None:
            lo, hi = samplers.ISOMETRY_COEF_RANGE
            assert lo <= plastic["isometry_coef"] <= hi
            lo, hi = samplers.REPLACEMENT_RATE_RANGE
            assert lo <= plastic["replacement_rate"] <= hi
            lo, hi = samplers.MATURITY_THRESHOLD_RANGE
            assert isinstance(plastic["maturity_threshold"], int) and lo <= plastic["maturity_threshold"] <= hi
        elif method == "l2_init":
            assert samplers.L2_INIT_COEF_RANGE[0] <= plastic["l2_init_coef"] <= samplers.L2_INIT_COEF_RANGE[1]
        elif method == "spectral":
            assert samplers.SPECTRAL_COEF_RANGE[0] <= plastic["spectral_coef"] <= samplers.SPECTRAL_COEF_RANGE[1]
        elif method == "nap":
            assert plastic["nap"] is True and plastic["nap_project"] in samplers.NAP_PROJECT_CHOICES
        elif method == "layer_reset":
            assert plastic["layer_reset_layers"] in samplers.LAYER_RESET_CHOICES
            lo, hi = samplers.LAYER_RESET_EVERY_RANGE
            assert isinstance(plastic["layer_reset_every"], int) and lo <= plastic["layer_reset_every"] <= hi
        elif method == "churn_reduction":
            lo, hi = samplers.CHURN_TARGET_SCALE_RANGE
            assert plastic["churn_reduction"] is True and lo <= plastic["churn_reduction_target_scale"] <= hi
        elif method == "trac":
            assert (plastic["optimizer"], plastic["isometry_mode"]) == ("trac", "off")
        elif method == "plasticity_injection":
            assert 0.1 <= plastic["plasticity_injection_at"] <= 0.9 and plastic["plasticity_injection_layers"] in (2, 3)
        elif method == "parseval":
            assert 1e-5 <= plastic["parseval_coef"] <= 1e-1
        elif method == "weight_clipping":
            lo, hi = samplers.WEIGHT_CLIPPING_KAPPA_RANGE
            assert plastic["weight_clipping"] is True and lo <= plastic["weight_clipping_kappa"] <= hi
        # the configs accept the values as sampled (their own validation), and keep them unchanged
        config = IsometryConfig(**{k: v for k, v in plastic.items() if k in ISOMETRY_KEYS})
        assert not (config.optimizer != "adamo" and config.isometry_mode == "decoupled")
        for cls in intervention_config_classes().values():
            names = {f.name for f in dataclasses.fields(cls)}
            given = {k: v for k, v in plastic.items() if k in names}
            built = cls(**given)
            assert {k: getattr(built, k) for k in given} == given
        if activation in ("crelu", "fourier"):  # unit resets are refused after width-doubling activations
            assert "replacement_rate" not in plastic and "redo_period" not in plastic
        assert converter(trial_params) == params


@pytest.mark.parametrize("base, method", REFUSED)
def test_a_method_the_algorithm_refuses_has_no_sampler(base, method):
    """``plastic_sampler_for`` raises, with the algorithm's reason, instead of giving a sampler whose every trial
    fails in ``learn()`` (a worker stops after 10 failed trials in a row)."""
    with pytest.raises(ValueError, match=f"No '{method}' sampler for '{base}'"):
        samplers.plastic_sampler_for(base, method=method)
    assert sorted(samplers.UNSUPPORTED_METHODS) == sorted(REFUSED)


@pytest.mark.parametrize(
    "name, env_id, keywords",
    [
        ("PlasticCrossQ", "Pendulum-v1", {"churn_reduction": True}),
        ("PlasticCrossQ", "Pendulum-v1", {"plasticity_injection_at": 0.5}),
        ("PlasticRecurrentPPO", "CartPole-v1", {"churn_reduction": True}),
    ],
)
def test_the_unsupported_table_matches_the_algorithms_refusals(name, env_id, keywords):
    """Each refused pair (:data:`~sb3_plastic.samplers.UNSUPPORTED_METHODS`) is a real refusal of the algorithm."""
    import sb3_plastic

    cls = getattr(sb3_plastic, name)
    extra = {"n_steps": 8, "batch_size": 8} if "PPO" in name else {"buffer_size": 64, "learning_starts": 0, "batch_size": 8}
    policy = "MlpLstmPolicy" if "Recurrent" in name else "MlpPolicy"
    model = cls(policy, env_id, seed=0, policy_kwargs={"net_arch": [8]} if "PPO" not in name else None, **extra, **keywords)
    with pytest.raises(ValueError, match="does not support"):
        model.learn(16)


@pytest.mark.parametrize("method", samplers.ACTIVATION_METHODS)
def test_ppo_lstm_doubling_activation_sampler_trains(method):
    """The ``ppo_lstm`` sampler with ``method="crelu"`` / ``"fourier"``: the model trains, its MLP after the LSTM
    keeps half the units before each doubling activation (as every other plastic policy), and its optimizer holds
    exactly the policy's parameters. (The MLP was left at full width: a shape error in the first rollout.)"""
    params, _ = _sampled("ppo_lstm", method, n_trials=1, seed=3)[0]
    params.update(n_steps=16, batch_size=8, n_epochs=1)
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", seed=0, **params)
    net_arch = params["policy_kwargs"]["net_arch"]
    first = model.policy.mlp_extractor.policy_net[0]
    assert first.out_features == net_arch["pi"][0] // 2
    assert model.policy.mlp_extractor.latent_dim_pi == net_arch["pi"][-1]
    in_optimizer = {id(p) for group in model.policy.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.policy.parameters()}
    model.learn(32)
    assert model.num_timesteps == 32


# --------------------------------------------------------------------------- yaml -> rl_zoo3 -> model
def _build_through_zoo(monkeypatch, conf: Path, env_id: str, *extra: str):
    """Run ``sb3-plastic train`` on ``conf`` up to the built model (no training); return it and the eval env."""
    import rl_zoo3.train

    built: dict = {}
    manager = rl_zoo3.train.ExperimentManager
    monkeypatch.setattr(manager, "learn", lambda self, model: built.update(model=model, callbacks=self.callbacks))
    monkeypatch.setattr(manager, "save_trained_model", lambda self, model: None)
    zoo.train(["--num-threads", "1", "--verbose", "0", "--seed", "0", "--algo", "plastic_ppo", "--env", env_id,
               "-conf", str(conf), "-f", "logs", *extra])
    return built["model"], built["callbacks"]


YAML_ENTRY = """\
sb3_plastic/RandomLabelBandit-v0:
  n_envs: 2
  n_timesteps: 64
  env_kwargs:
    change_every: 16
    n_contexts: 8
    task_seed: 5
  policy: 'MlpPolicy'
  policy_kwargs: "dict(net_arch=[16, 16])"
  n_steps: 16
  batch_size: 16
  n_epochs: 1
  learning_rate: lin_0.001
  clip_range: lin_0.2
  activation: maxmin
  isometry_coef: !!float 5e-2
  isometry_interval: auto
  isometry_layers: ['mlp_extractor.*']
  fire_every: 32
  fire_iterations: 10
  replacement_rate: !!float 1e-3
  maturity_threshold: 100
  cbp_replacement_rule: stochastic
  redo_period: 10
  layer_reset_layers: policy_head
  layer_reset_every: 48
"""


def test_yaml_plastic_keywords_reach_the_model_with_their_types(tmp_path, monkeypatch):
    """Plastic keys go through rl_zoo3's preprocessing unchanged: floats, ints (not floats), a list of patterns,
    ``"auto"`` (resolved from the batch size: ceil(1024 / 16) = 64), strings; SB3's keys as rl_zoo3 makes them
    (``lin_`` schedules, the ``policy_kwargs`` string evaluated); ``env_kwargs`` reach the training env and the
    ``--eval-freq`` env, whose evaluation callback follows the training task."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    conf.write_text(YAML_ENTRY)
    model, callbacks = _build_through_zoo(monkeypatch, conf, BANDIT, "--eval-freq", "8")
    iso = model.isometry_config
    assert (iso.activation, iso.isometry_coef, iso.isometry_layers, iso.isometry_interval) == (
        "maxmin", 0.05, ["mlp_extractor.*"], 64)
    assert type(iso.isometry_interval) is int
    configs = model.intervention_configs
    assert (configs["fire"].fire_every, configs["fire"].fire_iterations) == (32, 10)
    assert type(configs["fire"].fire_every) is int and type(configs["fire"].fire_iterations) is int
    cbp = configs["cbp"]
    assert (cbp.replacement_rate, cbp.maturity_threshold, cbp.cbp_replacement_rule) == (1e-3, 100, "stochastic")
    assert configs["redo"].redo_period == 10 and type(configs["redo"].redo_period) is int
    assert (configs["layer_reset"].layer_reset_layers, configs["layer_reset"].layer_reset_every) == ("policy_head", 48)
    assert model.learning_rate(1.0) == pytest.approx(1e-3) and model.learning_rate(0.5) == pytest.approx(5e-4)
    assert model.clip_range(0.5) == pytest.approx(0.1)
    assert model.policy_kwargs["net_arch"] == [16, 16]
    assert [m.out_features for m in model.policy.mlp_extractor.policy_net if hasattr(m, "out_features")] == [16, 16]
    names = sorted(type(c).__name__ for c in model.intervention_callbacks())
    assert names == ["ContinualBackprop", "FIRE", "LayerReset", "ReDo"]
    # env_kwargs: the training copies and the eval env share the yaml's schedule
    train_schedule = model.get_env().get_attr("schedule", [0])[0]
    assert (train_schedule.change_every, train_schedule.task_seed) == (16, 5)
    assert model.get_env().get_attr("spec", [0])[0].kwargs["n_contexts"] == 8
    evaluation = next(c for c in callbacks if hasattr(c, "eval_env"))
    assert isinstance(evaluation, TaskFollowingEvalMixin)
    eval_schedule = evaluation.eval_env.get_attr("schedule", [0])[0]
    assert (eval_schedule.change_every, eval_schedule.task_seed) == (16, 5)
    saved = yaml.load((tmp_path / "logs/plastic_ppo/sb3_plastic-RandomLabelBandit-v0_1/sb3_plastic-RandomLabelBandit-v0"
                       / "config.yml").read_text(), Loader=yaml.UnsafeLoader)
    saved = dict(saved)
    assert saved["isometry_layers"] == ["mlp_extractor.*"] and saved["isometry_interval"] == "auto"
    assert saved["maturity_threshold"] == 100 and saved["env_kwargs"] == {"change_every": 16, "n_contexts": 8, "task_seed": 5}


@pytest.mark.parametrize(
    "policy_kwargs, named",
    [("dict(net_arch=[16], fire_at=0.5)", "fire_at"), ("dict(net_arch=[16], isometry_coef=0.5)", "isometry_coef")],
)
def test_plastic_keyword_inside_policy_kwargs_is_refused_naming_the_top_level(tmp_path, monkeypatch, policy_kwargs, named):
    """The docs: plastic keywords are top-level keys, "the algorithms refuse" them in ``policy_kwargs``. An intervention
    keyword there got SB3's ``TypeError: ActorCriticPolicy.__init__() got an unexpected keyword argument``; now
    the same ``ValueError`` as an isometry keyword, naming the key and where it belongs."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    entry = {"n_timesteps": 16, "policy": "MlpPolicy", "n_steps": 16, "batch_size": 16, "n_epochs": 1,
             "policy_kwargs": policy_kwargs}
    conf.write_text(yaml.safe_dump({"CartPole-v1": entry}))
    with pytest.raises(ValueError, match=rf"\['{named}'\] must be top-level keywords of PlasticPPO"):
        _build_through_zoo(monkeypatch, conf, "CartPole-v1", "--eval-freq", "-1")
    with pytest.raises(ValueError, match="must be top-level keywords"):
        PlasticPPO("MlpPolicy", "CartPole-v1", policy_kwargs={"replacement_rate": 1e-4})


# --------------------------------------------------------------------------- train -i
CONTINUAL_ENTRY = {
    "n_envs": 2,
    "n_timesteps": 64,
    "policy": "MlpPolicy",
    "n_steps": 16,
    "batch_size": 16,
    "n_epochs": 1,
    "policy_kwargs": "dict(net_arch=[8])",
    "env_kwargs": {"change_every": 16, "n_contexts": 8, "obs_dim": 4, "episode_length": 4},
    "replacement_rate": 1e-6,
    "maturity_threshold": 10_000,
}


def _zoo(*argv: str) -> None:
    zoo.train(["--num-threads", "1", "--verbose", "0", "--seed", "0", "--algo", "plastic_ppo", "--env", BANDIT,
               "-f", "logs", *argv])


def test_continue_carries_cbp_state_and_evaluates_the_continued_tasks(tmp_path, monkeypatch):
    """``train -i``: Continual Backprop's per-unit ages go on from the saved model (64 timesteps = 2 rollouts of
    2 x 16 steps, 2 minibatches each: 4 updates per run, so 8 after the continued run, not 4), the clock goes on
    (num_timesteps 128) and the ``--eval-freq`` evaluations of the continued run measure its tasks: a task lasts
    16 x 2 = 32 timesteps, so evaluations at 80, 96, 112, 128 timesteps measure tasks 2, 2, 3, 3."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    conf.write_text(yaml.safe_dump({BANDIT: CONTINUAL_ENTRY}))
    _zoo("-conf", str(conf), "--eval-freq", "-1")
    name = BANDIT.replace("/", "-")
    first = PlasticPPO.load(tmp_path / "logs/plastic_ppo" / f"{name}_1" / f"{name}.zip", device="cpu")
    ages = first.plastic_state["ContinualBackprop:auto"]["policy"]["mlp_extractor.policy_net.0"]["age"]
    assert ages.tolist() == [4] * 8
    _zoo("-conf", str(conf), "-i", str(tmp_path / "logs/plastic_ppo" / f"{name}_1" / f"{name}.zip"),
         "--eval-freq", "16", "--eval-episodes", "1")
    run = tmp_path / "logs/plastic_ppo" / f"{name}_2"
    second = PlasticPPO.load(run / f"{name}.zip", device="cpu")
    assert second.num_timesteps == 128
    ages = second.plastic_state["ContinualBackprop:auto"]["policy"]["mlp_extractor.policy_net.0"]["age"]
    assert ages.tolist() == [8] * 8
    log = np.load(run / "evaluations.npz")
    assert log["timesteps"].tolist() == [80, 96, 112, 128]
    assert log["task_ids"].tolist() == [2, 2, 3, 3]


def test_continue_keeps_the_trained_models_nap_setting(tmp_path, monkeypatch):
    """NaP's layer norms are built into the networks (``PlasticPPO.load(..., nap=True)`` refuses): a config
    with ``nap: true`` continuing a model trained without NaP keeps the model's setting with the network settings'
    warning, and trains (the config's value was applied, and learn() stopped: "found no layer followed by a
    layer norm"). The config's other intervention keys are still applied."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    conf.write_text(yaml.safe_dump({BANDIT: CONTINUAL_ENTRY}))
    _zoo("-conf", str(conf), "--eval-freq", "-1")
    name = BANDIT.replace("/", "-")
    later = dict(CONTINUAL_ENTRY, nap=True, replacement_rate=1e-3)
    conf.write_text(yaml.safe_dump({BANDIT: later}))
    with pytest.warns(UserWarning, match=r"settings \{'nap': False\} are kept"):
        _zoo("-conf", str(conf), "-i", str(tmp_path / "logs/plastic_ppo" / f"{name}_1" / f"{name}.zip"),
             "--eval-freq", "-1")
    second = PlasticPPO.load(tmp_path / "logs/plastic_ppo" / f"{name}_2" / f"{name}.zip", device="cpu")
    assert second.num_timesteps == 128
    assert second.intervention_configs["nap"].nap is False and not second.policy.plastic_layer_norm
    assert second.intervention_configs["cbp"].replacement_rate == 1e-3


# --------------------------------------------------------------------------- reference settings (DESIGN)
def test_slippery_cbp_entry_and_sampler_ranges_hold_the_reference_settings():
    """Dohare et al.'s CBP + PPO on Slippery Ant (the design's reference): rho 1e-4, maturity 10 000 updates,
    eta 0.99, Adam betas (0.99, 0.99), weight decay 1e-4, ReLU [256, 256], friction every 2M steps, no isometry
    penalty: the plastic_ppo Slippery HalfCheetah entry holds all of them, and the sampler's ranges contain the
    reference values and the library defaults (isometry_coef 0.02 / 2e-3)."""
    entry = yaml.safe_load((CONFIGS / "plastic_ppo.yml").read_text())["sb3_plastic/SlipperyHalfCheetah-v0"]
    assert (entry["replacement_rate"], entry["maturity_threshold"], entry["cbp_decay_rate"]) == (1e-4, 10_000, 0.99)
    assert (entry["optimizer"], entry["isometry_mode"], entry["activation"]) == ("adam_equal_betas", "off", "relu")
    assert entry["env_kwargs"]["change_every"] * entry.get("n_envs", 1) == 2_000_000
    assert entry["n_timesteps"] == 2e7
    policy_kwargs = eval(entry["policy_kwargs"], {"dict": dict})  # a constant string of the repository
    assert policy_kwargs == {"net_arch": {"pi": [256, 256], "vf": [256, 256]}, "optimizer_kwargs": {"weight_decay": 1e-4}}
    from sb3_plastic.config import EQUAL_BETA

    assert EQUAL_BETA == 0.99
    lo, hi = samplers.REPLACEMENT_RATE_RANGE
    assert lo < 1e-4 < hi
    lo, hi = samplers.MATURITY_THRESHOLD_RANGE
    assert lo < 10_000 <= hi
    lo, hi = samplers.ISOMETRY_COEF_RANGE
    assert lo <= 2e-3 < 0.02 < 0.2 < hi


def test_every_shipped_entry_validates_all_its_plastic_keys():
    """Every entry of every zoo_configs/ file: its plastic keys build the plastic configs (their validation) with
    the values unchanged, so no entry can reach the model with a key silently dropped or altered."""
    checked = 0
    for path in sorted(CONFIGS.glob("plastic_*.yml")):
        for env_id, entry in yaml.safe_load(path.read_text()).items():
            plastic = {k: v for k, v in entry.items() if k in set(ISOMETRY_KEYS) | set(intervention_keys())}
            config = IsometryConfig(**{k: v for k, v in plastic.items() if k in ISOMETRY_KEYS})
            assert {k: getattr(config, k) for k in plastic if k in ISOMETRY_KEYS} == {
                k: v for k, v in plastic.items() if k in ISOMETRY_KEYS}, (path.name, env_id)
            for cls in intervention_config_classes().values():
                names = {f.name for f in dataclasses.fields(cls)}
                given = {k: v for k, v in plastic.items() if k in names}
                built = cls(**given)
                assert {k: getattr(built, k) for k in given} == given, (path.name, env_id)
            zoo.check_hyperparameters(path.stem, {k: v for k, v in entry.items() if k not in zoo.ZOO_KEYS},
                                      where=f"{path.name} [{env_id}]")
            checked += 1
    assert checked == 49  # the entries of the 8 files


def test_command_line_env_kwargs_replace_the_yaml_env_kwargs(tmp_path, monkeypatch):
    """rl_zoo3's ``--env-kwargs`` replaces the yaml's ``env_kwargs`` as a whole (documented in
    docs/zoo_and_tuning.md): ``--env-kwargs task_seed:7`` on an entry with ``change_every: 16`` gives the env's
    default ``change_every`` (2000), not 16."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    conf.write_text(YAML_ENTRY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = _build_through_zoo(monkeypatch, conf, BANDIT, "--eval-freq", "-1", "--env-kwargs", "task_seed:7")
    schedule = model.get_env().get_attr("schedule", [0])[0]
    assert (schedule.change_every, schedule.task_seed) == (2000, 7)
    assert gym.spec(BANDIT).kwargs.get("change_every", 2000) == 2000
