"""Evaluation on a continual (piecewise-stationary) env measures the task the agent is training on now.

SB3's :class:`~stable_baselines3.common.callbacks.EvalCallback` evaluates on a separate env whose copies count
their own steps: with a :class:`~sb3_plastic.envs.PiecewiseStationaryWrapper` env that copy switches tasks at
its own pace (after ``change_every`` *evaluation* steps), so ``evaluations.npz``, ``best_model.zip`` and an
optuna objective built on it mostly measure task 0. :class:`ContinualEvalCallback` pins every evaluation copy
to the task the agent is training on before each evaluation (the task of the training step just taken:
:meth:`TaskFollowingEvalMixin.trained_task`; :meth:`~sb3_plastic.envs.PiecewiseStationaryWrapper.pin_task`)
and records which task each evaluation measured. :func:`continual_eval_callback_class` gives the same
behaviour to any ``EvalCallback`` subclass (sb3-contrib's ``MaskableEvalCallback``, rl_zoo3's
``TrialEvalCallback``): the mechanism lives once, in :class:`TaskFollowingEvalMixin`.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Optional

import numpy as np
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.vec_env import VecEnv

from sb3_plastic.callbacks.base import iter_callbacks
from sb3_plastic.callbacks.schedule import piecewise_stationary_copies
from sb3_plastic.callbacks.triggers import is_int

#: Name of the extra array of ``evaluations.npz``: the task index each evaluation measured.
TASK_IDS_KEY = "task_ids"


def current_task(env: VecEnv, index: int = 0) -> Optional[int]:
    """The task copy ``index`` of ``env`` runs now (its ``task_id``; ``None`` before its first ``reset()``).

    Read with ``get_attr``, which SB3's vector-env wrappers forward and which resolves through gymnasium
    wrappers with ``get_wrapper_attr`` (gymnasium 1.x wrappers do not forward attributes themselves).

    :param env: a vector env whose copy ``index`` is piecewise-stationary.
    :param index: the copy to ask.
    """
    return env.get_attr("task_id", indices=[index])[0]


class TaskFollowingEvalMixin:
    """Put in front of an ``EvalCallback`` class: each evaluation runs on the task the agent is training on.

    At training start the training env and the eval env are checked for
    :class:`~sb3_plastic.envs.PiecewiseStationaryWrapper` copies:

    * both piecewise-stationary: before every evaluation the task of the training step just taken by the first
      such training copy (copy 0 normally; ``infos[copy]["task_id"]`` of that step, :meth:`trained_task`) is
      read, so an evaluation at a task boundary measures the task just trained, never the next one that the
      vector env's automatic reset may already have started; every piecewise-stationary eval copy
      is pinned to it (``pin_task``; the evaluation's first ``reset()`` applies it), ``eval/task_id`` is
      logged with SB3's ``eval/...`` values, the task is appended to :attr:`evaluation_task_ids` and saved as
      the extra array ``task_ids`` of ``evaluations.npz`` (next to SB3's ``timesteps``, ``results``,
      ``ep_lengths``; one entry per evaluation);
      An eval env made from another env id or with other kwargs than the training env (apart from
      :data:`EVAL_KWARGS_MAY_DIFFER`), or with another ``task_seed``, is warned about;
    * neither: nothing changes, the callback is the base class exactly (same evaluations, same files);
    * only one of them: a warning says so and the base class's behaviour is kept (a stationary eval env
      cannot follow the task; a piecewise-stationary eval env with a stationary training env runs its own
      schedule, counted in evaluation steps).

    ``best_model.zip`` is the base class's: the model of the evaluation with the highest mean return over
    the whole run. On a continual env that compares evaluations of different tasks (an easy task wins), so
    it is not "the best agent"; use ``evaluations.npz`` (``results`` with ``task_ids``) to compare
    evaluations of the same task.

    Every evaluation's mean return is also kept in :attr:`evaluation_mean_rewards` (stationary or not);
    :meth:`mean_evaluation_reward` is their mean, the area under the evaluation curve divided by the number
    of evaluations (the tuning objective of :mod:`sb3_plastic.zoo` on continual envs; with ``max_timesteps``
    only the evaluations within that budget count, the model's ``num_timesteps`` of each being kept in
    :attr:`evaluation_num_timesteps`).
    """

    eval_env: VecEnv
    training_env: VecEnv
    eval_freq: int
    n_calls: int
    log_path: Optional[str]
    last_mean_reward: float
    verbose: int
    evaluations_timesteps: list[int]
    evaluations_results: list[list[float]]
    evaluations_length: list[list[int]]
    evaluations_successes: list[list[bool]]
    _is_success_buffer: list[bool]

    def __init__(self, *args: Any, eval_at_task_start: bool = False, **kwargs: Any) -> None:
        if not isinstance(eval_at_task_start, bool):
            raise ValueError(f"eval_at_task_start must be True or False, got {eval_at_task_start!r}")
        super().__init__(*args, **kwargs)
        #: Whether to evaluate also at the first step of the run and of every new task (zero-shot; see the class).
        self.eval_at_task_start = eval_at_task_start
        #: The training task of the last step (what :attr:`eval_at_task_start` compares against).
        self.last_task: Optional[int] = None
        if not is_int(self.eval_freq):  # SB3 compares n_calls % eval_freq == 0: a string crashes, 10.5 means 21
            raise ValueError(
                f"eval_freq must be an int (evaluate every eval_freq calls: steps of the vector env), got {self.eval_freq!r}"
            )
        if self.eval_freq <= 0:  # EvalCallback evaluates when eval_freq > 0 and n_calls % eval_freq == 0
            warnings.warn(
                f"{type(self).__name__}(eval_freq={self.eval_freq!r}) never evaluates: it evaluates every eval_freq "
                "calls (steps of the vector env) when eval_freq > 0; give eval_freq > 0, or leave the callback out",
                stacklevel=3,
            )
        #: Whether evaluations follow the training task (set at training start).
        self.follows_task = False
        #: The task index of each evaluation that followed the training task.
        self.evaluation_task_ids: list[int] = []
        #: The mean return of each evaluation.
        self.evaluation_mean_rewards: list[float] = []
        #: The model's ``num_timesteps`` at each evaluation (one entry per :attr:`evaluation_mean_rewards`).
        self.evaluation_num_timesteps: list[int] = []
        self._training_copy = 0
        self._eval_copies: list[int] = []

    def _init_callback(self) -> None:
        super()._init_callback()  # type: ignore[misc]
        training = piecewise_stationary_copies(self.training_env)
        evaluation = piecewise_stationary_copies(self.eval_env)
        self.follows_task = bool(training) and bool(evaluation)
        if self.follows_task:
            self._training_copy, self._eval_copies = training[0], evaluation
            train_seed = self.training_env.get_attr("schedule", indices=[training[0]])[0].task_seed
            eval_seeds = sorted({schedule.task_seed for schedule in self.eval_env.get_attr("schedule", indices=evaluation)})
            if eval_seeds != [train_seed]:
                warnings.warn(
                    f"{type(self).__name__}: the eval env's task_seed {eval_seeds} differs from the training env's "
                    f"{train_seed}: a pinned task index then means a different task; give both the same task_seed",
                    stacklevel=2,
                )
            self._check_eval_env_kwargs(training[0], evaluation)
        elif training:
            warnings.warn(
                f"{type(self).__name__}: the training env is piecewise-stationary but the eval env is not: "
                "evaluations measure a stationary env, not the task being trained; make the eval env with the "
                "same piecewise-stationary env id/wrapper as the training env",
                stacklevel=2,
            )
        elif evaluation:
            warnings.warn(
                f"{type(self).__name__}: the eval env is piecewise-stationary but the training env is not: the "
                "eval env runs its own task schedule (counted in evaluation steps), unrelated to training",
                stacklevel=2,
            )

    def _check_eval_env_kwargs(self, training_copy: int, eval_copies: list[int]) -> None:
        """Warn when the eval env is made from another env id or with other kwargs than the training env.

        Compared: the gymnasium spec's ``id`` and ``kwargs`` (the constructor's defaults filled in) of training copy
        ``training_copy`` and of every eval copy in ``eval_copies``. Not compared: :data:`EVAL_KWARGS_MAY_DIFFER`
        (a pinned eval copy never follows its own schedule; ``task_seed`` is checked on its own). Envs without a
        spec (made without ``gym.make``) are not compared.
        """
        train_spec = self.training_env.get_attr("spec", indices=[training_copy])[0]
        if train_spec is None:
            return
        train_kwargs = _spec_kwargs(train_spec)
        for spec in self.eval_env.get_attr("spec", indices=eval_copies):
            if spec is None:
                continue
            if spec.id != train_spec.id:
                warnings.warn(
                    f"{type(self).__name__}: the eval env is {spec.id}, the training env {train_spec.id}: evaluations "
                    "then measure another env; make the eval env with the training env's id and kwargs",
                    stacklevel=3,
                )
                return
            eval_kwargs = _spec_kwargs(spec)
            keys = sorted(k for k in set(train_kwargs) | set(eval_kwargs)
                          if k not in EVAL_KWARGS_MAY_DIFFER and not _same(train_kwargs.get(k), eval_kwargs.get(k)))
            if keys:
                warnings.warn(
                    f"{type(self).__name__}: the eval env's kwargs {({k: eval_kwargs.get(k) for k in keys})} differ from "
                    f"the training env's {({k: train_kwargs.get(k) for k in keys})}: evaluations then measure another "
                    "env; make the eval env with the training env's kwargs",
                    stacklevel=3,
                )
                return

    def trained_task(self) -> Optional[int]:
        """The task of the training step just taken (the one this callback's ``_on_step`` follows).

        Read from that step's info (``self.locals["infos"][copy]["task_id"]``, which SB3's algorithms hand to
        their callbacks), not from the env's current task: when the step ended an episode at a task boundary
        (always so for game switching, which truncates the last step of a task, and for any env whose episode
        length divides ``change_every``), the vector env's automatic reset has already started the next task,
        on which the agent has not trained. Falls back to the env's current task (:func:`current_task`) when
        no step info is available (``None`` before the env's first ``reset()``).
        """
        infos = getattr(self, "locals", {}).get("infos")
        if infos is not None and len(infos) > self._training_copy:
            task = infos[self._training_copy].get("task_id")
            if task is not None:
                return int(task)
        task = current_task(self.training_env, self._training_copy)
        return None if task is None else int(task)

    def _follow_training_task(self) -> Optional[int]:
        task = self.trained_task()
        if task is None:  # cannot happen inside learn() (SB3 resets the env first); evaluate as the base class
            warnings.warn(f"{type(self).__name__}: the training env has no task yet; the eval env is not pinned")
            return None
        task = int(task)
        self.eval_env.env_method("pin_task", task, indices=self._eval_copies)
        self.logger.record("eval/task_id", task)  # type: ignore[attr-defined]
        if self.verbose >= 1:
            print(f"Eval on the training task {task}")
        return task

    def _on_step(self) -> bool:
        due = self.eval_freq > 0 and self.n_calls % self.eval_freq == 0  # EvalCallback's own condition
        start = False
        if self.eval_at_task_start and self.follows_task:
            trained = self.trained_task()
            start, self.last_task = trained is not None and trained != self.last_task, trained
        task = self._follow_training_task() if (due or start) and self.follows_task else None
        if start and not due:  # EvalCallback evaluates when n_calls % eval_freq == 0: make it so for this call
            eval_freq, self.eval_freq = self.eval_freq, 1
            try:
                continue_training = super()._on_step()  # type: ignore[misc]
            finally:
                self.eval_freq = eval_freq
            due = True
        else:
            continue_training = super()._on_step()  # type: ignore[misc]
        if due:
            self.evaluation_mean_rewards.append(float(self.last_mean_reward))
            self.evaluation_num_timesteps.append(int(self.num_timesteps))  # type: ignore[attr-defined]
            if task is not None:
                self.evaluation_task_ids.append(task)
                if self.log_path is not None:
                    self._save_evaluations()
        return continue_training

    def _save_evaluations(self) -> None:
        """Write ``evaluations.npz`` again, as the base class did, plus ``task_ids``."""
        kwargs: dict[str, Any] = {}
        if len(self._is_success_buffer) > 0:  # the base class's condition for writing ``successes``
            kwargs["successes"] = self.evaluations_successes
        assert self.log_path is not None
        np.savez(
            self.log_path,
            timesteps=self.evaluations_timesteps,
            results=self.evaluations_results,
            ep_lengths=self.evaluations_length,
            **{TASK_IDS_KEY: np.asarray(self.evaluation_task_ids, dtype=np.int64)},
            **kwargs,
        )

    def evaluations_within(self, max_timesteps: Optional[int] = None) -> list[float]:
        """The mean returns of the evaluations made at ``num_timesteps <= max_timesteps`` (all for ``None``).

        :param max_timesteps: the budget (e.g. the ``total_timesteps`` asked of ``learn()``: SB3 may train on to
            the next rollout boundary, and evaluations after the budget measure more training than asked for).
        :raises ValueError: for a ``max_timesteps`` that is not a non-negative integer or ``None``.
        """
        if max_timesteps is None:
            return list(self.evaluation_mean_rewards)
        if isinstance(max_timesteps, bool) or not isinstance(max_timesteps, (int, np.integer)) or max_timesteps < 0:
            raise ValueError(f"max_timesteps must be a non-negative integer or None, got {max_timesteps!r}")
        return [r for r, t in zip(self.evaluation_mean_rewards, self.evaluation_num_timesteps) if t <= max_timesteps]

    def mean_evaluation_reward(self, max_timesteps: Optional[int] = None) -> float:
        """Mean over the evaluations so far of each evaluation's mean return (``-inf`` before the first one).

        :param max_timesteps: count only the evaluations made at ``num_timesteps <= max_timesteps``
            (:meth:`evaluations_within`); ``None``: all of them. When none is within it, all of them count, with a
            warning.
        """
        rewards = self.evaluations_within(max_timesteps)
        if not rewards and self.evaluation_mean_rewards:
            warnings.warn(
                f"{type(self).__name__}: no evaluation at num_timesteps <= max_timesteps={max_timesteps} (evaluations "
                f"at {self.evaluation_num_timesteps}); the mean is over all of them",
                stacklevel=2,
            )
            rewards = self.evaluation_mean_rewards
        if not rewards:
            return float("-inf")
        return float(np.mean(rewards))


#: Env kwargs that may differ between the training and the eval env: the schedule's timing (a pinned eval copy
#: never switches on its own), the task seed (checked on its own) and rendering.
EVAL_KWARGS_MAY_DIFFER: frozenset[str] = frozenset({"change_every", "at_episode_end", "task_seed", "render_mode"})


def _spec_kwargs(spec: Any) -> dict[str, Any]:
    """The kwargs an env was made with: ``spec.kwargs`` over the defaults of its entry point's signature."""
    kwargs: dict[str, Any] = {}
    try:
        from gymnasium.envs.registration import load_env_creator

        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
        for name, parameter in inspect.signature(creator).parameters.items():
            if parameter.default is not inspect.Parameter.empty and parameter.kind in (
                parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY
            ):
                kwargs[name] = parameter.default
    except Exception:  # an entry point that cannot be inspected: compare the given kwargs only
        kwargs = {}
    kwargs.update(spec.kwargs or {})
    return kwargs


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.all(a == b)) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else bool(a == b)
    except Exception:
        return repr(a) == repr(b)


