"""SB3 usages beyond the policy aliases, each against SB3's / sb3-contrib's own class with the same seed (the drop-in
contract: with plasticity off, ``isometry_mode="off", optimizer="adam"``, any SB3 usage behaves exactly as SB3).

* Training usages (policy classes, features extractors, ``net_arch`` dicts, unshared extractors, activations,
  optimizers, schedules, ``target_kl``, ``VecNormalize``, several envs, gSDE, HER, image and Dict observations): the
  same parameters after ``learn``, the same logged keys and values, the same predictions and the same warnings.
* ``activation_fn`` as any callable that builds a module (``functools.partial(nn.LeakyReLU, 0.2)``), as SB3 takes it
  (it was refused: "Unknown activation").
* Callbacks (list, ``CallbackList``, ``EvalCallback``, ``CheckpointCallback``, a function), ``progress_bar``,
  ``tb_log_name``, ``reset_num_timesteps=False``.
* save / load: ``load(path, env=None)`` then ``set_env``, ``custom_objects``, ``print_system_info``, ``device="cpu"``,
  ``get_parameters`` / ``set_parameters``, cloudpickle, ``set_training_mode``; a plastic zip loads into the SB3
  class; ``load(path, policy_kwargs=...)`` as SB3 checks it (it raised: the saved ``policy_kwargs`` hold the plastic
  keywords); a model's ``policy_kwargs`` given to a new model (it raised "must be top-level keywords").
* ``policy.save`` with plasticity off writes SB3's file: the SB3 policy class loads it (it raised: "unexpected
  keyword argument 'activation'"), and the plastic policy class loads an SB3 policy file with plasticity off.
* Exceptions of misuses: the same exception classes as SB3.
"""

from __future__ import annotations

import functools
import gc
import os
import warnings

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch as th
from sb3_contrib import QRDQN, TQC, CrossQ, MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import (
    CallbackList,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnMaxEpisodes,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import BitFlippingEnv, FakeImageEnv, SimpleMultiObsEnv
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, NatureCNN
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize
from stable_baselines3.her import HerReplayBuffer
from test_sb3_parity import OFF, ON_POLICY, PAIRS, algo_kwargs, make_env, policy_name
from torch import nn

from sb3_plastic import (
    PlasticCrossQ,
    PlasticDQN,
    PlasticMaskablePPO,
    PlasticPPO,
    PlasticQRDQN,
    PlasticRecurrentPPO,
    PlasticSAC,
    PlasticTQC,
)
from sb3_plastic.optim import AdamO
from sb3_plastic.run_info import RUN_INFO_FILE


class Recorder(KVWriter):
    """Every logged key, and every dumped row without the wall-clock ``time/`` entries."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.rows: list[dict] = []

    def write(self, key_values, key_excluded, step=0) -> None:
        self.keys |= set(key_values)
        self.rows.append({k: v for k, v in key_values.items() if not k.startswith("time/")})

    def close(self) -> None:
        pass


def _state(model) -> dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def _assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert th.equal(a[key], b[key]), key


def _copy(kwargs: dict) -> dict:
    """SB3 writes into the policy_kwargs it is given: a fresh copy per model."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}


def _train(cls, policy, env_fn, kwargs, steps, extra, learn_kwargs=None):
    # the garbage of earlier tests is collected before the capture and the collector is off during it: an unclosed
    # file of another test (a ResourceWarning from its finaliser) is not a warning of this run
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = cls(policy, env_fn(), seed=0, **_copy(kwargs), **extra)
            recorder = Recorder()
            model.set_logger(Logger(None, [recorder]))
            start = _state(model)
            model.learn(steps, **(learn_kwargs or {}))
    finally:
        if enabled:
            gc.enable()
    return model, start, recorder, {(w.category, str(w.message)) for w in caught}


def test_another_tests_garbage_is_not_a_warning_of_the_run(tmp_path):
    """A cycle holding an open file warns (ResourceWarning) when the collector frees it, whenever that is: in CI an
    earlier test's unclosed monitor.csv files were freed inside a SAC run's capture and counted as its warnings (the
    forty-first session's flake). Here a cycle becomes garbage as the run starts, with the collector eager (threshold
    1): none of its warnings may land in the run's."""
    from stable_baselines3 import PPO

    class Holder:
        pass

    def env_fn():
        holder = Holder()
        holder.self, holder.file = holder, open(tmp_path / "left_open.txt", "w")  # left open on purpose
        del holder
        return gym.make("CartPole-v1")

    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        *_, caught = _train(PPO, "MlpPolicy", env_fn, dict(n_steps=16, batch_size=16), 16, {})
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
    assert not [m for category, m in caught if category is ResourceWarning]


def assert_trains_as_sb3(base_cls, plastic_cls, policy, env_fn, kwargs, steps) -> None:
    """Same seed, plasticity off: the same networks at construction and after ``learn``, the same logged keys and
    values, the same warnings and the same deterministic actions."""
    sb3, sb3_start, sb3_log, sb3_warnings = _train(base_cls, policy, env_fn, kwargs, steps, {})
    ours, our_start, our_log, our_warnings = _train(plastic_cls, policy, env_fn, kwargs, steps, OFF)
    _assert_same_state(sb3_start, our_start)
    end = _state(sb3)
    assert any(not th.equal(end[k], sb3_start[k]) for k in end), "the run must train something"
    _assert_same_state(end, _state(ours))
    assert sb3_log.keys == our_log.keys and sb3_log.rows == our_log.rows
    assert our_warnings == sb3_warnings
    assert sb3.num_timesteps == ours.num_timesteps
    obs = sb3.get_env().reset()
    ours.get_env().reset()
    np.testing.assert_array_equal(sb3.predict(obs, deterministic=True)[0], ours.predict(obs, deterministic=True)[0])


class SmallExtractor(BaseFeaturesExtractor):
    """A user's features extractor for vector observations (Linear + ELU)."""

    def __init__(self, observation_space: gym.Space, features_dim: int = 8) -> None:
        super().__init__(observation_space, features_dim)
        self.net = nn.Sequential(nn.Linear(int(np.prod(observation_space.shape)), features_dim), nn.ELU())

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.net(observations.flatten(1))


class TinyCNN(BaseFeaturesExtractor):
    """A user's CNN features extractor for channel-first images."""

    def __init__(self, observation_space: gym.Space, features_dim: int = 8) -> None:
        super().__init__(observation_space, features_dim)
        self.cnn = nn.Sequential(nn.Conv2d(observation_space.shape[0], 4, 8, stride=8), nn.ReLU(), nn.Flatten())
        with th.no_grad():
            n_flat = self.cnn(th.as_tensor(observation_space.sample()[None]).float()).shape[1]
        self.linear = nn.Linear(n_flat, features_dim)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.linear(self.cnn(observations))


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def pendulum() -> gym.Env:
    return gym.make("Pendulum-v1")


def images(discrete: bool = True):
    def make() -> gym.Env:
        env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=discrete)
        env.observation_space.seed(0)  # FakeImageEnv draws its frames from its observation space
        return env

    return make


