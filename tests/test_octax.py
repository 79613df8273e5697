"""Octax adapter (``sb3_plastic.envs.octax``): env checkers, seeding, permutation, game switching, training.

Needs the optional ``octax`` extra (JAX on CPU); the tests that use it are skipped without it. Each game
is built and jit-compiled once per process (a few seconds each), so the tests reuse Brix and Pong.
Set ``SB3_PLASTIC_OCTAX_ALL=1`` to also build and step every game (37 games, ~3-6 minutes).
"""

import os
import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_plastic.envs.octax import (
    OCTAX_ACTION_KEYS,
    OCTAX_GAMES,
    OCTAX_ID_NAMES,
    OctaxEnv,
    make_permuted_octax,
    make_switching_octax,
    octax_env_ids,
    register_octax_envs,
)

SKIP_REASON = "octax (CHIP-8 games in JAX) is not installed: pip install 'sb3-plastic[octax]'"


@pytest.fixture(scope="module")
def octax():
    """Skip the test when ``octax`` (and ``jax``) cannot be imported; register the ids."""
    module = pytest.importorskip("octax", reason=SKIP_REASON)
    register_octax_envs()
    return module


def rollout(env, seed, n_steps, actions_seed=0):
    """Observations, rewards, terminations of ``n_steps`` random steps (resetting after episode ends)."""
    rng = np.random.default_rng(actions_seed)
    obs, _ = env.reset(seed=seed)
    out = [obs]
    rewards, dones = [], []
    for _ in range(n_steps):
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        out.append(obs)
        rewards.append(reward)
        dones.append(terminated or truncated)
        if terminated or truncated:
            obs, _ = env.reset()
            out.append(obs)
    return np.stack(out), np.array(rewards), np.array(dones)


