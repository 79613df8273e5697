"""Non-stationary environments of sb3_plastic.envs: registration, env checkers, training smoke tests, exact
task-change semantics, lockstep across vector-env copies, reproducible seeding, friction / permutation /
game switching read back from the simulators, and argument errors."""

import itertools
import math
import sys
import warnings

import gymnasium as gym
import minatar.gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import DependencyNotInstalled
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import sb3_plastic.envs as plastic_envs
from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.envs import (
    ChannelPermutation,
    GameSwitchingEnv,
    PadActions,
    PadChannels,
    PhysicsParameterSchedule,
    PiecewiseStationaryWrapper,
    TaskSchedule,
)
from sb3_plastic.envs.minatar_envs import MINATAR_GAMES, MinAtarEnv, make_switching_minatar

minatar.gym.register_envs()

MUJOCO_IDS = ["sb3_plastic/SlipperyHalfCheetah-v0", "sb3_plastic/SlipperyAnt-v0"]
PERMUTED_IDS = [f"sb3_plastic/PermutedMinAtar-{g}-v0" for g in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")]
DISCRETE_IDS = [*PERMUTED_IDS, "sb3_plastic/SwitchingMinAtar-v0", "sb3_plastic/SwitchingAtari-v0"]
ALL_IDS = MUJOCO_IDS + DISCRETE_IDS
BASE_MINATAR = {"asterix": "Asterix", "breakout": "Breakout", "freeway": "Freeway", "seaquest": "Seaquest",
                "space_invaders": "SpaceInvaders"}
#: keep the Atari tests small: two games instead of the default three (the checker test uses the default)
ATARI_SMALL = dict(games=("Breakout", "Pong"))


def small_kwargs(env_id):
    return dict(ATARI_SMALL) if env_id.endswith("SwitchingAtari-v0") else {}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checker / deprecation / bool-image warnings are expected here
        yield


# --------------------------------------------------------------------------- registration
def test_registration_is_idempotent_and_namespaced():
    assert set(ALL_IDS) <= set(plastic_envs.REGISTERED_IDS)
    assert len(set(plastic_envs.REGISTERED_IDS)) == len(plastic_envs.REGISTERED_IDS)
    before = len(gym.registry)
    assert plastic_envs.register_envs() == plastic_envs.REGISTERED_IDS
    plastic_envs.register_envs()
    assert len(gym.registry) == before
    for env_id in ALL_IDS:
        assert env_id.startswith("sb3_plastic/") and env_id in gym.registry
    assert gym.spec("sb3_plastic/SlipperyAnt-v0").max_episode_steps == 1000
    assert "envs" not in sys.modules  # the package is sb3_plastic.envs, never a top-level "envs"
    assert plastic_envs.__name__ == "sb3_plastic.envs"


@pytest.mark.parametrize(
    "module, env_id, extra",
    [("mujoco", "sb3_plastic/SlipperyAnt-v0", "mujoco"), ("ale_py", "sb3_plastic/SwitchingAtari-v0", "atari")],
)
def test_missing_extra_fails_at_make_time_naming_the_extra(monkeypatch, module, env_id, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes "import <module>" raise ImportError
    assert env_id in gym.registry
    with pytest.raises(DependencyNotInstalled, match=rf"sb3-plastic\[{extra}\]"):
        gym.make(env_id)


# --------------------------------------------------------------------------- checkers and training
@pytest.mark.parametrize("env_id", ALL_IDS)
def test_env_checkers(env_id):
    gym_check_env(gym.make(env_id), skip_render_check=True)
    sb3_check_env(gym.make(env_id))
    # also with tasks changing while the checkers run
    gym_check_env(gym.make(env_id, change_every=3, **small_kwargs(env_id)), skip_render_check=True)
    sb3_check_env(gym.make(env_id, change_every=3, **small_kwargs(env_id)))


def _train_env(env_id):
    return gym.make(env_id, change_every=50, **small_kwargs(env_id))


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_train_plastic_ppo(env_id):
    policy = "MlpPolicy" if env_id in MUJOCO_IDS else "CnnPolicy"
    model = PlasticPPO(policy, _train_env(env_id), n_steps=128, batch_size=64, n_epochs=1, seed=0,
                       policy_kwargs=dict(net_arch=[32, 32]))
    model.learn(256)
    assert model.num_timesteps == 256


@pytest.mark.parametrize("env_id", MUJOCO_IDS)
def test_train_plastic_sac(env_id):
    model = PlasticSAC("MlpPolicy", _train_env(env_id), buffer_size=1000, learning_starts=32, batch_size=32, train_freq=4,
                       seed=0, policy_kwargs=dict(net_arch=[32, 32]))
    model.learn(256)
    assert model.num_timesteps == 256


@pytest.mark.parametrize("env_id", DISCRETE_IDS)
def test_train_plastic_dqn(env_id):
    model = PlasticDQN("CnnPolicy", _train_env(env_id), buffer_size=500, learning_starts=32, batch_size=32, train_freq=8,
                       target_update_interval=64, seed=0)
    model.learn(256)
    assert model.num_timesteps == 256


# --------------------------------------------------------------------------- schedule semantics
class CountingEnv(gym.Env):
    """Observation = steps taken in this episode; episodes end after ``episode_length`` steps."""

    def __init__(self, episode_length=1000):
        self.episode_length = episode_length
        self.observation_space = spaces.Box(0, 10_000, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        self.total_steps += 1
        return np.array([self.t], dtype=np.float32), 0.0, self.t >= self.episode_length, False, {}


class RecordingWrapper(PiecewiseStationaryWrapper):
    """Logs (task, inner env's step count when the task was applied, rng draw)."""

    def __init__(self, env, *args, **kwargs):
        super().__init__(env, *args, **kwargs)
        self.log = []

    def apply_task(self, task_index, rng):
        self.log.append((task_index, self.env.unwrapped.total_steps))
        return {"draw": float(rng.random())}


def run(env, n_steps, seed=None):
    """Step with action 0, resetting at episode ends; return per-step (task_id, task_step, truncated) and resets."""
    steps, resets = [], []
    _, info = env.reset(seed=seed)
    resets.append((0, info["task_id"], info["task_step"]))
    for n in range(n_steps):
        _, _, terminated, truncated, info = env.step(0)
        steps.append((info["task_id"], info["task_step"], truncated))
        if terminated or truncated:
            _, info = env.reset()
            resets.append((n + 1, info["task_id"], info["task_step"]))
    return steps, resets


def test_task_schedule_indices_and_generators():
    schedule = TaskSchedule(5, task_seed=3)
    assert [schedule.task_index(n) for n in range(12)] == [0] * 5 + [1] * 5 + [2] * 2
    assert schedule.task_start(2) == 10
    assert schedule.rng(4).random() == TaskSchedule(99, task_seed=3).rng(4).random()  # (task_seed, k) only
    assert schedule.rng(4).random() != schedule.rng(5).random()
    assert schedule.rng(4).random() != TaskSchedule(5, task_seed=4).rng(4).random()
    assert TaskSchedule(2e6).change_every == 2_000_000 and isinstance(TaskSchedule(2e6).change_every, int)


@pytest.mark.parametrize("episode_length", [3, 7, 1000])
def test_immediate_change_is_the_first_step_after_k_change_every_steps(episode_length):
    k = 5
    env = RecordingWrapper(CountingEnv(episode_length), k)
    steps, resets = run(env, 23)
    # step with 0-based index n runs under task n // k, whatever the episode boundaries
    assert [task for task, _, _ in steps] == [n // k for n in range(23)]
    assert [task_step for _, task_step, _ in steps] == [n % k + 1 for n in range(23)]
    # each task was applied once, before the inner env executed step k * task
    assert env.log == [(task, task * k) for task in range(5)]
    assert not any(truncated for _, _, truncated in steps)
    # a reset info carries the task in force and how far into it this copy is
    for n, task, task_step in resets:
        assert task == n // k and task_step == n % k


@pytest.mark.parametrize(
    "episode_length, expected_reset_tasks, expected_log",
    [
        (3, [0, 0, 1, 1, 2, 3, 3, 4, 4], [(0, 0), (1, 6), (2, 12), (3, 15), (4, 21)]),
        (12, [0, 2, 4], [(0, 0), (2, 12), (4, 24)]),
    ],
)
def test_at_episode_end_change_happens_at_the_first_reset_after_k_change_every_steps(
    episode_length, expected_reset_tasks, expected_log
):
    k = 5
    env = RecordingWrapper(CountingEnv(episode_length), k, at_episode_end=True)
    steps, resets = run(env, 24)
    assert [task for _, task, _ in resets] == expected_reset_tasks
    assert [task for _, task, _ in resets] == [n // k for n, _, _ in resets]
    # the task never changes inside an episode: step n runs under the task of the last reset before it
    for n, (task, _, _) in enumerate(steps):
        last_reset = max(r for r, _, _ in resets if r <= n)
        assert task == last_reset // k
    # tasks are applied at resets only, once each (tasks 1 and 3 are skipped by 12-step episodes)
    assert env.log == expected_log


def test_task_info_rng_seeded_reset_rewinds_and_set_env_steps():
    env = RecordingWrapper(CountingEnv(), 4, task_seed=7)
    _, info = env.reset(seed=1)
    draws = {0: info["draw"]}
    for _ in range(9):
        _, _, _, _, info = env.step(0)
        draws[info["task_id"]] = info["draw"]
    assert draws == {k: TaskSchedule(4, task_seed=7).rng(k).random() for k in range(3)}
    assert env.env_steps == 9 and env.task_id == 2 and env.task_step == 1
    _, info = env.reset(seed=1)  # a seeded reset starts afresh
    assert (info["task_id"], info["task_step"], env.env_steps) == (0, 0, 0)
    env.reset()  # an unseeded one does not
    env.set_env_steps(13)
    _, info = env.reset()
    assert info["task_id"] == 3 and env.env_steps == 13
    with pytest.raises(ValueError, match="env_steps"):
        env.set_env_steps(-1)


# --------------------------------------------------------------------------- vector envs in lockstep
def test_dummy_vec_env_copies_share_the_task_sequence():
    vec = make_vec_env("sb3_plastic/PermutedMinAtar-Breakout-v0", n_envs=2, seed=0, env_kwargs=dict(change_every=5),
                       vec_env_cls=DummyVecEnv)
    vec.reset()
    for n in range(23):
        _, _, _, infos = vec.step(np.array([vec.action_space.sample() for _ in range(2)]))
        assert [info["task_id"] for info in infos] == [n // 5] * 2
        perms = vec.get_attr("current_permutation")
        assert np.array_equal(perms[0], perms[1])
    vec.env_method("set_env_steps", 50)  # resume a run mid-schedule
    vec.reset()
    _, _, _, infos = vec.step(np.zeros(2, dtype=np.int64))
    assert [info["task_id"] for info in infos] == [10, 10]
    vec.close()


def test_subproc_vec_env_copies_share_the_task_sequence():
    # at_episode_end (the Slippery default) with fixed-length episodes: both copies change friction together
    vec = make_vec_env("sb3_plastic/SlipperyHalfCheetah-v0", n_envs=2, seed=0,
                       env_kwargs=dict(change_every=5, max_episode_steps=4), vec_env_cls=SubprocVecEnv,
                       vec_env_kwargs=dict(start_method="fork"))
    vec.reset()
    tasks, frictions = [], []
    for _ in range(20):
        _, _, _, infos = vec.step(np.zeros((2, 6), dtype=np.float32))
        assert infos[0]["task_id"] == infos[1]["task_id"] and infos[0]["friction"] == infos[1]["friction"]
        tasks.append(infos[0]["task_id"])
        frictions.append(infos[0]["friction"])
    # resets after 0, 4, 8, 12, 16 steps apply tasks 0, 0, 1, 2, 3 (n // 5 at each reset)
    assert tasks == [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4
    assert len({frictions[0], frictions[8], frictions[12], frictions[16]}) == 4
    # both copies were reset after 20 steps (auto-reset): task 4 is in force in each
    assert vec.get_attr("task_id") == [4, 4]
    assert len(set(vec.get_attr("friction"))) == 1
    vec.close()


# --------------------------------------------------------------------------- reproducible seeding
@pytest.mark.parametrize(
    "env_id", ["sb3_plastic/SlipperyAnt-v0", "sb3_plastic/PermutedMinAtar-Seaquest-v0", "sb3_plastic/SwitchingMinAtar-v0",
               "sb3_plastic/SwitchingAtari-v0"],
)
def test_seeded_reset_is_reproducible(env_id):
    def rollout(env):
        env.action_space.seed(0)
        obs, _ = env.reset(seed=3)
        out = [obs]
        for _ in range(16):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            out.append((obs, reward, terminated, truncated, sorted(info.items())))
            if terminated or truncated:
                out.append(env.reset()[0])
        return out

    kwargs = dict(change_every=5, **small_kwargs(env_id))
    env = gym.make(env_id, **kwargs)
    first = rollout(env)
    assert repr(rollout(gym.make(env_id, **kwargs))) == repr(first)  # a fresh env
    assert repr(rollout(env)) == repr(first)  # the same env after a seeded reset


# --------------------------------------------------------------------------- friction
def test_friction_is_written_into_the_model_and_drawn_as_documented():
    low, high = 0.05, 1.5
    env = gym.make("sb3_plastic/SlipperyAnt-v0", change_every=5, friction_range=(low, high), task_seed=11,
                   max_episode_steps=3)
    model = env.unwrapped.model
    schedule = TaskSchedule(5, task_seed=11)
    seen = {}
    _, info = env.reset(seed=0)
    for _ in range(30):
        assert np.all(model.geom_friction[:, 0] == info["friction"])  # every geom: floor and feet
        seen[info["task_id"]] = info["friction"]
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            _, info = env.reset()
    assert len(seen) >= 4
    for task, friction in seen.items():
        assert friction == 10 ** schedule.rng(task).uniform(math.log10(low), math.log10(high))
        assert low <= friction <= high
    assert len(set(seen.values())) == len(seen)
    assert np.all(model.geom_friction[:, 1:] == gym.make("Ant-v5").unwrapped.model.geom_friction[:, 1:])


def test_same_actions_from_the_same_state_diverge_under_two_frictions():
    mujoco = pytest.importorskip("mujoco")
    env = gym.make("sb3_plastic/SlipperyHalfCheetah-v0", change_every=1000, friction_range=(0.02, 2.0), task_seed=0)
    base = env.unwrapped
    actions = np.random.default_rng(0).uniform(-1, 1, size=(40, 6)).astype(np.float32)

    def trajectory():
        mujoco.mj_resetData(base.model, base.data)  # also clears the solver's warm start
        base.set_state(qpos0, qvel0)
        return np.array([env.step(a)[0] for a in actions])

    _, info = env.reset(seed=0)
    qpos0, qvel0 = base.data.qpos.copy(), base.data.qvel.copy()
    friction_a = info["friction"]
    traj_a = trajectory()
    assert np.array_equal(trajectory(), traj_a)  # deterministic under one friction
    env.get_wrapper_attr("set_env_steps")(1000)  # next task: move the counter past the change, start an episode
    _, info = env.reset()
    assert info["task_id"] == 1 and info["friction"] != friction_a
    assert np.all(base.model.geom_friction[:, 0] == info["friction"])
    traj_b = trajectory()
    assert np.abs(traj_a - traj_b).max() > 1e-2


# --------------------------------------------------------------------------- permuted MinAtar
def documented_permutations(n_channels, change_every, task_seed, n_tasks):
    """The rule of ChannelPermutation's docstring, re-implemented independently."""
    schedule = TaskSchedule(change_every, task_seed=task_seed)
    perms = [np.arange(n_channels)]
    for k in range(1, n_tasks):
        rng = schedule.rng(k)
        perm = rng.permutation(n_channels)
        while np.array_equal(perm, perms[-1]):
            perm = rng.permutation(n_channels)
        perms.append(perm)
    return perms


@pytest.mark.parametrize("game", MINATAR_GAMES)
def test_permuted_observation_is_the_base_observation_with_documented_channel_permutation(game):
    k, n_steps = 40, 400
    env = gym.make(f"sb3_plastic/PermutedMinAtar-{BASE_MINATAR[game]}-v0", change_every=k, task_seed=5)
    base = gym.make(f"MinAtar/{BASE_MINATAR[game]}-v0")  # minatar's own env, full action set
    n_channels = base.observation_space.shape[-1]
    perms = documented_permutations(n_channels, k, 5, n_steps // k + 1)
    assert env.observation_space == base.observation_space and env.action_space == base.action_space
    obs, info = env.reset(seed=2)
    base_obs, _ = base.reset(seed=2)
    assert np.array_equal(obs, base_obs)  # task 0 is unpermuted
    actions = np.random.default_rng(0).integers(6, size=n_steps)
    for n, action in enumerate(actions):
        obs, reward, terminated, _, info = env.step(action)
        base_obs, base_reward, base_terminated, _, _ = base.step(action)
        assert info["task_id"] == n // k
        assert np.array_equal(obs, np.take(base_obs, perms[n // k], axis=-1)), n
        assert (reward, terminated) == (base_reward, base_terminated)
        if terminated:
            obs, _ = env.reset()
            base_obs, _ = base.reset()
            assert np.array_equal(obs, np.take(base_obs, perms[(n + 1) // k], axis=-1))
    for a, b in itertools.pairwise(perms):
        assert not np.array_equal(a, b)


# --------------------------------------------------------------------------- switching
def test_switching_minatar_really_changes_game_with_fixed_spaces():
    games = ["breakout", "SpaceInvaders", "freeway"]
    env = gym.make("sb3_plastic/SwitchingMinAtar-v0", games=games, change_every=5)
    mux = env.unwrapped
    assert env.action_space == spaces.Discrete(6) and env.observation_space.shape == (10, 10, 10)
    expected = ["breakout", "space_invaders", "freeway"]
    obs, info = env.reset(seed=0)
    for n in range(40):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        game = expected[(n // 5) % 3]
        inner = mux.current.unwrapped
        assert info["game"] == game and inner.game.env_name == game  # read back from the env that stepped
        assert env.action_space == spaces.Discrete(6) and obs.shape == (10, 10, 10) and obs.dtype == bool
        assert not obs[..., inner.game_channels:].any() and obs[..., : inner.game_channels].any()
        assert truncated == ((n + 1) % 5 == 0 and not terminated)  # the last step of each game ends its episode
        if terminated or truncated:
            obs, info = env.reset()
            assert info["game"] == expected[((n + 1) // 5) % 3] == mux.current.unwrapped.game.env_name


def test_switching_at_episode_end_switches_only_at_resets():
    env = make_switching_minatar(games=["breakout", "asterix"], change_every=3, at_episode_end=True)
    _, info = env.reset(seed=0)
    episode_game = info["game"]
    for _ in range(200):
        _, _, terminated, truncated, info = env.step(0)
        assert info["game"] == episode_game and not truncated
        if terminated:
            _, info = env.reset()
            assert info["game"] == ["breakout", "asterix"][(env.env_steps // 3) % 2]
            episode_game = info["game"]


def test_switching_atari_plays_each_game_with_18_actions():
    env = gym.make("sb3_plastic/SwitchingAtari-v0", change_every=4, games=("breakout", "ALE/Pong-v5", "SpaceInvaders"))
    assert env.observation_space == spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert env.action_space == spaces.Discrete(18)
    env.reset(seed=0)
    seen = []
    for n in range(12):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        stepped = env.unwrapped.current.unwrapped
        assert info["game"] == ["Breakout", "Pong", "SpaceInvaders"][n // 4]
        assert stepped.spec.id == f"ALE/{info['game']}-v5" and len(stepped.get_action_meanings()) == 18
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        seen.append(info["game"])
        if terminated or truncated:
            env.reset()
    assert seen == ["Breakout"] * 4 + ["Pong"] * 4 + ["SpaceInvaders"] * 4


# --------------------------------------------------------------------------- building blocks
class ImageEnv(gym.Env):
    def __init__(self, shape=(3, 4, 4), n_actions=3):
        self.observation_space = spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        self.action_space = spaces.Discrete(n_actions)
        self.last_action = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.integers(0, 256, size=self.observation_space.shape, dtype=np.uint8), {}

    def step(self, action):
        self.last_action = action
        return self.np_random.integers(0, 256, size=self.observation_space.shape, dtype=np.uint8), 0.0, False, False, {}


def test_channel_permutation_channels_first_and_pads():
    env, twin = ChannelPermutation(ImageEnv(), change_every=2, axis=0), ImageEnv()
    obs, _ = env.reset(seed=0)
    assert np.array_equal(obs, twin.reset(seed=0)[0])
    perms = documented_permutations(3, 2, 0, 4)
    for n in range(8):
        obs, _, _, _, info = env.step(0)
        assert info["task_id"] == n // 2 and np.array_equal(env.current_permutation, perms[n // 2])
        assert np.array_equal(obs, np.take(twin.step(0)[0], perms[n // 2], axis=0))
    padded = PadChannels(ImageEnv(), 5, axis=0)
    obs, _ = padded.reset(seed=0)
    assert obs.shape == (5, 4, 4) and padded.observation_space.shape == (5, 4, 4) and not obs[3:].any()
    acts = PadActions(ImageEnv(n_actions=3), 5)
    acts.reset(seed=0)
    assert acts.action_space == spaces.Discrete(5)
    acts.step(4)
    assert acts.unwrapped.last_action == 0
    acts.step(2)
    assert acts.unwrapped.last_action == 2


def test_physics_parameter_schedule_with_callables():
    written = []
    env = PhysicsParameterSchedule(
        CountingEnv(3), change_every=4, sample_fn=lambda rng: {"gravity": float(rng.uniform(5, 15))},
        apply_fn=lambda unwrapped, params: written.append((unwrapped.total_steps, params["gravity"])),
    )
    _, info = env.reset(seed=0)
    assert info["gravity"] == written[0][1] and env.parameters == {"gravity": written[0][1]}
    for _ in range(10):
        _, _, terminated, _, _ = env.step(0)
        if terminated:
            env.reset()
    # at_episode_end by default: resets after 0, 3, 6, 9 steps apply tasks 0, 0, 1, 2
    assert [steps for steps, _ in written] == [0, 6, 9]


def test_game_switching_env_with_user_games_and_space_mismatch():
    env = GameSwitchingEnv([lambda: ImageEnv(), lambda: PadActions(ImageEnv(n_actions=2), 3)], change_every=2,
                           names=["a", "b"])
    assert env.games == ["a", "b"]
    env.reset(seed=0)
    assert env.current_game == "a"
    with pytest.raises(ValueError, match="action space"):
        GameSwitchingEnv([lambda: ImageEnv(), lambda: ImageEnv(n_actions=2)], change_every=2)
    with pytest.raises(ValueError, match="at least one game"):
        GameSwitchingEnv([], change_every=2)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("change_every", [0, -5, 1.5, "10", None, True])
@pytest.mark.parametrize("env_id", ["sb3_plastic/PermutedMinAtar-Breakout-v0", "sb3_plastic/SlipperyHalfCheetah-v0",
                                    "sb3_plastic/SwitchingMinAtar-v0"])
def test_bad_change_every(env_id, change_every):
    with pytest.raises(ValueError, match="change_every"):
        gym.make(env_id, change_every=change_every)


@pytest.mark.parametrize("friction_range", [(2, 0.02), (), (0.02,), (-1, 1), (0, 1), (0.1, float("inf")),
                                            (float("nan"), 1), "0.1, 1", 0.5, (0.1, 1, 2)])
def test_bad_friction_range(friction_range):
    with pytest.raises(ValueError, match="friction_range"):
        gym.make("sb3_plastic/SlipperyAnt-v0", friction_range=friction_range)


def test_bad_games_and_seeds():
    with pytest.raises(ValueError, match=r"unknown MinAtar game 'pong'.*breakout"):
        gym.make("sb3_plastic/SwitchingMinAtar-v0", games=["breakout", "pong"])
    with pytest.raises(ValueError, match="unknown MinAtar game"):
        gym.make("sb3_plastic/PermutedMinAtar-Breakout-v0", game="tetris")
    with pytest.raises(ValueError, match="at least one"):
        gym.make("sb3_plastic/SwitchingMinAtar-v0", games=[])
    with pytest.raises(ValueError, match=r"unknown Atari game 'NotAGame'.*Breakout"):
        gym.make("sb3_plastic/SwitchingAtari-v0", games=["Pong", "NotAGame"])
    with pytest.raises(ValueError, match="task_seed"):
        gym.make("sb3_plastic/PermutedMinAtar-Breakout-v0", task_seed=-1)
    with pytest.raises(ValueError, match="channels"):
        ChannelPermutation(ImageEnv(shape=(1, 4, 4)), change_every=2, axis=0)


def test_minatar_env_matches_minatar_gym_env():
    ours, theirs = MinAtarEnv("breakout"), gym.make("MinAtar/Breakout-v0").unwrapped
    assert ours.action_space == theirs.action_space == spaces.Discrete(6)
    a, _ = ours.reset(seed=4)
    b, _ = theirs.reset(seed=4)
    assert np.array_equal(a, b) and ours.np_random is not None
    for action in [1, 3, 5, 0, 2, 4] * 5:
        a, ra, ta, _, _ = ours.step(action)
        b, rb, tb, _, _ = theirs.step(action)
        assert np.array_equal(a, b) and ra == rb and type(ra) is float and ta == tb


@pytest.mark.parametrize("native", [True, False])
def test_minatar_env_padding_and_permutation(native):
    base = gym.make("MinAtar/Freeway-v0")
    env = MinAtarEnv("freeway", n_channels=10, native_channels=native)
    assert env.observation_space == spaces.Box(0, 1, (10, 10, 10), bool)
    perm = np.random.default_rng(0).permutation(10)
    obs, _ = env.reset(seed=1)
    base_obs, _ = base.reset(seed=1)
    for n, action in enumerate([0, 2, 2, 1, 3, 2, 4, 2, 5, 2] * 3):
        if n == 10:
            env.set_channel_permutation(perm)
        if n == 20:
            env.set_channel_permutation(None)
        padded = np.concatenate([base_obs, np.zeros((10, 10, 3), bool)], axis=-1)
        assert np.array_equal(obs, np.take(padded, perm, axis=-1) if 10 < n <= 20 else padded), n
        obs, *_ = env.step(action)
        base_obs, *_ = base.step(action)
    with pytest.raises(ValueError, match="permutation"):
        env.set_channel_permutation([0, 1, 2])
    # ChannelPermutation hands the permutation to the env only for the env's own channel axis
    assert ChannelPermutation(MinAtarEnv("breakout"), 5)._native
    rows = ChannelPermutation(MinAtarEnv("breakout"), 1, axis=0)
    assert not rows._native
    rows.reset(seed=0)
    obs, *_ = rows.step(0)
    assert np.array_equal(obs, np.take(rows.unwrapped.game.state(), rows.current_permutation, axis=0))
    with pytest.raises(ValueError, match="n_channels"):
        MinAtarEnv("seaquest", n_channels=4)


def test_truncate_idle_episode_cuts_an_idle_episode_at_max_steps_only():
    from sb3_plastic.envs import TruncateIdleEpisode

    class Counter(gym.Env):
        observation_space = gym.spaces.Discrete(2)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return 0, {}

        def step(self, action):  # action 1 earns a reward of 1
            return 0, float(action), False, False, {}

    env = TruncateIdleEpisode(Counter(), max_steps=5, min_return=0.1)
    env.reset()
    flags = [env.step(0)[3] for _ in range(5)]
    assert flags == [False] * 4 + [True]  # idle for 5 steps: cut at step 5
    env.reset()  # the count restarts
    assert [env.step(0)[3] for _ in range(4)] == [False] * 4
    env.reset()
    env.step(1)  # a reward: never idle in this episode
    assert not any(env.step(0)[3] for _ in range(20))
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1, got 0"):
        TruncateIdleEpisode(Counter(), max_steps=0)


def test_switching_minatar_idle_episode_steps_cuts_seaquest_as_c_chain_does():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one game: not switching
        env = gym.make("sb3_plastic/SwitchingMinAtar-v0", games=["seaquest"], idle_episode_steps=300,
                       change_every=10**6)
    env.reset(seed=0)
    steps = 0
    for _ in range(400):  # the no-op at the surface never ends a Seaquest episode
        _, reward, terminated, truncated, _ = env.step(0)
        steps += 1
        assert reward == 0 and not terminated
        if truncated:
            break
    assert steps == 300 and truncated
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        gym.make("sb3_plastic/SwitchingMinAtar-v0", idle_episode_steps=-1)