def dict_obs(discrete: bool = True):
    def make() -> gym.Env:
        np.random.seed(0)  # SimpleMultiObsEnv draws from numpy's global generator
        return SimpleMultiObsEnv(random_start=False, discrete_actions=discrete)

    return make


def bit_flipping(continuous: bool):
    return lambda: BitFlippingEnv(n_bits=4, continuous=continuous, max_steps=4)


def masked(n_envs: int):
    def one() -> gym.Env:
        env = InvalidActionEnvDiscrete(dim=6, n_invalid_actions=2)
        env.action_space.seed(0)  # the masked identity env draws its states from its action space
        return env

    return lambda: make_vec_env(one, n_envs=n_envs, seed=0)


PPO_KW = dict(n_steps=32, batch_size=16, n_epochs=2)
DQN_KW = dict(learning_starts=16, buffer_size=500, batch_size=16, train_freq=4, target_update_interval=40)
SAC_KW = dict(learning_starts=16, buffer_size=500, batch_size=16)
HER = dict(
    replay_buffer_class=HerReplayBuffer,
    replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="future"),
    learning_starts=16,
    buffer_size=400,
    batch_size=16,
)
FE16 = dict(features_dim=16)


def _decay(start: float):
    return lambda progress: start * progress


USAGES = [
    # id, SB3 class, plastic class, policy, env, kwargs, steps
    ("ppo-sb3-policy-class", PPO, PlasticPPO, ActorCriticPolicy, cartpole, dict(PPO_KW, policy_kwargs=dict(net_arch=[8])), 96),
    ("ppo-extractor-dict-arch-unshared", PPO, PlasticPPO, "MlpPolicy", cartpole, dict(PPO_KW, policy_kwargs=dict(
        features_extractor_class=SmallExtractor, net_arch=dict(pi=[8], vf=[6, 4]), share_features_extractor=False)), 96),
    ("ppo-leaky-relu-no-ortho", PPO, PlasticPPO, "MlpPolicy", cartpole, dict(PPO_KW, policy_kwargs=dict(
        net_arch=[8], activation_fn=nn.LeakyReLU, ortho_init=False)), 96),
    ("ppo-rmsprop", PPO, PlasticPPO, "MlpPolicy", cartpole, dict(PPO_KW, policy_kwargs=dict(
        net_arch=[8], optimizer_class=th.optim.RMSprop, optimizer_kwargs=dict(alpha=0.9, eps=1e-5))), 96),
    ("ppo-adam-weight-decay", PPO, PlasticPPO, "MlpPolicy", cartpole, dict(PPO_KW, policy_kwargs=dict(
        net_arch=[8], optimizer_kwargs=dict(weight_decay=1e-3))), 96),
    ("ppo-schedules-target-kl", PPO, PlasticPPO, "MlpPolicy", cartpole, dict(PPO_KW, learning_rate=_decay(1e-3),
        clip_range=_decay(0.2), clip_range_vf=0.5, target_kl=1e-3, policy_kwargs=dict(net_arch=[8])), 96),
    ("ppo-vecnormalize-3-envs", PPO, PlasticPPO, "MlpPolicy",
        lambda: VecNormalize(make_vec_env("CartPole-v1", n_envs=3, seed=1)),
        dict(PPO_KW, policy_kwargs=dict(net_arch=[8])), 192),
    ("ppo-gsde", PPO, PlasticPPO, "MlpPolicy", pendulum, dict(PPO_KW, use_sde=True, sde_sample_freq=4, policy_kwargs=dict(
        net_arch=[8], log_std_init=-1.0, full_std=False)), 96),
    ("ppo-cnn-no-normalize", PPO, PlasticPPO, "CnnPolicy", images(), dict(PPO_KW, policy_kwargs=dict(
        normalize_images=False, features_extractor_kwargs=FE16)), 64),
    ("ppo-cnn-user-extractor", PPO, PlasticPPO, "CnnPolicy", images(), dict(PPO_KW, policy_kwargs=dict(
        features_extractor_class=TinyCNN)), 64),
    ("ppo-cnn-naturecnn-unshared", PPO, PlasticPPO, "CnnPolicy", images(), dict(PPO_KW, policy_kwargs=dict(
        features_extractor_class=NatureCNN, features_extractor_kwargs=FE16, share_features_extractor=False,
        net_arch=dict(pi=[8], vf=[8]))), 64),
    ("ppo-cnn-framestack-2-envs", PPO, PlasticPPO, "CnnPolicy",
        lambda: VecFrameStack(make_vec_env(images(), n_envs=2, seed=0), 2), dict(PPO_KW, policy_kwargs=dict(
        features_extractor_kwargs=FE16)), 64),
    ("ppo-dict-no-normalize", PPO, PlasticPPO, "MultiInputPolicy", dict_obs(), dict(PPO_KW, policy_kwargs=dict(
        normalize_images=False, net_arch=[8], features_extractor_kwargs=dict(cnn_output_dim=8))), 64),
    ("dqn-sb3-policy-class-rmsprop", DQN, PlasticDQN, DQN.policy_aliases["MlpPolicy"], cartpole, dict(DQN_KW,
        policy_kwargs=dict(net_arch=[8], optimizer_class=th.optim.RMSprop)), 128),
    ("dqn-extractor-tanh-schedule", DQN, PlasticDQN, "MlpPolicy", cartpole, dict(DQN_KW, learning_rate=_decay(1e-3),
        gradient_steps=2, exploration_fraction=0.5, policy_kwargs=dict(
        net_arch=[8], activation_fn=nn.Tanh, features_extractor_class=SmallExtractor)), 128),
    ("dqn-her", DQN, PlasticDQN, "MultiInputPolicy", bit_flipping(False), dict(HER, train_freq=4, policy_kwargs=dict(
        net_arch=[8])), 96),
    ("dqn-cnn-no-normalize-user-extractor", DQN, PlasticDQN, "CnnPolicy", images(), dict(DQN_KW, policy_kwargs=dict(
        normalize_images=False, features_extractor_class=TinyCNN)), 64),
    ("sac-net-arch-qf-shared-tanh", SAC, PlasticSAC, "MlpPolicy", pendulum, dict(SAC_KW, policy_kwargs=dict(
        net_arch=dict(pi=[8], qf=[6]), activation_fn=nn.Tanh, share_features_extractor=True)), 64),
    ("sac-gsde-auto-ent-extractor", SAC, PlasticSAC, "MlpPolicy", pendulum, dict(SAC_KW, use_sde=True,
        ent_coef="auto_0.5", target_entropy=-0.5, policy_kwargs=dict(net_arch=[8], features_extractor_class=SmallExtractor,
        n_critics=3, optimizer_kwargs=dict(weight_decay=1e-4))), 64),
    ("sac-vecnormalize-2-envs-schedule", SAC, PlasticSAC, "MlpPolicy",
        lambda: VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=1)), dict(SAC_KW, learning_rate=_decay(1e-3),
        policy_kwargs=dict(net_arch=[8])), 64),
    ("sac-her", SAC, PlasticSAC, "MultiInputPolicy", bit_flipping(True), dict(HER, policy_kwargs=dict(net_arch=[8])), 64),
    ("sac-cnn-shared-no-normalize", SAC, PlasticSAC, "CnnPolicy", images(False), dict(SAC_KW, buffer_size=300,
        policy_kwargs=dict(net_arch=[8], share_features_extractor=True, normalize_images=False,
        features_extractor_kwargs=FE16)), 48),
    ("sac-dict-unnormalised-images", SAC, PlasticSAC, "MultiInputPolicy", dict_obs(False), dict(SAC_KW, buffer_size=300,
        policy_kwargs=dict(net_arch=[8], features_extractor_kwargs=dict(cnn_output_dim=8, normalized_image=False))), 48),
    ("qrdqn-optimizer-kwargs", QRDQN, PlasticQRDQN, "MlpPolicy", cartpole, dict(DQN_KW, policy_kwargs=dict(
        net_arch=[8], optimizer_kwargs=dict(weight_decay=1e-3))), 96),  # sb3-contrib replaces them by its epsilon
    ("qrdqn-sb3-policy-class-rmsprop-tanh", QRDQN, PlasticQRDQN, QRDQN.policy_aliases["MlpPolicy"], cartpole, dict(
        DQN_KW, policy_kwargs=dict(net_arch=[8], n_quantiles=5, activation_fn=nn.Tanh,
        optimizer_class=th.optim.RMSprop)), 96),
    ("tqc-net-arch-dict-schedule", TQC, PlasticTQC, "MlpPolicy", pendulum, dict(SAC_KW, top_quantiles_to_drop_per_net=1,
        learning_rate=_decay(1e-3), policy_kwargs=dict(net_arch=dict(pi=[8], qf=[6]), n_quantiles=5, activation_fn=nn.Tanh,
        optimizer_kwargs=dict(weight_decay=1e-4))), 64),
    ("crossq-net-arch-betas", CrossQ, PlasticCrossQ, "MlpPolicy", pendulum, dict(SAC_KW, policy_kwargs=dict(
        net_arch=dict(pi=[8], qf=[16]), activation_fn=nn.Tanh, optimizer_kwargs=dict(betas=(0.9, 0.999)))), 64),
    ("crossq-rmsprop", CrossQ, PlasticCrossQ, "MlpPolicy", pendulum, dict(SAC_KW, policy_kwargs=dict(
        net_arch=[8], optimizer_class=th.optim.RMSprop)), 64),
    ("maskable-class-2-envs-schedules", MaskablePPO, PlasticMaskablePPO, MaskablePPO.policy_aliases["MlpPolicy"],
        masked(2), dict(PPO_KW, learning_rate=_decay(1e-3), clip_range=_decay(0.2), target_kl=0.01, policy_kwargs=dict(
        net_arch=dict(pi=[8], vf=[6]), activation_fn=nn.ReLU, optimizer_kwargs=dict(weight_decay=1e-4))), 128),
    ("recurrent-shared-lstm", RecurrentPPO, PlasticRecurrentPPO, "MlpLstmPolicy", cartpole, dict(PPO_KW, policy_kwargs=dict(
        net_arch=[8], lstm_hidden_size=8, shared_lstm=True, enable_critic_lstm=False, activation_fn=nn.ReLU)), 96),
    ("recurrent-class-2-envs-rmsprop", RecurrentPPO, PlasticRecurrentPPO, RecurrentPPO.policy_aliases["MlpLstmPolicy"],
        lambda: make_vec_env("CartPole-v1", n_envs=2, seed=0), dict(PPO_KW, learning_rate=_decay(1e-3), policy_kwargs=dict(
        net_arch=[8], lstm_hidden_size=8, n_lstm_layers=2, optimizer_class=th.optim.RMSprop)), 128),
]


