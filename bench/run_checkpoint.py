"""Checkpoints of a benchmark run in progress, so that a run longer than one working session resumes where it
stopped instead of starting again (bench/continual.py; issue #28: a C-MinAtar DQN run takes many CPU-hours).

A checkpoint is taken at a rollout start (``_on_rollout_start``, on-policy and off-policy alike), at most every
``every_seconds`` of wall time, and holds everything the rest of the run depends on:

* the model (SB3's ``save``: weights, optimizer state, ``num_timesteps``, ``_last_obs`` and the episode bookkeeping,
  the plastic callbacks' state in ``model.plastic_state``) and, off-policy, the replay buffer;
* the vector env itself (pickled with cloudpickle: the episodes in progress, each copy's position in its task
  sequence, the envs' own random generators; SB3's ``VecNormalize`` with its running statistics, :func:`dumps_env`);
* the global random states (torch, numpy, python), the action space's generator (epsilon-greedy draws its random
  actions from it) and what the caller adds (``extra()``: the bench's per-task
  recorder, the monitor's probe batch and history, the CPU time so far).

A run can also be stopped on request without losing what it did since its last checkpoint: :data:`STOP_SIGNAL`
(SIGUSR1; :func:`install_stop_handler`) asks it to take a checkpoint at its next rollout start (the one after, if
that start follows a task switch) and then raise :class:`RunStopped` (``bench/stop_workers.sh``, the end of a working
session).

Resuming loads all of it and restores the random states at the first rollout start of the resumed ``learn()``,
the point where the checkpoint was taken, so the resumed run continues the interrupted one exactly (tested bit for
bit against an uninterrupted run). A checkpoint is not taken in the rollout right after a task switch (an
intervention told of the switch acts at the next rollout start, from state the callback object holds). A
checkpoint that cannot be written (an env that does not pickle) is reported once and checkpointing is off for
that run; the run itself goes on.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

#: default wall seconds between two checkpoints of a run in progress
CHECKPOINT_SECONDS = 600.0
_LATEST = "latest"
#: the signal that asks the runs of a process to checkpoint at their next rollout start and stop
STOP_SIGNAL = signal.SIGUSR1
_stop = {"requested": False}


class RunStopped(RuntimeError):
    """A run stopped on request (:data:`STOP_SIGNAL`), its checkpoint saved: the same command resumes it."""


def request_stop(*_: Any) -> None:
    """Ask every run of this process to checkpoint at its next rollout start and stop (the signal handler)."""
    _stop["requested"] = True


def stop_requested() -> bool:
    """Whether a stop was requested in this process (:func:`request_stop`)."""
    return _stop["requested"]


def clear_stop() -> None:
    """Forget a stop request (tests, and a process that goes on after one)."""
    _stop["requested"] = False


def install_stop_handler() -> Any:
    """Make :data:`STOP_SIGNAL` request a stop (:func:`request_stop`) instead of ending the process at once; returns
    the handler it replaces (``None`` outside the main thread, where Python lets no handler be set)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(STOP_SIGNAL, request_stop)


def latest(root: str) -> Optional[str]:
    """The folder of the newest complete checkpoint under ``root`` (``None``: none)."""
    try:
        with open(os.path.join(root, _LATEST)) as f:
            folder = os.path.join(root, f.read().strip())
    except OSError:
        return None
    return folder if os.path.isfile(os.path.join(folder, "state.pkl")) else None


