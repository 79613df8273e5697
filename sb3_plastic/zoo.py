"""Run the plastic algorithms through rl-baselines3-zoo (``rl_zoo3``) itself.

:func:`train` and :func:`enjoy` take rl_zoo3's own command line (every option works unchanged: eval,
checkpoints, ``-tb``, ``-optimize``, ``--storage``/``--study-name``, ``--trial-id``, ``-params``, ...).
Before handing over, :func:`register`

* adds every plastic algorithm exported by :mod:`sb3_plastic` (``PlasticPPO`` -> ``plastic_ppo``,
  ``PlasticDQN`` -> ``plastic_dqn``, ``PlasticSAC`` -> ``plastic_sac``, ``PlasticQRDQN`` -> ``plastic_qrdqn``,
  ``PlasticTQC`` -> ``plastic_tqc``,
  ``PlasticCrossQ`` -> ``plastic_crossq``, ``PlasticRecurrentPPO`` -> ``plastic_ppo_lstm`` (rl_zoo3's ``ppo_lstm``);
  ``PlasticMaskablePPO`` -> ``plastic_ppo_mask``, after upstream rl-zoo's ``ppo_mask``, as rl_zoo3 2.9.2 has no
  MaskablePPO: :data:`EXTRA_BASE_ZOO_NAMES`) to rl_zoo3's algorithm table ``ALGOS``, the way the ``sbx`` project's
  ``train_sbx.py`` does. The table is one ``dict`` that ``rl_zoo3``, ``rl_zoo3.utils``, ``.train``,
  ``.enjoy``, ``.exp_manager``, ... all imported by name: it is updated in place, and every loaded
  ``rl_zoo3`` module holding an ``ALGOS`` dict is checked, so each of them sees the plastic algorithms;
* adds the plastic optuna samplers (:mod:`sb3_plastic.samplers`) to ``HYPERPARAMS_SAMPLER`` and their
  converters to ``HYPERPARAMS_CONVERTER`` (used by ``--trial-id``) the same way;
* imports :mod:`sb3_plastic.envs` (registers the ``sb3_plastic/...`` gymnasium ids) and registers the
  MinAtar ids (``MinAtar/Breakout-v1``, ...; they exist only after ``minatar.gym.register_envs()``, which
  :func:`train` / :func:`enjoy` call when ``--env`` starts with ``MinAtar/``: importing minatar takes seconds);
* makes the public names of :mod:`sb3_plastic` (``MaxMin``, ``PlasticCNN``, ``PlasticMLP``, ``AdamO``, ...)
  and the module ``sb3_plastic`` usable in yaml strings: rl_zoo3 turns ``policy_kwargs`` /
  ``replay_buffer_kwargs`` strings into objects with a bare ``eval`` in the namespace of
  ``rl_zoo3.exp_manager`` (and ``-params`` values with ``eval`` in ``rl_zoo3.utils``), so the names are
  added to those two module namespaces (existing rl_zoo3 names are never replaced);
* has ``rl_zoo3.train`` use ``PlasticExperimentManager``, rl_zoo3's ``ExperimentManager`` with four
  additions: a misspelt hyperparameter of a plastic algorithm is an error naming the key and the allowed
  ones (rl_zoo3 would pass it on as a keyword argument), and so is an entry without ``policy`` (any algorithm;
  rl_zoo3 would die with ``TypeError: missing 'policy'``) and ``-i`` with a file that is not a whole model zip
  (SB3's load would raise from inside rl_zoo3); a trial that raises is recorded as failed
  (``TrialState.FAIL``, reason in the trial's ``fail_reason`` user attribute) instead of ending the study
  (rl_zoo3 prunes only ``AssertionError``/``ValueError`` raised inside ``learn``); with ``--storage``
  plus ``--study-name`` the study is created up front with retries, so many workers can start at once on
  a fresh database; and when training continues (``-i model.zip``) the config's intervention keywords
  (``fire_at``, ``replacement_rate``, ...) are applied to the loaded model (SB3's ``load`` would only store
  them as unused attributes), while its network/optimizer settings are kept, with a warning if they differ;
  the continued run also continues the model's ``num_timesteps`` (rl_zoo3 would restart it at 0): ``-n N``
  trains N more timesteps, and a continual env's task sequence goes on where the saved model left it
  (:class:`ContinuedTraining`).
  Without ``--eval-env-kwargs`` the eval env is made with the training env's ``env_kwargs``, the yaml's included
  (rl_zoo3 would pass it only the command line's ``--env-kwargs``).
  A maskable algorithm (``plastic_ppo_mask``) is also evaluated with action masks, during training
  (``--eval-freq``) and optuna trials (:func:`action_mask_evaluation`), and :func:`enjoy` plays it with masks.
  On a piecewise-stationary env the evaluations follow the training task (:func:`task_following_evaluation`) and
  the tuning objective is the mean over the trial's evaluations (:func:`continual_objective`);
* adds the launcher option ``--monitor EVERY`` to ``train``: a
  :class:`~sb3_plastic.callbacks.PlasticityMonitor` in the training run (``plasticity/...`` scalars with ``-tb``).

Without ``--algo`` the launcher trains ``plastic_ppo``; without ``-conf`` a plastic algorithm reads
``zoo_configs/<algo>.yml`` of this repository.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import inspect
import random
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

#: Keys of an rl_zoo3 yaml entry that rl_zoo3 consumes itself (never passed to the algorithm).
ZOO_KEYS: tuple[str, ...] = (
    "callback",
    "env_kwargs",
    "env_wrapper",
    "frame_stack",
    "monitor_kwargs",
    "n_envs",
    "n_timesteps",
    "noise_std",
    "noise_type",
    "normalize",
    "vec_env_wrapper",
)
#: Constructor arguments that rl_zoo3 sets from its command line (a yaml must not set them).
ZOO_SET_KEYS: tuple[str, ...] = ("env", "tensorboard_log", "seed", "verbose", "device")
#: The default algorithm of ``sb3-plastic train`` / ``enjoy``.
DEFAULT_ALGO = "plastic_ppo"
#: A worker stops after this many failed trials in a row (a broken setup must not loop for ever).
MAX_CONSECUTIVE_FAILURES = 10
#: Intervention keywords built into the networks (``nap``: NaP's layer norms): like the isometry keywords, a run
#: continued with ``-i`` keeps the trained model's value (``PlasticX.load`` refuses to change them).
FIXED_ON_LOAD: tuple[str, ...] = ("nap",)
#: ``--monitor EVERY`` of the ``train`` call in progress (``None``: no PlasticityMonitor added).
_MONITOR_EVERY: Optional[int] = None


class LauncherError(ValueError):
    """A launcher error: ``sb3-plastic train`` prints its message and exits with status 2 (no traceback)."""


class HyperparameterError(LauncherError):
    """A yaml entry (or ``-params``) names a hyperparameter the algorithm does not accept, or misses ``policy``."""


# --------------------------------------------------------------------------- algorithms
def zoo_name(cls: type) -> str:
    """rl_zoo3 name of a plastic algorithm class: ``plastic_`` + the rl_zoo3 name of its SB3 base."""
    return f"plastic_{base_zoo_name(cls)}"


#: Zoo names of the sb3-contrib algorithms that rl_zoo3 2.9.2's ``ALGOS`` lacks, by class name. MaskablePPO
#: lives in ``sb3_contrib.ppo_mask`` and upstream rl-baselines3-zoo calls it ``ppo_mask``; so
#: ``PlasticMaskablePPO`` is ``plastic_ppo_mask`` (``ALGOS`` is consulted first, should rl_zoo3 add it).
EXTRA_BASE_ZOO_NAMES: dict[str, str] = {"MaskablePPO": "ppo_mask"}


def base_zoo_name(cls: type) -> str:
    """rl_zoo3 name of the SB3 / sb3-contrib algorithm a plastic class extends (``PlasticPPO`` -> ``ppo``,
    ``PlasticMaskablePPO`` -> ``ppo_mask``: :data:`EXTRA_BASE_ZOO_NAMES`)."""
    from rl_zoo3 import hyperparams_opt  # noqa: F401  (the original table below is rl_zoo3's own)
    from rl_zoo3.utils import ALGOS

    for klass in cls.__mro__[1:]:
        for name, algo in ALGOS.items():
            if algo is klass and not name.startswith("plastic_"):
                return name
    for klass in cls.__mro__[1:]:
        if klass.__module__.startswith("sb3_contrib") and klass.__name__ in EXTRA_BASE_ZOO_NAMES:
            return EXTRA_BASE_ZOO_NAMES[klass.__name__]
    return cls.__name__.lower().removeprefix("plastic")


def plastic_algorithms() -> dict[str, type]:
    """The plastic algorithm classes exported by :mod:`sb3_plastic`, keyed by their rl_zoo3 name."""
    import sb3_plastic
    from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin

    found: dict[str, type] = {}
    for name in sorted(dir(sb3_plastic)):
        obj = getattr(sb3_plastic, name)
        if isinstance(obj, type) and issubclass(obj, PlasticAlgorithmMixin) and obj is not PlasticAlgorithmMixin:
            found[zoo_name(obj)] = obj
    return found


def accepted_keywords(cls: type) -> Optional[set[str]]:
    """Keyword arguments the constructor of ``cls`` accepts, following ``**kwargs`` up the MRO (the
    plastic mixin forwards them to SB3); ``None`` when some constructor takes arbitrary keywords."""
    from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin, intervention_keys

    names: set[str] = set()
    if issubclass(cls, PlasticAlgorithmMixin):
        names.update(intervention_keys())  # popped by the mixin out of its **kwargs
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names.discard("self")
            return names
    return None


def check_hyperparameters(algo: str, hyperparams: dict[str, Any], where: str = "") -> None:
    """Raise :class:`HyperparameterError` if ``hyperparams`` (an rl_zoo3 entry after rl_zoo3 removed its own
    keys) holds a key the algorithm ``algo`` does not accept, naming the key and the allowed ones."""
    from rl_zoo3.utils import ALGOS

    cls = ALGOS[algo]
    allowed = accepted_keywords(cls)
    if allowed is None:
        return
    allowed -= set(ZOO_SET_KEYS) | {"_init_setup_model"}
    preset = sorted(set(hyperparams) & set(ZOO_SET_KEYS))
    unknown = sorted(set(hyperparams) - allowed - set(ZOO_KEYS) - set(ZOO_SET_KEYS))
    if not unknown and not preset:
        return
    lines = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(allowed | set(ZOO_KEYS)), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        lines.append(f"unknown hyperparameter {key!r} for {algo} ({cls.__name__}){hint}")
    for key in preset:
        lines.append(f"hyperparameter {key!r} is set by rl_zoo3 from its command line; remove it from the config")
    plastic = _plastic_keys(cls)
    message = (f"{where}: " if where else "") + "; ".join(lines)
    message += (
        f".\nAllowed keys: rl_zoo3's own {sorted(ZOO_KEYS)}"
        + (f", the plastic keywords {sorted(plastic)}" if plastic else "")
        + f" and {cls.__name__}'s other arguments {sorted(allowed - plastic)}."
    )
    raise HyperparameterError(message)


def _plastic_keys(cls: type) -> set[str]:
    from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin, intervention_keys
    from sb3_plastic.config import ISOMETRY_KEYS

    if not issubclass(cls, PlasticAlgorithmMixin):
        return set()
    return set(ISOMETRY_KEYS) | set(intervention_keys())


# --------------------------------------------------------------------------- experiment manager
def _experiment_manager_class() -> type:
    from rl_zoo3.exp_manager import ExperimentManager

    class PlasticExperimentManager(ExperimentManager):
        """rl_zoo3's ``ExperimentManager`` with key validation, failure-tolerant trials and a study
        created up front (see :mod:`sb3_plastic.zoo`)."""

        _consecutive_failures = 0

        def _preprocess_hyperparams(self, hyperparams: dict[str, Any]) -> Any:
            result = super()._preprocess_hyperparams(hyperparams)
            # rl_zoo3 binds eval_env_kwargs to the command line's env_kwargs before it reads the yaml, then rebinds
            # env_kwargs to the yaml's: without --eval-env-kwargs the eval env would miss the yaml's env_kwargs
            # (another task schedule, task seed, even other spaces). It gets the training env's kwargs instead.
            if getattr(self, "_eval_env_kwargs_args", None) is None:
                self.eval_env_kwargs = self.env_kwargs
            where = f"{self.config} [{self.env_name.gym_id}]"
            if "policy" not in result[0]:  # rl_zoo3 would fail with "missing 'policy'" (TypeError) or a KeyError
                raise HyperparameterError(
                    f"{where}: the entry has no 'policy' key; every rl_zoo3 entry names its policy, e.g. "
                    "policy: 'MlpPolicy' (or 'CnnPolicy', 'MultiInputPolicy', a module.Class path)"
                )
            if self.algo in plastic_algorithms():
                check_hyperparameters(self.algo, result[0], where=where)
            return result

        def _load_pretrained_agent(self, hyperparams: dict[str, Any], env: Any) -> Any:
            # SB3's load() would store plastic keywords as plain attributes, without effect: apply the
            # intervention settings of the config to the loaded model; keep its network / optimizer
            # settings (they define the trained weights and optimizer state) and say so when they differ.
            from sb3_plastic.common.model_zip import read_data_text

            try:
                read_data_text(self.trained_agent)  # SB3's load would raise from deep inside rl_zoo3 (a traceback)
            except ValueError as exc:
                env.close()  # rl_zoo3 built it (its Monitor files open) and would train in it: nothing will now
                raise LauncherError(f"cannot continue from -i {self.trained_agent}: {exc}") from exc
            if self.algo not in plastic_algorithms():
                return super()._load_pretrained_agent(hyperparams, env)
            from sb3_plastic.common.plastic_algorithm import intervention_config_classes
            from sb3_plastic.config import ISOMETRY_KEYS

            groups = {key: {f.name for f in dataclasses.fields(cls)} for key, cls in intervention_config_classes().items()}
            plastic = set(ISOMETRY_KEYS).union(*groups.values())
            given = {key: hyperparams.pop(key) for key in list(hyperparams) if key in plastic}
            model = super()._load_pretrained_agent(hyperparams, env)
            for group, names in groups.items():
                update = {key: value for key, value in given.items() if key in names and key not in FIXED_ON_LOAD}
                if update:
                    model.intervention_configs[group] = dataclasses.replace(model.intervention_configs[group], **update)
            trained = {key: getattr(model.isometry_config, key) for key in ISOMETRY_KEYS}
            trained["nap"] = model.intervention_configs["nap"].nap  # NaP's layer norms are part of the networks
            kept = {key: value for key, value in trained.items() if key in given and given[key] != value}
            if kept:
                warnings.warn(
                    f"Continuing training of {self.trained_agent}: the trained model's network/optimizer settings "
                    f"{kept} are kept (the config asks for {({key: given[key] for key in kept})})"
                )
            return model

        def learn(self, model: Any) -> None:
            # rl_zoo3 calls model.learn(n_timesteps): a run continued with -i would restart num_timesteps at 0,
            # and with it the task schedule and FIRE's run. Continue the model's clock instead.
            super().learn(ContinuedTraining(model) if self.continue_training else model)

        def create_callbacks(self) -> None:
            with action_mask_evaluation(self.algo), task_following_evaluation():
                super().create_callbacks()
            import os

            from sb3_plastic.run_info import RunInfoCallback

            # run metadata next to the TensorBoard events (plain algorithms too), for `sb3-plastic plot`
            self.callbacks.append(RunInfoCallback(zoo_algo=self.algo, zoo_log_dir=os.path.abspath(self.params_path)))
            if _MONITOR_EVERY is not None:
                if self.optimize_hyperparameters:
                    warnings.warn(
                        f"--monitor {_MONITOR_EVERY} does nothing with -optimize: optuna trials write no TensorBoard "
                        "logs (rl_zoo3 builds them with tensorboard_log=None)"
                    )
                else:
                    from sb3_plastic.callbacks import PlasticityMonitor

                    self.callbacks.append(PlasticityMonitor(every=_MONITOR_EVERY))

        def objective(self, trial: Any) -> float:
            """rl_zoo3's objective, with evaluations that follow the training task on a continual env.

            On a stationary env this is rl_zoo3's objective unchanged: the mean return of the trial's last
            evaluation. On a piecewise-stationary env (the eval env's copies are
            :class:`~sb3_plastic.envs.PiecewiseStationaryWrapper`), every evaluation runs on the task being
            trained at that moment (:class:`~sb3_plastic.callbacks.ContinualEvalCallback`'s mechanism) and the
            objective is the **mean over all evaluations of the trial of each evaluation's mean return**: the
            average performance over the run, i.e. the area under the evaluation curve divided by the number of
            evaluations, counting only the evaluations made within the trial's budget ``-n`` (SB3 trains on to
            the next rollout boundary: :func:`continual_objective`). Continual learning is about staying good on
            every new task, so neither the last evaluation (one task, and noisy) nor the best (an easy task wins)
            measures it. Each evaluation's mean return is still reported to optuna as the intermediate value of
            its evaluation index, as rl_zoo3 does, so pruning works unchanged. The trial's user attribute
            ``objective`` names the quantity returned (``"mean_over_evaluations"`` or ``"last_evaluation"``).
            """
            import optuna

            try:
                with action_mask_evaluation(self.algo), task_following_evaluation() as created:
                    value = super().objective(trial)
                value = continual_objective(created, value, trial, n_timesteps=self.n_timesteps)
            except optuna.TrialPruned:
                self._consecutive_failures = 0
                raise
            except Exception as exc:
                self._consecutive_failures += 1
                reason = f"{type(exc).__name__}: {exc}"
                print(f"Trial {trial.number} failed ({reason}); the study goes on.", file=sys.stderr)
                traceback.print_exc()
                trial.set_user_attr("fail_reason", reason[:1000])
                if self._consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    print(f"{self._consecutive_failures} trials in a row failed: this worker stops.", file=sys.stderr)
                    trial.study.stop()
                return float("nan")  # optuna records the trial as FAIL and continues
            self._consecutive_failures = 0
            return value

        def hyperparameters_optimization(self) -> None:
            if self.storage is not None and self.study_name is not None and not self.storage.endswith(".log"):
                ensure_study(self.storage, self.study_name)
            super().hyperparameters_optimization()

    return PlasticExperimentManager


class ContinuedTraining:
    """The model of a run continued with ``train -i model.zip``, as rl_zoo3's ``ExperimentManager.learn`` sees it:
    its ``learn`` passes ``reset_num_timesteps=False`` (``-n N`` trains N more timesteps; ``num_timesteps``, the
    task schedule of a continual env and FIRE's run continue where the saved model stopped) and, for a plain
    algorithm on a piecewise-stationary env, adds :class:`~sb3_plastic.callbacks.TaskScheduleSync` (the plastic
    algorithms add it themselves). Every other attribute is the model's.

    :param model: the loaded model.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def learn(self, total_timesteps: int, callback: Any = None, **kwargs: Any) -> Any:
        """``model.learn(total_timesteps, callback, reset_num_timesteps=False, **kwargs)``."""
        from sb3_plastic.callbacks.schedule import TaskScheduleSync, is_piecewise_stationary
        from sb3_plastic.common.plastic_algorithm import is_plastic

        if not is_plastic(self.model) and is_piecewise_stationary(self.model.get_env()):
            given = [] if callback is None else list(callback) if isinstance(callback, list) else [callback]
            callback = [TaskScheduleSync(verbose=int(self.model.verbose)), *given]
        return self.model.learn(total_timesteps, callback, reset_num_timesteps=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def uses_action_masks(algo: str) -> bool:
    """Whether rl_zoo3's algorithm ``algo`` is a MaskablePPO (it learns with action masks, so it is evaluated
    with them too: :func:`action_mask_evaluation`)."""
    from rl_zoo3.utils import ALGOS
    from sb3_contrib import MaskablePPO

    cls = ALGOS.get(algo)
    return isinstance(cls, type) and issubclass(cls, MaskablePPO)


_MASKABLE_TRIAL_EVAL_CALLBACK: Optional[type] = None


def maskable_trial_eval_callback_class() -> type:
    """rl_zoo3's ``TrialEvalCallback`` (reports each evaluation to optuna, prunes) evaluating as sb3-contrib's
    ``MaskableEvalCallback`` does: with the eval env's ``action_masks()``."""
    global _MASKABLE_TRIAL_EVAL_CALLBACK
    if _MASKABLE_TRIAL_EVAL_CALLBACK is None:
        from rl_zoo3.callbacks import TrialEvalCallback
        from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

        class MaskableTrialEvalCallback(TrialEvalCallback, MaskableEvalCallback):
            """``TrialEvalCallback`` whose evaluations pass action masks to ``predict`` (``use_masking=True``)."""

        _MASKABLE_TRIAL_EVAL_CALLBACK = MaskableTrialEvalCallback
    return _MASKABLE_TRIAL_EVAL_CALLBACK


@contextlib.contextmanager
def action_mask_evaluation(algo: str) -> Iterator[None]:
    """While active, and only if ``algo`` is maskable (:func:`uses_action_masks`), rl_zoo3's experiment manager
    builds sb3-contrib's ``MaskableEvalCallback`` where it would build SB3's ``EvalCallback`` (``--eval-freq``)
    and :func:`maskable_trial_eval_callback_class` where it would build ``TrialEvalCallback`` (``-optimize``).

    rl_zoo3 creates both inside ``create_callbacks`` / ``objective`` by their names in ``rl_zoo3.exp_manager``;
    those two names are swapped for the duration and restored afterwards. Without this, rl_zoo3 evaluates a
    MaskablePPO without masks: it may pick invalid actions, so best models and optuna's objective would be
    chosen on a policy different from the one trained.
    """
    if not uses_action_masks(algo):
        yield
        return
    import rl_zoo3.exp_manager
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    names = vars(rl_zoo3.exp_manager)
    saved = names["EvalCallback"], names["TrialEvalCallback"]
    names["EvalCallback"], names["TrialEvalCallback"] = MaskableEvalCallback, maskable_trial_eval_callback_class()
    try:
        yield
    finally:
        names["EvalCallback"], names["TrialEvalCallback"] = saved


@contextlib.contextmanager
def task_following_evaluation() -> Iterator[list[Any]]:
    """While active, rl_zoo3's experiment manager builds evaluation callbacks that follow the training task on a
    continual env: the ``EvalCallback`` (``--eval-freq``) and ``TrialEvalCallback`` (``-optimize``) it would build,
    or the masked ones :func:`action_mask_evaluation` put in their place (enter that one first), get
    :class:`~sb3_plastic.callbacks.continual_eval.TaskFollowingEvalMixin` in front
    (:func:`~sb3_plastic.callbacks.continual_eval_callback_class`). On a stationary env they behave exactly as
    the originals. As with :func:`action_mask_evaluation`, the two names in ``rl_zoo3.exp_manager`` are swapped
    for the duration and restored afterwards.

    :return: (yields) the list of the evaluation callbacks built meanwhile, in order.
    """
    import rl_zoo3.exp_manager

    from sb3_plastic.callbacks.continual_eval import continual_eval_callback_class

    names = vars(rl_zoo3.exp_manager)
    saved = names["EvalCallback"], names["TrialEvalCallback"]
    created: list[Any] = []

    def building(base: type) -> Any:
        cls = continual_eval_callback_class(base)

        def build(*args: Any, **kwargs: Any) -> Any:
            callback = cls(*args, **kwargs)
            created.append(callback)
            return callback

        return build

    names["EvalCallback"], names["TrialEvalCallback"] = building(saved[0]), building(saved[1])
    try:
        yield created
    finally:
        names["EvalCallback"], names["TrialEvalCallback"] = saved


def continual_objective(created: Sequence[Any], value: float, trial: Any = None, n_timesteps: Optional[int] = None) -> float:
    """The tuning objective of a trial whose evaluation callbacks were ``created`` (see
    ``PlasticExperimentManager.objective``): when the trial's evaluation callback (the last one built) followed
    the training task on a continual env, the mean over its evaluations of their mean return
    (:meth:`~sb3_plastic.callbacks.continual_eval.TaskFollowingEvalMixin.mean_evaluation_reward`), counting
    only the evaluations made at ``num_timesteps <= n_timesteps``; otherwise ``value``, rl_zoo3's objective
    (the last evaluation's mean return).

    SB3 trains on to the rollout boundary at or after ``-n``, so a trial may train, and be evaluated, beyond
    its budget by up to one rollout (``n_steps * n_envs``, which the sampler varies per trial); the evaluations
    after ``-n`` are left out so that every trial is averaged over the same part of the run.

    :param created: the callbacks yielded by :func:`task_following_evaluation`.
    :param value: rl_zoo3's objective value.
    :param trial: the optuna trial; its user attribute ``objective`` records which quantity was returned, and
        ``objective_evaluations`` how many evaluations the mean is over (continual envs).
    :param n_timesteps: the trial's budget (``-n``); ``None``: every evaluation counts.
    """
    callback = created[-1] if created else None
    continual = bool(getattr(callback, "follows_task", False))
    if trial is not None:
        trial.set_user_attr("objective", "mean_over_evaluations" if continual else "last_evaluation")
    if not continual:
        return value
    assert callback is not None
    if trial is not None:
        counted = len(callback.evaluations_within(n_timesteps)) or len(callback.evaluation_mean_rewards)
        trial.set_user_attr("objective_evaluations", counted)
    return callback.mean_evaluation_reward(n_timesteps)


def ensure_study(storage: str, study_name: str, attempts: int = 8) -> None:
    """Create (or load) the optuna study ``study_name`` in the database ``storage``, retrying on database
    errors: workers started together on a fresh database race to create its tables."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError  # optuna's RDB storage is built on SQLAlchemy

    for attempt in range(attempts):
        try:
            optuna.create_study(storage=storage, study_name=study_name, load_if_exists=True, direction="maximize")
            return
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))


# --------------------------------------------------------------------------- registration
def _zoo_modules() -> list[Any]:
    import rl_zoo3
    import rl_zoo3.enjoy
    import rl_zoo3.exp_manager
    import rl_zoo3.hyperparams_opt
    import rl_zoo3.train
    import rl_zoo3.utils

    names = sorted(n for n in sys.modules if n == "rl_zoo3" or n.startswith("rl_zoo3."))
    return [sys.modules[n] for n in names if sys.modules[n] is not None] + [rl_zoo3]


def _update_tables(attribute: str, entries: dict[str, Any]) -> None:
    """Put ``entries`` into every loaded rl_zoo3 module's dict ``attribute`` (in place: the modules share it).

    Entries already there are kept, so a sampler (or class) a user put under a plastic name after a first
    :func:`register` survives the :func:`register` that :func:`train` does.
    """
    seen: set[int] = set()
    for module in _zoo_modules():
        table = module.__dict__.get(attribute)
        if isinstance(table, dict) and id(table) not in seen:
            seen.add(id(table))
            for key, value in entries.items():
                table.setdefault(key, value)


def eval_namespace() -> dict[str, Any]:
    """Names usable in rl_zoo3's evaluated yaml strings (``policy_kwargs: "dict(activation_fn=MaxMin)"``)."""
    import sb3_plastic

    names: dict[str, Any] = {name: getattr(sb3_plastic, name) for name in sb3_plastic.__all__}
    names["sb3_plastic"] = sb3_plastic
    return names


def register_envs(env_ids: Optional[Sequence[str]] = None) -> list[str]:
    """Import :mod:`sb3_plastic.envs` (registers ``sb3_plastic/...``) and register MinAtar's gymnasium ids.

    :param env_ids: the ids about to be used; MinAtar's ids are registered when one of them starts with
        ``MinAtar/`` or when ``None`` (importing ``minatar`` costs seconds: it imports seaborn and scipy).
    :return: the ``sb3_plastic/...`` ids now registered.
    """
    import gymnasium as gym

    import sb3_plastic.envs  # noqa: F401  (registers the sb3_plastic/ ids on import)

    wanted = env_ids is None or any(str(env_id).startswith("MinAtar/") for env_id in env_ids)
    if wanted and not any(env_id.startswith("MinAtar/") for env_id in gym.envs.registry):
        try:
            import minatar.gym
        except ImportError:
            pass
        else:
            minatar.gym.register_envs()
    return sorted(env_id for env_id in gym.envs.registry if env_id.startswith("sb3_plastic/"))


def register(env_ids: Optional[Sequence[str]] = None) -> dict[str, type]:
    """Register the plastic algorithms, samplers, environments and yaml names into rl_zoo3 (idempotent).

    :param env_ids: passed to :func:`register_envs` (``None``: every environment, MinAtar included).
    :return: the registered algorithms by rl_zoo3 name.
    """
    from sb3_plastic.samplers import plastic_sampler_for

    modules = _zoo_modules()  # imports rl_zoo3's modules, so that every table exists
    algos = plastic_algorithms()
    samplers, converters = {}, {}
    for name, cls in algos.items():
        found = plastic_sampler_for(base_zoo_name(cls))
        if found is not None:
            samplers[name], converters[name] = found
    _update_tables("ALGOS", algos)
    _update_tables("HYPERPARAMS_SAMPLER", samplers)
    _update_tables("HYPERPARAMS_CONVERTER", converters)

    names = eval_namespace()
    for module in modules:
        if module.__name__ in ("rl_zoo3.exp_manager", "rl_zoo3.utils"):
            for key, value in names.items():
                module.__dict__.setdefault(key, value)

    import rl_zoo3.train

    if not getattr(rl_zoo3.train.ExperimentManager, "_plastic", False):
        manager = _experiment_manager_class()
        manager._plastic = True  # type: ignore[attr-defined]
        rl_zoo3.train.ExperimentManager = manager  # type: ignore[attr-defined,misc]
    register_envs(env_ids)
    return algos


# --------------------------------------------------------------------------- command lines
def config_dir() -> Optional[Path]:
    """The folder of the plastic yaml files (``zoo_configs/`` of the repository, or shipped in the package)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "zoo_configs", here.parent / "zoo_configs"):
        if candidate.is_dir():
            return candidate
    return None


def _with_defaults(argv: Sequence[str], conf: bool) -> tuple[list[str], Optional[str]]:
    """``argv`` plus ``--algo plastic_ppo`` and (``conf``) ``-conf zoo_configs/<algo>.yml`` when not given;
    and the ``--env`` it names (``None``: rl_zoo3's default)."""
    argv = list(argv)
    parser = argparse.ArgumentParser(add_help=False)  # same option spellings (and abbreviations) as rl_zoo3
    parser.add_argument("--algo", default=None)
    parser.add_argument("--env", default=None)
    if conf:
        parser.add_argument("-conf", "--conf-file", default=None)
    try:
        known, _ = parser.parse_known_args(argv)
    except SystemExit:  # leave malformed command lines to rl_zoo3's parser and its message
        return argv, None
    algo = known.algo
    if algo is None:
        algo = DEFAULT_ALGO
        argv = ["--algo", algo, *argv]
    if conf and known.conf_file is None and algo.startswith("plastic_"):
        folder = config_dir()
        if folder is not None and (folder / f"{algo}.yml").is_file():
            argv += ["-conf", str(folder / f"{algo}.yml")]
    return argv, known.env


def _hand_over(function: Any, prog: str, argv: Sequence[str]) -> None:
    saved = sys.argv
    sys.argv = [prog, *argv]
    try:
        function()
    finally:
        sys.argv = saved


def train(argv: Optional[Sequence[str]] = None) -> None:
    """``sb3-plastic train``: rl_zoo3's ``train`` with the plastic algorithms registered.

    The launcher's own option ``--monitor EVERY`` (a positive integer, environment steps) adds
    ``PlasticityMonitor(every=EVERY)`` to the training run's callbacks; everything else goes to rl_zoo3.

    :param argv: rl_zoo3's train arguments, e.g. ``["--algo", "plastic_ppo", "--env", "CartPole-v1",
        "-n", "2000"]`` (default: ``sys.argv[1:]``), plus ``--monitor EVERY``.
    :raises SystemExit: (status 2) with a message naming the key when a yaml key is misspelt or ``policy`` is
        missing, or naming the file when ``-i`` is not a whole model zip.
    """
    global _MONITOR_EVERY
    args, monitor_every = _pop_monitor(sys.argv[1:] if argv is None else argv)
    args, env_id = _with_defaults(args, conf=True)
    register([env_id or "CartPole-v1"])
    import rl_zoo3.train

    _MONITOR_EVERY = monitor_every
    try:
        _hand_over(rl_zoo3.train.train, "sb3-plastic train", args)
    except LauncherError as exc:
        print(f"sb3-plastic train: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        _MONITOR_EVERY = None


def _pop_monitor(argv: Sequence[str]) -> tuple[list[str], Optional[int]]:
    """Take ``--monitor EVERY`` (the launcher's own option: add a
    :class:`~sb3_plastic.callbacks.PlasticityMonitor` with ``every=EVERY`` to the training run) out of ``argv``."""
    from sb3_plastic.cli import positive_int

    parser = argparse.ArgumentParser(prog="sb3-plastic train", add_help=False, allow_abbrev=False)
    parser.add_argument("--monitor", type=positive_int, default=None, metavar="EVERY")
    known, rest = parser.parse_known_args(list(argv))
    return rest, known.monitor


def enjoy(argv: Optional[Sequence[str]] = None) -> None:
    """``sb3-plastic enjoy``: rl_zoo3's ``enjoy`` with the plastic algorithms registered.

    Off-policy plastic models are loaded with a one-transition replay buffer, as rl_zoo3 does for its own
    off-policy algorithms (its list of them is fixed inside ``enjoy``). A maskable model (``plastic_ppo_mask``)
    predicts with the action masks of the env it plays: rl_zoo3's loop calls ``predict`` without masks, so
    the model is handed to it behind :class:`_MaskedPredictor`, which asks that env (the vector env rl_zoo3's
    ``create_test_env`` made, recorded on the way) for ``action_masks()`` before each prediction.

    :param argv: rl_zoo3's enjoy arguments (default: ``sys.argv[1:]``).
    """
    args, env_id = _with_defaults(sys.argv[1:] if argv is None else argv, conf=False)
    algos = register([env_id or "CartPole-v1"])
    import rl_zoo3.enjoy
    from rl_zoo3.utils import ALGOS
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    off_policy = [name for name, cls in algos.items() if issubclass(cls, OffPolicyAlgorithm)]
    maskable = [name for name in algos if uses_action_masks(name)]
    originals = {name: ALGOS[name] for name in off_policy + maskable}
    played: list[Any] = []  # the env(s) rl_zoo3's enjoy creates; a maskable model takes its masks from the last
    create_test_env = rl_zoo3.enjoy.create_test_env
    try:
        for name in off_policy:
            ALGOS[name] = _SmallBufferLoader(originals[name])  # type: ignore[assignment]
        for name in maskable:
            ALGOS[name] = _MaskedPredictLoader(originals[name], played)  # type: ignore[assignment]

        def recording_create_test_env(*env_args: Any, **env_kwargs: Any) -> Any:
            env = create_test_env(*env_args, **env_kwargs)
            played.append(env)
            return env

        rl_zoo3.enjoy.create_test_env = recording_create_test_env  # type: ignore[attr-defined]
        _hand_over(rl_zoo3.enjoy.enjoy, "sb3-plastic enjoy", args)
    finally:
        rl_zoo3.enjoy.create_test_env = create_test_env  # type: ignore[attr-defined]
        ALGOS.update(originals)


class _SmallBufferLoader:
    """Stands in for an off-policy class in ``ALGOS`` during ``enjoy``: ``load`` with ``buffer_size=1``."""

    def __init__(self, cls: type) -> None:
        self._cls = cls

    def load(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("buffer_size", 1)
        return self._cls.load(*args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


class _MaskedPredictLoader:
    """Stands in for a maskable class in ``ALGOS`` during ``enjoy``: ``load`` returns the model behind a
    :class:`_MaskedPredictor` that takes its masks from the last env in ``played``."""

    def __init__(self, cls: type, played: list[Any]) -> None:
        self._cls = cls
        self._played = played

    def load(self, *args: Any, **kwargs: Any) -> Any:
        return _MaskedPredictor(self._cls.load(*args, **kwargs), self._played)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


class _MaskedPredictor:
    """A loaded MaskablePPO whose ``predict`` fills in ``action_masks`` from the env being played when the
    caller passes none (rl_zoo3's enjoy loop); every other attribute is the model's."""

    def __init__(self, model: Any, played: list[Any]) -> None:
        self._model = model
        self._played = played

    def predict(
        self,
        observation: Any,
        state: Optional[tuple[Any, ...]] = None,
        episode_start: Any = None,
        deterministic: bool = False,
        action_masks: Any = None,
    ) -> tuple[Any, Optional[tuple[Any, ...]]]:
        if action_masks is None:
            if not self._played:
                raise RuntimeError("sb3-plastic enjoy: no env to take action masks from (rl_zoo3 created none)")
            from sb3_contrib.common.maskable.utils import get_action_masks

            action_masks = get_action_masks(self._played[-1])
        return self._model.predict(
            observation, state=state, episode_start=episode_start, deterministic=deterministic, action_masks=action_masks
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