@pytest.mark.parametrize(
    "base_cls, plastic_cls, policy, env_fn, kwargs, steps", [pytest.param(*u[1:], id=u[0]) for u in USAGES]
)
def test_sb3_usage_with_plasticity_off_trains_as_sb3(base_cls, plastic_cls, policy, env_fn, kwargs, steps):
    assert_trains_as_sb3(base_cls, plastic_cls, policy, env_fn, kwargs, steps)


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_activation_fn_callable_is_taken_as_sb3_takes_it(plastic_cls):
    """SB3 only calls ``activation_fn()``: a ``functools.partial`` (LeakyReLU with its own slope) trains bit for bit as
    in SB3. Fails on the old code: ``ValueError: Unknown activation functools.partial(...)``."""
    kwargs = algo_kwargs(plastic_cls, "mlp")
    kwargs["policy_kwargs"].update(activation_fn=functools.partial(nn.LeakyReLU, 0.2), net_arch=[16])

    def env_fn():
        env = make_env(plastic_cls, "mlp")
        env.action_space.seed(0)
        return env

    steps = 128 if plastic_cls in ON_POLICY else 96
    assert_trains_as_sb3(PAIRS[plastic_cls][0], plastic_cls, policy_name(plastic_cls, "mlp"), env_fn, kwargs, steps)
    # with the penalty on too: the user's activation, the penalty on the hidden layers
    model = plastic_cls(policy_name(plastic_cls, "mlp"), env_fn(), **_copy(kwargs))
    slopes = {m.negative_slope for m in model.policy.modules() if isinstance(m, nn.LeakyReLU)}
    assert slopes == {0.2}


