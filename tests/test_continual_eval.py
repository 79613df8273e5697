"""Evaluation on a continual env follows the training task; the zoo's tuning objective on a continual env;
``sb3-plastic train --monitor`` / yaml ``callback:`` write ``plasticity/`` scalars (issue #12, item 3).

The continual env is ``sb3_plastic/RandomLabelBandit-v0`` (16-step episodes, cheap) with a small
``change_every``, so the task changes several times in a few hundred steps. The reference for "the task being
trained at an evaluation" is the schedule itself: after ``s`` steps of each copy (lockstep copies) the step just
taken has index ``s - 1``, so the agent has been training on task ``(s - 1) // change_every``. Evaluations come
every 32 steps of each copy, at the end of a 16-step episode: at a task boundary the vector env's automatic reset
has already started the next task, which the agent has not trained on yet, and the evaluation must not measure it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import optuna
import pytest
import yaml
from builders import zoo_bandit_conf
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize

from sb3_plastic import PlasticPPO, zoo
from sb3_plastic.callbacks import ContinualEvalCallback, continual_eval_callback_class
from sb3_plastic.envs import ChannelPermutation, GameSwitchingEnv
from sb3_plastic.envs.bandit_envs import ContextualBandit

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
BANDIT_DIR = "sb3_plastic-RandomLabelBandit-v0"  # rl_zoo3's folder name for the id
CHANGE_EVERY = 64
#: rl_zoo3 PPO-sampler values that keep a trial to a few seconds (as in test_zoo.py; the rest is sampled)
CHEAP_PPO = {"batch_size_pow": 6, "n_steps_pow": 5, "n_epochs": 1, "net_arch": "tiny"}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def expected_task(timesteps: int, n_envs: int, change_every: int = CHANGE_EVERY) -> int:
    """The task the agent trained on in the last step before ``timesteps`` model timesteps (each copy took
    ``timesteps // n_envs`` steps, ending an episode; the last one has index ``timesteps // n_envs - 1``)."""
    steps = timesteps // n_envs
    assert steps % 16 == 0  # an episode end (RandomLabelBandit's 16-step episodes)
    return (steps - 1) // change_every


def bandit(n_envs: int, seed: int = 0, **kwargs) -> DummyVecEnv:
    return make_vec_env(BANDIT, n_envs=n_envs, seed=seed, env_kwargs={"change_every": CHANGE_EVERY, **kwargs})


# --------------------------------------------------------------------------- pin_task
def _cartpole_permuted(change_every: int = 10, **kwargs) -> ChannelPermutation:
    return ChannelPermutation(gym.make("CartPole-v1"), change_every=change_every, axis=0, **kwargs)


def test_pin_task_overrides_the_step_count_until_unpinned():
    env = _cartpole_permuted(change_every=10)
    env.reset(seed=0)
    for _ in range(50):
        _, _, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            env.reset()
    assert env.env_steps == 50 and info["task_id"] == 4
    env.pin_task(1)
    assert env.pinned_task == 1
    obs, _, _, _, info = env.step(0)  # immediate mode: the next step runs the pinned task
    assert info["task_id"] == 1 and env.task_id == 1 and info["task_step"] == 1
    np.testing.assert_array_equal(env.current_permutation, env.permutation_for(1))
    np.testing.assert_array_equal(obs, np.asarray(env.unwrapped.state, dtype=np.float32)[env.permutation_for(1)])
    for _ in range(30):  # its own steps never switch it
        _, _, terminated, truncated, info = env.step(0)
        assert info["task_id"] == 1
        if terminated or truncated:
            _, info = env.reset()
            assert info["task_id"] == 1
    _, info = env.reset(seed=5)  # a seeded reset rewinds the count but keeps the pin
    assert info["task_id"] == 1 and env.env_steps == 0
    for _ in range(25):
        _, _, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            env.reset()
    env.pin_task(None)  # back to the own schedule: task env_steps // change_every
    _, _, _, _, info = env.step(0)
    assert env.pinned_task is None and info["task_id"] == 25 // 10 == env.task_id
    env.pin_task(2)  # pinning the current task changes nothing
    _, _, _, _, info = env.step(0)
    assert info["task_id"] == 2 and info["task_step"] == 2


def test_pin_task_at_episode_end_waits_for_reset():
    env = _cartpole_permuted(change_every=1000, at_episode_end=True)
    env.reset(seed=0)
    env.pin_task(3)
    _, _, _, _, info = env.step(0)
    assert info["task_id"] == 0  # only reset() switches in this mode
    _, info = env.reset()
    assert info["task_id"] == 3


def test_pin_task_before_the_first_reset_and_after_set_env_steps():
    env = _cartpole_permuted(change_every=10)
    env.pin_task(2)
    _, info = env.reset(seed=0)
    assert info["task_id"] == 2
    env.set_env_steps(100)
    _, info = env.reset()
    assert info["task_id"] == 2
    env.pin_task(None)
    _, info = env.reset()
    assert info["task_id"] == 10


def test_pin_task_on_game_switching_ends_the_episode_then_switches():
    env = GameSwitchingEnv([lambda: gym.make("CartPole-v1"), lambda: gym.make("CartPole-v1")], change_every=1000,
                           names=["a", "b"])
    env.reset(seed=0)
    _, _, _, truncated, info = env.step(0)
    assert info["game"] == "a" and not truncated
    env.pin_task(1)
    _, _, _, truncated, info = env.step(0)
    assert truncated and info["task_id"] == 0  # the game never changes inside an episode
    _, info = env.reset()
    assert info["task_id"] == 1 and info["game"] == "b"


def test_pin_task_on_the_fused_permuted_minatar_step():
    """PermutedMinAtar inlines the base class's step: a pin still reaches it (through ``_switch``)."""
    from sb3_plastic.envs.minatar_envs import PermutedMinAtar, make_permuted_minatar

    env = make_permuted_minatar("breakout", change_every=10)
    assert isinstance(env, PermutedMinAtar)
    env.reset(seed=0)
    env.pin_task(3)
    for _ in range(30):
        _, _, terminated, truncated, info = env.step(0)
        assert info["task_id"] == 3
        np.testing.assert_array_equal(env.current_permutation, env.permutation_for(3))
        if terminated or truncated:
            env.reset()
    env.pin_task(None)
    _, _, _, _, info = env.step(0)
    assert info["task_id"] == 31 // 10


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_pin_task_rejects_bad_values(bad):
    env = _cartpole_permuted()
    with pytest.raises(ValueError, match=r"task_index must be a non-negative integer or None, got"):
        env.pin_task(bad)


# --------------------------------------------------------------------------- ContinualEvalCallback
class _RecordingMixin:
    """Records ``info["task_id"]`` of every evaluation step (SB3 passes ``evaluate_policy``'s locals here)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen_tasks: list[set] = []

    def _on_step(self):
        self._evaluating = False  # at most one evaluation per call; its first step opens a new set
        return super()._on_step()

    def _log_success_callback(self, locals_, globals_):
        if not self._evaluating:
            self.seen_tasks.append(set())
            self._evaluating = True
        self.seen_tasks[-1].add(locals_["info"]["task_id"])
        return super()._log_success_callback(locals_, globals_)


class RecordingContinualEval(_RecordingMixin, ContinualEvalCallback):
    pass


class RecordingEval(_RecordingMixin, EvalCallback):
    pass


WRAPPERS = {
    "plain": lambda venv, train: venv,
    "VecNormalize": lambda venv, train: VecNormalize(venv, training=train, norm_reward=train),
    "VecFrameStack": lambda venv, train: VecFrameStack(venv, n_stack=2),
}


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_evaluations_follow_the_training_task(tmp_path, wrapper):
    """Each evaluation runs on the task the training env is on at that moment (through SB3's vec-env wrappers);
    evaluations.npz records it as ``task_ids``; a plain EvalCallback's eval env runs its own schedule instead."""
    n_envs, total = 2, 640
    train_env = WRAPPERS[wrapper](bandit(n_envs, seed=1), True)
    callback = RecordingContinualEval(
        WRAPPERS[wrapper](bandit(1, seed=2), False), eval_freq=32, n_eval_episodes=1, log_path=str(tmp_path), verbose=0
    )
    model = PPO("MlpPolicy", train_env, n_steps=32, batch_size=32, n_epochs=1, seed=0)
    model.learn(total, callback=callback)

    data = np.load(tmp_path / "evaluations.npz")
    expected = [expected_task(int(t), n_envs) for t in data["timesteps"]]
    assert len(expected) == total // (32 * n_envs) and max(expected) == 4  # tasks 0 .. 4
    assert data["task_ids"].tolist() == expected == callback.evaluation_task_ids
    assert callback.seen_tasks == [{task} for task in expected]  # every evaluation step ran on that task
    assert sorted(data.files) == ["ep_lengths", "results", "task_ids", "timesteps"]
    np.testing.assert_allclose(callback.evaluation_mean_rewards, data["results"].mean(axis=1))
    assert callback.mean_evaluation_reward() == pytest.approx(np.mean(data["results"].mean(axis=1)))

    # SB3's EvalCallback (the old behaviour): the eval copy counts its own 16-step evaluations and lags behind
    plain = RecordingEval(WRAPPERS[wrapper](bandit(1, seed=2), False), eval_freq=32, n_eval_episodes=1, verbose=0)
    PPO("MlpPolicy", WRAPPERS[wrapper](bandit(n_envs, seed=1), True), n_steps=32, batch_size=32, n_epochs=1,
        seed=0).learn(total, callback=plain)
    assert [min(seen) for seen in plain.seen_tasks] != expected


class _LastTrainingTask(BaseCallback):
    """Records ``infos[0]["task_id"]`` of the training step just taken, before the evaluation of the same step."""

    def __init__(self):
        super().__init__()
        self.tasks: list[int] = []

    def _on_step(self) -> bool:
        self.tasks.append(int(self.locals["infos"][0]["task_id"]))
        return True


def _two_games() -> GameSwitchingEnv:
    return GameSwitchingEnv([lambda: gym.make("CartPole-v1"), lambda: gym.make("CartPole-v1")], change_every=48,
                            names=["a", "b"])


BOUNDARY_ENVS = {
    # the bandit's 16-step episodes end exactly at every task boundary
    "bandit": lambda n_envs, seed: bandit(n_envs, seed=seed),
    # game switching truncates the last step of every task: its episode always ends at the boundary
    "game_switching": lambda n_envs, seed: make_vec_env(_two_games, n_envs=n_envs, seed=seed),
}


@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("kind", list(BOUNDARY_ENVS))
def test_an_evaluation_at_a_task_boundary_measures_the_task_just_trained(kind, n_envs):
    """At ``k * change_every`` steps of each copy the automatic reset has already put the training copies on task
    ``k``; the evaluation of that step measures task ``k - 1``, the one the agent trained on (never task ``k``)."""
    change_every = CHANGE_EVERY if kind == "bandit" else 48
    make = BOUNDARY_ENVS[kind]
    evaluation = RecordingContinualEval(make(1, 2), eval_freq=change_every, n_eval_episodes=1, verbose=0)
    trained = _LastTrainingTask()
    model = PPO("MlpPolicy", make(n_envs, 1), n_steps=change_every, batch_size=change_every, n_epochs=1, seed=0)
    model.learn(4 * change_every * n_envs, callback=[trained, evaluation])
    # evaluation i comes after (i + 1) * change_every steps of each copy: the last training step was task i
    assert evaluation.evaluation_task_ids == [0, 1, 2, 3]
    assert evaluation.evaluation_task_ids == trained.tasks[change_every - 1::change_every]
    assert evaluation.seen_tasks == [{0}, {1}, {2}, {3}]  # every evaluation step ran on that task
    assert model.get_env().get_attr("task_id", [0])[0] == 4  # while the training env is on the next task


def test_continual_eval_is_eval_callback_on_a_stationary_env(tmp_path):
    """Bit-identical evaluations, files and training with SB3's EvalCallback when nothing is piecewise-stationary."""
    runs = {}
    for name, cls in (("sb3", EvalCallback), ("continual", ContinualEvalCallback)):
        folder = tmp_path / name
        env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
        callback = cls(make_vec_env("CartPole-v1", n_envs=1, seed=1), eval_freq=32, n_eval_episodes=2,
                       log_path=str(folder), best_model_save_path=str(folder), verbose=0)
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no warning on a stationary env
            model.learn(384, callback=callback)
        runs[name] = (np.load(folder / "evaluations.npz"), model, callback)
    (sb3_data, sb3_model, sb3_cb), (data, model, cb) = runs["sb3"], runs["continual"]
    assert sorted(data.files) == sorted(sb3_data.files) == ["ep_lengths", "results", "timesteps"]
    for key in sb3_data.files:
        np.testing.assert_array_equal(data[key], sb3_data[key])
    assert len(data["timesteps"]) == 6 and not cb.follows_task and cb.evaluation_task_ids == []
    assert cb.last_mean_reward == sb3_cb.last_mean_reward and cb.best_mean_reward == sb3_cb.best_mean_reward
    for p, q in zip(model.policy.parameters(), sb3_model.policy.parameters()):
        assert p.data.equal(q.data)
    assert (tmp_path / "continual" / "best_model.zip").is_file()


def _learn_briefly(train_env, callback) -> None:
    PPO("MlpPolicy", train_env, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16, callback=callback)


def test_mismatched_envs_are_warned_about():
    stationary = lambda: DummyVecEnv([lambda: ContextualBandit(256, 32, 8, 16, 0)])  # noqa: E731
    with pytest.warns(UserWarning, match="training env is piecewise-stationary but the eval env is not"):
        _learn_briefly(bandit(1), ContinualEvalCallback(stationary(), eval_freq=8))
    with pytest.warns(UserWarning, match="eval env is piecewise-stationary but the training env is not"):
        _learn_briefly(stationary(), ContinualEvalCallback(bandit(1), eval_freq=8))
    with pytest.warns(UserWarning, match=r"eval env's task_seed \[7\] differs from the training env's 0"):
        _learn_briefly(bandit(1), ContinualEvalCallback(bandit(1, task_seed=7), eval_freq=8))


def test_an_eval_env_with_other_kwargs_is_warned_about():
    """The eval env must be the training env's: another episode length (or any other env kwarg) is warned about,
    naming the kwargs; change_every / at_episode_end may differ (a pinned eval copy never follows its own schedule)."""
    with pytest.warns(UserWarning, match=r"eval env's kwargs \{'episode_length': 8\} differ from the training "
                                         r"env's \{'episode_length': 16\}"):
        _learn_briefly(bandit(1), ContinualEvalCallback(bandit(1, episode_length=8), eval_freq=8))
    with pytest.warns(UserWarning, match=r"eval env is sb3_plastic/RandomLabelBandit-v0, the training env "
                                         r"sb3_plastic/SwitchingBandit"):
        gym.register("sb3_plastic/SwitchingBanditCopy-v0", entry_point=gym.spec(BANDIT).entry_point)
        try:
            train = make_vec_env("sb3_plastic/SwitchingBanditCopy-v0", n_envs=1, seed=0,
                                 env_kwargs={"change_every": CHANGE_EVERY})
            _learn_briefly(train, ContinualEvalCallback(bandit(1), eval_freq=8))
        finally:
            gym.registry.pop("sb3_plastic/SwitchingBanditCopy-v0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _learn_briefly(bandit(1, episode_length=8),
                       ContinualEvalCallback(bandit(1, episode_length=8, change_every=5, at_episode_end=True), eval_freq=8))
    assert not [w for w in caught if "eval env" in str(w.message)]


def test_plastic_learn_warns_about_a_plain_eval_callback_on_a_continual_env():
    model = PlasticPPO("MlpPolicy", bandit(1), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    with pytest.warns(UserWarning, match="EvalCallback evaluates on a piecewise-stationary env.*ContinualEvalCallback"):
        model.learn(16, callback=[EvalCallback(bandit(1), eval_freq=1000)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(16, callback=ContinualEvalCallback(bandit(1), eval_freq=1000))
    assert not [w for w in caught if "piecewise-stationary" in str(w.message)]


def test_continual_eval_callback_class():
    from rl_zoo3.callbacks import TrialEvalCallback
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    assert continual_eval_callback_class(EvalCallback) is ContinualEvalCallback
    masked = continual_eval_callback_class(MaskableEvalCallback)
    assert issubclass(masked, MaskableEvalCallback) and continual_eval_callback_class(masked) is masked
    assert continual_eval_callback_class(TrialEvalCallback) is continual_eval_callback_class(TrialEvalCallback)
    with pytest.raises(TypeError, match="base must be an EvalCallback class, got"):
        continual_eval_callback_class(PPO)


# --------------------------------------------------------------------------- rl_zoo3
@pytest.fixture
def bandit_conf(tmp_path, monkeypatch) -> Path:
    return zoo_bandit_conf(tmp_path, monkeypatch, 640, {"change_every": CHANGE_EVERY}, with_cartpole=True)


def _train(*argv: str) -> None:
    zoo.train(["--num-threads", "1", "--verbose", "0", "--seed", "0", *argv])


def test_zoo_eval_follows_the_training_task(tmp_path, bandit_conf):
    """``sb3-plastic train --eval-freq``: evaluations.npz records, per evaluation, the task being trained."""
    _train("--algo", "plastic_ppo", "--env", BANDIT, "-conf", str(bandit_conf), "-n", "640", "-f", "logs",
           "--eval-freq", "64", "--eval-episodes", "1")
    data = np.load(tmp_path / "logs" / "plastic_ppo" / f"{BANDIT_DIR}_1" / "evaluations.npz")
    expected = [expected_task(int(t), 2) for t in data["timesteps"]]
    assert len(expected) == 10 and max(expected) == 4
    assert data["task_ids"].tolist() == expected == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # 5 tasks of 64 steps per copy


def _one_trial(env: str, conf: Path, name: str, n_evaluations: int) -> optuna.trial.FrozenTrial:
    storage = "sqlite:///tune.db"
    zoo.ensure_study(storage, name)
    optuna.load_study(storage=storage, study_name=name).enqueue_trial(CHEAP_PPO)
    _train(
        *("--algo", "plastic_ppo", "--env", env, "-conf", str(conf), "-optimize", "--n-trials", "1", "-n", "640"),
        *("--n-evaluations", str(n_evaluations), "--eval-episodes", "2", "--storage", storage, "--study-name", name),
        *("--pruner", "none", "--no-optim-plots", "--optimization-log-path", "trials", "-f", "logs"),
    )
    (trial,) = optuna.load_study(storage=storage, study_name=name).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    return trial


def test_zoo_tuning_objective_on_a_continual_env_is_the_mean_over_evaluations(tmp_path, bandit_conf):
    trial = _one_trial(BANDIT, bandit_conf, "continual", n_evaluations=5)
    data = np.load(tmp_path / "trials" / f"trial_{trial.number}" / "evaluations.npz")
    means = data["results"].mean(axis=1)
    assert len(means) == 5
    assert data["task_ids"].tolist() == [expected_task(int(t), 2) for t in data["timesteps"]]
    assert data["task_ids"].tolist() == [0, 1, 2, 3, 4]  # one evaluation per 128-timestep task, at its end
    assert trial.value == pytest.approx(float(np.mean(means)), abs=1e-12)
    assert [trial.intermediate_values[i] for i in range(1, 6)] == pytest.approx(means.tolist())  # each reported
    assert trial.user_attrs["objective"] == "mean_over_evaluations"


def test_zoo_tuning_objective_on_a_stationary_env_is_rl_zoo3s(tmp_path, bandit_conf):
    trial = _one_trial("CartPole-v1", bandit_conf, "stationary", n_evaluations=2)
    data = np.load(tmp_path / "trials" / f"trial_{trial.number}" / "evaluations.npz")
    assert "task_ids" not in data.files and len(data["timesteps"]) == 2
    assert trial.value == pytest.approx(float(data["results"][-1].mean()))  # the last evaluation, as rl_zoo3
    assert trial.value == trial.intermediate_values[2]
    assert trial.user_attrs["objective"] == "last_evaluation"


# --------------------------------------------------------------------------- the monitor in zoo runs
def _plasticity_scalars(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in folder.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        tags.update(tag for tag in accumulator.Tags()["scalars"] if tag.startswith("plasticity/"))
    return tags


def test_monitor_flag_and_yaml_callback_write_plasticity_scalars(tmp_path, bandit_conf):
    base = ("--algo", "plastic_ppo", "--env", "CartPole-v1", "-n", "256", "--eval-freq", "-1", "-f", "logs")
    _train(*base, "-conf", str(bandit_conf), "-tb", "plain")
    assert list((tmp_path / "plain").rglob("events.out.tfevents.*")) and not _plasticity_scalars(tmp_path / "plain")

    _train(*base, "-conf", str(bandit_conf), "-tb", "flag", "--monitor", "128")
    tags = _plasticity_scalars(tmp_path / "flag")
    assert {"plasticity/policy/dormant_fraction", "plasticity/policy/ntk_cond"} <= tags

    conf = yaml.safe_load(bandit_conf.read_text())
    conf["CartPole-v1"]["callback"] = [{"sb3_plastic.callbacks.PlasticityMonitor": {"every": 128}}]
    (tmp_path / "monitor.yml").write_text(yaml.safe_dump(conf))
    _train(*base, "-conf", str(tmp_path / "monitor.yml"), "-tb", "yaml")
    assert {"plasticity/policy/dormant_fraction", "plasticity/policy/ntk_cond"} <= _plasticity_scalars(tmp_path / "yaml")


def test_monitor_flag_rejects_a_bad_period(capsys):
    with pytest.raises(SystemExit):
        zoo.train(["--env", "CartPole-v1", "--monitor", "0"])
    assert "argument --monitor: expected a positive integer, got '0'" in capsys.readouterr().err


def test_zoo_masked_callbacks_also_follow_the_task():
    """For a maskable algorithm the zoo's callbacks are the masked ones with the task-following mixin in front."""
    import rl_zoo3.exp_manager as em
    from rl_zoo3.callbacks import TrialEvalCallback
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    from sb3_plastic.callbacks.continual_eval import TaskFollowingEvalMixin

    zoo.register()
    saved = em.EvalCallback, em.TrialEvalCallback
    env = DummyVecEnv([lambda: gym.make("sb3_plastic/InvalidActionDiscrete-v0")])
    trial = optuna.create_study(direction="maximize").ask()
    with zoo.action_mask_evaluation("plastic_ppo_mask"), zoo.task_following_evaluation() as created:
        evaluation = em.EvalCallback(env, eval_freq=10)
        trial_evaluation = em.TrialEvalCallback(env, trial, eval_freq=10)
    assert created == [evaluation, trial_evaluation]
    assert isinstance(evaluation, MaskableEvalCallback) and isinstance(evaluation, TaskFollowingEvalMixin)
    for cls in (TrialEvalCallback, MaskableEvalCallback, TaskFollowingEvalMixin):
        assert isinstance(trial_evaluation, cls)
    assert (em.EvalCallback, em.TrialEvalCallback) == saved  # restored
    assert zoo.continual_objective(created, -1.0, trial) == -1.0  # stationary: rl_zoo3's value
    assert trial.user_attrs["objective"] == "last_evaluation"


def test_eval_at_task_start_adds_a_zero_shot_evaluation_of_every_new_task():
    """With eval_at_task_start the callback also evaluates at the first step and at the first step of every new task,
    on that task (seen by the eval copy) before the agent's first update on it; its schedule is otherwise EvalCallback's,
    and without the option nothing changes. Bad input is refused."""
    n_envs, total = 1, 320
    callback = RecordingContinualEval(bandit(1, seed=2), eval_freq=48, n_eval_episodes=1, verbose=0,
                                      eval_at_task_start=True)
    model = PPO("MlpPolicy", bandit(n_envs, seed=1), n_steps=32, batch_size=32, n_epochs=1, seed=0)
    updates = []
    model.learn(total, callback=[callback, _UpdatesAtEvaluation(callback, updates)])
    starts = [1 + task * CHANGE_EVERY for task in range(total // CHANGE_EVERY)]  # 1, 65, 129, 193, 257
    regular = list(range(48, total + 1, 48))
    assert callback.evaluation_num_timesteps == sorted(starts + regular)
    tasks = [(t - 1) // CHANGE_EVERY for t in callback.evaluation_num_timesteps]
    assert callback.evaluation_task_ids == tasks and callback.seen_tasks == [{t} for t in tasks]
    # a task start's evaluation comes before any update on that task: PPO's last update was at a rollout end of the
    # previous task (32-step rollouts; tasks of 64 steps start mid-nothing: 65 = 2 rollouts + 1)
    assert all(n <= (t - 1) // 32 for t, n in zip(callback.evaluation_num_timesteps, updates))
    plain = ContinualEvalCallback(bandit(1, seed=2), eval_freq=48, n_eval_episodes=1, verbose=0)
    PPO("MlpPolicy", bandit(n_envs, seed=1), n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(total, callback=plain)
    assert plain.evaluation_num_timesteps == regular and plain.last_task is None
    with pytest.raises(ValueError, match="eval_at_task_start must be True or False, got 1"):
        ContinualEvalCallback(bandit(1, seed=2), eval_freq=48, eval_at_task_start=1)


class _UpdatesAtEvaluation(BaseCallback):
    """Records PPO's number of train() calls so far at each evaluation of ``evaluator`` (which runs first)."""

    def __init__(self, evaluator, out):
        super().__init__()
        self.evaluator, self.out, self.seen = evaluator, out, 0

    def _on_step(self) -> bool:
        if len(self.evaluator.evaluation_num_timesteps) > self.seen:
            self.seen = len(self.evaluator.evaluation_num_timesteps)
            self.out.append(int(self.model._n_updates) // max(int(self.model.n_epochs), 1))
        return True
