"""Run metadata next to the TensorBoard event files, so ``sb3-plastic plot`` can tell methods apart.

A TensorBoard run directory of SB3 (``<tensorboard_log>/<tb_log_name>_<n>``, e.g. ``runs/CartPole-v1/PPO_1``
for ``sb3-plastic train --algo plastic_ppo --env CartPole-v1 -tb runs/``) says neither the algorithm's
hyperparameters nor, for the plastic algorithms (whose ``tb_log_name`` is their SB3 base's, ``PPO``), which
algorithm wrote it. At training start :func:`write_run_info` writes :data:`RUN_INFO_FILE` into that
directory:

.. code-block:: json

    {"format": 1, "algo": "PlasticPPO", "zoo_algo": "plastic_ppo", "env_id": "CartPole-v1", "seed": 0,
     "hyperparameters": {"learning_rate": 0.0003, "n_steps": 64, "net_arch": [16, 16],
                         "activation_fn": "ReLU", "isometry_coef": 0.1, "fire_at": null, ...}}

``hyperparameters`` holds the constructor arguments that are plain values (numbers, strings, lists, class
names; schedules only when constant or SB3's ``LinearSchedule``), the entries of ``policy_kwargs`` (and the
policy's own ``net_arch`` / ``activation_fn`` when ``policy_kwargs`` leaves them to the default), the plastic
keywords (``model.isometry_config`` and ``model.intervention_configs``) and the interventions passed as
callbacks (``callbacks``: their class names; ``<Class>.<argument>``: their plain arguments;
:class:`~sb3_plastic.callbacks.PlasticityMonitor` and SB3's own callbacks are not methods and are left out).

Every plastic algorithm writes it (:class:`~sb3_plastic.common.plastic_algorithm.PlasticAlgorithmMixin`
calls :func:`write_run_info` once SB3 has configured its logger); plain SB3 models get it from
:class:`RunInfoCallback`. Nothing is written when the model logs no TensorBoard output.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import TensorBoardOutputFormat

#: Name of the metadata file in a TensorBoard run directory.
RUN_INFO_FILE = "sb3_plastic_run.json"
#: Version of the file's layout.
RUN_INFO_FORMAT = 1

#: Constructor arguments that do not define the method (where and how verbosely it runs, its seed).
_NOT_HYPERPARAMETERS = frozenset(
    {"self", "policy", "env", "tensorboard_log", "verbose", "seed", "device", "_init_setup_model", "policy_kwargs"}
)
_SKIP = object()


def _plain(value: Any) -> Any:
    """``value`` as a JSON value, or ``_SKIP`` when it is not a plain setting (an object, a function)."""
    from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, FloatSchedule):
        return _plain(value.value_schedule)
    if isinstance(value, ConstantSchedule):
        return _plain(value.val)
    if isinstance(value, LinearSchedule):
        return f"linear({value.start:g} -> {value.end:g}, end_fraction={value.end_fraction:g})"
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    if isinstance(value, dict):
        out = {str(k): _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _SKIP}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return _SKIP


def _constructor_values(obj: Any, exclude: frozenset[str] = frozenset()) -> Iterator[tuple[str, Any]]:
    """``(name, plain value)`` of the constructor arguments of ``obj`` stored as attributes of the same name."""
    names: dict[str, None] = {}
    for klass in type(obj).__mro__:  # a mixin's __init__ passes SB3's arguments on through **kwargs
        if "__init__" in vars(klass) and klass is not object:
            try:
                names.update(dict.fromkeys(inspect.signature(vars(klass)["__init__"]).parameters))
            except (TypeError, ValueError):
                continue
    for name in names:
        if name in exclude or name in ("self", "args", "kwargs") or not hasattr(obj, name):
            continue
        try:
            value = _plain(getattr(obj, name))
        except Exception:  # a property that cannot be read before training
            continue
        if value is not _SKIP:
            yield name, value


def intervention_callbacks(callback: Optional[BaseCallback]) -> list[BaseCallback]:
    """The plasticity interventions among ``callback`` (a callback or ``CallbackList``, searched recursively):
    :class:`~sb3_plastic.callbacks.PlasticCallback` instances other than the monitor and other than those a
    plastic algorithm adds from its keywords (named ``"auto"``, already in its hyperparameters)."""
    from sb3_plastic.callbacks.base import PlasticCallback, iter_callbacks
    from sb3_plastic.callbacks.monitor import PlasticityMonitor

    found = []
    for item in iter_callbacks(callback):
        if isinstance(item, PlasticCallback) and not isinstance(item, PlasticityMonitor) and item.name != "auto":
            found.append(item)
    return found


def env_id_of(model: BaseAlgorithm) -> Optional[str]:
    """Gymnasium id of the model's (first) environment, ``None`` when it has none or no registered spec."""
    env = model.get_env()
    if env is None:
        return None
    try:
        spec = env.get_attr("spec", indices=[0])[0]
    except Exception:
        return None
    return getattr(spec, "id", None)


def _zoo_name(model: BaseAlgorithm) -> Optional[str]:
    """rl_zoo3 name of a plastic algorithm, when rl_zoo3 is already loaded (i.e. under ``sb3-plastic train``)."""
    from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin

    if "rl_zoo3" not in sys.modules or not isinstance(model, PlasticAlgorithmMixin):
        return None
    from sb3_plastic.zoo import zoo_name

    return zoo_name(type(model))