def _callbacks(kind: str, directory: str):
    if kind == "list":
        return [StopTrainingOnMaxEpisodes(1000), CheckpointCallback(40, directory)]
    if kind == "callback-list":
        eval_env = DummyVecEnv([cartpole])
        eval_env.seed(7)
        return CallbackList([EvalCallback(eval_env, eval_freq=40, n_eval_episodes=2, log_path=directory, verbose=0)])
    return lambda _locals, _globals: True


@pytest.mark.parametrize("kind", ["list", "callback-list", "function"])
def test_callbacks_and_progress_bar_as_sb3(tmp_path, kind):
    """A list of callbacks (CheckpointCallback's files), a CallbackList with an EvalCallback (its logged evaluations
    and its evaluations.npz), a function with the progress bar: the same run, logs and files as SB3."""
    runs = []
    for cls, extra in ((PPO, {}), (PlasticPPO, OFF)):
        directory = str(tmp_path / cls.__name__)
        model = cls("MlpPolicy", cartpole(), seed=0, **_copy(dict(PPO_KW, policy_kwargs=dict(net_arch=[8]))), **extra)
        recorder = Recorder()
        model.set_logger(Logger(None, [recorder]))
        model.learn(96, callback=_callbacks(kind, directory), progress_bar=kind == "function")
        files = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        runs.append((_state(model), recorder, files, directory))
    (theirs, their_log, their_files, their_dir), (ours, our_log, our_files, our_dir) = runs
    _assert_same_state(theirs, ours)
    assert their_log.keys == our_log.keys and their_log.rows == our_log.rows
    assert their_files == our_files
    if kind == "list":
        assert their_files == ["rl_model_40_steps.zip", "rl_model_80_steps.zip"]
        _assert_same_state(_state(PPO.load(f"{their_dir}/rl_model_80_steps.zip")),
                           _state(PlasticPPO.load(f"{our_dir}/rl_model_80_steps.zip")))
    if kind == "callback-list":
        assert "eval/mean_reward" in our_log.keys
        for key in ("timesteps", "results", "ep_lengths"):
            their_npz, our_npz = np.load(f"{their_dir}/evaluations.npz"), np.load(f"{our_dir}/evaluations.npz")
            np.testing.assert_array_equal(their_npz[key], our_npz[key])


