"""Slippery MuJoCo locomotion: HalfCheetah / Ant whose ground friction changes every ``change_every`` steps.

Slippery Ant is the continual RL benchmark of Dohare et al. (2024), "Loss of plasticity in deep
continual learning", Nature 632, 768-774 (reference code: shibhansh/loss-of-plasticity,
``lop/envs/slippery_ant.py``); Slippery HalfCheetah applies the same recipe to HalfCheetah.

Friction: for every task ``k`` a sliding friction coefficient ``f = 10 ** U(log10 lo, log10 hi)`` is
drawn from ``schedule.rng(k)`` (default range ``(0.02, 2.0)``, so ``log10 f ~ U(-1.7, 0.3)``; task 0 is
drawn too) and written into the first column (sliding) of ``model.geom_friction`` of *every* geom.
The reference code does the same through the XML: it rewrites the ``friction`` of the ``<default><geom>``
class (``root[3][1]``, ``f 0.5 0.5``), which every geom of ``ant.xml`` inherits, floor included (tested: the
two models have equal ``geom_friction`` and step bit for bit alike). MuJoCo combines the friction of two
touching geoms with an element-wise maximum, so every floor/feet contact uses exactly ``f``. Torsional and
rolling friction are left as they are (``0.5``; unused with the model's ``condim=3``).

Differences from the reference that remain: its frictions are read from the file ``cfg/frictions`` (row
``seed``, the same log-uniform distribution, other draws); it changes the friction at the first episode end
more than ``change_time`` steps after the previous change (each interval longer by up to one episode, and the
delays add up: its k-th change comes up to ~k episodes after ``k * change_time``, at most ~9 000 steps by the last
of 2 M-step tasks; ours change at the first reset at or after ``k * change_every`` steps); and it runs gym
0.23's ``Ant-v3`` on mujoco-py 2.1,
whose 84 contact-force entries of the observation and contact cost are always zero (MuJoCo 2 no longer computes
``cfrc_ext``; openai/gym#1541), where ``Ant-v5`` observes 78 live, clipped contact forces and charges their
cost (pass ``include_cfrc_ext_in_observation=False, contact_cost_weight=0.0`` to match it); ``Ant-v5`` also
gives no healthy reward on the step that terminates.

By default a change takes effect at the next episode end (Dohare et al.): the episode that starts
with a ``reset()`` after ``n`` env steps runs with the friction of task ``n // change_every``.
``info["friction"]`` carries the friction in force, with ``info["task_id"]`` and ``info["task_step"]``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from sb3_plastic.envs._deps import require
from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import PhysicsParameterSchedule, RawActions, ZeroPaddedObservations

#: Default friction range ``(low, high)`` of the log-uniform draw (Dohare et al., 2024).
DEFAULT_FRICTION_RANGE = (0.02, 2.0)
#: Default task length in env steps (Dohare et al., 2024: a new friction every 2M steps).
SLIPPERY_CHANGE_EVERY = 2_000_000


def check_friction_range(friction_range: Any) -> tuple[float, float]:
    """Return ``friction_range`` as ``(low, high)`` floats with ``0 < low <= high < inf``.

    ``low == high`` is allowed (a constant friction). :raises ValueError: for anything else.
    """
    allowed = "a pair (low, high) of finite numbers with 0 < low <= high, e.g. (0.02, 2.0)"
    if isinstance(friction_range, (str, bytes)):
        raise ValueError(f"friction_range must be {allowed}, got {friction_range!r}")
    try:
        values = list(friction_range)
    except TypeError:
        raise ValueError(f"friction_range must be {allowed}, got {friction_range!r}") from None
    if len(values) != 2 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"friction_range must be {allowed}, got {friction_range!r}")
    low, high = float(values[0]), float(values[1])
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ValueError(f"friction_range must be {allowed}, got {friction_range!r}")
    return low, high


class SlipperyFriction(PhysicsParameterSchedule):
    """Replace the sliding friction of every geom of a MuJoCo env by a log-uniform draw per task.

    See the module docstring for the exact draw and where it is written. Dohare et al. (2024),
    Nature 632, 768-774 ("Slippery Ant").

    :param env: a gymnasium MuJoCo env (its ``unwrapped.model`` is modified in place).
    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0;
        default 2 000 000).
    :param friction_range: ``(low, high)``, ``0 < low <= high``; ``f = 10 ** U(log10 low, log10 high)``.
    :param task_seed: seed of the friction sequence, shared by the copies of a vector env (>= 0).
    :param at_episode_end: apply a new friction at the next ``reset()`` (default) or immediately.
    """

    def __init__(
        self,
        env: gym.Env,
        change_every: int = SLIPPERY_CHANGE_EVERY,
        friction_range: tuple[float, float] = DEFAULT_FRICTION_RANGE,
        task_seed: int = 0,
        at_episode_end: bool = True,
    ) -> None:
        self.friction_range = check_friction_range(friction_range)
        model = getattr(env.unwrapped, "model", None)
        if model is None or not hasattr(model, "geom_friction"):
            raise ValueError(f"SlipperyFriction needs a MuJoCo env with unwrapped.model.geom_friction, got {env}")
        super().__init__(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end)
        self._log_range = (math.log10(self.friction_range[0]), math.log10(self.friction_range[1]))

    @property
    def friction(self) -> Optional[float]:
        """The sliding friction in force (``None`` before the first ``reset()``)."""
        return self.parameters.get("friction")

    def sample_parameters(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"friction": float(10.0 ** rng.uniform(*self._log_range))}

    def apply_parameters(self, parameters: dict[str, Any]) -> None:
        self.env.unwrapped.model.geom_friction[:, 0] = parameters["friction"]

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (the bench's checkpoints pickle the vector env): gymnasium's MuJoCo envs pickle through
        ``EzPickle``, which rebuilds them from their constructor arguments, so the model would come back with the XML's
        friction (1.0 for Ant) until the next task switch, the episode in progress at its initial pose and the
        generator unseeded. The live model, data and generator travel with this wrapper instead (``MjModel`` /
        ``MjData`` pickle natively): an unpickled copy steps exactly as the original."""
        state = self.__dict__.copy()
        sim = self.env.unwrapped
        state["_simulation"] = (sim.model, sim.data, getattr(sim, "_np_random", None),
                                getattr(sim, "_np_random_seed", None))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        simulation = state.pop("_simulation", None)
        super().__setstate__(state)  # the friction in force written into the rebuilt model
        if simulation is not None:
            sim = self.env.unwrapped
            sim.model, sim.data, sim._np_random, sim._np_random_seed = simulation
            renderer = getattr(sim, "mujoco_renderer", None)
            if renderer is not None:
                renderer.model, renderer.data = sim.model, sim.data


