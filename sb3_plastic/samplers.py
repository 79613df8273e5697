"""Optuna samplers of the plastic algorithms for rl_zoo3's ``-optimize``.

Each plastic sampler is the base algorithm's own rl_zoo3 sampler (``rl_zoo3.hyperparams_opt``: learning
rate, batch size, gamma, net_arch, ...) plus the plastic search space, in the spelling of the yaml files
and of the algorithms' constructors (top-level keywords):

* ``isometry_coef``: log-uniform in [2e-3, 20] (the authors' convention ``R = 1/2 ||Gram - s I||_F^2``; [1e-3, 10]
  before issue #27, whose penalty had no 1/2: the same penalties); reaches AdamO's ``param_groups`` (``"isometry_coef"``).
* ``replacement_rate``: log-uniform in [1e-6, 1e-2]; reaches Continual Backprop.
* ``maturity_threshold``: integer, log-uniform in [100, 10 000] gradient steps; reaches Continual Backprop.
* ``activation``: PPO ``tanh`` / ``relu`` / ``maxmin`` (it takes the place of rl_zoo3's ``activation_fn``
  question, widened by MaxMin); off-policy algorithms ``relu`` / ``maxmin`` (added: rl_zoo3 keeps ReLU
  there). Reaches the policy networks.

Why these ranges. The decoupled isometry step is ``lr * isometry_coef * grad R(W)``: with the base
learning rates (1e-5 ... 2e-3) the range keeps ``lr * isometry_coef`` between ~2e-8 (practically off) and
~4e-2 (strong; our supervised probe kept ReLU nets trainable for 2e-4 ... 2e-2, see
``sb3_plastic.config.IsometryConfig``). Dohare et al. (2024, Nature) use ``replacement_rate`` 1e-4 and a
maturity of 10 000 updates for PPO on Slippery Ant and report the rate to be insensitive within an order
of magnitude; the range spans two orders on either side. Every sampled trial therefore runs Continual
Backprop (a log-uniform rate cannot be 0, and optuna refuses to enqueue 0 for it): to fix values, enqueue
trials (``study.enqueue_trial({"replacement_rate": 1e-4})``); to tune without Continual Backprop, build a
sampler with :func:`make_plastic_sampler` and your own ``plastic`` part, and put it into
``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` after :func:`sb3_plastic.zoo.register`.

The sampled values are passed as top-level keywords to ``PlasticPPO`` / ``PlasticDQN`` / ``PlasticSAC`` /
``PlasticQRDQN`` / ``PlasticTQC`` (the last two on rl_zoo3's ``qrdqn`` / ``tqc`` samplers, which add
``n_quantiles`` and, for TQC, ``top_quantiles_to_drop_per_net``) / ``PlasticMaskablePPO`` (``plastic_ppo_mask``,
on rl_zoo3's PPO sampler: rl_zoo3 has none for MaskablePPO, see :data:`SAMPLER_BASES`),
which hand ``isometry_coef`` to AdamO and ``replacement_rate`` / ``maturity_threshold`` to the
:class:`~sb3_plastic.callbacks.ContinualBackprop` they add to ``learn()`` (``model.intervention_configs``).
A yaml's top-level plastic keys that are not sampled (``fire_at``, ``isometry_mode``, ...) stay in force.

The isometry paper's baselines (issue #15) have search spaces of their own, used *instead of* the plastic space
above (:data:`BASELINE_SPACES`, :func:`plastic_sampler_for` with ``method=``): ``"l2_init"`` samples
``l2_init_coef`` log-uniform in [1e-6, 1e-1] (Kumar et al., 2023, sweep 1e-5 ... 1e-2), ``"spectral"`` samples
``spectral_coef`` log-uniform in [1e-6, 1e-1] (Lewandowski et al., 2024, sweep a similar decade range),
``"nap"`` turns Normalize-and-Project on and samples ``nap_project`` (``"normalized"`` / ``"all"``), ``"layer_reset"``
samples what :class:`~sb3_plastic.callbacks.LayerReset` resets (``layer_reset_layers``: ``"heads"``, ``"policy_head"``,
``"value_head"``, ``"critic"``) and its period ``layer_reset_every`` (integer, log-uniform in [1e4, 1e6] timesteps;
Nikishin et al., 2022 reset every 2e4 updates with SPR and 2e5 with SAC), ``"churn_reduction"`` turns C-CHAIN on
(:class:`~sb3_plastic.callbacks.ChurnReduction`) and samples its target relative scale ``churn_reduction_target_scale``
log-uniform in [1e-3, 1e5] (the references' values differ by agent: 1e4 for discrete PPO, 0.05 for continuous PPO,
0.01 for DQN; enqueue the one of your agent), ``"trac"`` switches the optimizer to TRAC (``optimizer="trac"``,
``isometry_mode="off"``; parameter-free: nothing of its own is sampled, the base space's learning rate stays),
``"plasticity_injection"`` injects once (:class:`~sb3_plastic.callbacks.PlasticityInjection`) at a sampled fraction
``plasticity_injection_at`` of the run (uniform in [0.1, 0.9]; the paper's 0.5 in the middle) into a head of
``plasticity_injection_layers`` 2 or 3 layers, ``"parseval"`` samples ``parseval_coef`` log-uniform in [1e-5, 1e-1]
(:class:`~sb3_plastic.callbacks.ParsevalRegularisation`; Plasticine's value 1e-3 in the middle), ``"weight_clipping"``
turns weight clipping on (:class:`~sb3_plastic.callbacks.WeightClipping`) and samples ``weight_clipping_kappa``
log-uniform in [1, 10] (the reference's RL value 3 inside). The earlier methods have spaces too:
``"shrink_perturb"`` (the event form: ``shrink_factor`` uniform in [0.1, 0.9], ``perturb_scale`` log-uniform in
[1e-3, 1], period ``shrink_perturb_every`` log-uniform in [1e4, 1e6] timesteps; Ash & Adams' 0.4 / 0.1 inside),
``"shrink_perturb_continual"`` (``perturb_noise_std`` in [1e-7, 1e-3], ``shrink_weight_decay`` in [1e-6, 1e-2],
log-uniform; Dohare et al.'s 1e-5 / 1e-4 inside), ``"redo"`` (``redo_period`` in [100, 10 000] gradient steps and
``redo_tau`` in [0.01, 0.2], log-uniform; Sokar et al.'s 1 000 and 0.025 / 0.1 inside), ``"fire"`` (one FIRE at
``fire_at`` uniform in [0.1, 0.9] of the run), ``"layernorm"`` (``nap=True, nap_project="none"``: the layer norms
alone), ``"l2"`` (plain L2: ``weight_decay`` log-uniform in [1e-6, 1e-2], merged into
``policy_kwargs["optimizer_kwargs"]``) and ``"adam_equal_betas"`` (``optimizer="adam_equal_betas"``, penalty off;
nothing else sampled). ``"crelu"`` and
``"fourier"`` fix the activation (the ``activation`` parameter has that one choice; :class:`~sb3_plastic.activations.CReLU`,
:class:`~sb3_plastic.activations.Fourier`) and sample nothing else. To compare
against the plain baseline, set ``isometry_mode: "off"`` and ``optimizer: adam`` in the yaml (otherwise AdamO's
default penalty stays on), and register the sampler before running rl_zoo3::

    from rl_zoo3 import hyperparams_opt
    from sb3_plastic.samplers import plastic_sampler_for
    sampler, converter = plastic_sampler_for("ppo", method="spectral")
    hyperparams_opt.HYPERPARAMS_SAMPLER["plastic_ppo"] = sampler
    hyperparams_opt.HYPERPARAMS_CONVERTER["plastic_ppo"] = converter
As everywhere in rl_zoo3, sampled keys override the yaml's, and the sampled ``policy_kwargs`` (net_arch,
...) replace the yaml's ``policy_kwargs`` as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from torch import nn

#: The plastic optuna parameters added to every base search space (``activation`` is handled apart).
PLASTIC_PARAMS: tuple[str, ...] = ("isometry_coef", "replacement_rate", "maturity_threshold")
#: Search range of ``isometry_coef`` (log-uniform).
ISOMETRY_COEF_RANGE = (2e-3, 20.0)
#: Search range of ``replacement_rate`` (log-uniform).
REPLACEMENT_RATE_RANGE = (1e-6, 1e-2)
#: Search range of ``maturity_threshold`` (integer, log-uniform; counts gradient steps).
MATURITY_THRESHOLD_RANGE = (100, 10_000)
#: Search range of ``l2_init_coef`` (log-uniform).
L2_INIT_COEF_RANGE = (1e-6, 1e-1)
#: Search range of ``spectral_coef`` (log-uniform).
SPECTRAL_COEF_RANGE = (1e-6, 1e-1)
#: ``nap_project`` choices.
NAP_PROJECT_CHOICES = ("normalized", "all")
#: ``layer_reset_layers`` choices (the roles of :data:`sb3_plastic.callbacks.layer_reset.LAYER_ROLES` but ``"all"``).
LAYER_RESET_CHOICES = ("heads", "policy_head", "value_head", "critic")
#: Search range of ``layer_reset_every`` (integer timesteps, log-uniform).
LAYER_RESET_EVERY_RANGE = (10_000, 1_000_000)
#: Search range of ``churn_reduction_target_scale`` (log-uniform).
CHURN_TARGET_SCALE_RANGE = (1e-3, 1e5)
#: Search range of ``weight_clipping_kappa`` (log-uniform).
WEIGHT_CLIPPING_KAPPA_RANGE = (1.0, 10.0)
#: Search range of ``shrink_factor`` (uniform) and ``perturb_scale`` (log-uniform) of event Shrink & Perturb.
SHRINK_FACTOR_RANGE = (0.1, 0.9)
PERTURB_SCALE_RANGE = (1e-3, 1.0)
#: Search range of ``shrink_perturb_every`` (integer timesteps, log-uniform).
SHRINK_PERTURB_EVERY_RANGE = (10_000, 1_000_000)
#: Search range of ``perturb_noise_std`` and ``shrink_weight_decay`` of continual Shrink & Perturb (log-uniform).
PERTURB_NOISE_STD_RANGE = (1e-7, 1e-3)
SHRINK_WEIGHT_DECAY_RANGE = (1e-6, 1e-2)
#: Search range of ``redo_period`` (integer gradient steps, log-uniform) and ``redo_tau`` (log-uniform).
REDO_PERIOD_RANGE = (100, 10_000)
REDO_TAU_RANGE = (0.01, 0.2)
#: Search range of ``fire_at`` (uniform fraction of the run).
FIRE_AT_RANGE = (0.1, 0.9)
#: Search range of plain L2's ``weight_decay`` (``optimizer_kwargs``; log-uniform).
WEIGHT_DECAY_RANGE = (1e-6, 1e-2)
#: The optuna parameters of the baselines' spaces (:data:`BASELINE_SPACES`).
BASELINE_PARAMS: tuple[str, ...] = ("l2_init_coef", "spectral_coef", "nap_project", "layer_reset_layers",
                                    "layer_reset_every", "churn_reduction_target_scale", "optimizer",
                                    "plasticity_injection_at", "plasticity_injection_layers", "parseval_coef",
                                    "weight_clipping_kappa", "shrink_factor", "perturb_scale",
                                    "shrink_perturb_every", "perturb_noise_std", "shrink_weight_decay", "redo_period",
                                    "redo_tau", "fire_at")
#: ``activation`` choices of on-policy samplers (rl_zoo3's tanh / relu, plus MaxMin).
ON_POLICY_ACTIVATIONS = ("tanh", "relu", "maxmin")
#: ``activation`` choices of off-policy samplers (rl_zoo3 keeps SB3's ReLU there; MaxMin added).
OFF_POLICY_ACTIVATIONS = ("relu", "maxmin")

_ACTIVATION_CLASSES: dict[type[nn.Module], str] = {nn.Tanh: "tanh", nn.ReLU: "relu"}

Sampler = Callable[[optuna.Trial, int, int, dict], dict[str, Any]]
Converter = Callable[[dict[str, Any]], dict[str, Any]]


def sample_plastic_params(trial: optuna.Trial) -> dict[str, Any]:
    """The plastic part of every search space (see the module docstring)."""
    return {
        "isometry_coef": trial.suggest_float("isometry_coef", *ISOMETRY_COEF_RANGE, log=True),
        "replacement_rate": trial.suggest_float("replacement_rate", *REPLACEMENT_RATE_RANGE, log=True),
        "maturity_threshold": trial.suggest_int("maturity_threshold", *MATURITY_THRESHOLD_RANGE, log=True),
    }


def sample_l2_init_params(trial: optuna.Trial) -> dict[str, Any]:
    """L2-init's space: ``l2_init_coef`` (:class:`~sb3_plastic.callbacks.L2Init`)."""
    return {"l2_init_coef": trial.suggest_float("l2_init_coef", *L2_INIT_COEF_RANGE, log=True)}