class ContinualEvalCallback(TaskFollowingEvalMixin, EvalCallback):
    """SB3's :class:`~stable_baselines3.common.callbacks.EvalCallback` whose evaluations follow the training task.

    Same arguments and outputs as ``EvalCallback``; on a piecewise-stationary env every evaluation runs on
    the task the agent is training on at that moment, ``evaluations.npz`` gets a ``task_ids`` array and
    ``eval/task_id`` is logged (:class:`TaskFollowingEvalMixin`). On a stationary env it is ``EvalCallback``.

    Example::

        eval_env = make_vec_env("sb3_plastic/PermutedMinAtar-Breakout-v0", n_envs=1, env_kwargs=dict(change_every=100_000))
        model.learn(1_000_000, callback=ContinualEvalCallback(eval_env, eval_freq=10_000, log_path="logs/"))

    With ``eval_at_task_start=True`` it also evaluates at the first step of the run and at the first step of every
    new task, on that task, before any update on it (a zero-shot evaluation: what C-CHAIN's continual MinAtar runs log
    at every game's start, Tang et al., 2025); :attr:`last_task` holds the task of the last step (a new callback, e.g.
    on a resumed run, counts its first step as a task start).

    Resuming: like ``EvalCallback`` it keeps nothing in the model's zip. The callback of a resumed run
    (load -> ``learn(..., reset_num_timesteps=False)``) counts ``eval_freq`` from the resume, so its evaluations fall
    on the uninterrupted run's steps only when the resume is a multiple of ``eval_freq * n_envs`` timesteps, and its
    ``evaluations.npz`` holds only its own evaluations: give it another ``log_path`` (or keep the first part's file),
    or the earlier evaluations are overwritten. With the same eval env (or one in the same state) the two parts'
    files concatenate to the uninterrupted run's (``tests/test_resume_matrix.py``).

    :param eval_env: the evaluation env (the same env id / wrappers as the training env).
    :param args: ``EvalCallback``'s other arguments.
    :param eval_at_task_start: also evaluate when the training task changes, and at the first step (default
        ``False``: ``EvalCallback``'s schedule only). Needs piecewise-stationary training and eval envs.
    :param kwargs: ``EvalCallback``'s keyword arguments.
    """