def test_tensorboard_runs_as_sb3(tmp_path):
    """``tb_log_name`` and ``reset_num_timesteps``: the same run directories and event files as SB3 (the plastic run
    adds its metadata file, :data:`sb3_plastic.run_info.RUN_INFO_FILE`), the same step counters."""
    layouts = []
    for cls, extra in ((PPO, {}), (PlasticPPO, OFF)):
        log = tmp_path / cls.__name__
        model = cls("MlpPolicy", cartpole(), seed=0, tensorboard_log=str(log), **_copy(dict(PPO_KW, n_epochs=1)), **extra)
        model.learn(32, tb_log_name="run")
        model.learn(32, tb_log_name="run", reset_num_timesteps=False)  # continues run_1
        model.learn(32, tb_log_name="run")  # a new run_2
        layout = {d: sum(1 for f in os.listdir(log / d) if f != RUN_INFO_FILE) for d in sorted(os.listdir(log))}
        layouts.append((layout, model.num_timesteps, model._num_timesteps_at_start))
    assert layouts[0] == layouts[1]
    assert layouts[0][0] == {"run_1": 2, "run_2": 1}


@pytest.mark.parametrize(
    "base_cls, plastic_cls, env_id, kwargs",
    [(PPO, PlasticPPO, "CartPole-v1", dict(PPO_KW, n_epochs=1)),
     (DQN, PlasticDQN, "CartPole-v1", dict(learning_starts=16)),
     (SAC, PlasticSAC, "Pendulum-v1", SAC_KW)],
    ids=["PPO", "DQN", "SAC"],
)
def test_save_load_usages_as_sb3(tmp_path, capsys, base_cls, plastic_cls, env_id, kwargs):
    """``load(path, env=None, custom_objects=..., print_system_info=True, device="cpu")`` then ``set_env`` and
    ``learn(reset_num_timesteps=False)``; ``get_parameters`` / ``set_parameters``; cloudpickle; ``set_training_mode``:
    as SB3."""
    runs = []
    objects = {"learning_rate": 5e-4, "lr_schedule": lambda _: 5e-4}
    for cls, extra in ((base_cls, {}), (plastic_cls, OFF)):
        model_kwargs = _copy(dict(kwargs, policy_kwargs=dict(net_arch=[8])))
        model = cls("MlpPolicy", env_id, seed=0, device="cpu", **model_kwargs, **extra)
        model.learn(64)
        model.save(tmp_path / f"{cls.__name__}.zip")
        capsys.readouterr()
        loaded = cls.load(tmp_path / f"{cls.__name__}.zip", env=None, custom_objects=objects, print_system_info=True,
                          device="cpu")
        printed = capsys.readouterr().out
        assert loaded.get_env() is None
        assert "== CURRENT SYSTEM INFO ==" in printed and "== SAVED MODEL SYSTEM INFO ==" in printed
        loaded.set_env(gym.make(env_id))
        loaded.set_random_seed(3)
        loaded.learn(64, reset_num_timesteps=False)
        pickled = cloudpickle.loads(cloudpickle.dumps(loaded))
        loaded.policy.set_training_mode(False)
        owners = [loaded.actor, loaded.critic] if hasattr(loaded, "actor") else [loaded.policy]
        optimizers = [owner.optimizer for owner in owners]
        runs.append(dict(
            state=_state(loaded), pickled=_state(pickled), params=loaded.get_parameters(),
            optimizers=[(type(o), o.param_groups[0]["lr"], len(o.param_groups)) for o in optimizers],
            training=loaded.policy.training, steps=loaded.num_timesteps, lr=loaded.lr_schedule(1.0),
        ))
    theirs, ours = runs
    _assert_same_state(theirs["state"], ours["state"])
    _assert_same_state(ours["state"], ours["pickled"])
    assert list(theirs["params"]) == list(ours["params"])
    for key in ("optimizers", "training", "steps", "lr"):
        assert theirs[key] == ours[key], key
    # set_parameters: SB3's parameter dict into the plastic model, and an SB3 zip (SB3's Adam kept with plasticity off)
    plastic = plastic_cls.load(tmp_path / f"{plastic_cls.__name__}.zip")
    plastic.set_parameters(theirs["params"])
    _assert_same_state(_state(plastic), theirs["state"])
    plastic.set_parameters(str(tmp_path / f"{base_cls.__name__}.zip"))
    assert all(type(o) is th.optim.Adam for o in ([plastic.policy.optimizer] if base_cls is not SAC else
                                                  [plastic.actor.optimizer, plastic.critic.optimizer]))


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_plastic_zip_with_plasticity_off_loads_into_the_sb3_class(tmp_path, plastic_cls):
    """The reverse of ``PlasticX.load(sb3.zip)``: ``X.load(plastic.zip)`` (sb3_plastic importable: the zip names the
    plastic policy class) continues exactly as ``PlasticX.load`` of the same zip does."""
    base_cls = PAIRS[plastic_cls][0]
    name = policy_name(plastic_cls, "mlp")
    kwargs = algo_kwargs(plastic_cls, "mlp")
    kwargs["policy_kwargs"]["net_arch"] = [16]
    model = plastic_cls(name, make_env(plastic_cls, "mlp"), seed=3, **kwargs, **OFF)
    model.learn(64)
    model.save(tmp_path / "plastic.zip")
    runs = []
    for cls in (base_cls, plastic_cls):
        env = make_env(plastic_cls, "mlp")
        env.action_space.seed(0)
        loaded = cls.load(tmp_path / "plastic.zip", env=env)
        loaded.set_random_seed(5)
        loaded.learn(64, reset_num_timesteps=False)
        runs.append(loaded)
    theirs, ours = runs
    assert type(theirs) is base_cls and type(theirs.policy) is type(ours.policy)
    _assert_same_state(_state(theirs), _state(ours))