def sample_spectral_params(trial: optuna.Trial) -> dict[str, Any]:
    """Spectral regularisation's space: ``spectral_coef`` (:class:`~sb3_plastic.callbacks.SpectralRegularisation`)."""
    return {"spectral_coef": trial.suggest_float("spectral_coef", *SPECTRAL_COEF_RANGE, log=True)}


def sample_nap_params(trial: optuna.Trial) -> dict[str, Any]:
    """Normalize-and-Project's space: ``nap=True`` and ``nap_project`` (:mod:`sb3_plastic.callbacks.nap`)."""
    return {"nap": True, "nap_project": trial.suggest_categorical("nap_project", list(NAP_PROJECT_CHOICES))}


def sample_layer_reset_params(trial: optuna.Trial) -> dict[str, Any]:
    """Layer reset's space: ``layer_reset_layers`` and ``layer_reset_every`` (:class:`~sb3_plastic.callbacks.LayerReset`)."""
    return {
        "layer_reset_layers": trial.suggest_categorical("layer_reset_layers", list(LAYER_RESET_CHOICES)),
        "layer_reset_every": trial.suggest_int("layer_reset_every", *LAYER_RESET_EVERY_RANGE, log=True),
    }


def sample_churn_reduction_params(trial: optuna.Trial) -> dict[str, Any]:
    """C-CHAIN's space: ``churn_reduction=True`` and ``churn_reduction_target_scale``
    (:class:`~sb3_plastic.callbacks.ChurnReduction`)."""
    scale = trial.suggest_float("churn_reduction_target_scale", *CHURN_TARGET_SCALE_RANGE, log=True)
    return {"churn_reduction": True, "churn_reduction_target_scale": scale}


