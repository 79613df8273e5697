"""The one mechanism behind the eight plastic algorithms (PlasticPPO, PlasticDQN, PlasticSAC, PlasticQRDQN,
PlasticTQC, PlasticCrossQ, PlasticRecurrentPPO, PlasticMaskablePPO).

:class:`PlasticAlgorithmMixin` sits in front of an SB3 algorithm class in the MRO. It takes the
plastic keywords as top-level constructor arguments (so rl_zoo3 yaml files and optuna samplers can set
them), validates them into an :class:`~sb3_plastic.config.IsometryConfig`, hands them to the plastic
policy through ``policy_kwargs`` and passes every other argument to SB3 untouched. A user's own policy class is
handled by :mod:`sb3_plastic.common.user_policy`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, ClassVar, Optional, Union

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback

from sb3_plastic.common.model_zip import read_data
from sb3_plastic.common.user_policy import plastic_alias_class, resolve_policy_class
from sb3_plastic.config import AUTO, ISOMETRY_KEYS, IsometryConfig, auto_isometry_interval
from sb3_plastic.isometry import ISOMETRY_FORMAT
from sb3_plastic.policies import PlasticPolicyMixin

#: the entries a plastic algorithm adds to the ``policy_kwargs`` it hands to its policy (and saves): the isometry
#: keywords, and ``layer_norm`` for NaP
PLASTIC_POLICY_KEYS: tuple[str, ...] = (*ISOMETRY_KEYS, "layer_norm")


def intervention_config_classes() -> dict[str, type]:
    """The intervention configs whose fields are top-level keywords of every plastic algorithm."""
    from sb3_plastic.callbacks.cbp import ContinualBackpropConfig
    from sb3_plastic.callbacks.churn_reduction import ChurnReductionConfig
    from sb3_plastic.callbacks.fire import FIREConfig
    from sb3_plastic.callbacks.layer_reset import LayerResetConfig
    from sb3_plastic.callbacks.nap import NaPConfig
    from sb3_plastic.callbacks.parseval import ParsevalConfig
    from sb3_plastic.callbacks.plasticity_injection import PlasticityInjectionConfig
    from sb3_plastic.callbacks.redo import ReDoConfig
    from sb3_plastic.callbacks.regularisers import L2InitConfig, SpectralRegularisationConfig
    from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturbConfig
    from sb3_plastic.callbacks.weight_clipping import WeightClippingConfig

    return {
        "fire": FIREConfig,
        "cbp": ContinualBackpropConfig,
        "redo": ReDoConfig,
        "shrink_perturb": ShrinkPerturbConfig,
        "l2_init": L2InitConfig,
        "spectral": SpectralRegularisationConfig,
        "nap": NaPConfig,
        "layer_reset": LayerResetConfig,
        "churn_reduction": ChurnReductionConfig,
        "plasticity_injection": PlasticityInjectionConfig,
        "parseval": ParsevalConfig,
        "weight_clipping": WeightClippingConfig,
    }


def intervention_keys() -> tuple[str, ...]:
    """Names of the intervention keywords (fields of the intervention configs)."""
    return tuple(f.name for cls in intervention_config_classes().values() for f in dataclasses.fields(cls))


class PlasticAlgorithmMixin:
    """Adds the plastic keywords to an SB3 algorithm; everything else is SB3's.

    :param policy: as in SB3; ``"MlpPolicy"``, ``"CnnPolicy"`` and ``"MultiInputPolicy"`` (and SB3's classes of
        those aliases) resolve to the plastic policies. A user's own SB3 policy class is SB3's, untouched, with
        plasticity off, and gets the isometry penalty and the interventions on the Linear / Conv layers it owns
        with plasticity on (:mod:`sb3_plastic.common.user_policy`).
    :param env: as in SB3.
    :param args: SB3's positional arguments, unchanged.
    :param activation: see :class:`~sb3_plastic.config.IsometryConfig` (also for the keywords below).
    :param isometry_coef: ``lambda`` of the isometry penalty ``1/2 ||Gram - t I||_F^2`` (the authors' convention since
        issue #27; before it the penalty had no 1/2); ``None``: the algorithm family's :attr:`default_isometry_coef`
        (0.02 for the PPO and DQN families, 2e-3 for SAC, TQC and CrossQ).
    :param isometry_scale: target scale ``s`` of ``W^T W``.
    :param isometry_rect_scale: target ``s * out / in`` for a tall layer (the authors' ``rect_scale``; off).
    :param isometry_normalize: divide each weight's penalty by ``min(out, in)`` (off).
    :param isometry_free_scale: each weight's own mean squared singular value as the target instead of
        ``isometry_scale``: the penalty holds the weights' shape, not their scale (this library's ablation; off).
    :param isometry_side: ``"both"`` (the penalty), or only the squared singular values below (``"floor"``) or above
        (``"ceiling"``) the target (this library's ablation); the monitor's ``dfi_floor`` / ``dfi_ceiling`` keys say
        whether that side has anything to act on.
    :param isometry_mode: ``"decoupled"`` (AdamO), ``"coupled"`` or ``"off"``.
    :param isometry_layers: ``"hidden"``, ``"all"`` or a list of fnmatch patterns.
    :param isometry_interval: ``1`` (default): the exact AdamO step at every update; ``k`` or ``"auto"``
        (``ceil(1024 / batch_size)`` clipped to [1, 64], :func:`~sb3_plastic.config.auto_isometry_interval`): the
        step every ``k`` updates, ``k`` times larger, a speed option with a first-order error (decoupled mode only).
    :param optimizer: ``"adamo"``, ``"adam"`` or ``"adam_equal_betas"``.
    :param orthogonal_init: orthogonal hidden layers (default: only with MaxMin).
    :param kwargs: SB3's keyword arguments, unchanged, and the intervention keywords: the fields of
        :class:`~sb3_plastic.callbacks.FIREConfig` (``fire_at``, ``fire_every``, ...),
        :class:`~sb3_plastic.callbacks.ContinualBackpropConfig` (``replacement_rate``, ``maturity_threshold``,
        ...), :class:`~sb3_plastic.callbacks.ReDoConfig` (``redo_period``, ...),
        :class:`~sb3_plastic.callbacks.ShrinkPerturbConfig` (``shrink_perturb``, ...),
        :class:`~sb3_plastic.callbacks.L2InitConfig` (``l2_init_coef``),
        :class:`~sb3_plastic.callbacks.SpectralRegularisationConfig` (``spectral_coef``, ...) and
        :class:`~sb3_plastic.callbacks.NaPConfig` (``nap``, ``nap_project``; ``nap=True`` also builds the networks
        with layer norms) and :class:`~sb3_plastic.callbacks.LayerResetConfig` (``layer_reset_layers``,
        ``layer_reset_on_task_change``, ...), :class:`~sb3_plastic.callbacks.ChurnReductionConfig` (``churn_reduction``,
        ``churn_reduction_coef``, ...), :class:`~sb3_plastic.callbacks.PlasticityInjectionConfig`
        (``plasticity_injection_at``, ...), :class:`~sb3_plastic.callbacks.ParsevalConfig` (``parseval_coef``, ...),
        :class:`~sb3_plastic.callbacks.WeightClippingConfig` (``weight_clipping``, ``weight_clipping_kappa``, ...).
        An enabled intervention
        is added to the callbacks of every ``learn()`` call; it is the same class users can pass as a
        callback themselves.
    """

    isometry_config: IsometryConfig
    policy_aliases: dict[str, type]
    #: ``isometry_coef`` when the keyword is left at ``None``: 0.02 for the PPO and DQN families, 2e-3 for the
    #: SAC family (``PlasticSAC``, ``PlasticTQC``, ``PlasticCrossQ``), see
    #: :attr:`sb3_plastic.config.IsometryConfig.isometry_coef` for the measurements behind both values.
    default_isometry_coef: ClassVar[float] = 0.02

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Append the plastic and intervention keywords, with meanings and defaults, to the subclass's docstring
        (generated from the config dataclasses by :func:`plastic_keyword_docs`), so ``help(PlasticPPO)`` lists them."""
        super().__init_subclass__(**kwargs)
        from sb3_plastic.common.docs import with_keyword_docs

        cls.__doc__ = with_keyword_docs(cls.__doc__, plastic_keyword_docs(cls.default_isometry_coef))

    def __init__(
        self,
        policy: Union[str, type],
        env: Any,
        *args: Any,
        activation: Optional[str] = None,
        isometry_coef: Optional[float] = None,
        isometry_scale: float = 1.0,
        isometry_rect_scale: bool = False,
        isometry_normalize: bool = False,
        isometry_free_scale: bool = False,
        isometry_side: str = "both",
        isometry_mode: str = "decoupled",
        isometry_layers: Union[str, list[str]] = "hidden",
        isometry_interval: Union[int, str] = 1,
        optimizer: str = "adamo",
        orthogonal_init: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        # the penalty's own options: nothing reads them without a penalty
        penalty_options = {
            "isometry_layers": (isometry_layers, "hidden"),
            "isometry_interval": (isometry_interval, 1),
            "isometry_rect_scale": (isometry_rect_scale, False),
            "isometry_normalize": (isometry_normalize, False),
            "isometry_free_scale": (isometry_free_scale, False),
            "isometry_side": (isometry_side, "both"),
        }
        if isometry_mode == "off":
            from sb3_plastic.callbacks.base import warn_ignored_options

            warn_ignored_options(
                {"isometry_coef": (isometry_coef, None), **penalty_options},
                "isometry_mode='off' (no isometry penalty); set isometry_mode='decoupled' (AdamO) or 'coupled'",
                stacklevel=3,
            )
        elif isinstance(isometry_coef, (int, float)) and not isinstance(isometry_coef, bool) and isometry_coef == 0:
            from sb3_plastic.callbacks.base import warn_ignored_options

            warn_ignored_options(
                penalty_options,
                "isometry_coef=0 (no isometry penalty); give isometry_coef > 0",
                stacklevel=3,
            )
        config = IsometryConfig(
            activation=activation,
            isometry_coef=type(self).default_isometry_coef if isometry_coef is None else isometry_coef,
            isometry_scale=isometry_scale,
            isometry_rect_scale=isometry_rect_scale,
            isometry_normalize=isometry_normalize,
            isometry_free_scale=isometry_free_scale,
            isometry_side=isometry_side,
            isometry_mode=isometry_mode,
            isometry_layers=isometry_layers,
            isometry_interval=isometry_interval,
            optimizer=optimizer,
            orthogonal_init=orthogonal_init,
        )
        interventions = {}
        for key, cls in intervention_config_classes().items():
            names = {f.name for f in dataclasses.fields(cls)}
            interventions[key] = cls(**{name: kwargs.pop(name) for name in list(kwargs) if name in names})
        base_init = super().__init__  # type: ignore[misc]
        try:
            bound = inspect.signature(base_init).bind(policy, env, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{type(self).__name__}: {exc}") from None
        policy_kwargs = dict(bound.arguments.get("policy_kwargs") or {})
        nap = interventions["nap"].enabled
        if isinstance(policy, str):
            self._check_plastic_policy(policy)
        elif bound.arguments.get("_init_setup_model", True):  # SB3's load passes the saved class: kept as saved
            policy = resolve_policy_class(type(self), policy, config, nap)
            bound.arguments["policy"] = policy
        if config.isometry_interval == AUTO:
            batch_size = bound.arguments.get("batch_size", _default(base_init, "batch_size"))
            interval = auto_isometry_interval(batch_size) if batch_size is not None else 4
            config = dataclasses.replace(config, isometry_interval=interval)
        # a plastic model's own ``policy_kwargs`` (which hold its plastic keywords) given back, as SB3 users clone a
        # model's architecture: entries equal to this model's keywords are taken, any other value is misplaced
        own = config.to_kwargs()
        misplaced = sorted(key for key in set(ISOMETRY_KEYS) & set(policy_kwargs) if policy_kwargs[key] != own[key])
        misplaced += sorted(set(intervention_keys()) & set(policy_kwargs))  # never in a plastic model's policy_kwargs
        if misplaced:
            raise ValueError(
                f"{misplaced} must be top-level keywords of {type(self).__name__}, not entries of policy_kwargs"
            )
        for key in ISOMETRY_KEYS:
            policy_kwargs.pop(key, None)
        if isinstance(policy, str) or issubclass(policy, PlasticPolicyMixin):  # a user's class with plasticity off: SB3's
            policy_kwargs.update(config.to_kwargs())
            if nap:
                policy_kwargs["layer_norm"] = True  # NaP's norms are part of the networks (sb3_plastic.callbacks.nap)
        bound.arguments["policy_kwargs"] = policy_kwargs
        self.isometry_config = config
        #: the isometry convention of this model (:data:`sb3_plastic.isometry.ISOMETRY_FORMAT`), saved in the zip
        self.isometry_format = ISOMETRY_FORMAT
        self.intervention_configs = interventions
        base_init(*bound.args, **bound.kwargs)

    @classmethod
    def load(  # type: ignore[override]
        cls,
        path: Any,
        env: Any = None,
        device: Any = "auto",
        custom_objects: Optional[dict[str, Any]] = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> Any:
        """SB3's ``load`` (same signature); intervention keywords (``replacement_rate=``, ``fire_at=``, ...) given here
        replace the saved ones. Isometry keywords cannot change after the networks and optimizer are built.
        ``policy_kwargs=`` is checked as SB3 checks it (equal to the saved ones, else SB3's ``ValueError``), the plastic
        keywords the model added to its saved ``policy_kwargs`` left out of the comparison.

        A zip saved by the SB3 / sb3-contrib class itself (``PPO.save`` read by ``PlasticPPO.load``) loads with
        plasticity off, ``isometry_mode="off", optimizer="adam"`` and SB3's activations (:func:`sb3_zip_objects`;
        one of SB3's alias classes becomes the plastic class of the alias, a user's own policy class stays as saved):
        the same networks and optimizer state, and training continues exactly as ``PPO.load`` would continue it.
        Interventions (callbacks, or intervention keywords given here) can act on it; to continue an SB3 model with
        the isometry penalty on, build the plastic model with the keywords and call ``set_parameters(path)`` (the
        optimizer state is mapped onto AdamO's groups, or restarted with a warning when it cannot be).

        A plastic zip saved before issue #27 (no ``isometry_format`` in its data: the isometry penalty without the
        1/2) loads in today's convention with the same effective penalty: its ``isometry_coef`` doubled in the saved
        ``policy_kwargs``, ``isometry_config`` and optimizer param groups
        (:func:`upgrade_isometry_data`, :func:`sb3_plastic.optim.upgrade_isometry_groups`), ``isometry_rect_scale``
        and ``isometry_normalize`` off.

        :raises ValueError: for an isometry keyword, an SB3 zip whose policy class is not one of the SB3 class's
            policy aliases, or a file that is not a whole model zip (SB3's "wasn't a zip-file" for a file that is not
            a zip; a zip without SB3's ``data`` entry, e.g. a truncated file).
        """
        fixed = sorted(set(kwargs) & {*ISOMETRY_KEYS, "nap"})
        if fixed:
            raise ValueError(
                f"{fixed} are fixed when the networks and optimizer are built and cannot be changed by load(); "
                "edit model.policy.optimizer.param_groups (e.g. 'isometry_coef') after loading instead"
            )
        data = read_data(path, custom_objects)
        foreign = sb3_zip_objects(cls, path, custom_objects, data)
        if foreign is not None:  # SB3's own zip: the plastic policy class with plasticity off
            objects, config = foreign
            custom_objects = {**(custom_objects or {}), **objects}
            kwargs["isometry_config"] = config  # set on the model before its networks are built (SB3's load)
        else:  # a plastic zip, perhaps of an older isometry convention
            custom_objects = {**(custom_objects or {}), **upgrade_isometry_data(data)}
        stored = custom_objects.get("policy_kwargs", data.get("policy_kwargs"))
        given = kwargs.get("policy_kwargs")
        if isinstance(given, dict) and isinstance(stored, dict) and given != stored:
            # SB3's load raises unless policy_kwargs= equals the saved ones; the saved ones also hold the plastic
            # keywords, which the user never gave: compare without them
            if {k: v for k, v in stored.items() if k not in PLASTIC_POLICY_KEYS} == given:
                kwargs["policy_kwargs"] = stored
        updates = {key: kwargs.pop(key) for key in list(kwargs) if key in intervention_keys()}
        model = super().load(  # type: ignore[misc]
            path,
            env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )
        for name, config_cls in intervention_config_classes().items():
            mine = {k: v for k, v in updates.items() if k in {f.name for f in dataclasses.fields(config_cls)}}
            if mine:
                model.intervention_configs[name] = dataclasses.replace(model.intervention_configs[name], **mine)
        return model

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: Any = "auto") -> None:
        """SB3's ``set_parameters``; a model whose persistent state records plasticity injections first gets their
        branches rebuilt (:func:`sb3_plastic.callbacks.plasticity_injection.restore_injections`), so that ``load``
        finds the parameters it saved."""
        from sb3_plastic.callbacks.plasticity_injection import restore_injections

        restore_injections(self)  # type: ignore[arg-type]
        super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)  # type: ignore[misc]

    def intervention_callbacks(self) -> list[BaseCallback]:
        """Callbacks of the interventions enabled through keywords (named ``"auto"``)."""
        callbacks = []
        for config in self.intervention_configs.values():
            callback = config.make_callback() if config.enabled else None
            if callback is not None:
                callback.name = "auto"  # persistent state key "<Class>:auto", distinct from user-passed callbacks
                callbacks.append(callback)
        return callbacks

    def learn(self, total_timesteps: int, callback: Any = None, *args: Any, **kwargs: Any) -> Any:
        """SB3's ``learn``, with the keyword-enabled interventions added to ``callback``.

        On a piecewise-stationary env (:class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`) a
        :class:`~sb3_plastic.callbacks.TaskScheduleSync` runs first (unless ``callback`` holds one): the task
        schedule follows ``num_timesteps``, so ``learn(..., reset_num_timesteps=False)`` after a ``load``
        continues the task sequence, and ``reset_num_timesteps=True`` (the default) restarts it at task 0.
        """
        from sb3_plastic.callbacks.base import iter_callbacks
        from sb3_plastic.callbacks.continual_eval import warn_plain_eval_on_continual_env
        from sb3_plastic.callbacks.schedule import TaskScheduleSync, is_piecewise_stationary

        warn_plain_eval_on_continual_env(callback)  # SB3's EvalCallback on a continual env would measure task 0
        extra = self.intervention_callbacks()
        held = any(isinstance(c, TaskScheduleSync) for c in iter_callbacks(callback))
        if is_piecewise_stationary(self.get_env()) and not held:  # type: ignore[attr-defined]
            extra.insert(0, TaskScheduleSync(verbose=int(getattr(self, "verbose", 0))))
        if extra:
            if callback is None:
                user: list[BaseCallback] = []
            elif isinstance(callback, list):
                user = list(callback)
            elif isinstance(callback, BaseCallback):
                user = [callback]
            else:
                user = [ConvertCallback(callback)]
            sync = [c for c in extra if isinstance(c, TaskScheduleSync)]
            callback = CallbackList(sync + user + [c for c in extra if c not in sync])
        return super().learn(total_timesteps, callback, *args, **kwargs)  # type: ignore[misc]

    def _setup_learn(self, *args: Any, **kwargs: Any) -> Any:
        """SB3's ``_setup_learn``; then, with the run's logger configured, the run metadata goes into its
        TensorBoard directory (:func:`sb3_plastic.run_info.write_run_info`, read by ``sb3-plastic plot``)."""
        from sb3_plastic.run_info import write_run_info

        total_timesteps, callback = super()._setup_learn(*args, **kwargs)  # type: ignore[misc]
        write_run_info(self, callback)  # type: ignore[arg-type]
        return total_timesteps, callback

    def _check_plastic_policy(self, policy: str) -> None:
        if policy not in self.policy_aliases:
            raise ValueError(
                f"Unknown policy {policy!r} for {type(self).__name__}; allowed: {sorted(self.policy_aliases)} "
                "or a policy class"
            )


def upgrade_isometry_data(data: dict[str, Any]) -> dict[str, Any]:
    """The entries of a plastic zip's ``data`` that change to load it in today's isometry convention (SB3
    ``custom_objects``; empty for a zip of the current format).

    A zip without ``isometry_format`` was saved before issue #27, when the penalty was ``||Gram - s I||_F^2`` (no 1/2):
    its ``policy_kwargs`` and ``isometry_config`` get ``isometry_coef`` doubled (the same penalty as
    ``1/2 ||Gram - s I||_F^2``), ``isometry_rect_scale=False`` and ``isometry_normalize=False``, and
    ``isometry_format`` the current :data:`~sb3_plastic.isometry.ISOMETRY_FORMAT`. (The optimizer's param groups are
    upgraded when they are loaded, :func:`sb3_plastic.optim.upgrade_isometry_groups`.)
    """
    if data.get("isometry_format", 1) >= ISOMETRY_FORMAT:
        return {}
    before = dict(isometry_rect_scale=False, isometry_normalize=False)  # the options did not exist
    objects: dict[str, Any] = {"isometry_format": ISOMETRY_FORMAT}
    policy_kwargs = data.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and "isometry_coef" in policy_kwargs:
        objects["policy_kwargs"] = {**policy_kwargs, "isometry_coef": 2 * policy_kwargs["isometry_coef"], **before}
    config = data.get("isometry_config")
    if isinstance(config, IsometryConfig):
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(IsometryConfig)}
        fields.update(isometry_coef=2 * config.isometry_coef, **before)
        objects["isometry_config"] = IsometryConfig(**fields)
    return objects


def sb3_zip_objects(
    cls: type, path: Any, custom_objects: Optional[dict[str, Any]] = None, data: Optional[dict[str, Any]] = None
) -> Optional[tuple[dict[str, Any], IsometryConfig]]:
    """What loads a zip saved by the SB3 / sb3-contrib class behind the plastic class ``cls`` as ``cls``: ``None`` for a
    plastic zip (its policy class is a :class:`~sb3_plastic.policies.PlasticPolicyMixin`), else
    ``(custom_objects, config)`` with ``config`` plasticity off (``activation=None``: SB3's activations;
    ``isometry_mode="off"``, ``optimizer="adam"``), so the networks and the optimizer are SB3's, bit for bit. For a
    policy class of one of the SB3 class's aliases, ``custom_objects`` put the plastic policy of the same alias
    (``cls.policy_aliases``) in place of SB3's and add the plastic keywords of ``config`` to the saved
    ``policy_kwargs``; a user's own policy class (also the one of a plastic model trained with plasticity off) is
    kept as saved (``custom_objects`` empty, :mod:`sb3_plastic.common.user_policy`).

    Reads only the zip's ``data`` entry (the parameters are read once, by SB3's ``load``), or takes it as ``data``.

    :raises ValueError: for a file that is not a whole model zip (:func:`sb3_plastic.common.model_zip.read_data_text`).
    """
    data = read_data(path, custom_objects) if data is None else data
    policy_class = data.get("policy_class")
    if isinstance(policy_class, type) and issubclass(policy_class, PlasticPolicyMixin):
        return None
    config = IsometryConfig(
        activation=None, isometry_coef=cls.default_isometry_coef, isometry_mode="off", optimizer="adam"
    )
    alias = plastic_alias_class(cls, policy_class) if isinstance(policy_class, type) else None
    if alias is None:
        saved = data.get("isometry_config")  # a plastic model's own zip (a user's class, plasticity off)
        return {}, saved if isinstance(saved, IsometryConfig) else config
    policy_kwargs = dict(data.get("policy_kwargs") or {})
    policy_kwargs.update(config.to_kwargs())
    return {"policy_class": cls.policy_aliases[alias], "policy_kwargs": policy_kwargs}, config


def _default(function: Any, name: str) -> Any:
    """Default value of parameter ``name`` of ``function`` (``None`` if it has none)."""
    parameter = inspect.signature(function).parameters.get(name)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default


@functools.cache
def plastic_keyword_docs(isometry_coef_default: float = PlasticAlgorithmMixin.default_isometry_coef) -> str:
    """The ``:param`` section of every plastic and intervention keyword (meaning and default), generated from
    the docstrings of :class:`~sb3_plastic.config.IsometryConfig` and of the intervention configs
    (:func:`intervention_config_classes`); appended to the docstring of every plastic algorithm.

    :param isometry_coef_default: the class's :attr:`PlasticAlgorithmMixin.default_isometry_coef`, shown as the
        default of ``isometry_coef``.
    """
    from sb3_plastic.common.docs import keyword_docs

    signature = inspect.signature(PlasticAlgorithmMixin.__init__).parameters
    isometry_defaults = {name: signature[name].default for name in ISOMETRY_KEYS if name in signature}
    isometry_defaults["isometry_coef"] = isometry_coef_default
    titles = {
        "fire": "FIRE",
        "cbp": "Continual Backprop",
        "redo": "ReDo",
        "shrink_perturb": "Shrink & Perturb",
        "l2_init": "L2-init (regenerative regularisation)",
        "spectral": "Spectral regularisation",
        "nap": "Normalize-and-Project",
        "layer_reset": "Layer reset (primacy bias)",
        "churn_reduction": "C-CHAIN (churn reduction)",
        "plasticity_injection": "Plasticity injection",
        "parseval": "Parseval regularisation",
    }
    groups: dict[str, tuple[type, Optional[dict[str, Any]]]] = {"Isometry": (IsometryConfig, isometry_defaults)}
    for key, config_cls in intervention_config_classes().items():
        groups[f"Intervention: {titles.get(key, key)}"] = (config_cls, None)
    intro = (
        "An intervention enabled by its keywords is added to the callbacks of every ``learn()`` call; it is the "
        "same callback class users can pass themselves (:mod:`sb3_plastic.callbacks`)."
    )
    return keyword_docs(groups, intro)


def is_plastic(model: BaseAlgorithm) -> bool:
    """Whether ``model`` is one of the plastic algorithms."""
    return isinstance(model, PlasticAlgorithmMixin)