def test_registration_imports_no_jax_and_missing_octax_error():
    """Registering imports neither jax nor octax; making an env without octax names the extra."""
    code = textwrap.dedent(
        """
        import sys
        import gymnasium as gym
        from sb3_plastic.envs.octax import OctaxNotInstalled, octax_env_ids, register_octax_envs
        ids = register_octax_envs()
        assert ids == octax_env_ids() and all(i in gym.registry for i in ids), ids
        assert register_octax_envs() == ids  # idempotent
        assert "jax" not in sys.modules and "octax" not in sys.modules
        sys.modules["octax"] = None  # as if octax were not installed
        for env_id in ("sb3_plastic/Octax-Brix-v0", "sb3_plastic/SwitchingOctax-v0"):
            try:
                gym.make(env_id)
            except ImportError as exc:
                assert isinstance(exc, OctaxNotInstalled) and "sb3-plastic[octax]" in str(exc), exc
            else:
                raise AssertionError("no ImportError")
        print("OK")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-2000:]


def test_ids_and_names():
    ids = octax_env_ids()
    assert len(ids) == 2 * len(OCTAX_GAMES) + 1 and len(set(ids)) == len(ids)
    for name in ("Brix", "VerticalBrix", "SpaceFlight3", "TargetShooter1", "Cavern5", "FlightRunner"):
        assert f"sb3_plastic/Octax-{name}-v0" in ids and f"sb3_plastic/PermutedOctax-{name}-v0" in ids
    assert "sb3_plastic/SwitchingOctax-v0" in ids
    assert OCTAX_ID_NAMES["shooting_stars"] == "ShootingStars"


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("sb3_plastic/Octax-Brix-v0", {}),
        ("sb3_plastic/Octax-Brix-v0", {"obs_dtype": "uint8"}),
        ("sb3_plastic/PermutedOctax-Brix-v0", {"change_every": 3}),
        ("sb3_plastic/SwitchingOctax-v0", {"change_every": 5}),
    ],
)
def test_env_checkers(octax, env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    uint8 = kwargs.get("obs_dtype") == "uint8"
    assert env.observation_space == gym.spaces.Box(0, 255 if uint8 else 1, (4, 32, 64), np.uint8 if uint8 else np.bool_)
    with warnings.catch_warnings():
        # SB3 warns that 32 x 64 frames are below NatureCNN's 36 x 36 (PlasticCNN handles them), and that
        # bool frames are not uint8 images; gymnasium that the checked env is a wrapper: all expected.
        warnings.simplefilter("ignore", UserWarning)
        base = env_id.startswith("sb3_plastic/Octax")
        # the render check re-makes the env in every mode of its metadata (GameMux also lists "human")
        gym_check_env(env.unwrapped if base else env, skip_render_check=not base)
        sb3_check_env(env.unwrapped if base else env)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, reward, _, _, info = env.step(0)
    assert env.observation_space.contains(obs) and isinstance(reward, float) and "score" in info
    if not env_id.startswith("sb3_plastic/Octax"):
        assert info["task_id"] == 0 and info["task_step"] == 1
    env.close()


def test_reset_reproducible_and_equal_to_octax(octax):
    import jax

    env = OctaxEnv("brix")
    obs_a, rew_a, done_a = rollout(env, seed=5, n_steps=60)
    obs_b, rew_b, done_b = rollout(OctaxEnv("Brix"), seed=5, n_steps=60)
    assert np.array_equal(obs_a, obs_b) and np.array_equal(rew_a, rew_b) and np.array_equal(done_a, done_b)
    assert done_a.any() and rew_a.sum() > 0  # the rollout crossed episode ends and scored
    assert env.step(0)[0].flags.writeable  # a NumPy copy, not a read-only view of a jax buffer
    # unseeded resets continue the seeded stream reproducibly
    env_c, env_d = OctaxEnv("brix"), OctaxEnv("brix")
    env_c.reset(seed=11), env_d.reset(seed=11)
    assert np.array_equal(rollout(env_c, None, 30)[0], rollout(env_d, None, 30)[0])
    # the adapter is octax itself, transposed to (frames, height, width), with key PRNGKey(seed)
    raw = env._game.env
    state, frames, _ = raw.reset(jax.random.PRNGKey(7))
    obs, _ = env.reset(seed=7)
    assert np.array_equal(obs, np.asarray(frames).transpose(0, 2, 1))
    rng = np.random.default_rng(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # jax dtype warnings while octax's step is traced
        for _ in range(25):
            action = int(rng.integers(env.action_space.n))
            state, frames, reward, terminated, _, _ = raw.step(state, action)
            obs, r, term, _, _ = env.step(action)
            assert np.array_equal(obs, np.asarray(frames).transpose(0, 2, 1))
            assert r == float(reward) and term == bool(terminated)
            if term:
                break
    # the uint8 observation is the bool one times 255
    obs_u8, _ = OctaxEnv("brix", obs_dtype="uint8").reset(seed=5)
    assert obs_u8.dtype == np.uint8 and np.array_equal(obs_u8, obs_a[0].astype(np.uint8) * 255)


def test_permutation_is_base_with_permuted_channels(octax):
    change_every = 7
    env = make_permuted_octax("brix", change_every=change_every, task_seed=3)
    base = OctaxEnv("brix")
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=1)
    base_obs, _ = base.reset(seed=1)
    assert info["task_id"] == 0 and np.array_equal(obs, base_obs)  # task 0 is unpermuted
    seen = set()
    for n in range(40):
        action = int(rng.integers(3))
        obs, reward, terminated, truncated, info = env.step(action)
        base_obs, base_reward, base_terminated, base_truncated, _ = base.step(action)
        task = n // change_every
        perm = env.permutation_for(task)
        assert info["task_id"] == task and np.array_equal(env.current_permutation, perm)
        assert np.array_equal(obs, base_obs[perm]) and np.array_equal(obs, np.take(base_obs, perm, axis=0))
        assert (reward, terminated, truncated) == (base_reward, base_terminated, base_truncated)
        seen.add(tuple(perm))
        if terminated or truncated:
            obs, info = env.reset()
            base_obs, _ = base.reset()
            assert np.array_equal(obs, np.take(base_obs, env.current_permutation, axis=0))
    assert len(seen) >= 3 and tuple(range(4)) in seen
    # two copies of a vector env (different seeds) go through the same permutations in lockstep
    venv = DummyVecEnv([lambda: make_permuted_octax("brix", change_every=4, task_seed=3)] * 2)
    venv.seed(0)
    venv.reset()
    for _ in range(9):
        _, _, _, infos = venv.step(np.array([0, 1]))
        assert infos[0]["task_id"] == infos[1]["task_id"]
        perms = venv.get_attr("current_permutation")
        assert np.array_equal(perms[0], perms[1])
    venv.close()


def test_switching_changes_game_with_fixed_action_space(octax):
    env = make_switching_octax(["brix", "pong"], change_every=10, task_seed=0)
    # union of the keys: brix (4, 6), pong (1, 4) -> keys (1, 4, 6) + no-op
    assert env.action_space == gym.spaces.Discrete(4) and env.games == ["brix", "pong"]
    fresh = {game: OctaxEnv(game).reset(seed=0)[0] for game in ("brix", "pong")}
    assert not np.array_equal(fresh["brix"], fresh["pong"])
    obs, info = env.reset(seed=0)
    games = []
    for n in range(30):
        if n % 10 == 0:
            game = ["brix", "pong"][(n // 10) % 2]
            assert info["game"] == env.current_game == game
            current = env.env.current.unwrapped  # read the game back from the env in play
            assert isinstance(current, OctaxEnv) and current.game == game
            assert np.array_equal(obs, fresh[game])  # the first screen is the game's own
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.action_space == gym.spaces.Discrete(4)
        games.append(info["game"])
        assert truncated == ((n + 1) % 10 == 0) or terminated
        if terminated or truncated:
            obs, info = env.reset()
    assert games == ["brix"] * 10 + ["pong"] * 10 + ["brix"] * 10
    # action tables: an action on a key the game does not use is the game's own no-op
    brix, pong = (game.unwrapped for game in env.env.games)
    assert brix.game_keys == OCTAX_ACTION_KEYS["brix"] == (4, 6) and pong.game_keys == OCTAX_ACTION_KEYS["pong"] == (1, 4)
    assert brix.action_keys == pong.action_keys == (1, 4, 6)
    assert list(brix.action_table) == [2, 0, 1, 2] and list(pong.action_table) == [0, 1, 2, 2]
    noop_key = OctaxEnv("brix", action_keys=(1, 4, 6))
    native = OctaxEnv("brix")
    a = rollout(noop_key, seed=2, n_steps=15, actions_seed=9)
    noop_key.reset(seed=2), native.reset(seed=2)
    for _ in range(15):
        obs_k, *_ = noop_key.step(0)  # key 1: unused by brix
        obs_n, *_ = native.step(2)  # brix's native no-op
        assert np.array_equal(obs_k, obs_n)
    assert a[0].shape[1:] == (4, 32, 64)
    # padded mode: the largest native action set (pong/brix: 3), extra actions are no-ops
    padded = make_switching_octax(["brix", "pong"], change_every=10, action_mode="padded")
    assert padded.action_space == gym.spaces.Discrete(3)
    env.close(), padded.close()


def test_bad_parameters(octax):
    with pytest.raises(ValueError, match="unknown Octax game"):
        OctaxEnv("breakout")
    with pytest.raises(ValueError, match="unknown Octax game"):
        make_switching_octax(["brix", "nope"])
    with pytest.raises(ValueError, match="at least one"):
        make_switching_octax([])
    with pytest.raises(ValueError, match="change_every"):
        make_permuted_octax("brix", change_every=0)
    with pytest.raises(ValueError, match="change_every"):
        make_switching_octax(["brix"], change_every=-5)
    with pytest.raises(ValueError, match="action_mode"):
        make_switching_octax(["brix"], action_mode="full")
    with pytest.raises(ValueError, match="action_keys"):
        OctaxEnv("brix", action_keys=(4, 4))
    with pytest.raises(ValueError, match="obs_dtype"):
        OctaxEnv("brix", obs_dtype="float32")
    env = OctaxEnv("brix")
    with pytest.raises(gym.error.ResetNeeded):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(3)


def test_plastic_ppo_and_dqn_train_256_steps(octax):
    from sb3_plastic import PlasticDQN, PlasticPPO
    from sb3_plastic.networks import PlasticCNN

    model = PlasticPPO("CnnPolicy", gym.make("sb3_plastic/PermutedOctax-Brix-v0", change_every=100),
                       n_steps=128, batch_size=64, n_epochs=1, seed=0)
    extractor = model.policy.features_extractor
    assert isinstance(extractor, PlasticCNN) and extractor.arch == "minatar" and not extractor.channels_last
    model.learn(256)
    assert model.num_timesteps == 256
    dqn = PlasticDQN("CnnPolicy", gym.make("sb3_plastic/SwitchingOctax-v0", games=["brix", "pong"], change_every=100),
                     learning_starts=64, buffer_size=512, train_freq=4, seed=0)
    dqn.learn(256)
    assert dqn.num_timesteps == 256


@pytest.mark.skipif(not os.environ.get("SB3_PLASTIC_OCTAX_ALL"), reason="slow: set SB3_PLASTIC_OCTAX_ALL=1 to step every game")
def test_every_game_steps(octax):
    for game in OCTAX_GAMES:
        env = gym.make(f"sb3_plastic/Octax-{OCTAX_ID_NAMES[game]}-v0")
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs) and env.unwrapped.game_keys == OCTAX_ACTION_KEYS[game]
        for action in range(env.action_space.n):
            obs, reward, _, _, _ = env.step(action)
            assert env.observation_space.contains(obs) and np.isfinite(reward)
        env.close()
