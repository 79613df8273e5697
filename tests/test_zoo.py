"""rl_zoo3 runs of the plastic algorithms (sb3_plastic.zoo) and their optuna tuning (sb3_plastic.samplers).

The runs go through rl_zoo3's own ``train`` / ``enjoy`` (in this process where possible; the
multi-worker studies start real worker processes). Budgets are tiny: these tests check the plumbing,
not learning. Trials of the tuning tests get cheap base hyperparameters through optuna's
``enqueue_trial`` (rl_zoo3's search space allows e.g. 4096-step rollouts with 20 epochs), while the
plastic parameters (isometry_coef, replacement_rate, maturity_threshold, activation) are sampled.

The PostgreSQL test needs ``SB3_PLASTIC_TEST_POSTGRES_URL`` (e.g.
``postgresql+psycopg2://sb3plastic:sb3plastic@127.0.0.1:5432/sb3plastic``; .ci/run starts a server
and sets it) and skips, saying why, when it is unset or the server cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import gymnasium as gym
import optuna
import pytest
import torch as th
import yaml

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC, zoo
from sb3_plastic.samplers import PLASTIC_PARAMS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "zoo_configs"
CLASSES = {"plastic_ppo": PlasticPPO, "plastic_dqn": PlasticDQN, "plastic_sac": PlasticSAC}
#: rl_zoo3 PPO-sampler values that keep a CartPole trial to a few seconds (the rest is sampled)
CHEAP_PPO = {"batch_size_pow": 6, "n_steps_pow": 5, "n_epochs": 1, "net_arch": "tiny"}
POSTGRES_ENV = "SB3_PLASTIC_TEST_POSTGRES_URL"

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    zoo.register()


def _train(*argv: str) -> None:
    zoo.train(["--num-threads", "1", "--verbose", "0", *argv])


def _load(path: Path, algo: str):
    return CLASSES[algo].load(path, device="cpu")


# --------------------------------------------------------------------------- registration
def test_registration_reaches_every_rl_zoo3_table():
    import rl_zoo3
    import rl_zoo3.enjoy
    import rl_zoo3.exp_manager
    import rl_zoo3.hyperparams_opt
    import rl_zoo3.train
    import rl_zoo3.utils

    for module in (rl_zoo3, rl_zoo3.utils, rl_zoo3.train, rl_zoo3.enjoy, rl_zoo3.exp_manager):
        for name, cls in CLASSES.items():
            assert module.ALGOS[name] is cls
    for table in (rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER, rl_zoo3.exp_manager.HYPERPARAMS_SAMPLER):
        assert {"plastic_ppo", "plastic_dqn", "plastic_sac"} <= set(table)
    assert {"plastic_ppo", "plastic_dqn", "plastic_sac"} <= set(rl_zoo3.exp_manager.HYPERPARAMS_CONVERTER)
    assert rl_zoo3.ALGOS["ppo"].__name__ == "PPO"  # rl_zoo3's own entries untouched
    assert "MinAtar/Breakout-v1" in gym.envs.registry
    assert rl_zoo3.train.ExperimentManager.__name__ == "PlasticExperimentManager"
    # rl_zoo3 evaluates policy_kwargs strings in rl_zoo3.exp_manager's namespace, -params in rl_zoo3.utils'
    from sb3_plastic import MaxMin, PlasticCNN

    text = "dict(activation_fn=MaxMin, features_extractor_class=PlasticCNN, net_arch=[64, 64])"
    for module in (rl_zoo3.exp_manager, rl_zoo3.utils):
        value = eval(text, vars(module))
        assert value["activation_fn"] is MaxMin and value["features_extractor_class"] is PlasticCNN
    zoo.register()  # idempotent
    assert rl_zoo3.train.ExperimentManager.__mro__[1].__name__ == "ExperimentManager"
    # a sampler a user puts under a plastic name survives the register() that train() does
    default = rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER["plastic_sac"]
    try:
        rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER["plastic_sac"] = custom = lambda *args: {}
        zoo.register()
        assert rl_zoo3.exp_manager.HYPERPARAMS_SAMPLER["plastic_sac"] is custom
    finally:
        rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER["plastic_sac"] = default


def test_policy_kwargs_with_sb3_plastic_names(tmp_path, monkeypatch):
    """A yaml policy_kwargs string naming MaxMin / PlasticMLP builds the model (rl_zoo3's eval)."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    conf.write_text(
        yaml.safe_dump(
            {
                "CartPole-v1": {
                    "policy": "MlpPolicy",
                    "n_timesteps": 64,
                    "n_steps": 32,
                    "batch_size": 32,
                    "n_epochs": 1,
                    "policy_kwargs": "dict(activation_fn=MaxMin, features_extractor_class=PlasticMLP, "
                    "features_extractor_kwargs=dict(net_arch=[32]), net_arch=[16])",
                }
            }
        )
    )
    _train("--algo", "plastic_ppo", "--env", "CartPole-v1", "-conf", str(conf), "--eval-freq", "-1", "-f", "logs")
    model = _load(tmp_path / "logs/plastic_ppo/CartPole-v1_1/CartPole-v1.zip", "plastic_ppo")
    assert type(model.policy.features_extractor).__name__ == "PlasticMLP"
    assert type(model.policy.mlp_extractor.policy_net[1]).__name__ == "MaxMin"


# --------------------------------------------------------------------------- yaml runs
RUNS = [
    # algo, env, extra rl_zoo3 options keeping the 2000 steps quick on one core
    ("plastic_ppo", "CartPole-v1", ["--eval-freq", "1000", "--eval-episodes", "1"]),
    ("plastic_dqn", "CartPole-v1", ["--eval-freq", "-1", "-params", "gradient_steps:16"]),
    ("plastic_sac", "Pendulum-v1", ["--eval-freq", "-1", "-params", "learning_starts:1900"]),
]