def sample_trac_params(trial: optuna.Trial) -> dict[str, Any]:
    """TRAC's space: ``optimizer="trac"`` (recorded as a one-choice categorical, so ``--trial-id`` restores it) with the
    isometry penalty off (:mod:`sb3_plastic.trac`)."""
    return {"optimizer": trial.suggest_categorical("optimizer", ["trac"]), "isometry_mode": "off"}


def sample_plasticity_injection_params(trial: optuna.Trial) -> dict[str, Any]:
    """Plasticity injection's space: ``plasticity_injection_at`` and ``plasticity_injection_layers``."""
    return {
        "plasticity_injection_at": trial.suggest_float("plasticity_injection_at", 0.1, 0.9),
        "plasticity_injection_layers": trial.suggest_categorical("plasticity_injection_layers", [2, 3]),
    }


def sample_parseval_params(trial: optuna.Trial) -> dict[str, Any]:
    """Parseval regularisation's space: ``parseval_coef``."""
    return {"parseval_coef": trial.suggest_float("parseval_coef", 1e-5, 1e-1, log=True)}


def sample_weight_clipping_params(trial: optuna.Trial) -> dict[str, Any]:
    """Weight clipping's space: ``weight_clipping=True`` and ``weight_clipping_kappa``
    (:class:`~sb3_plastic.callbacks.WeightClipping`)."""
    kappa = trial.suggest_float("weight_clipping_kappa", *WEIGHT_CLIPPING_KAPPA_RANGE, log=True)
    return {"weight_clipping": True, "weight_clipping_kappa": kappa}


