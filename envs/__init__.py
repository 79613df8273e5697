"""Non-stationary environments of sb3-plastic, installed as ``sb3_plastic.envs``.

The folder ``envs/`` of the repository is mapped onto the package ``sb3_plastic.envs`` (see
``pyproject.toml``), so installing sb3-plastic never creates a top-level module named ``envs``.
Importing this package registers the gymnasium ids of the namespace ``sb3_plastic/`` (idempotent).
Gymnasium 1.x loads no plugins, so without the import ``gym.make("sb3_plastic/...")`` fails with
"Namespace sb3_plastic not found"; the module-prefixed id ``gym.make("sb3_plastic.envs:sb3_plastic/<Name>-v0")``
(which SB3's ``make_vec_env`` passes through) imports this package first and works in a fresh interpreter:

==========================================  ===================================  ======================  ==============
id                                          what changes                         default change_every    needs extra
==========================================  ===================================  ======================  ==============
``sb3_plastic/SlipperyHalfCheetah-v0``      floor/feet friction (next episode)   2 000 000               ``mujoco``
``sb3_plastic/SlipperyAnt-v0``              floor/feet friction (next episode)   2 000 000               ``mujoco``
``sb3_plastic/PermutedMinAtar-<Game>-v0``   observation channel permutation      500 000                 (core)
``sb3_plastic/SwitchingMinAtar-v0``         the MinAtar game                     500 000 per game        (core)
``sb3_plastic/SwitchingAtari-v0``           the Atari game (18 actions)          2 500 000 per game      ``atari``
``sb3_plastic/RandomLabelBandit-v0``        rewarded action of every context     2 000                   (core)
``sb3_plastic/Perturbed<Control>-v0``       fixed random observation offset      50 000                  (core)
==========================================  ===================================  ======================  ==============

(``<Game>``: Asterix, Breakout, Freeway, Seaquest, SpaceInvaders; ``<Control>``: CartPole, Acrobot, LunarLander
(LunarLander needs the ``box2d`` extra), :mod:`~sb3_plastic.envs.control_envs`.) One more id is stationary and there
for invalid-action masking (MaskablePPO runs): ``sb3_plastic/InvalidActionDiscrete-v0``, sb3-contrib's
identity env with ``action_masks()`` (:mod:`~sb3_plastic.envs.masking`). Every other id takes ``change_every``,
``task_seed`` and ``at_episode_end`` keywords; see :mod:`~sb3_plastic.envs.mujoco_envs`,
:mod:`~sb3_plastic.envs.minatar_envs` and :mod:`~sb3_plastic.envs.atari_envs`. The MuJoCo, Atari
and LunarLander ids are registered even without their extras; ``gym.make`` then raises
``gymnasium.error.DependencyNotInstalled`` naming the extra to install.

All of them count ``change_every`` in env steps of each env copy (a task lasts ``change_every * n_envs``
model timesteps with ``n_envs`` copies: the defaults above are per copy) and derive each task from
``(task_seed, task_index)`` alone, so the copies of an SB3 vector env see the same task sequence; ``info["task_id"]`` and
``info["task_step"]`` tell loggers the task, the observation never does. Where a change happens
exactly: :class:`~sb3_plastic.envs.schedule.TaskSchedule`; training keeps the copies on the model's
``num_timesteps`` (:class:`~sb3_plastic.callbacks.TaskScheduleSync`), so resuming continues the sequence.

Building blocks for your own non-stationary envs (stable API): :class:`TaskSchedule`,
:class:`PiecewiseStationaryWrapper`, :class:`ChannelPermutation`, :class:`PhysicsParameterSchedule`,
:class:`GameSwitchingEnv`, :class:`PadChannels`, :class:`PadActions`.
"""

from __future__ import annotations

import gymnasium as gym

from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import (
    ChannelPermutation,
    GameMux,
    GameSwitchingEnv,
    PadActions,
    PadChannels,
    PhysicsParameterSchedule,
    PiecewiseStationaryWrapper,
    RawActions,
    TruncateIdleEpisode,
    TruncationAsTermination,
    ZeroPaddedObservations,
)