def save(root: str, model: Any, extra: dict[str, Any]) -> str:
    """Write a checkpoint of ``model``, its env, the global random states and ``extra`` under ``root``; the previous
    checkpoint is removed once this one is complete (a checkpoint being written is never the ``latest``)."""
    import torch as th

    name = f"step{int(model.num_timesteps)}"
    folder, tmp = os.path.join(root, name), os.path.join(root, name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save(os.path.join(tmp, "model.zip"))
    if getattr(model, "replay_buffer", None) is not None:
        save_buffer(model.replay_buffer, os.path.join(tmp, "replay_buffer"))
    with open(os.path.join(tmp, "env.pkl"), "wb") as f:
        f.write(dumps_env(model.get_env()))
    state = dict(extra, rng=(th.get_rng_state(), np.random.get_state(), random.getstate()),
                 action_space_rng=_space_rng(model).bit_generator.state)
    with open(os.path.join(tmp, "state.pkl"), "wb") as f:
        pickle.dump(state, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    with open(os.path.join(root, _LATEST + ".tmp"), "w") as f:
        f.write(name)
    os.replace(os.path.join(root, _LATEST + ".tmp"), os.path.join(root, _LATEST))
    for old in os.listdir(root):
        if old.startswith("step") and old != name:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return folder


#: the tag of a pickled VecNormalize in :func:`dumps_env` (a plain env is pickled as itself, as before it existed)
_VEC_NORMALIZE = "VecNormalize"


def dumps_env(env: Any) -> bytes:
    """The bytes of a vector env, episodes in progress and random generators included, for :func:`loads_env`.

    cloudpickle of the env itself, except for SB3's ``VecNormalize``: its ``__getstate__`` leaves out the env it
    wraps and its discounted returns (SB3 saves the statistics alone and expects ``set_venv`` after loading), so
    it is written as ``("VecNormalize", wrapper, returns, dumps_env(wrapped env))``: the running observation and
    return statistics, the wrapped env and the returns all come back. A ``VecNormalize`` below another wrapper
    would lose its env: that raises ``TypeError`` (the checkpointer then warns and goes on without checkpoints).
    Envs that pickle through gymnasium's ``EzPickle`` are rebuilt from their constructor arguments: the Slippery
    MuJoCo envs carry their simulation and generator through (``SlipperyFriction.__getstate__``); Box2D's
    LunarLander comes back without its episode in progress (it must be reset before it steps) and with an unseeded
    generator: its C-CHAIN setting resets the env at every rollout start, where checkpoints are written, so a resumed
    run is unbiased but not bit for bit the uninterrupted one.
    """
    import cloudpickle
    from stable_baselines3.common.vec_env import VecEnvWrapper, VecNormalize

    if isinstance(env, VecNormalize):
        return cloudpickle.dumps((_VEC_NORMALIZE, env, env.returns, dumps_env(env.venv)))
    inner = env
    while isinstance(inner, VecEnvWrapper):
        inner = inner.venv
        if isinstance(inner, VecNormalize):
            raise TypeError(f"a VecNormalize below {type(env).__name__} cannot be checkpointed (it pickles without "
                            "its env); wrap it outermost")
    return cloudpickle.dumps(env)


def loads_env(data: bytes) -> Any:
    """The vector env :func:`dumps_env` wrote (a checkpoint written before it existed holds the pickled env
    itself, which is read the same way)."""
    import cloudpickle

    env = cloudpickle.loads(data)
    if isinstance(env, tuple) and env and env[0] == _VEC_NORMALIZE:
        _, wrapper, returns, inner = env
        wrapper.set_venv(loads_env(inner))
        wrapper.returns = returns
        return wrapper
    return env


def save_buffer(buffer: Any, path: str) -> None:
    """Write a replay buffer compactly: its arrays to ``path.npz`` (``np.savez_compressed``; boolean arrays, e.g.
    MinAtar frames, bit-packed first: a 1e5-transition C-MinAtar buffer is ~200 MB pickled), everything else
    (its class, sizes, position, device) to ``path.pkl``."""
    import cloudpickle

    arrays, rest = {}, {}
    for key, value in vars(buffer).items():
        if isinstance(value, np.ndarray) and value.dtype == bool:
            arrays[key + "__bits"], arrays[key + "__shape"] = np.packbits(value.ravel()), np.asarray(value.shape)
        elif isinstance(value, np.ndarray):
            arrays[key] = value
        else:
            rest[key] = value
    np.savez_compressed(path + ".npz", **arrays)
    with open(path + ".pkl", "wb") as f:
        cloudpickle.dump((type(buffer), rest), f)


def load_buffer(path: str) -> Any:
    """The replay buffer :func:`save_buffer` wrote to ``path``."""
    import cloudpickle

    with open(path + ".pkl", "rb") as f:
        cls, rest = cloudpickle.load(f)
    buffer = cls.__new__(cls)
    vars(buffer).update(rest)
    with np.load(path + ".npz") as data:
        for key in data.files:
            if key.endswith("__bits"):
                name, shape = key[: -len("__bits")], tuple(data[key[: -len("__bits")] + "__shape"])
                vars(buffer)[name] = np.unpackbits(data[key], count=int(np.prod(shape))).astype(bool).reshape(shape)
            elif not key.endswith("__shape"):
                vars(buffer)[key] = data[key]
    return buffer


def load(folder: str, cls: Any, device: str, tensorboard_log: Optional[str]) -> tuple[Any, dict[str, Any]]:
    """The model of the checkpoint ``folder`` (class ``cls``, or a subclass of the same name that rebuilds injected
    branches) on its pickled env, not reset (``force_reset=False``:
    the episodes in progress continue), with its replay buffer; and the checkpoint's state (``extra`` and ``rng``)."""
    from sb3_plastic.callbacks.plasticity_injection import load_injected

    with open(os.path.join(folder, "env.pkl"), "rb") as f:
        env = loads_env(f.read())
    # a plasticity injection (a callback on a plain SB3 class too) added branches: rebuilt before the parameters load
    model = load_injected(cls, os.path.join(folder, "model.zip"), env=env, device=device, force_reset=False)
    # SB3's load seeds the env again (set_random_seed in _setup_model), which the next VecEnv.reset() would apply: a
    # seeded reset starts an sb3_plastic env's task sequence afresh (and every episode from the seed). The pickled env
    # carries its own generators and position, so the pending seeds are dropped (a rollout_reset setting resets the
    # env at every rollout start).
    vec = model.get_env()
    if hasattr(vec, "_reset_seeds"):
        vec._reset_seeds()
    model.tensorboard_log = tensorboard_log
    buffer = os.path.join(folder, "replay_buffer")
    if os.path.exists(buffer + ".npz"):
        model.replay_buffer = load_buffer(buffer)
    with open(os.path.join(folder, "state.pkl"), "rb") as f:
        state = pickle.load(f)
    return model, state


def _space_rng(model: Any) -> np.random.Generator:
    # the action space's own generator: SB3's epsilon-greedy exploration draws its random actions from it
    return model.action_space.np_random


def restore_rng(state: dict[str, Any], model: Any) -> None:
    """Set the global random states saved in a checkpoint's ``state``, and that of ``model``'s action space
    (SB3's ``load`` does not bring it back)."""
    import torch as th

    torch_state, numpy_state, python_state = state["rng"]
    th.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    random.setstate(python_state)
    if "action_space_rng" in state:  # (checkpoints of commit 2e06cce lack it: PPO runs, which never draw from it)
        _space_rng(model).bit_generator.state = state["action_space_rng"]


def checkpointer(root: str, every_seconds: Optional[float], extra: Callable[[], dict[str, Any]],
                 restore: Optional[Callable[[], None]] = None) -> Any:
    """The SB3 callback that checkpoints a run (put it first in the callback list).

    :param root: the run's checkpoint folder.
    :param every_seconds: wall seconds between two checkpoints (0: at every rollout start; ``None``: never).
    :param extra: what to save besides the model, the env and the random states (called at each checkpoint).
    :param restore: for a resumed run: called at its first rollout start (set the random states and the other
        callbacks' internals there, after their ``_on_training_start``).
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class Checkpointer(BaseCallback):
        def _on_training_start(self) -> None:
            self._last = time.monotonic()
            self._task: Any = None
            self._switched = False
            self._restore = restore
            self._every = every_seconds

        def _on_step(self) -> bool:
            infos = self.locals.get("infos") or [{}]
            task = infos[0].get("task_id")
            if task != self._task:
                self._switched = self._switched or self._task is not None
                self._task = task
            return True

        def _on_rollout_start(self) -> None:
            if self._restore is not None:
                do, self._restore = self._restore, None
                do()
                self._last = time.monotonic()
                if stop_requested():  # the checkpoint it resumed from is still the latest
                    raise RunStopped(f"stopped on request at step {self.num_timesteps}, its checkpoint under {root}")
                return
            if self._switched:  # no checkpoint here (and a requested stop waits for the next rollout start)
                self._switched = False
                return
            stopping = stop_requested()
            if not stopping and (self._every is None or time.monotonic() - self._last < self._every):
                return
            if stopping and self._every is None:
                raise RunStopped(f"stopped on request at step {self.num_timesteps} without a checkpoint (checkpointing "
                                 "is off for this run): it starts again")
            try:
                folder = save(root, self.model, extra())
            except Exception as exc:  # reported; the run goes on without checkpoints
                warnings.warn(f"checkpoint of {root} failed ({type(exc).__name__}: {exc}); checkpointing is off for "
                              "this run", stacklevel=2)
                self._every = None
                if stopping:
                    raise RunStopped(f"stopped on request at step {self.num_timesteps}; its checkpoint failed: it "
                                     "starts again") from exc
            else:
                if stopping:
                    raise RunStopped(f"stopped on request at step {self.num_timesteps}, checkpoint {folder}")
            self._last = time.monotonic()

    return Checkpointer()