def sample_shrink_perturb_params(trial: optuna.Trial) -> dict[str, Any]:
    """Shrink & Perturb's event form (Ash & Adams, 2020; :class:`~sb3_plastic.callbacks.ShrinkPerturb`): ``shrink_factor``,
    ``perturb_scale`` and the period ``shrink_perturb_every`` (a yaml's ``shrink_perturb_on_task_change: true`` adds the
    switches)."""
    return {
        "shrink_perturb": "event",
        "shrink_factor": trial.suggest_float("shrink_factor", *SHRINK_FACTOR_RANGE),
        "perturb_scale": trial.suggest_float("perturb_scale", *PERTURB_SCALE_RANGE, log=True),
        "shrink_perturb_every": trial.suggest_int("shrink_perturb_every", *SHRINK_PERTURB_EVERY_RANGE, log=True),
    }


def sample_shrink_perturb_continual_params(trial: optuna.Trial) -> dict[str, Any]:
    """Shrink & Perturb's continual form (Dohare et al., 2024): ``perturb_noise_std`` and ``shrink_weight_decay``."""
    return {
        "shrink_perturb": "continual",
        "perturb_noise_std": trial.suggest_float("perturb_noise_std", *PERTURB_NOISE_STD_RANGE, log=True),
        "shrink_weight_decay": trial.suggest_float("shrink_weight_decay", *SHRINK_WEIGHT_DECAY_RANGE, log=True),
    }