#: Namespace of the gymnasium ids of this package.
NAMESPACE = "sb3_plastic"

_MODULE = "sb3_plastic.envs"

#: id -> (entry point, kwargs, max_episode_steps)
_SPECS: dict[str, tuple[str, dict, object]] = {
    f"{NAMESPACE}/SlipperyHalfCheetah-v0": (f"{_MODULE}.mujoco_envs:make_slippery_half_cheetah", {}, 1000),
    f"{NAMESPACE}/SlipperyAnt-v0": (f"{_MODULE}.mujoco_envs:make_slippery_ant", {}, 1000),
    **{
        f"{NAMESPACE}/PermutedMinAtar-{name}-v0": (f"{_MODULE}.minatar_envs:make_permuted_minatar", {"game": game}, None)
        for game, name in (
            ("asterix", "Asterix"),
            ("breakout", "Breakout"),
            ("freeway", "Freeway"),
            ("seaquest", "Seaquest"),
            ("space_invaders", "SpaceInvaders"),
        )
    },
    f"{NAMESPACE}/SwitchingMinAtar-v0": (f"{_MODULE}.minatar_envs:make_switching_minatar", {}, None),
    f"{NAMESPACE}/SwitchingAtari-v0": (f"{_MODULE}.atari_envs:make_switching_atari", {}, None),
    f"{NAMESPACE}/RandomLabelBandit-v0": (f"{_MODULE}.bandit_envs:make_random_label_bandit", {}, None),
    **{
        f"{NAMESPACE}/Perturbed{name}-v0": (f"{_MODULE}.control_envs:make_perturbed_control", {"base": base}, None)
        for name, base in (("CartPole", "CartPole-v1"), ("Acrobot", "Acrobot-v1"), ("LunarLander", "LunarLander-v3"))
    },
    # stationary, with action masks (MaskablePPO through rl_zoo3); truncates its own episodes
    f"{NAMESPACE}/InvalidActionDiscrete-v0": (f"{_MODULE}.masking:InvalidActionDiscreteEnv", {}, None),
}

#: Gymnasium ids registered by this package.
REGISTERED_IDS: list[str] = list(_SPECS)


def register_env(env_id: str, entry_point: str, kwargs: dict | None = None, max_episode_steps: int | None = None) -> str:
    """Register one more id with gymnasium (idempotent) and list it in :data:`REGISTERED_IDS`.

    For env modules of this package that register their own ids (e.g. an adapter with an optional extra):
    give a lazy ``"module:function"`` entry point so nothing heavy is imported before ``gym.make``.
    """
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs or {}), max_episode_steps=max_episode_steps)
    if env_id not in REGISTERED_IDS:
        REGISTERED_IDS.append(env_id)
    return env_id


def register_envs() -> list[str]:
    """Register the ``sb3_plastic/`` ids with gymnasium (idempotent: ids already registered are left alone).

    :return: the registered ids (:data:`REGISTERED_IDS`).
    """
    for env_id, (entry_point, kwargs, max_episode_steps) in _SPECS.items():
        register_env(env_id, entry_point, kwargs, max_episode_steps)
    return list(REGISTERED_IDS)


register_envs()


def _register_octax() -> None:
    """Octax ids (``Octax-<Game>-v0``, ``PermutedOctax-<Game>-v0``, ``SwitchingOctax-v0``; the ``octax``
    extra): registering them imports neither JAX nor octax, making one does."""
    from sb3_plastic.envs.octax import register_octax_envs

    for env_id in register_octax_envs():
        if env_id not in REGISTERED_IDS:
            REGISTERED_IDS.append(env_id)


_register_octax()

__all__ = [
    "NAMESPACE",
    "REGISTERED_IDS",
    "ChannelPermutation",
    "GameMux",
    "GameSwitchingEnv",
    "PadActions",
    "PadChannels",
    "PhysicsParameterSchedule",
    "PiecewiseStationaryWrapper",
    "RawActions",
    "TaskSchedule",
    "TruncateIdleEpisode",
    "TruncationAsTermination",
    "ZeroPaddedObservations",
    "register_env",
    "register_envs",
]