def _yaml_run(tmp_path, monkeypatch, algo: str, env_id: str, extra, keys=("isometry_coef", "activation", "fire_at")):
    """2 000 steps of ``algo`` on ``env_id`` from ``zoo_configs/<algo>.yml`` through ``sb3-plastic train``: the model,
    rl_zoo3's saved config (``keys`` of the yaml entry that it sets), args and TensorBoard events are written.
    Returns (run folder, model path, the yaml entry)."""
    monkeypatch.chdir(tmp_path)
    conf = CONFIGS / f"{algo}.yml"
    _train("--algo", algo, "--env", env_id, "-conf", str(conf), "-n", "2000", "-f", "logs", "-tb", "tb", "--seed", "3", *extra)
    run = tmp_path / "logs" / algo / f"{env_id}_1"
    model_path = run / f"{env_id}.zip"
    assert model_path.is_file()
    saved = dict(yaml.load((run / env_id / "config.yml").read_text(), Loader=yaml.UnsafeLoader))  # as rl_zoo3 reads it
    expected = yaml.safe_load(conf.read_text())[env_id]
    for key in keys:
        if key in expected:
            assert saved[key] == expected[key], key
    args = yaml.load((run / env_id / "args.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert args["algo"] == algo and args["n_timesteps"] == 2000
    assert list((tmp_path / "tb" / env_id).rglob("events.out.tfevents.*"))
    return run, model_path, expected


@pytest.mark.parametrize("algo, env_id, extra", RUNS, ids=[r[0] for r in RUNS])
def test_yaml_run_writes_model_config_and_tensorboard(tmp_path, monkeypatch, algo, env_id, extra):
    run, model_path, expected = _yaml_run(tmp_path, monkeypatch, algo, env_id, extra)
    if algo == "plastic_ppo":
        assert (run / "evaluations.npz").is_file()

    model = _load(model_path, algo)
    assert model.num_timesteps >= 2000
    assert model.isometry_config.isometry_coef == expected["isometry_coef"]
    groups = [g for opt in _optimizers(model) for g in opt.param_groups]
    assert max(g["isometry_coef"] for g in groups) == expected["isometry_coef"]
    if expected.get("fire_at") is not None:
        assert model.intervention_configs["fire"].fire_at == expected["fire_at"]
        assert model.plastic_state["FIRE:auto"]["count"] == 1

    zoo.enjoy(["--algo", algo, "--env", env_id, "-f", "logs", "-n", "30", "--no-render", "--verbose", "0"])


def _optimizers(model):
    if hasattr(model.policy, "optimizer"):
        return [model.policy.optimizer]
    return [model.actor.optimizer, model.critic.optimizer]


def test_continue_training_applies_the_configs_interventions(tmp_path, monkeypatch):
    """``-i model.zip``: the config's intervention keywords reach the loaded model (SB3's load alone would
    keep the saved ones); its network / optimizer settings are kept, with a warning when they differ."""
    monkeypatch.chdir(tmp_path)
    base = ("--algo", "plastic_ppo", "--env", "CartPole-v1", "-n", "256", "--eval-freq", "-1", "-f", "logs")
    _train(*base)
    first = tmp_path / "logs/plastic_ppo/CartPole-v1_1/CartPole-v1.zip"
    with pytest.warns(UserWarning, match="network/optimizer settings .*isometry_coef"):
        _train(*base, "-i", str(first), "-params", "replacement_rate:0.01", "fire_at:0.5", "isometry_coef:0.5")
    model = _load(tmp_path / "logs/plastic_ppo/CartPole-v1_2/CartPole-v1.zip", "plastic_ppo")
    assert model.intervention_configs["cbp"].replacement_rate == 0.01
    assert model.intervention_configs["fire"].fire_at == 0.5
    assert model.plastic_state["FIRE:auto"]["count"] == 1
    assert model.isometry_config.isometry_coef == 0.2  # the trained model's (zoo_configs: 0.2)


# --------------------------------------------------------------------------- optuna
def _study(storage: str, name: str) -> optuna.Study:
    zoo.ensure_study(storage, name)
    return optuna.load_study(storage=storage, study_name=name)


def _optimize_two_cheap_trials(tmp_path, monkeypatch, algo: str, env: str, name: str, config: str = "") -> list:
    """``-optimize`` with 2 trials of 512 steps in an sqlite study (cheap PPO settings enqueued, the plastic
    ones sampled), each trial's best model saved under ``trials/``; returns the completed trials. ``config``: the
    yaml file (default: the project's ``zoo_configs/<algo>.yml``)."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    study = _study(storage, name)
    for _ in range(2):
        study.enqueue_trial(CHEAP_PPO)
    _train(
        *("--algo", algo, "--env", env, "-conf", config or str(CONFIGS / f"{algo}.yml")),
        *("-optimize", "--n-trials", "2", "-n", "512", "--n-evaluations", "1", "--eval-episodes", "1"),
        *("--storage", storage, "--study-name", name, "--pruner", "none", "--no-optim-plots"),
        *("--optimization-log-path", "trials", "-f", "logs", "--seed", "0"),
    )
    trials = optuna.load_study(storage=storage, study_name=name).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    return trials


def test_optimize_two_trials_sampled_values_reach_the_model(tmp_path, monkeypatch):
    trials = _optimize_two_cheap_trials(tmp_path, monkeypatch, "plastic_ppo", "CartPole-v1", "opt")
    for trial in trials:
        model = _load(tmp_path / "trials" / f"trial_{trial.number}" / "best_model.zip", "plastic_ppo")
        params = trial.params
        assert set(PLASTIC_PARAMS) | {"activation"} <= set(params)
        coefs = sorted(g["isometry_coef"] for g in model.policy.optimizer.param_groups)
        assert coefs == [0.0, params["isometry_coef"]]  # regularised weights / the rest
        assert model.isometry_config.activation == params["activation"]
        cbp = model.intervention_configs["cbp"]
        assert cbp.replacement_rate == params["replacement_rate"]
        assert cbp.maturity_threshold == params["maturity_threshold"]
        assert "ContinualBackprop:auto" in model.plastic_state  # the callback ran during the trial
    assert list((tmp_path / "logs" / "plastic_ppo").glob("report_CartPole-v1_*.csv"))

    # rl_zoo3's --trial-id trains with a stored trial's settings (through the plastic converter);
    # rl_zoo3 ignores --trial-id 0 (it tests the id for truth), hence trial 1
    _train(
        *("--algo", "plastic_ppo", "--env", "CartPole-v1", "-n", "256", "--eval-freq", "-1", "-f", "replay"),
        *("--storage", f"sqlite:///{tmp_path / 'tune.db'}", "--study-name", "opt", "--trial-id", "1"),
    )
    model = _load(tmp_path / "replay/plastic_ppo/CartPole-v1_1/CartPole-v1.zip", "plastic_ppo")
    params = trials[1].params
    assert max(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == params["isometry_coef"]
    assert model.intervention_configs["cbp"].replacement_rate == params["replacement_rate"]
    assert model.n_steps == 2 ** params["n_steps_pow"]


def test_optimize_with_a_baseline_sampler_as_the_samplers_docstring_says(tmp_path, monkeypatch):
    """The recipe of :mod:`sb3_plastic.samplers` for the isometry paper's baselines: register the L2-init sampler
    under ``plastic_ppo``, turn the penalty off in the yaml, run ``-optimize``. Each trial's model is plain Adam with
    L2-init at the sampled coefficient (its theta_0 recorded during the trial), and ``--trial-id`` replays it."""
    from rl_zoo3 import hyperparams_opt

    from sb3_plastic.samplers import plastic_sampler_for

    sampler, converter = plastic_sampler_for("ppo", method="l2_init")
    monkeypatch.setitem(hyperparams_opt.HYPERPARAMS_SAMPLER, "plastic_ppo", sampler)
    monkeypatch.setitem(hyperparams_opt.HYPERPARAMS_CONVERTER, "plastic_ppo", converter)
    config = tmp_path / "l2init.yml"
    config.write_text(yaml.safe_dump({"CartPole-v1": {
        "n_envs": 2, "n_timesteps": 512, "policy": "MlpPolicy", "isometry_mode": "off", "optimizer": "adam"}}))
    trials = _optimize_two_cheap_trials(tmp_path, monkeypatch, "plastic_ppo", "CartPole-v1", "l2init", str(config))
    for trial in trials:
        assert "l2_init_coef" in trial.params and not set(PLASTIC_PARAMS) & set(trial.params)
        model = _load(tmp_path / "trials" / f"trial_{trial.number}" / "best_model.zip", "plastic_ppo")
        assert type(model.policy.optimizer) is th.optim.Adam  # isometry_mode 'off' + optimizer adam: no AdamO
        assert model.intervention_configs["l2_init"].l2_init_coef == trial.params["l2_init_coef"]
        assert model.intervention_configs["cbp"].replacement_rate == 0.0  # the plastic space was not sampled
        assert model.plastic_state["L2Init:auto"]["theta0"]  # the regulariser ran during the trial
    _train(
        *("--algo", "plastic_ppo", "--env", "CartPole-v1", "-conf", str(config), "-n", "256", "--eval-freq", "-1"),
        *("-f", "replay", "--storage", f"sqlite:///{tmp_path / 'tune.db'}", "--study-name", "l2init", "--trial-id", "1"),
    )
    model = _load(tmp_path / "replay/plastic_ppo/CartPole-v1_1/CartPole-v1.zip", "plastic_ppo")
    assert model.intervention_configs["l2_init"].l2_init_coef == trials[1].params["l2_init_coef"]
    assert model.n_steps == 2 ** trials[1].params["n_steps_pow"]

@pytest.mark.parametrize("algo, env_id", [("plastic_dqn", "CartPole-v1"), ("plastic_sac", "Pendulum-v1")])
def test_off_policy_samplers_build_models_and_round_trip(algo, env_id):
    import rl_zoo3.exp_manager as em

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    env = gym.make(env_id)
    n_actions = env.action_space.shape[0] if hasattr(env.action_space, "shape") and env.action_space.shape else 0
    params = em.HYPERPARAMS_SAMPLER[algo](trial, n_actions, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert params["isometry_coef"] == trial.params["isometry_coef"]
    assert "activation_fn" not in params.get("policy_kwargs", {})
    model = CLASSES[algo]("MlpPolicy", env, buffer_size=100, **params)
    assert max(g["isometry_coef"] for opt in _optimizers(model) for g in opt.param_groups) == trial.params["isometry_coef"]
    assert model.intervention_configs["cbp"].replacement_rate == trial.params["replacement_rate"]
    assert model.isometry_config.activation == trial.params["activation"]
    # rl_zoo3's --trial-id path: optuna params -> the same hyperparameters
    converted = em.HYPERPARAMS_CONVERTER[algo](trial.params)
    assert converted == params


def test_ppo_converter_round_trip():
    import rl_zoo3.exp_manager as em

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(4):
        trial = study.ask()
        params = em.HYPERPARAMS_SAMPLER["plastic_ppo"](trial, 0, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
        assert params["activation"] in ("tanh", "relu", "maxmin") and "activation_fn" not in params["policy_kwargs"]
        assert "activation_fn" not in trial.params
        assert em.HYPERPARAMS_CONVERTER["plastic_ppo"](trial.params) == params


@pytest.mark.filterwarnings("ignore:Fixed parameter replacement_rate")
def test_failing_trial_does_not_end_the_study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage, name = f"sqlite:///{tmp_path / 'fail.db'}", "fail"
    study = _study(storage, name)
    # out of optuna's range (it warns and uses it) and invalid for Continual Backprop (rate > 1):
    # PlasticPPO raises in its constructor, which rl_zoo3 calls outside its own try/except
    study.enqueue_trial({**CHEAP_PPO, "replacement_rate": 2.0})
    study.enqueue_trial(CHEAP_PPO)
    _train(
        *("--algo", "plastic_ppo", "--env", "CartPole-v1", "-conf", str(CONFIGS / "plastic_ppo.yml")),
        *("-optimize", "--n-trials", "2", "-n", "256", "--n-evaluations", "1", "--eval-episodes", "1"),
        *("--storage", storage, "--study-name", name, "--pruner", "none", "--no-optim-plots", "-f", "logs"),
    )
    first, second = optuna.load_study(storage=storage, study_name=name).trials
    assert first.state == optuna.trial.TrialState.FAIL
    assert "replacement_rate" in first.user_attrs["fail_reason"]
    assert second.state == optuna.trial.TrialState.COMPLETE


# --------------------------------------------------------------------------- many workers
def _worker(storage: str, name: str, folder: Path) -> subprocess.Popen:
    code = "import sys; from sb3_plastic.zoo import train; train(sys.argv[1:])"
    argv = [
        *("--algo", "plastic_ppo", "--env", "CartPole-v1", "-conf", str(CONFIGS / "plastic_ppo.yml")),
        *("-optimize", "--n-trials", "2", "-n", "256", "--n-evaluations", "1", "--eval-episodes", "1"),
        *("--storage", storage, "--study-name", name, "--pruner", "none", "--no-optim-plots"),
        *("-f", str(folder / "logs"), "--num-threads", "1", "--verbose", "0", "-uuid"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _two_workers(storage: str, name: str, folder: Path) -> None:
    study = _study(storage, name)
    for _ in range(6):  # enough cheap settings for every trial, whichever worker takes them
        study.enqueue_trial(CHEAP_PPO)
    # optuna pops an enqueued (WAITING) trial by reading it and then marking it RUNNING; sqlite has no row
    # locks, so two workers that start in the same instant can both claim trial 0 (the second one then fails
    # with "Trial#0 has already finished"). Start the second worker once the first holds its trial.
    workers = [_worker(storage, name, folder)]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workers[0].poll() is None:
        running = optuna.load_study(storage=storage, study_name=name).get_trials(states=(optuna.trial.TrialState.RUNNING,))
        if running:
            break
        time.sleep(0.2)
    workers.append(_worker(storage, name, folder))
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for worker, out in zip(workers, outputs):
        assert worker.returncode == 0, out[-4000:]
    trials = optuna.load_study(storage=storage, study_name=name).trials
    trials = [t for t in trials if t.state != optuna.trial.TrialState.WAITING]  # unused enqueued settings
    assert len(trials) == 4, [t.state for t in trials]  # 2 trials per worker, none lost, none extra
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.value is not None for t in trials)
    assert sorted(t.number for t in trials) == list(range(4))
    for out in outputs:
        assert "Number of finished trials" in out


def test_two_workers_share_one_sqlite_study(tmp_path):
    # a generous sqlite lock timeout: two processes write the same file on a loaded 2-core machine
    _two_workers(f"sqlite:///{tmp_path / 'shared.db'}?timeout=60", "shared", tmp_path)


def _postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        reason = f"{POSTGRES_ENV} is not set (.ci/run starts PostgreSQL and sets it)"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5} if "postgres" in url else {})
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        reason = f"PostgreSQL at {POSTGRES_ENV} cannot be reached: {type(exc).__name__}: {exc}"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return url


def test_two_workers_share_one_postgres_study(tmp_path):
    url = _postgres_url()
    name = f"sb3-plastic-test-{uuid.uuid4().hex[:12]}"
    try:
        _two_workers(url, name, tmp_path)
    finally:
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


# --------------------------------------------------------------------------- errors
def test_misspelt_yaml_key_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "typo.yml"
    conf.write_text(yaml.safe_dump({"CartPole-v1": {"policy": "MlpPolicy", "n_timesteps": 64, "isometry_cof": 0.1}}))
    with pytest.raises(SystemExit) as info:
        _train("--algo", "plastic_ppo", "--env", "CartPole-v1", "-conf", str(conf), "--eval-freq", "-1", "-f", "logs")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown hyperparameter 'isometry_cof' for plastic_ppo" in err
    assert "did you mean 'isometry_coef'" in err
    assert "typo.yml [CartPole-v1]" in err
    for allowed in ("isometry_coef", "replacement_rate", "fire_at", "n_steps", "n_envs"):
        assert f"'{allowed}'" in err
    assert not (tmp_path / "logs/plastic_ppo/CartPole-v1_1/CartPole-v1.zip").exists()


@pytest.mark.parametrize("algo", ["plastic_ppo", "ppo"])
def test_yaml_entry_without_policy_is_a_launcher_error_naming_the_key(tmp_path, monkeypatch, capsys, algo):
    """Issue #31: rl_zoo3 died with ``TypeError: missing 'policy'`` (plain algorithms too)."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "nopolicy.yml"
    conf.write_text(yaml.safe_dump({"CartPole-v1": {"n_timesteps": 64, "n_steps": 32}}))
    with pytest.raises(SystemExit) as info:
        _train("--algo", algo, "--env", "CartPole-v1", "-conf", str(conf), "--eval-freq", "-1", "-f", "logs")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sb3-plastic train: error: " in err and "nopolicy.yml [CartPole-v1]: the entry has no 'policy' key" in err
    assert "Traceback" not in err


def test_check_hyperparameters_names_preset_keys():
    zoo.check_hyperparameters("plastic_dqn", {"policy": "MlpPolicy", "replacement_rate": 1e-4, "redo_period": 10})
    with pytest.raises(zoo.HyperparameterError, match="'seed' is set by rl_zoo3"):
        zoo.check_hyperparameters("plastic_dqn", {"policy": "MlpPolicy", "seed": 1})
    with pytest.raises(zoo.HyperparameterError, match="'clip_range' for plastic_dqn"):
        zoo.check_hyperparameters("plastic_dqn", {"policy": "MlpPolicy", "clip_range": 0.2})


# --------------------------------------------------------------------------- every yaml entry builds
def _entries() -> list[tuple[str, str]]:
    out = []
    for algo in CLASSES:
        for key in yaml.safe_load((CONFIGS / f"{algo}.yml").read_text()):
            out.append((algo, "BreakoutNoFrameskip-v4" if key == "atari" else key))
    return out


@pytest.mark.parametrize("algo, env_id", _entries(), ids=[f"{a}-{e}" for a, e in _entries()])
def test_every_yaml_entry_builds_its_model(tmp_path, monkeypatch, algo, env_id):
    """Each entry of zoo_configs/ reads, validates, makes its env and builds its model (no training)."""
    import rl_zoo3.train

    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    if env_id not in gym.envs.registry:
        reason = f"{env_id} is not registered (yet) in this installation"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    try:
        gym.make(env_id).close()
    except Exception as exc:  # e.g. MuJoCo or Atari ROMs missing
        pytest.skip(f"{env_id} cannot be made here: {type(exc).__name__}: {exc}")
    built = {}
    manager = rl_zoo3.train.ExperimentManager
    monkeypatch.setattr(manager, "learn", lambda self, model: built.setdefault("model", model))
    monkeypatch.setattr(manager, "save_trained_model", lambda self, model: None)
    params = ["buffer_size:1000"] if algo != "plastic_ppo" else []
    _train("--algo", algo, "--env", env_id, "--eval-freq", "-1", "-f", "logs", *(["-params", *params] if params else []))
    model = built["model"]
    assert isinstance(model, CLASSES[algo])
    entry = yaml.safe_load((CONFIGS / f"{algo}.yml").read_text())["atari" if "NoFrameskip" in env_id else env_id]
    for key in ("isometry_coef", "replacement_rate", "fire_at", "fire_on_task_change", "activation"):
        if key in entry:
            value = getattr(model.isometry_config, key, None) if key in ("isometry_coef", "activation") else None
            if value is None:
                value = next(getattr(c, key) for c in model.intervention_configs.values() if hasattr(c, key))
            assert value == entry[key], key
    model.get_env().close()


# --------------------------------------------------------------------------- QR-DQN and TQC (sb3-contrib)
def _contrib_classes() -> dict:
    from sb3_plastic import PlasticQRDQN, PlasticTQC

    return {"plastic_qrdqn": PlasticQRDQN, "plastic_tqc": PlasticTQC}


CONTRIB_RUNS = [
    # algo, env, extra rl_zoo3 options keeping the 2000 steps quick on one core
    ("plastic_qrdqn", "CartPole-v1", ["--eval-freq", "-1", "-params", "gradient_steps:16"]),
    ("plastic_tqc", "Pendulum-v1", ["--eval-freq", "-1", "-params", "learning_starts:1900"]),
]


def test_qrdqn_tqc_registered_with_samplers():
    import rl_zoo3
    import rl_zoo3.exp_manager as em

    from sb3_plastic.samplers import sample_plastic_qrdqn_params, sample_plastic_tqc_params

    for name, cls in _contrib_classes().items():
        assert rl_zoo3.ALGOS[name] is cls
        assert name in em.HYPERPARAMS_CONVERTER
    assert em.HYPERPARAMS_SAMPLER["plastic_qrdqn"] is sample_plastic_qrdqn_params
    assert em.HYPERPARAMS_SAMPLER["plastic_tqc"] is sample_plastic_tqc_params


@pytest.mark.parametrize("algo, env_id, extra", CONTRIB_RUNS, ids=[r[0] for r in CONTRIB_RUNS])
def test_qrdqn_tqc_yaml_run_writes_model_config_and_tensorboard(tmp_path, monkeypatch, algo, env_id, extra):
    _, model_path, expected = _yaml_run(tmp_path, monkeypatch, algo, env_id, extra)

    model = _contrib_classes()[algo].load(model_path, device="cpu")
    assert model.num_timesteps >= 2000
    assert model.isometry_config.isometry_coef == expected["isometry_coef"]
    assert model.isometry_config.activation == expected["activation"]
    groups = [g for opt in _optimizers(model) for g in opt.param_groups]
    assert max(g["isometry_coef"] for g in groups) == expected["isometry_coef"]
    if algo == "plastic_qrdqn":
        assert model.policy.n_quantiles == 10  # rl_zoo3's CartPole policy_kwargs
    if expected.get("fire_at") is not None:
        assert model.intervention_configs["fire"].fire_at == expected["fire_at"]
        assert model.plastic_state["FIRE:auto"]["count"] == 1

    zoo.enjoy(["--algo", algo, "--env", env_id, "-f", "logs", "-n", "30", "--no-render", "--verbose", "0"])


@pytest.mark.parametrize("algo, env_id", [("plastic_qrdqn", "CartPole-v1"), ("plastic_tqc", "Pendulum-v1")])
def test_qrdqn_tqc_samplers_build_models_and_round_trip(algo, env_id):
    import rl_zoo3.exp_manager as em

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=2))
    trial = study.ask()
    env = gym.make(env_id)
    n_actions = env.action_space.shape[0] if env.action_space.shape else 0
    params = em.HYPERPARAMS_SAMPLER[algo](trial, n_actions, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert set(PLASTIC_PARAMS) | {"activation", "n_quantiles"} <= set(trial.params)
    assert params["isometry_coef"] == trial.params["isometry_coef"]
    assert params["policy_kwargs"]["n_quantiles"] == trial.params["n_quantiles"]
    assert "activation_fn" not in params["policy_kwargs"]
    model = _contrib_classes()[algo]("MlpPolicy", env, buffer_size=100, **params)
    assert max(g["isometry_coef"] for opt in _optimizers(model) for g in opt.param_groups) == trial.params["isometry_coef"]
    cbp = model.intervention_configs["cbp"]
    assert cbp.replacement_rate == trial.params["replacement_rate"]
    assert cbp.maturity_threshold == trial.params["maturity_threshold"]
    assert model.isometry_config.activation == trial.params["activation"]
    if algo == "plastic_tqc":
        assert model.top_quantiles_to_drop_per_net == trial.params["top_quantiles_to_drop_per_net"]
    # rl_zoo3's --trial-id path: optuna params -> the same hyperparameters
    assert em.HYPERPARAMS_CONVERTER[algo](trial.params) == params
    env.close()


def test_qrdqn_optimize_one_trial_sampled_values_reach_the_model(tmp_path, monkeypatch):
    """A 1-trial ``-optimize`` of plastic_qrdqn with cheap base settings enqueued (plastic ones sampled)."""
    monkeypatch.chdir(tmp_path)
    storage, name = f"sqlite:///{tmp_path / 'tune.db'}", "opt_qrdqn"
    study = _study(storage, name)
    study.enqueue_trial({"batch_size_pow": 5, "train_freq": 4, "subsample_steps": 4, "net_arch": "small", "n_quantiles": 5})
    _train(
        *("--algo", "plastic_qrdqn", "--env", "CartPole-v1", "-conf", str(CONFIGS / "plastic_qrdqn.yml")),
        *("-optimize", "--n-trials", "1", "-n", "400", "--n-evaluations", "1", "--eval-episodes", "1"),
        *("--storage", storage, "--study-name", name, "--pruner", "none", "--no-optim-plots"),
        *("--optimization-log-path", "trials", "-f", "logs", "--seed", "0", "-params", "learning_starts:100"),
    )
    (trial,) = optuna.load_study(storage=storage, study_name=name).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    params = trial.params
    model = _contrib_classes()["plastic_qrdqn"].load(tmp_path / "trials" / "trial_0" / "best_model.zip", device="cpu")
    assert max(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == params["isometry_coef"]
    assert model.intervention_configs["cbp"].replacement_rate == params["replacement_rate"]
    assert model.intervention_configs["cbp"].maturity_threshold == params["maturity_threshold"]
    assert model.isometry_config.activation == params["activation"]
    assert model.policy.n_quantiles == params["n_quantiles"] == 5


# --------------------------------------------------------------------------- CrossQ (sb3-contrib)
def test_crossq_registered_as_plastic_crossq_with_sampler():
    import rl_zoo3
    import rl_zoo3.exp_manager as em
    from sb3_contrib import CrossQ

    from sb3_plastic import PlasticCrossQ
    from sb3_plastic.samplers import sample_plastic_crossq_params

    assert rl_zoo3.ALGOS["crossq"] is CrossQ  # rl_zoo3 2.9.2 knows CrossQ: plastic_crossq is named after it
    assert zoo.zoo_name(PlasticCrossQ) == "plastic_crossq"
    assert rl_zoo3.ALGOS["plastic_crossq"] is PlasticCrossQ
    assert em.HYPERPARAMS_SAMPLER["plastic_crossq"] is sample_plastic_crossq_params
    assert "plastic_crossq" in em.HYPERPARAMS_CONVERTER


def test_crossq_sampler_builds_the_model_and_round_trips():
    import rl_zoo3.exp_manager as em

    from sb3_plastic import PlasticCrossQ

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=4))
    trial = study.ask()
    env = gym.make("Pendulum-v1")
    params = em.HYPERPARAMS_SAMPLER["plastic_crossq"](trial, 1, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert set(PLASTIC_PARAMS) | {"activation", "policy_delay"} <= set(trial.params)
    assert "tau" not in trial.params and "tau" not in params  # CrossQ has no target network
    assert "activation_fn" not in params["policy_kwargs"]
    model = PlasticCrossQ("MlpPolicy", env, buffer_size=100, **params)
    assert max(g["isometry_coef"] for opt in _optimizers(model) for g in opt.param_groups) == trial.params["isometry_coef"]
    assert model.policy_delay == trial.params["policy_delay"]
    assert model.batch_size == 2 ** trial.params["batch_size_pow"] >= 32
    assert model.intervention_configs["cbp"].replacement_rate == trial.params["replacement_rate"]
    assert model.isometry_config.activation == trial.params["activation"]
    assert em.HYPERPARAMS_CONVERTER["plastic_crossq"](trial.params) == params  # rl_zoo3's --trial-id path
    env.close()


def test_crossq_yaml_run_writes_model_config_and_tensorboard(tmp_path, monkeypatch):
    from sb3_plastic import PlasticCrossQ

    algo, env_id = "plastic_crossq", "Pendulum-v1"
    extra = ("--eval-freq", "-1", "-params", "learning_starts:1900")  # 100 updates of the [256, 256] nets
    keys = ("isometry_coef", "activation", "policy_delay")
    _, model_path, expected = _yaml_run(tmp_path, monkeypatch, algo, env_id, extra, keys)
    assert set(keys) <= set(expected)

    model = PlasticCrossQ.load(model_path, device="cpu")
    assert model.num_timesteps >= 2000 and model._n_updates > 0
    assert model.isometry_config.isometry_coef == expected["isometry_coef"]
    assert model.isometry_config.activation == expected["activation"]
    assert model.policy_delay == expected["policy_delay"] and model.actor.latent_pi[1].out_features == 256
    groups = [g for opt in _optimizers(model) for g in opt.param_groups]
    assert max(g["isometry_coef"] for g in groups) == expected["isometry_coef"]

    zoo.enjoy(["--algo", algo, "--env", env_id, "-f", "logs", "-n", "30", "--no-render", "--verbose", "0"])


def _crossq_entries() -> list[str]:
    return list(yaml.safe_load((CONFIGS / "plastic_crossq.yml").read_text()))


@pytest.mark.parametrize("env_id", _crossq_entries())
def test_crossq_yaml_entry_builds_its_model(tmp_path, monkeypatch, env_id):
    """Each entry of plastic_crossq.yml reads, validates, makes its env and builds its model."""
    import rl_zoo3.train

    from sb3_plastic import PlasticCrossQ

    monkeypatch.chdir(tmp_path)
    if env_id not in gym.envs.registry:
        pytest.skip(f"{env_id} is not registered (yet) in this installation")
    try:
        gym.make(env_id).close()
    except Exception as exc:  # e.g. MuJoCo missing
        pytest.skip(f"{env_id} cannot be made here: {type(exc).__name__}: {exc}")
    built = {}
    manager = rl_zoo3.train.ExperimentManager
    monkeypatch.setattr(manager, "learn", lambda self, model: built.setdefault("model", model))
    monkeypatch.setattr(manager, "save_trained_model", lambda self, model: None)
    _train("--algo", "plastic_crossq", "--env", env_id, "--eval-freq", "-1", "-f", "logs", "-params", "buffer_size:1000")
    model = built["model"]
    assert isinstance(model, PlasticCrossQ)
    entry = yaml.safe_load((CONFIGS / "plastic_crossq.yml").read_text())[env_id]
    assert model.isometry_config.isometry_coef == entry["isometry_coef"]
    assert model.isometry_config.activation == entry["activation"]
    assert model.policy_delay == entry["policy_delay"]
    for key in ("replacement_rate", "fire_at", "fire_on_task_change"):
        if key in entry:
            value = next(getattr(c, key) for c in model.intervention_configs.values() if hasattr(c, key))
            assert value == entry[key], key
    model.get_env().close()


def _contrib_entries() -> list[tuple[str, str]]:
    out = []
    for algo in ("plastic_qrdqn", "plastic_tqc"):
        for key in yaml.safe_load((CONFIGS / f"{algo}.yml").read_text()):
            out.append((algo, "BreakoutNoFrameskip-v4" if key == "atari" else key))
    return out


@pytest.mark.parametrize("algo, env_id", _contrib_entries(), ids=[f"{a}-{e}" for a, e in _contrib_entries()])
def test_qrdqn_tqc_yaml_entry_builds_its_model(tmp_path, monkeypatch, algo, env_id):
    """Each entry of plastic_qrdqn.yml / plastic_tqc.yml reads, validates, makes its env and builds its model."""
    import rl_zoo3.train

    monkeypatch.chdir(tmp_path)
    if env_id not in gym.envs.registry:
        pytest.skip(f"{env_id} is not registered (yet) in this installation")
    try:
        gym.make(env_id).close()
    except Exception as exc:  # e.g. MuJoCo or Atari ROMs missing
        pytest.skip(f"{env_id} cannot be made here: {type(exc).__name__}: {exc}")
    built = {}
    manager = rl_zoo3.train.ExperimentManager
    monkeypatch.setattr(manager, "learn", lambda self, model: built.setdefault("model", model))
    monkeypatch.setattr(manager, "save_trained_model", lambda self, model: None)
    _train("--algo", algo, "--env", env_id, "--eval-freq", "-1", "-f", "logs", "-params", "buffer_size:1000")
    model = built["model"]
    assert isinstance(model, _contrib_classes()[algo])
    entry = yaml.safe_load((CONFIGS / f"{algo}.yml").read_text())["atari" if "NoFrameskip" in env_id else env_id]
    for key in ("isometry_coef", "activation", "isometry_mode", "optimizer"):
        if key in entry:
            assert getattr(model.isometry_config, key) == entry[key], key
    from sb3_plastic.common.plastic_algorithm import intervention_keys

    for key in sorted(set(entry) & set(intervention_keys())):
        value = next(getattr(c, key) for c in model.intervention_configs.values() if hasattr(c, key))
        assert value == entry[key], key
    model.get_env().close()


# --------------------------------------------------------------------------- MaskablePPO (sb3-contrib)
MASKED_ENV = "sb3_plastic/InvalidActionDiscrete-v0"
MASKED_DIR = "sb3_plastic-InvalidActionDiscrete-v0"  # rl_zoo3's folder name for the id


def test_ppo_mask_registered_with_sampler_and_masked_evaluation():
    import rl_zoo3
    import rl_zoo3.exp_manager as em
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
    from stable_baselines3.common.callbacks import EvalCallback

    from sb3_plastic import PlasticMaskablePPO
    from sb3_plastic.samplers import sample_plastic_ppo_mask_params

    assert zoo.base_zoo_name(PlasticMaskablePPO) == "ppo_mask"
    assert rl_zoo3.ALGOS["plastic_ppo_mask"] is PlasticMaskablePPO and "plastic_maskableppo" not in rl_zoo3.ALGOS
    assert em.HYPERPARAMS_SAMPLER["plastic_ppo_mask"] is sample_plastic_ppo_mask_params
    assert "plastic_ppo_mask" in em.HYPERPARAMS_CONVERTER
    assert (CONFIGS / "plastic_ppo_mask.yml").is_file()
    assert zoo.uses_action_masks("plastic_ppo_mask") and not zoo.uses_action_masks("plastic_ppo")
    trial_cls = em.TrialEvalCallback
    with zoo.action_mask_evaluation("plastic_ppo"):
        assert em.EvalCallback is EvalCallback and em.TrialEvalCallback is trial_cls
    with zoo.action_mask_evaluation("plastic_ppo_mask"):
        assert em.EvalCallback is MaskableEvalCallback
        assert issubclass(em.TrialEvalCallback, trial_cls) and issubclass(em.TrialEvalCallback, MaskableEvalCallback)
    assert em.EvalCallback is EvalCallback and em.TrialEvalCallback is trial_cls  # restored


@pytest.fixture
def masked_evaluations(monkeypatch):
    """Records the ``use_masking`` of every evaluation run by sb3-contrib's MaskableEvalCallback."""
    import sb3_contrib.common.maskable.callbacks as maskable_callbacks

    calls: list[bool] = []
    evaluate = maskable_callbacks.evaluate_policy

    def spy(*args, **kwargs):
        calls.append(kwargs.get("use_masking", True))
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(maskable_callbacks, "evaluate_policy", spy)
    return calls


def test_ppo_mask_yaml_run_evaluates_and_enjoys_with_masks(tmp_path, monkeypatch, masked_evaluations):
    import numpy as np

    from sb3_plastic import PlasticMaskablePPO

    monkeypatch.chdir(tmp_path)
    conf = CONFIGS / "plastic_ppo_mask.yml"
    _train(
        *("--algo", "plastic_ppo_mask", "--env", MASKED_ENV, "-n", "2000", "-f", "logs", "-tb", "tb", "--seed", "3"),
        *("--eval-freq", "1000", "--eval-episodes", "1"),
    )
    assert masked_evaluations == [True, True]  # --eval-freq 1000 over 2000 steps, each with masks
    run = tmp_path / "logs" / "plastic_ppo_mask" / f"{MASKED_DIR}_1"
    assert (run / f"{MASKED_DIR}.zip").is_file() and (run / "evaluations.npz").is_file()
    saved = dict(yaml.load((run / MASKED_DIR / "config.yml").read_text(), Loader=yaml.UnsafeLoader))
    expected = yaml.safe_load(conf.read_text())[MASKED_ENV]
    assert saved["isometry_coef"] == expected["isometry_coef"] and saved["activation"] == expected["activation"]
    assert list((tmp_path / "tb" / MASKED_DIR).rglob("events.out.tfevents.*"))
    model = PlasticMaskablePPO.load(run / f"{MASKED_DIR}.zip", device="cpu")
    assert model.num_timesteps >= 2000
    assert model.isometry_config.activation == expected["activation"]
    assert max(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == expected["isometry_coef"]
    actions, masks = model.rollout_buffer.actions.reshape(-1).astype(int), model.rollout_buffer.action_masks
    assert masks.reshape(len(actions), -1).astype(bool)[range(len(actions)), actions].all()  # learnt with masks

    # enjoy: rl_zoo3's loop passes no masks; the launcher fills them in from the env being played
    predicted = []
    predict = PlasticMaskablePPO.predict

    def spy(self, observation, *args, action_masks=None, **kwargs):
        assert action_masks is not None
        action, state = predict(self, observation, *args, action_masks=action_masks, **kwargs)
        predicted.append(bool(np.asarray(action_masks)[np.arange(len(action)), action].all()))
        return action, state

    monkeypatch.setattr(PlasticMaskablePPO, "predict", spy)
    zoo.enjoy(["--algo", "plastic_ppo_mask", "--env", MASKED_ENV, "-f", "logs", "-n", "30", "--no-render", "--verbose", "0"])
    assert len(predicted) == 30 and all(predicted)


def test_ppo_mask_without_action_masks_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.yml"
    entry = {"policy": "MlpPolicy", "n_timesteps": 64, "n_steps": 32, "batch_size": 32}
    conf.write_text(yaml.safe_dump({"CartPole-v1": entry}))
    with pytest.raises(ValueError, match="does not support action masking"):
        _train("--algo", "plastic_ppo_mask", "--env", "CartPole-v1", "-conf", str(conf), "--eval-freq", "-1", "-f", "logs")


def test_ppo_mask_sampler_builds_model_and_round_trips():
    import rl_zoo3.exp_manager as em

    from sb3_plastic import PlasticMaskablePPO

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=3))
    trial = study.ask()
    params = em.HYPERPARAMS_SAMPLER["plastic_ppo_mask"](trial, 0, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert set(PLASTIC_PARAMS) | {"activation", "n_steps_pow", "batch_size_pow"} <= set(trial.params)
    assert params["activation"] == trial.params["activation"] and "activation_fn" not in params["policy_kwargs"]
    model = PlasticMaskablePPO("MlpPolicy", gym.make(MASKED_ENV), **params)
    assert max(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == trial.params["isometry_coef"]
    assert model.intervention_configs["cbp"].replacement_rate == trial.params["replacement_rate"]
    assert model.isometry_config.activation == trial.params["activation"]
    assert em.HYPERPARAMS_CONVERTER["plastic_ppo_mask"](trial.params) == params


def test_ppo_mask_optimize_two_trials_evaluate_with_masks(tmp_path, monkeypatch, masked_evaluations):
    """``-optimize`` with 2 trials of 512 steps (cheap PPO settings enqueued, plastic ones sampled): each trial's
    optuna evaluation uses the masks, and the sampled values reach the saved models."""
    from sb3_plastic import PlasticMaskablePPO

    trials = _optimize_two_cheap_trials(tmp_path, monkeypatch, "plastic_ppo_mask", MASKED_ENV, "opt_mask")
    assert masked_evaluations == [True, True]  # one evaluation per trial, with masks
    for trial in trials:
        model = PlasticMaskablePPO.load(tmp_path / "trials" / f"trial_{trial.number}" / "best_model.zip", device="cpu")
        params = trial.params
        assert sorted(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == [0.0, params["isometry_coef"]]
        assert model.isometry_config.activation == params["activation"]
        assert model.intervention_configs["cbp"].replacement_rate == params["replacement_rate"]
        assert model.intervention_configs["cbp"].maturity_threshold == params["maturity_threshold"]
        assert model.n_steps == 2 ** params["n_steps_pow"]


# --------------------------------------------------------------------------- RecurrentPPO (sb3-contrib)
def _recurrent_ppo_class() -> type:
    from sb3_plastic import PlasticRecurrentPPO

    return PlasticRecurrentPPO


def test_ppo_lstm_registered_as_plastic_ppo_lstm_with_sampler():
    import rl_zoo3
    import rl_zoo3.exp_manager as em

    from sb3_plastic.samplers import sample_plastic_ppo_lstm_params

    assert rl_zoo3.ALGOS["plastic_ppo_lstm"] is _recurrent_ppo_class()  # rl_zoo3 calls RecurrentPPO "ppo_lstm"
    assert em.HYPERPARAMS_SAMPLER["plastic_ppo_lstm"] is sample_plastic_ppo_lstm_params
    assert "plastic_ppo_lstm" in em.HYPERPARAMS_CONVERTER


def test_ppo_lstm_yaml_run_writes_model_config_and_tensorboard(tmp_path, monkeypatch):
    """2 000 steps of plastic_ppo_lstm on CartPole-v1 from zoo_configs/plastic_ppo_lstm.yml, then enjoy (LSTM states)."""
    algo, env_id = "plastic_ppo_lstm", "CartPole-v1"
    keys = ("isometry_coef", "activation", "policy_kwargs")
    extra = ["--eval-freq", "-1", "-params", "n_epochs:2"]
    _, model_path, expected = _yaml_run(tmp_path, monkeypatch, algo, env_id, extra, keys)
    assert set(keys) <= set(expected)

    model = _recurrent_ppo_class().load(model_path, device="cpu")
    assert model.num_timesteps >= 2000
    assert model.isometry_config.isometry_coef == expected["isometry_coef"]
    assert model.isometry_config.activation == expected["activation"]
    assert model.policy.lstm_actor.hidden_size == 64 and model.policy.lstm_critic is not None
    groups = model.policy.optimizer.param_groups
    assert [(g["isometry_coef"], g.get("isometry_blocks", 1)) for g in groups] == [
        (expected["isometry_coef"], 1),
        (expected["isometry_coef"], 4),
        (0.0, 1),
    ]

    zoo.enjoy(["--algo", algo, "--env", env_id, "-f", "logs", "-n", "30", "--no-render", "--verbose", "0"])


def test_ppo_lstm_sampler_builds_model_and_round_trips():
    import rl_zoo3.exp_manager as em

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=2))
    trial = study.ask()
    params = em.HYPERPARAMS_SAMPLER["plastic_ppo_lstm"](trial, 0, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    assert set(PLASTIC_PARAMS) | {"activation"} <= set(trial.params)
    assert "activation_fn" not in trial.params and "activation_fn" not in params["policy_kwargs"]
    params["policy_kwargs"]["lstm_hidden_size"] = 8
    model = _recurrent_ppo_class()("MlpLstmPolicy", "CartPole-v1", **params)
    assert max(g["isometry_coef"] for g in model.policy.optimizer.param_groups) == trial.params["isometry_coef"]
    assert model.isometry_config.activation == trial.params["activation"]
    assert model.intervention_configs["cbp"].replacement_rate == trial.params["replacement_rate"]
    del params["policy_kwargs"]["lstm_hidden_size"]
    assert em.HYPERPARAMS_CONVERTER["plastic_ppo_lstm"](trial.params) == params


def _ppo_lstm_entries() -> list[str]:
    return list(yaml.safe_load((CONFIGS / "plastic_ppo_lstm.yml").read_text()))


@pytest.mark.parametrize("env_id", _ppo_lstm_entries())
def test_ppo_lstm_yaml_entry_builds_its_model(tmp_path, monkeypatch, env_id):
    """Each entry of plastic_ppo_lstm.yml reads, validates, makes its env and builds its model (no training)."""
    import rl_zoo3.train

    monkeypatch.chdir(tmp_path)
    zoo.register_envs([env_id])
    if env_id not in gym.envs.registry:
        pytest.skip(f"{env_id} is not registered (yet) in this installation")
    built = {}
    manager = rl_zoo3.train.ExperimentManager
    monkeypatch.setattr(manager, "learn", lambda self, model: built.setdefault("model", model))
    monkeypatch.setattr(manager, "save_trained_model", lambda self, model: None)
    _train("--algo", "plastic_ppo_lstm", "--env", env_id, "--eval-freq", "-1", "-f", "logs")
    model = built["model"]
    assert isinstance(model, _recurrent_ppo_class())
    entry = yaml.safe_load((CONFIGS / "plastic_ppo_lstm.yml").read_text())[env_id]
    assert model.isometry_config.isometry_coef == entry["isometry_coef"]
    assert model.isometry_config.activation == entry["activation"]
    assert [g.get("isometry_blocks", 1) for g in model.policy.optimizer.param_groups] == [1, 4, 1]
    model.get_env().close()