def run_info(model: BaseAlgorithm, callback: Optional[BaseCallback] = None, **extra: Any) -> dict[str, Any]:
    """The metadata of a run of ``model`` (see the module docstring).

    :param model: the SB3 / sb3-plastic model.
    :param callback: the callbacks of the ``learn`` call (their interventions are recorded).
    :param extra: further top-level entries (e.g. ``zoo_algo``, ``zoo_log_dir``); ``None`` values are kept
        out unless the key is one of the standard entries.
    :return: a JSON-serialisable dict.
    """
    hyper: dict[str, Any] = dict(_constructor_values(model, _NOT_HYPERPARAMETERS))
    for key, value in (getattr(model, "policy_kwargs", None) or {}).items():
        plain = _plain(value)
        if plain is not _SKIP:
            hyper[str(key)] = plain
    policy = getattr(model, "policy", None)
    for name in ("net_arch", "activation_fn"):  # the policy's own defaults when policy_kwargs leaves them out
        if name not in hyper and hasattr(policy, name) and (plain := _plain(getattr(policy, name))) is not _SKIP:
            hyper[name] = plain
    config = getattr(model, "isometry_config", None)
    if dataclasses.is_dataclass(config):
        hyper.update({k: v for k, v in ((k, _plain(v)) for k, v in dataclasses.asdict(config).items()) if v is not _SKIP})
    for intervention in (getattr(model, "intervention_configs", None) or {}).values():
        if dataclasses.is_dataclass(intervention):
            for k, v in dataclasses.asdict(intervention).items():
                if (plain := _plain(v)) is not _SKIP:
                    hyper[k] = plain
    interventions = intervention_callbacks(callback)
    if interventions:
        hyper["callbacks"] = "+".join(sorted(type(c).__name__ for c in interventions))
        for item in interventions:
            prefix = type(item).__name__ + (f"[{item.name}]" if item.name else "")
            for name, value in _constructor_values(item, frozenset({"name", "verbose"})):
                hyper[f"{prefix}.{name}"] = value
    info: dict[str, Any] = {
        "format": RUN_INFO_FORMAT,
        "algo": type(model).__name__,
        "zoo_algo": _zoo_name(model),
        "env_id": env_id_of(model),
        "seed": _plain(model.seed) if _plain(model.seed) is not _SKIP else None,
        "hyperparameters": dict(sorted(hyper.items())),
    }
    for key, value in extra.items():
        if value is not None or key in info:
            info[key] = _plain(value) if _plain(value) is not _SKIP else repr(value)
    return info


def tensorboard_dir(model: BaseAlgorithm) -> Optional[str]:
    """The directory of the model's TensorBoard output, ``None`` when its logger writes none."""
    logger = getattr(model, "_logger", None)
    if logger is None:
        return None
    for output in logger.output_formats:
        if isinstance(output, TensorBoardOutputFormat):
            return logger.get_dir()
    return None


def write_run_info(model: BaseAlgorithm, callback: Optional[BaseCallback] = None, **extra: Any) -> Optional[str]:
    """Write :func:`run_info` as :data:`RUN_INFO_FILE` into the model's TensorBoard run directory (call it
    after SB3 configured the logger of the ``learn`` call, i.e. from ``_setup_learn`` or a callback's
    ``_on_training_start``). A failure to write is a warning, never an error of the training run.

    :return: the path written, or ``None`` when the model logs no TensorBoard output.
    """
    directory = tensorboard_dir(model)
    if directory is None:
        return None
    path = os.path.join(directory, RUN_INFO_FILE)
    try:
        info = run_info(model, callback, **extra)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
        os.replace(tmp, path)
    except Exception as error:  # metadata must never stop training
        warnings.warn(f"could not write the run metadata {path}: {type(error).__name__}: {error}", stacklevel=2)
        return None
    return path


def read_run_info(run_dir: str) -> Optional[dict[str, Any]]:
    """The metadata of a TensorBoard run directory, ``None`` when it has no :data:`RUN_INFO_FILE`.

    :raises ValueError: when the file exists but is not a JSON object with an ``algo`` entry.
    """
    path = os.path.join(run_dir, RUN_INFO_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"unreadable run metadata {path}: {error}") from None
    if not isinstance(info, dict) or not isinstance(info.get("algo"), str):
        raise ValueError(f"run metadata {path} is not a JSON object with an 'algo' entry")
    if not isinstance(info.get("hyperparameters", {}), dict):
        raise ValueError(f"run metadata {path}: 'hyperparameters' must be a JSON object")
    return info


class RunInfoCallback(BaseCallback):
    """Writes the run metadata (:func:`write_run_info`) at training start, for plain SB3 models (the plastic
    algorithms write it themselves), so ``sb3-plastic plot`` groups their runs by algorithm and hyperparameters.

    :param extra: further top-level entries of the metadata (e.g. ``zoo_algo="ppo"``).
    :param verbose: 1 prints the path written.
    """

    def __init__(self, verbose: int = 0, **extra: Any) -> None:
        super().__init__(verbose)
        self.extra = extra
        self.path: Optional[str] = None

    def _on_training_start(self) -> None:
        callback = self.locals.get("callback") if isinstance(self.locals, dict) else None
        self.path = write_run_info(self.model, callback if isinstance(callback, BaseCallback) else None, **self.extra)
        if self.verbose >= 1 and self.path is not None:
            print(f"run metadata: {self.path}")

    def _on_step(self) -> bool:
        return True