_CONTINUAL_CLASSES: dict[type, type] = {EvalCallback: ContinualEvalCallback}


def continual_eval_callback_class(base: type) -> type:
    """The subclass of the ``EvalCallback`` class ``base`` whose evaluations follow the training task
    (:class:`TaskFollowingEvalMixin` in front of ``base``; one class per ``base``, ``base`` itself if it
    already follows the task).

    :param base: ``EvalCallback`` or a subclass (``MaskableEvalCallback``, rl_zoo3's ``TrialEvalCallback``, ...).
    """
    if not (isinstance(base, type) and issubclass(base, EvalCallback)):
        raise TypeError(f"base must be an EvalCallback class, got {base!r}")
    if issubclass(base, TaskFollowingEvalMixin):
        return base
    if base not in _CONTINUAL_CLASSES:
        _CONTINUAL_CLASSES[base] = type(
            f"Continual{base.__name__}",
            (TaskFollowingEvalMixin, base),
            {"__doc__": f"``{base.__name__}`` whose evaluations follow the training task (TaskFollowingEvalMixin).",
             "__module__": __name__},
        )
    return _CONTINUAL_CLASSES[base]


def warn_plain_eval_on_continual_env(callback: Any) -> None:
    """Warn for every ``EvalCallback`` in ``callback`` (a callback, a list or a ``CallbackList``) that does not
    follow the training task while its eval env is piecewise-stationary (it would evaluate task 0 mostly)."""
    for found in iter_callbacks(callback):
        if not isinstance(found, EvalCallback) or isinstance(found, TaskFollowingEvalMixin):
            continue
        if piecewise_stationary_copies(found.eval_env):
            warnings.warn(
                f"{type(found).__name__} evaluates on a piecewise-stationary env with its own task schedule (counted "
                "in evaluation steps), not on the task being trained: use sb3_plastic.callbacks.ContinualEvalCallback "
                "(or continual_eval_callback_class) to evaluate the training task",
                stacklevel=3,
            )