def sample_redo_params(trial: optuna.Trial) -> dict[str, Any]:
    """ReDo's space (Sokar et al., 2023; :class:`~sb3_plastic.callbacks.ReDo`): ``redo_period`` and ``redo_tau`` (their
    0.025 and 0.1 inside)."""
    return {
        "redo_period": trial.suggest_int("redo_period", *REDO_PERIOD_RANGE, log=True),
        "redo_tau": trial.suggest_float("redo_tau", *REDO_TAU_RANGE, log=True),
    }


def sample_fire_params(trial: optuna.Trial) -> dict[str, Any]:
    """FIRE's space (Lee et al., 2024; :class:`~sb3_plastic.callbacks.FIRE`): one FIRE at a fraction ``fire_at`` of the
    run (a yaml's ``fire_on_task_change: true`` adds the switches)."""
    return {"fire_at": trial.suggest_float("fire_at", *FIRE_AT_RANGE)}


def sample_layernorm_params(trial: optuna.Trial) -> dict[str, Any]:
    """LayerNorm alone: NaP's layer norms without its projection (``nap=True, nap_project="none"``; recorded as a
    one-choice categorical, so ``--trial-id`` restores it)."""
    return {"nap": True, "nap_project": trial.suggest_categorical("nap_project", ["none"])}


def sample_adam_equal_betas_params(trial: optuna.Trial) -> dict[str, Any]:
    """Adam with beta1 = beta2 (Dohare et al., 2023): ``optimizer="adam_equal_betas"`` (a one-choice categorical) with the
    isometry penalty off; nothing else of its own (the base space's learning rate stays)."""
    return {"optimizer": trial.suggest_categorical("optimizer", ["adam_equal_betas"]), "isometry_mode": "off"}


def sample_l2_params(trial: optuna.Trial) -> dict[str, Any]:
    """Plain L2: the optimizer's ``weight_decay`` (``policy_kwargs["optimizer_kwargs"]``, torch Adam's coupled L2),
    log-uniform; the sampler merges it into the sampled ``policy_kwargs``."""
    return {"weight_decay": trial.suggest_float("weight_decay", *WEIGHT_DECAY_RANGE, log=True)}


#: method -> its search space, used in place of :func:`sample_plastic_params` (see the module docstring).
BASELINE_SPACES: dict[str, Callable[[optuna.Trial], dict[str, Any]]] = {
    "l2_init": sample_l2_init_params,
    "spectral": sample_spectral_params,
    "nap": sample_nap_params,
    "layer_reset": sample_layer_reset_params,
    "churn_reduction": sample_churn_reduction_params,
    "trac": sample_trac_params,
    "plasticity_injection": sample_plasticity_injection_params,
    "parseval": sample_parseval_params,
    "weight_clipping": sample_weight_clipping_params,
    "shrink_perturb": sample_shrink_perturb_params,
    "shrink_perturb_continual": sample_shrink_perturb_continual_params,
    "redo": sample_redo_params,
    "fire": sample_fire_params,
    "layernorm": sample_layernorm_params,
    "adam_equal_betas": sample_adam_equal_betas_params,
    "l2": sample_l2_params,
}


class _ActivationTrial:
    """A trial seen by rl_zoo3's base sampler: its ``activation_fn`` question is answered by the plastic
    ``activation`` parameter (MaxMin added to the choices); every other call goes to the real trial.

    The base sampler still gets one of its own choices (the real one, or ``"relu"`` standing in for
    ``"maxmin"``) so that its converter works unchanged; :func:`_to_plastic` then replaces the resulting
    ``policy_kwargs["activation_fn"]`` by the top-level ``activation`` keyword.
    """

    def __init__(self, trial: optuna.Trial, choices: tuple[str, ...]) -> None:
        self._trial = trial
        self._choices = choices
        self.activation: str | None = None

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        if name != "activation_fn":
            return self._trial.suggest_categorical(name, choices)
        self.activation = self._trial.suggest_categorical("activation", list(self._choices))
        return self.activation if self.activation in choices else "relu"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