@pytest.mark.parametrize(
    "base_cls, plastic_cls, env_id, kwargs",
    [(PPO, PlasticPPO, "CartPole-v1", dict(n_steps=32)),
     (DQN, PlasticDQN, "CartPole-v1", {}),
     (SAC, PlasticSAC, "Pendulum-v1", {})],
    ids=["PPO", "DQN", "SAC"],
)
def test_load_with_policy_kwargs_checks_them_as_sb3(tmp_path, base_cls, plastic_cls, env_id, kwargs):
    """SB3's ``load(path, policy_kwargs=...)`` accepts the saved ``policy_kwargs`` and raises for any others (SAC's
    saved ones also hold ``use_sde``, which SB3 added). The plastic class does the same for its own zip and for an SB3
    zip. Fails on the old code: the saved plastic keywords made every ``policy_kwargs=`` unequal ("The specified
    policy kwargs do not equal the stored policy kwargs")."""
    given = dict(net_arch=[8])
    sb3 = base_cls("MlpPolicy", env_id, seed=0, policy_kwargs=dict(given), **kwargs)
    sb3.save(tmp_path / "sb3.zip")
    plastic_cls("MlpPolicy", env_id, seed=0, policy_kwargs=dict(given), **kwargs, **OFF).save(tmp_path / "plastic.zip")
    for candidate in (given, dict(sb3.policy_kwargs), dict(net_arch=[16])):
        try:
            base_cls.load(tmp_path / "sb3.zip", policy_kwargs=candidate)
            expected = None
        except ValueError as error:
            expected = error
        for path in ("sb3.zip", "plastic.zip"):
            if expected is None:
                loaded = plastic_cls.load(tmp_path / path, policy_kwargs=candidate)
                assert loaded.policy_kwargs["net_arch"] == [8] and loaded.policy_kwargs["isometry_mode"] == "off"
            else:
                with pytest.raises(ValueError, match="do not equal the stored policy kwargs"):
                    plastic_cls.load(tmp_path / path, policy_kwargs=candidate)
    assert base_cls is SAC or sb3.policy_kwargs == given  # the user's own dict is accepted by SB3 except for SAC


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_a_models_policy_kwargs_build_the_same_model(plastic_cls):
    """``X(policy, env, policy_kwargs=model.policy_kwargs)``, SB3's way to build a fresh model of a model's
    architecture: the plastic model's ``policy_kwargs`` hold its plastic keywords, taken when they equal the new
    model's keywords (the same networks as SB3 builds from SB3's model's ``policy_kwargs``), refused otherwise. Fails
    on the old code: "[...] must be top-level keywords of PlasticX, not entries of policy_kwargs"."""
    base_cls = PAIRS[plastic_cls][0]
    name = policy_name(plastic_cls, "mlp")
    kwargs = algo_kwargs(plastic_cls, "mlp")
    kwargs["policy_kwargs"]["net_arch"] = [8]
    sb3 = base_cls(name, make_env(plastic_cls, "mlp"), **_copy(kwargs))
    plastic = plastic_cls(name, make_env(plastic_cls, "mlp"), **_copy(kwargs), **OFF)
    assert plastic.policy_kwargs != sb3.policy_kwargs  # the plastic keywords are part of them
    clones = []
    for cls, source, extra in ((base_cls, sb3, {}), (plastic_cls, plastic, OFF)):
        clone_kwargs = dict(kwargs, policy_kwargs=dict(source.policy_kwargs))
        clones.append(cls(name, make_env(plastic_cls, "mlp"), seed=1, **clone_kwargs, **extra))
    _assert_same_state(_state(clones[0]), _state(clones[1]))
    assert clones[1].policy_kwargs == plastic.policy_kwargs and clones[1].isometry_config == plastic.isometry_config
    with pytest.raises(ValueError, match=r"\['isometry_mode', 'optimizer'\] must be top-level keywords"):
        plastic_cls(name, make_env(plastic_cls, "mlp"), **dict(kwargs, policy_kwargs=dict(plastic.policy_kwargs)))


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_policy_save_is_sb3s_file_with_plasticity_off(tmp_path, plastic_cls):
    """``model.policy.save`` with plasticity off writes SB3's file: SB3's policy class of the alias loads it (as in
    SB3's docs, ``MlpPolicy.load``) with the same weights and actions. The plastic policy class loads an SB3 policy
    file with plasticity off (SB3's optimizer), and a policy with the penalty on keeps its keywords. Fails on the
    old code: "__init__() got an unexpected keyword argument 'activation'"."""
    base_cls = PAIRS[plastic_cls][0]
    name = policy_name(plastic_cls, "mlp")
    sb3_policy_cls, plastic_policy_cls = base_cls.policy_aliases[name], plastic_cls.policy_aliases[name]
    kwargs = algo_kwargs(plastic_cls, "mlp")
    # sb3-contrib's RecurrentActorCriticPolicy does not save its LSTM keywords (its own policy.save -> load of
    # lstm_hidden_size=16 fails the same way): its default size here
    kwargs["policy_kwargs"].pop("lstm_hidden_size", None)
    model = plastic_cls(name, make_env(plastic_cls, "mlp"), seed=0, **_copy(kwargs), **OFF)
    sb3 = base_cls(name, make_env(plastic_cls, "mlp"), seed=0, **_copy(kwargs))
    model.policy.save(str(tmp_path / "plastic.pth"))
    sb3.policy.save(str(tmp_path / "sb3.pth"))
    obs = model.observation_space.sample()

    def optimizer_types(policy):
        owners = [policy.actor, policy.critic] if hasattr(policy, "actor") else [policy]
        return [type(o.optimizer) for o in owners]

    for policy_cls, path, source in ((sb3_policy_cls, "plastic.pth", model), (plastic_policy_cls, "sb3.pth", sb3),
                                     (plastic_policy_cls, "plastic.pth", model)):
        loaded = policy_cls.load(str(tmp_path / path))
        assert type(loaded) is policy_cls
        _assert_same_state(loaded.state_dict(), source.policy.state_dict())
        np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0],
                                      source.policy.predict(obs, deterministic=True)[0])
        assert optimizer_types(loaded) == optimizer_types(sb3.policy)
        if policy_cls is plastic_policy_cls:  # (isometry_coef, unused with the penalty off, is the policy default)
            config = loaded.isometry_config
            assert (config.isometry_mode, config.optimizer, config.activation) == ("off", "adam", None)
    on = plastic_cls(name, make_env(plastic_cls, "mlp"), seed=0, **_copy(kwargs))
    on.policy.save(str(tmp_path / "on.pth"))
    loaded = plastic_policy_cls.load(str(tmp_path / "on.pth"))
    assert loaded.isometry_config == on.policy.isometry_config and all(
        isinstance(t, type) and issubclass(t, AdamO) for t in optimizer_types(loaded))


