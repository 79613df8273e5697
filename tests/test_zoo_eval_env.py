"""The zoo's eval env on a continual env: it is made with the training env's ``env_kwargs`` (the yaml's too, not
only ``--env-kwargs``), and the tuning objective counts only the evaluations within the trial's budget ``-n``.

rl_zoo3 2.9.2 binds ``eval_env_kwargs`` to the (empty) command-line ``env_kwargs`` before it reads the yaml; the
yaml's ``env_kwargs`` then reach only the training env. ``sb3_plastic.zoo.PlasticExperimentManager`` gives the
eval env the training env's kwargs unless ``--eval-env-kwargs`` was given.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
from builders import zoo_bandit_conf

from sb3_plastic import zoo

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
#: every kwarg differs from the registered default (change_every 2000, task_seed 0, 8 actions, 16-step episodes)
YAML_KWARGS = {"change_every": 64, "n_actions": 4, "task_seed": 3, "episode_length": 8}
CHEAP_PPO = {"batch_size_pow": 6, "n_steps_pow": 5, "n_epochs": 1, "net_arch": "tiny"}

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def conf(tmp_path, monkeypatch) -> Path:
    return zoo_bandit_conf(tmp_path, monkeypatch, 256, YAML_KWARGS)


@pytest.fixture
def created_envs(monkeypatch) -> list[tuple[bool, object]]:
    """Every ``(eval_env, vec_env)`` rl_zoo3's experiment manager creates."""
    from rl_zoo3.exp_manager import ExperimentManager

    created: list[tuple[bool, object]] = []
    original = ExperimentManager.create_envs

    def recording(self, n_envs, eval_env=False, no_log=False):
        env = original(self, n_envs, eval_env=eval_env, no_log=no_log)
        created.append((eval_env, env))
        return env

    monkeypatch.setattr(ExperimentManager, "create_envs", recording)
    return created


def _train(*argv: str) -> None:
    zoo.train(["--num-threads", "1", "--verbose", "0", "--seed", "0", *argv])


def _kwargs_and_space(env) -> tuple[dict, object]:
    spec = env.get_attr("spec", [0])[0]
    schedule = env.get_attr("schedule", [0])[0]
    kwargs = {key: spec.kwargs.get(key) for key in YAML_KWARGS}
    kwargs["schedule"] = (schedule.change_every, schedule.task_seed)
    return kwargs, env.action_space


def _check_eval_env_is_the_training_env(created) -> None:
    training = [env for is_eval, env in created if not is_eval]
    evaluation = [env for is_eval, env in created if is_eval]
    assert training and evaluation
    want = {**YAML_KWARGS, "schedule": (64, 3)}
    for env in training + evaluation:
        kwargs, space = _kwargs_and_space(env)
        assert kwargs == want and space.n == 4


def test_zoo_eval_env_gets_the_yaml_env_kwargs(conf, created_envs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train("--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(conf), "-n", "128", "-f", "logs",
               "--eval-freq", "32", "--eval-episodes", "1")
    _check_eval_env_is_the_training_env(created_envs)
    assert not [w for w in caught if "eval env" in str(w.message)]  # nothing to warn about


def test_zoo_trial_eval_env_gets_the_yaml_env_kwargs(conf, created_envs):
    storage, name = "sqlite:///tune.db", "kwargs"
    zoo.ensure_study(storage, name)
    optuna.load_study(storage=storage, study_name=name).enqueue_trial(CHEAP_PPO)
    _train("--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(conf), "-optimize", "--n-trials", "1", "-n", "128",
           "--n-evaluations", "2", "--eval-episodes", "1", "--storage", storage, "--study-name", name,
           "--pruner", "none", "--no-optim-plots", "-f", "logs")
    (trial,) = optuna.load_study(storage=storage, study_name=name).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    _check_eval_env_is_the_training_env(created_envs)


def test_zoo_explicit_eval_env_kwargs_are_kept(conf, created_envs):
    with pytest.warns(UserWarning, match="eval env"):  # its episode_length differs from the training env's
        _train("--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(conf), "-n", "64", "-f", "logs",
               "--eval-freq", "32", "--eval-episodes", "1",
               "--eval-env-kwargs", "change_every:64", "task_seed:3", "n_actions:4", "episode_length:4")
    (evaluation,) = [env for is_eval, env in created_envs if is_eval]
    assert evaluation.get_attr("spec", [0])[0].kwargs["episode_length"] == 4


def test_zoo_tuning_objective_counts_only_evaluations_within_the_budget(conf):
    """``-n 70`` with 64-timestep rollouts: SB3 trains to 128 timesteps, and rl_zoo3's evaluations every 34
    timesteps (``--n-evaluations 2``) come at 34, 68 and 102. The objective is the mean over the first two only,
    the ones within the budget, so that every trial of a study is averaged over the same part of the run."""
    storage, name = "sqlite:///tune.db", "budget"
    zoo.ensure_study(storage, name)
    optuna.load_study(storage=storage, study_name=name).enqueue_trial(CHEAP_PPO)
    _train("--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(conf), "-optimize", "--n-trials", "1", "-n", "70",
           "--n-evaluations", "2", "--eval-episodes", "2", "--storage", storage, "--study-name", name,
           "--pruner", "none", "--no-optim-plots", "--optimization-log-path", "trials", "-f", "logs")
    (trial,) = optuna.load_study(storage=storage, study_name=name).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    data = np.load(Path("trials") / f"trial_{trial.number}" / "evaluations.npz")
    assert data["timesteps"].tolist() == [34, 68, 102]
    means = data["results"].mean(axis=1)
    assert trial.value == pytest.approx(float(np.mean(means[:2])), abs=1e-12)
    assert trial.user_attrs["objective"] == "mean_over_evaluations"
    assert trial.user_attrs["objective_evaluations"] == 2