def _to_plastic(params: dict[str, Any], activation: str | None) -> dict[str, Any]:
    """Move the activation from ``policy_kwargs["activation_fn"]`` to the plastic ``activation`` keyword.

    A top-level ``activation`` in the yaml would otherwise clash with a sampled ``activation_fn``.
    """
    params = dict(params)
    policy_kwargs = dict(params.get("policy_kwargs") or {})
    fn = policy_kwargs.get("activation_fn")
    if activation is None and fn in _ACTIVATION_CLASSES:
        activation = _ACTIVATION_CLASSES[fn]
    if activation is not None:
        policy_kwargs.pop("activation_fn", None)
        params["activation"] = activation
    if "policy_kwargs" in params or policy_kwargs:
        params["policy_kwargs"] = policy_kwargs
    return params


def make_plastic_sampler(
    base_sampler: Sampler,
    activations: tuple[str, ...],
    plastic: Callable[[optuna.Trial], dict[str, Any]] = sample_plastic_params,
) -> Sampler:
    """A plastic sampler: ``base_sampler``'s space, ``activation`` among ``activations`` and the plastic
    parameters of ``plastic``.

    :param base_sampler: an rl_zoo3 sampler, ``(trial, n_actions, n_envs, additional_args) -> hyperparams``.
    :param activations: choices of the ``activation`` parameter (it replaces the base's ``activation_fn``
        if the base samples one, else it is added).
    :param plastic: ``trial -> top-level plastic keywords`` (default :func:`sample_plastic_params`).
    """

    def sampler(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
        proxy = _ActivationTrial(trial, activations)
        params = base_sampler(proxy, n_actions, n_envs, additional_args)  # type: ignore[arg-type]
        activation = proxy.activation
        if activation is None:
            activation = trial.suggest_categorical("activation", list(activations))
        params = _to_plastic(params, activation)
        params.update(plastic(trial))
        return _weight_decay_into_optimizer_kwargs(params)

    sampler.__name__ = f"plastic_{getattr(base_sampler, '__name__', 'sampler')}"
    sampler.__doc__ = f"{getattr(base_sampler, '__name__', 'the base sampler')} + sb3_plastic.samplers.sample_plastic_params"
    return sampler


def _weight_decay_into_optimizer_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """Move a sampled ``weight_decay`` (plain L2) into ``policy_kwargs["optimizer_kwargs"]``, where SB3 hands it to the
    optimizer."""
    if "weight_decay" in params:
        policy_kwargs = dict(params.get("policy_kwargs") or {})
        policy_kwargs["optimizer_kwargs"] = {**(policy_kwargs.get("optimizer_kwargs") or {}),
                                             "weight_decay": params.pop("weight_decay")}
        params["policy_kwargs"] = policy_kwargs
    return params


def make_plastic_converter(base_converter: Converter, base_samples_activation: bool) -> Converter:
    """The inverse path used by rl_zoo3's ``--trial-id`` / ``load_trial``: optuna params -> hyperparameters.

    :param base_converter: rl_zoo3's converter of the base algorithm.
    :param base_samples_activation: whether the base sampler asks for ``activation_fn`` (its converter
        then needs that entry; it gets a stand-in, replaced by the plastic ``activation``).
    """

    def convert(sampled_params: dict[str, Any]) -> dict[str, Any]:
        params = dict(sampled_params)
        plastic = {key: params.pop(key) for key in (*PLASTIC_PARAMS, *BASELINE_PARAMS, "weight_decay") if key in params}
        if "nap_project" in plastic:
            plastic["nap"] = True
        if "shrink_factor" in plastic:
            plastic["shrink_perturb"] = "event"
        if "perturb_noise_std" in plastic:
            plastic["shrink_perturb"] = "continual"
        if "churn_reduction_target_scale" in plastic:
            plastic["churn_reduction"] = True
        if "weight_clipping_kappa" in plastic:
            plastic["weight_clipping"] = True
        if plastic.get("optimizer") in ("trac", "adam_equal_betas"):
            plastic["isometry_mode"] = "off"
        activation = params.pop("activation", None)
        if activation is not None and base_samples_activation:
            params["activation_fn"] = activation if activation in ("tanh", "relu") else "relu"
        hyperparams = _to_plastic(base_converter(params), activation)
        hyperparams.update(plastic)
        return _weight_decay_into_optimizer_kwargs(hyperparams)

    convert.__name__ = f"plastic_{getattr(base_converter, '__name__', 'converter')}"
    return convert


def _base(name: str) -> tuple[Sampler, Converter]:
    from rl_zoo3 import hyperparams_opt

    # the original rl_zoo3 functions, not whatever a launcher registered under the name since
    sampler = getattr(hyperparams_opt, f"sample_{name}_params")
    converter = hyperparams_opt.HYPERPARAMS_CONVERTER[name]
    return sampler, converter


def sample_plastic_ppo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's PPO space (``activation_fn`` widened to the plastic ``activation``) + the plastic space."""
    return make_plastic_sampler(_base("ppo")[0], ON_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_dqn_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's DQN space + ``activation`` (relu / maxmin) + the plastic space."""
    return make_plastic_sampler(_base("dqn")[0], OFF_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_sac_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's SAC space + ``activation`` (relu / maxmin) + the plastic space."""
    return make_plastic_sampler(_base("sac")[0], OFF_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_qrdqn_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's QR-DQN space (its DQN space + ``n_quantiles`` in ``policy_kwargs``) + ``activation``
    (relu / maxmin) + the plastic space."""
    return make_plastic_sampler(_base("qrdqn")[0], OFF_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_tqc_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's TQC space (its SAC space + ``n_quantiles`` in ``policy_kwargs`` and
    ``top_quantiles_to_drop_per_net``) + ``activation`` (relu / maxmin) + the plastic space."""
    return make_plastic_sampler(_base("tqc")[0], OFF_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_crossq_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """A CrossQ search space (rl_zoo3 2.9.2 has ``crossq`` in ``ALGOS`` but no sampler for it): rl_zoo3's SAC
    space without ``tau`` (CrossQ has no target network), batch sizes 32 ... 1024 (BatchRenorm estimates
    statistics on the batch, so tiny batches are left out), and CrossQ's ``policy_delay`` (critic updates per
    actor update, 1 ... 5; sb3-contrib's default is 3). The optuna parameter names and their conversion are
    rl_zoo3's off-policy ones (``convert_offpolicy_params``, SAC's converter), so ``--trial-id`` works."""
    from rl_zoo3.hyperparams_opt import convert_offpolicy_params, sample_her_params

    one_minus_gamma = trial.suggest_float("one_minus_gamma", 0.0001, 0.03, log=True)
    batch_size_pow = trial.suggest_int("batch_size_pow", 5, 10)
    learning_rate = trial.suggest_float("learning_rate", 1e-5, 0.002, log=True)
    train_freq = trial.suggest_int("train_freq", 1, 10)
    policy_delay = trial.suggest_int("policy_delay", 1, 5)
    net_arch = trial.suggest_categorical("net_arch", ["small", "medium", "big"])
    trial.set_user_attr("gamma", 1 - one_minus_gamma)
    trial.set_user_attr("batch_size", 2**batch_size_pow)
    hyperparams = {
        "one_minus_gamma": one_minus_gamma,
        "learning_rate": learning_rate,
        "batch_size_pow": batch_size_pow,
        "train_freq": train_freq,
        "policy_delay": policy_delay,
        "net_arch": net_arch,
    }
    if additional_args.get("using_her_replay_buffer"):
        hyperparams = sample_her_params(trial, hyperparams, additional_args["her_kwargs"])
    return convert_offpolicy_params(hyperparams)


def sample_plastic_crossq_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """CrossQ (``plastic_crossq``): :func:`sample_crossq_params` + ``activation`` (relu / maxmin) + the plastic
    space (``isometry_coef`` reaches the Linear weights; BatchRenorm layers have no matrix to regularise)."""
    return make_plastic_sampler(sample_crossq_params, OFF_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_ppo_mask_params(
    trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict
) -> dict[str, Any]:
    """MaskablePPO (``plastic_ppo_mask``): rl_zoo3 2.9.2 has no MaskablePPO sampler, and MaskablePPO's
    hyperparameters are PPO's (masks change the policy's distribution, not what is tuned), so this is
    rl_zoo3's PPO space (``activation_fn`` widened to the plastic ``activation``) + the plastic space."""
    return make_plastic_sampler(_base("ppo")[0], ON_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


def sample_plastic_ppo_lstm_params(
    trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict
) -> dict[str, Any]:
    """RecurrentPPO (``plastic_ppo_lstm``): rl_zoo3's ``ppo_lstm`` space (which is its PPO space; the LSTM size
    stays the yaml's ``policy_kwargs``) with ``activation_fn`` widened to the plastic ``activation`` (the MLP
    after the LSTM) + the plastic space (``isometry_coef`` also reaches the LSTM gate blocks)."""
    return make_plastic_sampler(_base("ppo_lstm")[0], ON_POLICY_ACTIVATIONS)(trial, n_actions, n_envs, additional_args)


#: Base rl_zoo3 algorithms whose samplers sample ``activation_fn`` (the rest get ``activation`` added).
_ON_POLICY = ("ppo", "a2c", "trpo", "ppo_lstm")
#: Base algorithms rl_zoo3 has no sampler for, tuned on another base's space (MaskablePPO on PPO's) or with
#: another base's converter (CrossQ: its own space, :func:`sample_crossq_params`, converted as SAC's).
SAMPLER_BASES: dict[str, str] = {"crossq": "sac", "ppo_mask": "ppo"}


#: Methods that are an activation: the sampler's ``activation`` parameter has that one choice.
ACTIVATION_METHODS: tuple[str, ...] = ("crelu", "fourier")
#: ``(base, method)`` pairs whose plastic algorithm refuses the method in ``learn()`` (``ValueError``, with this reason):
#: :func:`plastic_sampler_for` raises for them rather than hand out a sampler every trial of which would fail.
UNSUPPORTED_METHODS: dict[tuple[str, str], str] = {
    ("crossq", "churn_reduction"): "ChurnReduction does not support CrossQ (BatchRenorm's batch statistics)",
    ("crossq", "plasticity_injection"): "PlasticityInjection does not support CrossQ (BatchRenorm's batch statistics)",
    ("ppo_lstm", "churn_reduction"): "ChurnReduction does not support RecurrentPPO (a batch needs its sequences' LSTM states)",
}


def plastic_sampler_for(base_name: str, method: str | None = None) -> tuple[Sampler, Converter] | None:
    """The plastic sampler and converter for a plastic algorithm built on rl_zoo3's ``base_name``
    (``"ppo"``, ``"dqn"``, ``"sac"``, ``"qrdqn"``, ...); ``None`` when rl_zoo3 has no sampler for it.

    :param base_name: the rl_zoo3 algorithm the plastic one extends.
    :param method: ``None`` (the plastic space, :func:`sample_plastic_params`), a key of :data:`BASELINE_SPACES`
        (``"l2_init"``, ``"spectral"``, ``"nap"``, ...): the base space + ``activation`` + that baseline's space, or one of
        :data:`ACTIVATION_METHODS`: the base space with that activation.
    :raises ValueError: for an unknown ``method``, or one the algorithm refuses (:data:`UNSUPPORTED_METHODS`).
    """
    from rl_zoo3 import hyperparams_opt

    if method is not None and method not in BASELINE_SPACES and method not in ACTIVATION_METHODS:
        raise ValueError(f"Unknown method {method!r}; allowed: None or {sorted([*BASELINE_SPACES, *ACTIVATION_METHODS])}")
    if (base_name, method) in UNSUPPORTED_METHODS:
        raise ValueError(f"No {method!r} sampler for {base_name!r}: {UNSUPPORTED_METHODS[base_name, method]}")

    source = SAMPLER_BASES.get(base_name, base_name)
    if not hasattr(hyperparams_opt, f"sample_{source}_params") or source not in hyperparams_opt.HYPERPARAMS_CONVERTER:
        return None
    named = {
        "ppo": sample_plastic_ppo_params,
        "dqn": sample_plastic_dqn_params,
        "sac": sample_plastic_sac_params,
        "qrdqn": sample_plastic_qrdqn_params,
        "tqc": sample_plastic_tqc_params,
        "crossq": sample_plastic_crossq_params,
        "ppo_lstm": sample_plastic_ppo_lstm_params,
        "ppo_mask": sample_plastic_ppo_mask_params,
    }
    base_sampler, base_converter = _base(source)
    on_policy = source in _ON_POLICY
    activations = ON_POLICY_ACTIVATIONS if on_policy else OFF_POLICY_ACTIVATIONS
    converter = make_plastic_converter(base_converter, base_samples_activation=on_policy)
    if method is not None:
        space = sample_crossq_params if base_name == "crossq" else base_sampler
        if method in ACTIVATION_METHODS:
            return make_plastic_sampler(space, (method,), plastic=lambda trial: {}), converter
        return make_plastic_sampler(space, activations, plastic=BASELINE_SPACES[method]), converter
    sampler = named.get(base_name) or make_plastic_sampler(base_sampler, activations)
    return sampler, converter