def _outcome(make) -> type:
    try:
        make()
    except Exception as error:  # the exception class is what is compared
        return type(error)
    return type(None)


def _misuses(tmp_path):
    saved = tmp_path / "cartpole.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(saved)

    def small(cls, extra):
        return cls("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, **extra)

    return {
        "unknown policy": lambda ppo, dqn, extra: ppo("FooPolicy", "CartPole-v1", **extra),
        "unexpected keyword": lambda ppo, dqn, extra: ppo("MlpPolicy", "CartPole-v1", foo=1, **extra),
        "bad policy_kwargs": lambda ppo, dqn, extra: ppo("MlpPolicy", "CartPole-v1", policy_kwargs=dict(foo=1), **extra),
        "Box actions for DQN": lambda ppo, dqn, extra: dqn("MlpPolicy", "Pendulum-v1", **extra),
        "CnnPolicy on vectors": lambda ppo, dqn, extra: ppo("CnnPolicy", "CartPole-v1", **extra),
        "MultiInputPolicy on a Box": lambda ppo, dqn, extra: ppo("MultiInputPolicy", "CartPole-v1", **extra),
        "batch_size 1": lambda ppo, dqn, extra: ppo("MlpPolicy", "CartPole-v1", batch_size=1, **extra),
        "gSDE on discrete actions": lambda ppo, dqn, extra: ppo("MlpPolicy", "CartPole-v1", use_sde=True, **extra),
        "load a missing file": lambda ppo, dqn, extra: ppo.load(tmp_path / "missing.zip"),
        "load with another env": lambda ppo, dqn, extra: ppo.load(saved, env=gym.make("Acrobot-v1")),
        "set_env with another env": lambda ppo, dqn, extra: small(ppo, extra).set_env(gym.make("Acrobot-v1")),
        "set_parameters of another net": lambda ppo, dqn, extra: small(ppo, extra).set_parameters({"policy": {}}),
        "predict a wrong shape": lambda ppo, dqn, extra: small(ppo, extra).predict(np.zeros(3, dtype=np.float32)),
        "learn with a bad callback": lambda ppo, dqn, extra: small(ppo, extra).learn(32, callback=42),
    }


def test_misuses_raise_sb3s_exceptions(tmp_path):
    """The same exception class as SB3 (or a subclass of it: the CNN's ``ImageSpaceError`` is an AssertionError) for
    each misuse."""
    for label, misuse in _misuses(tmp_path).items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = _outcome(functools.partial(misuse, PPO, DQN, {}))
            ours = _outcome(functools.partial(misuse, PlasticPPO, PlasticDQN, OFF))
        assert theirs is not type(None), label
        assert issubclass(ours, theirs), (label, theirs, ours)