def make_slippery(
    base_id: str,
    change_every: int = SLIPPERY_CHANGE_EVERY,
    friction_range: tuple[float, float] = DEFAULT_FRICTION_RANGE,
    task_seed: int = 0,
    at_episode_end: bool = True,
    raw_actions: bool = False,
    observation_zeros: int = 0,
    **kwargs: Any,
) -> gym.Env:
    """Build :class:`SlipperyFriction` over the MuJoCo env ``base_id`` (constructor keywords in ``kwargs``).

    ``raw_actions=True`` wraps it in :class:`~sb3_plastic.envs.wrappers.RawActions`: an agent's raw action reaches
    the env unclipped, so the control cost charges the action sampled, as in Dohare et al.'s runs (MuJoCo still clamps
    it for the dynamics). ``observation_zeros=n`` appends ``n`` always-zero entries to the observation
    (:class:`~sb3_plastic.envs.wrappers.ZeroPaddedObservations`): ``Ant-v5`` without contact forces (27 observations)
    and ``n = 84`` has the 111 inputs of Dohare et al.'s ``Ant-v3``, whose contact forces were always 0.

    The base env is built without its time limit: the registered ``sb3_plastic/`` ids add the base
    env's 1000-step limit outside the wrapper, so ``gym.make(..., max_episode_steps=...)`` works.
    """
    check_friction_range(friction_range)
    TaskSchedule(change_every, task_seed, at_episode_end)  # validates before the (slow) model is built
    if isinstance(observation_zeros, bool) or not isinstance(observation_zeros, (int, np.integer)) or observation_zeros < 0:
        raise ValueError(f"observation_zeros must be an int >= 0, got {observation_zeros!r}")
    require("mujoco", "mujoco", f"sb3_plastic/Slippery{base_id.split('-')[0]}")
    spec = gym.spec(base_id)
    creator = gym.envs.registration.load_env_creator(spec.entry_point)
    env = creator(**{**spec.kwargs, **kwargs})
    out: gym.Env = SlipperyFriction(env, change_every, friction_range, task_seed, at_episode_end)
    if observation_zeros:
        out = ZeroPaddedObservations(out, observation_zeros)
    return RawActions(out) if raw_actions else out


def make_slippery_half_cheetah(**kwargs: Any) -> gym.Env:
    """``sb3_plastic/SlipperyHalfCheetah-v0``: :func:`make_slippery` over ``HalfCheetah-v5``."""
    return make_slippery("HalfCheetah-v5", **kwargs)


def make_slippery_ant(**kwargs: Any) -> gym.Env:
    """``sb3_plastic/SlipperyAnt-v0``: :func:`make_slippery` over ``Ant-v5`` (Dohare et al., 2024)."""
    return make_slippery("Ant-v5", **kwargs)
