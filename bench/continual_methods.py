"""The methods of bench/continual.py: the method names (:data:`METHODS` and its groups, the names per algorithm),
their hyperparameters (:class:`MethodParams`), and the env and agent of a run (:func:`make_env`,
:func:`build_model`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

from continual_settings import ALGOS, PLAIN_ACTIVATIONS, Setting

#: method names for PPO settings; on a DQN / SAC setting the "ppo" prefix is the algorithm's (see method_name)
METHODS = (
    "ppo", "ppo_l2", "ppo_snp", "ppo_cbp", "ppo_cbp_dohare", "ppo_redo", "ppo_fire", "ppo_fire_switch",
    "plastic_relu", "plastic_maxmin", "ppo_adam_equal_betas",
)
#: The isometry paper's baselines (issue #15), on request (``--methods``).
BASELINE_METHODS = ("ppo_l2_init", "ppo_spectral", "ppo_nap")
#: The isometry penalty's options in its authors' convention (issue #27), on request: keywords of the plastic algorithm.
#: The last three take the penalty of ``plastic_relu`` apart (thirty-seventh session, why its fresh agents learn
#: slowly on ``minatar_intensive``): ``plastic_relu_free`` holds the weights' shape and not their scale
#: (``isometry_free_scale``; ``s = 2`` only for DfI's reading, 0 at SB3's init), ``plastic_relu_conv`` /
#: ``plastic_relu_linear`` penalise only the CNN's conv layer / its linear layer (the names of the library's
#: PlasticCNN; on another network the pattern matches nothing and the plastic algorithm refuses it);
#: ``plastic_maxmin_conv`` is MaxMin + AdamO with the conv layer's penalty alone. Thirty-ninth session: the penalty on
#: one side of its target (``isometry_side``), on the linear layer alone (``plastic_relu_linear_floor`` /
#: ``_ceiling``) and on every hidden layer (``plastic_relu_floor`` / ``_ceiling``): which half of the hold costs the
#: speed; ``plastic_relu_ceiling_s16`` / ``_s64``: the ceiling at a looser target (singular values capped at 4 / 8
#: instead of 1): how much growth a task's learning needs. Forty-first session: ``plastic_maxmin_off`` is the control
#: of ``plastic_maxmin_conv`` (its seed 0 ended tasks 10-19 at 42 against plain PPO's 19): MaxMin and the library's
#: orthogonal init with no penalty and Adam, so that the activation and init are told apart from the conv penalty.
#: Forty-third session: that control is the grid's strongest agent, and it differs from plain PPO in two things, the
#: activation (MaxMin, with the library's width convention) and the init (orthogonal with gain 1 on the hidden layers,
#: where SB3's ``ortho_init`` gives gain sqrt(2)); the other two cells of that 2 x 2 split them:
#: ``plastic_maxmin_off_sb3init`` (MaxMin with SB3's init) and ``plastic_relu_off_ortho`` (ReLU with the library's).
ISOMETRY_VARIANTS: dict[str, dict[str, Any]] = {
    "plastic_relu_rect": dict(isometry_rect_scale=True),
    "plastic_relu_s2": dict(isometry_scale=2.0),
    "plastic_relu_s2_rect": dict(isometry_scale=2.0, isometry_rect_scale=True),
    "plastic_maxmin_rect": dict(isometry_rect_scale=True),
    "plastic_relu_free": dict(isometry_scale=2.0, isometry_free_scale=True),
    "plastic_relu_conv": dict(isometry_layers=["features_extractor.cnn.*"]),
    "plastic_relu_linear": dict(isometry_layers=["features_extractor.linear.*"]),
    "plastic_maxmin_conv": dict(isometry_layers=["features_extractor.cnn.*"]),
    "plastic_maxmin_off": dict(isometry_mode="off", optimizer="adam"),
    "plastic_maxmin_off_sb3init": dict(isometry_mode="off", optimizer="adam", orthogonal_init=False),
    "plastic_relu_off_ortho": dict(isometry_mode="off", optimizer="adam", orthogonal_init=True),
    "plastic_relu_linear_floor": dict(isometry_layers=["features_extractor.linear.*"], isometry_side="floor"),
    "plastic_relu_linear_ceiling": dict(isometry_layers=["features_extractor.linear.*"], isometry_side="ceiling"),
    "plastic_relu_floor": dict(isometry_side="floor"),
    "plastic_relu_ceiling": dict(isometry_side="ceiling"),
    "plastic_relu_ceiling_s16": dict(isometry_side="ceiling", isometry_scale=16.0),
    "plastic_relu_ceiling_s64": dict(isometry_side="ceiling", isometry_scale=64.0),
}
METHODS = METHODS + BASELINE_METHODS + tuple(ISOMETRY_VARIANTS)
DEFAULT_METHODS = tuple(
    m for m in METHODS
    if m not in ("ppo_fire_switch", "ppo_cbp_dohare", "ppo_redo", "ppo_adam_equal_betas")
    and m not in BASELINE_METHODS + tuple(ISOMETRY_VARIANTS)
)
#: methods whose interventions act only at task changes or at the continual run's midpoint: off in a fresh agent
TASK_CHANGE_METHODS = ("ppo_snp", "ppo_fire", "ppo_fire_switch")

#: Head reset at every task switch (issue #29's control; :class:`~sb3_plastic.callbacks.LayerReset`, Nikishin et al.,
#: 2022), on request: ``ppo_head_reset`` both heads, ``ppo_policy_head_reset`` the action head, ``ppo_value_head_reset``
#: the value head (on a DQN setting each is the Q head). They act only at task changes: their fresh agent is the plain
#: one. Each maps to the ``layers`` of its LayerReset. ``ppo_head2_reset`` re-draws the last 2 layers of every path,
#: the layers ``ppo_injection`` replaces: the control that tells whether injection's frozen old heads (kept in the sum)
#: are what costs it, since both give the same layers fresh trainable weights at every switch.
HEAD_RESET_METHODS: dict[str, Any] = {"ppo_head_reset": "heads", "ppo_policy_head_reset": "policy_head",
                                      "ppo_value_head_reset": "value_head", "ppo_head2_reset": 2}
METHODS = METHODS + tuple(HEAD_RESET_METHODS) + ("ppo_injection",)
#: ``ppo_injection``: :class:`~sb3_plastic.callbacks.PlasticityInjection` (Nikishin et al., 2023) of a 2-layer head at
#: every task change (the paper injects once; every switch is the continual use), on request.
TASK_CHANGE_METHODS = TASK_CHANGE_METHODS + tuple(HEAD_RESET_METHODS) + ("ppo_injection",)

#: The field's methods (issue #30), on request: ``ppo_cchain`` C-CHAIN (:class:`~sb3_plastic.callbacks.ChurnReduction`,
#: Tang et al., 2025) at its reference settings for the agent; ``ppo_trac`` the plain agent's network with TRAC around
#: its Adam (``optimizer="trac"``, Muppidi et al., 2024); ``ppo_parseval``
#: :class:`~sb3_plastic.callbacks.ParsevalRegularisation` (Chung et al., 2024) at ``--parseval-coef``; ``ppo_crelu`` /
#: ``ppo_fourier`` the plain agent's network with CReLU (Abbas et al., 2023) / deep Fourier features (Lewandowski et al.,
#: 2024) in place of ReLU (half the units per layer); ``ppo_layernorm`` the plain agent with a layer norm before every
#: ReLU and no projection (``nap=True, nap_project="none"``: NaP without its projection); Adam beta1 = beta2 = 0.99 is
#: ``ppo_adam_equal_betas`` above; ``ppo_weight_clipping`` (twenty-third session): the plain agent with
#: :class:`~sb3_plastic.callbacks.WeightClipping` (Elsayed et al., 2024; a column of C-CHAIN's Gym-control table) at
#: ``--weight-clipping-kappa``. They act within a task: their fresh agents run them.
FIELD_METHODS = ("ppo_cchain", "ppo_trac", "ppo_parseval", "ppo_crelu", "ppo_fourier", "ppo_layernorm",
                 "ppo_weight_clipping")
METHODS = METHODS + FIELD_METHODS

#: Issue #29's mechanism controls besides the head resets, on request. ``ppo_vecnorm``: the plain agent on SB3's
#: running observation normalisation (:func:`normalise_observations`); it acts on every step, so its fresh agent runs
#: it too, with statistics of its own from the fresh agent's first observation. ``ppo_fire_switch_hidden``: FIRE at every
#: task change on the hidden layers only (``FIRE(layers="hidden")``, the output heads untouched: does the polar factor
#: of the representation alone restore learning, where FIRE on every layer also rewrites the saturated head?); a
#: task-change method, its fresh agent is the plain one.
#: ``ppo_tanh`` (twenty-first session): the plain agent with Tanh in place of its hidden activation (SB3's own
#: ``MlpPolicy`` default), MLP settings only: bounded hidden features, the control for deep Fourier features
#: (``ppo_fourier``, whose sin / cos are bounded too): does any bound on the features keep the head out of the saturation
#: that an observation offset drives a ReLU network's into? It acts within a task: its fresh agent runs it.
#: ``ppo_leaky_relu`` (forty-seventh session): the plain agent with :class:`torch.nn.LeakyReLU` (PyTorch's default
#: negative slope 0.01, fixed before its runs) in place of ReLU in every hidden layer, its CNN's included, at plain
#: PPO's widths, init and Adam: the control of the second of MaxMin's two properties on ``minatar_intensive`` (read
#: against ``ppo_crelu``, which has both). Every unit passes gradient, as with MaxMin and CReLU, but a negative
#: pre-activation leaves only 1 % of itself, so the layer does not keep its input's norm. Settings whose plain agent is
#: ReLU only (C-CHAIN's Gym-control agents already have leaky ReLU). It acts within a task: its fresh agent runs it.
MECHANISM_CONTROLS = ("ppo_vecnorm", "ppo_fire_switch_hidden", "ppo_tanh", "ppo_leaky_relu")
METHODS = METHODS + MECHANISM_CONTROLS
TASK_CHANGE_METHODS = (*TASK_CHANGE_METHODS, "ppo_fire_switch_hidden")

#: Dohare et al.'s regularised PPO agents of Slippery Ant (issue #28, ``slippery_ant_dohare``; their
#: ``lop/rl/cfg/sant/*.yml``), on request. Like ``ppo_cbp_dohare`` each trains with Adam beta1 = beta2 = 0.99, the
#: change their ``ns.yml`` isolates (``ppo_adam_equal_betas`` here): ``ppo_l2_dohare`` L2 :data:`DOHARE_L2` (Adam
#: ``weight_decay``, their ``l2.yml``); ``ppo_snp_continual`` continual Shrink & Perturb
#: (:class:`~sb3_plastic.callbacks.ShrinkPerturb` ``mode="continual"`` at the library defaults: L2 1e-4 in the
#: gradient, N(0, 1e-5^2) noise after every step; they publish no Slippery Ant S&P configuration). Both act on every
#: step: their fresh agents run them.
DOHARE_METHODS = ("ppo_l2_dohare", "ppo_snp_continual")
METHODS = METHODS + DOHARE_METHODS

#: The control of ``ppo_cbp_dohare`` (thirty-first session's audit, on request): its optimizer exactly (Adam betas
#: (0.99, 0.99) and weight decay 1e-4, :data:`DOHARE_CBP`) with no unit replacement, so that what CBP's replacement
#: adds is separated from the L2 and the betas its arm also carries. It acts on every step: its fresh agents run it.
CBP_CONTROLS = ("ppo_cbp_dohare_no_replace",)
METHODS = METHODS + CBP_CONTROLS

#: Issue #29 part 2's check of the Gym-control anchor, on request: ``ppo_cchain_vanilla`` the plain agent trained on
#: the targets of C-CHAIN's vanilla PPO (:func:`cchain_vanilla.their_targets`: advantages normalised once per rollout,
#: lambda = 1 value targets), the two differences between our plain agent and theirs that SB3's PPO can be given. It
#: acts on every update: its fresh agents run it.
ANCHOR_CHECKS = ("ppo_cchain_vanilla",)
METHODS = METHODS + ANCHOR_CHECKS
#: methods that exist for PPO settings only (not offered on a DQN / SAC setting)
PPO_ONLY_METHODS = ANCHOR_CHECKS


def method_name(method: str, algo: str) -> str:
    """The name of ``method`` (a :data:`METHODS` entry) on a setting of ``algo``: ``ppo_l2`` -> ``dqn_l2``."""
    return algo + method[3:] if method.startswith("ppo") else method


def methods_of(algo: str) -> list[str]:
    """The method names of a setting of ``algo`` (:data:`METHODS` on its algorithm, :data:`PPO_ONLY_METHODS` for PPO
    only)."""
    return [method_name(m, algo) for m in METHODS if algo == "ppo" or m not in PPO_ONLY_METHODS]


def canonical_method(name: str) -> str:
    """The :data:`METHODS` entry of a method name of any algorithm (``dqn_l2`` -> ``ppo_l2``)."""
    for algo in ALGOS:
        if name == algo or name.startswith(algo + "_"):
            return "ppo" + name[len(algo):]
    return name


ALL_METHOD_NAMES = tuple(dict.fromkeys(method_name(m, a) for a in ALGOS for m in METHODS))

#: The arm each control or ablation is read against (forty-second session): the report sets a method beside its arm
#: as it sets every method beside plain PPO (Welch's t on the runs' last-half means, plus the paired differences of
#: the seeds both ran, which share a task sequence). A control changes one ingredient of its arm:
#: ``plastic_maxmin_off`` drops the conv penalty of ``plastic_maxmin_conv``, ``plastic_maxmin_off_sb3init`` /
#: ``plastic_relu_off_ortho`` change its init / its activation, ``ppo_cbp_dohare_no_replace`` CBP's
#: replacement, the one-head resets re-draw one of ``ppo_head_reset``'s two heads, ``ppo_head2_reset`` gives
#: ``ppo_injection``'s layers fresh weights without the frozen old heads, ``ppo_fire_switch_hidden`` leaves FIRE's
#: output layers alone, ``ppo_tanh`` has bounded features without Fourier features' periodic ones, ``ppo_crelu`` (a
#: field method elsewhere; on ``minatar_intensive`` since the forty-fifth session the control of MaxMin's activation) keeps
#: MaxMin's two properties, no dead unit and the input's norm, without its pairing of units, ``ppo_leaky_relu`` keeps
#: CReLU's first property (no dead unit) without its second (the norm; at plain PPO's widths); the isometry
#: variants (:data:`ISOMETRY_VARIANTS`) change one option of the penalty of their arm.
ARM_OF: dict[str, str] = {
    "plastic_maxmin_off": "plastic_maxmin_conv",
    "plastic_maxmin_off_sb3init": "plastic_maxmin_off",
    "ppo_cbp_dohare_no_replace": "ppo_cbp_dohare",
    "ppo_policy_head_reset": "ppo_head_reset",
    "ppo_value_head_reset": "ppo_head_reset",
    "ppo_head2_reset": "ppo_injection",
    "ppo_fire_switch_hidden": "ppo_fire_switch",
    "ppo_tanh": "ppo_fourier",
    "ppo_crelu": "plastic_maxmin_off_sb3init",
    "ppo_leaky_relu": "ppo_crelu",
    "plastic_maxmin_rect": "plastic_maxmin",
    "plastic_maxmin_conv": "plastic_maxmin",
    **{name: "plastic_relu" for name in ISOMETRY_VARIANTS if name.startswith("plastic_relu_")
       and not name.startswith("plastic_relu_linear_")},
    "plastic_relu_linear_floor": "plastic_relu_linear",
    "plastic_relu_linear_ceiling": "plastic_relu_linear",
    "plastic_relu_off_ortho": "plastic_maxmin_off",  # after the ReLU variants' "plastic_relu" above: its arm is MaxMin's
}


#: The methods a results folder's grid named before any of its runs, by folder: the family over which a reader
#: adjusts the folder's "vs plain" tests for multiplicity (``bench/verdict_coverage.py`` lists Holm's correction over
#: it beside the one over every test). Methods a folder gained later (a control, an ablation, an arm chosen after
#: results were seen) are post hoc and sit outside it. ``minatar_intensive``: issue #28's list for the MinAtar grid
#: (plain PPO's baseline aside); ``cminatar_rr4``: the arms the thirty-eighth session queued before that folder's
#: first run.
PREREGISTERED: dict[str, tuple[str, ...]] = {
    "minatar_intensive": ("ppo_adam_equal_betas", "ppo_l2_init", "ppo_snp", "ppo_fire_switch", "ppo_head_reset",
                          "plastic_relu", "plastic_maxmin", "ppo_cbp_dohare", "ppo_nap", "ppo_spectral"),
    "cminatar_rr4": ("dqn_cchain", "dqn_redo", "dqn_l2_init", "plastic_relu"),
}

@dataclass(frozen=True)
class MethodParams:
    """Hyperparameters of the methods (flags of the script), fixed before the grid.

    :param l2: Adam ``weight_decay`` of ``ppo_l2``.
    :param shrink: ``lambda`` of Shrink & Perturb (event form).
    :param perturb: ``p`` of Shrink & Perturb.
    :param cbp_rate: Continual Backprop replacement rate per optimizer step of ``ppo_cbp`` (library default).
    :param cbp_maturity: Continual Backprop maturity threshold (optimizer steps) of ``ppo_cbp`` (library default,
        Dohare's RL value).
    :param isometry_coef: ``lambda`` of the isometry penalty (AdamO) of the plastic methods, in the authors' convention
        ``1/2 ||Gram - s I||_F^2`` (issue #27): 0.2, the same penalty as the 0.1 of the runs made before it.
    :param l2_init_coef: ``lambda`` of ``ppo_l2_init``.
    :param spectral_coef: ``lambda`` of ``ppo_spectral``.
    :param fire_head_scale: ``head_scale`` of the FIRE methods (``"init"``, the library default, or ``"reference"``).
    :param fire_iterations: ``iterations`` of the FIRE methods: 0 for the library default (the exact polar factor),
        ``k`` for ``k`` Newton–Schulz steps (10: the reference implementation).
    :param isometry_interval: ``isometry_interval`` of the plastic methods: an int ``k`` or ``"auto"``
        (``"1"``: the exact per-update AdamO step, the library default).
    :param parseval_coef: ``lambda`` of ``ppo_parseval`` (Plasticine's 1e-3).
    :param weight_clipping_kappa: ``kappa`` of ``ppo_weight_clipping`` (the reference's RL value 3).
    """

    l2: float = 1e-3
    shrink: float = 0.4
    perturb: float = 0.1
    cbp_rate: float = 1e-4
    cbp_maturity: int = 10_000
    isometry_coef: float = 0.2
    l2_init_coef: float = 1e-3
    spectral_coef: float = 1e-3
    fire_head_scale: str = "init"
    fire_iterations: int = 0
    isometry_interval: str = "1"
    parseval_coef: float = 1e-3
    weight_clipping_kappa: float = 3.0


#: Adam's betas of ``ppo_adam_equal_betas`` (Dohare et al., 2023, *Overcoming policy collapse in deep RL*: beta1 = beta2
#: keeps Adam's update bounded after a change of the gradient's scale; the library's ``optimizer="adam_equal_betas"``)
EQUAL_BETAS = (0.99, 0.99)
#: Continual Backprop at Dohare's RL settings (``ppo_cbp_dohare``; his Slippery Ant PPO runs)
DOHARE_CBP = dict(replacement_rate=1e-4, maturity_threshold=10_000, betas=(0.99, 0.99), weight_decay=1e-4)
#: ``ppo_cbp_dohare`` on a setting that is his design (``init="lecun"``: ``slippery_ant_dohare``) also follows how his
#: RL runs' ``gnt.py`` replaces units: new incoming weights LeCun uniform (``init='lecun'``), the stochastic count
#: (``accumulate=False``) and torch's plain Adam, whose state of the touched entries ``update_optim_params`` leaves
#: alone. Elsewhere (``minatar_intensive``: SB3's CNN and init) the library's defaults: the layer's own initialiser,
#: the accumulated count, the touched entries' Adam state restarted.
DOHARE_GNT = dict(unit_init="lecun", replacement_rule="stochastic", optimizer_restart=False)
#: ``ppo_cchain`` on the toy settings (the bandit and ``cartpole_obs``, whose rows were run before the twenty-ninth
#: session): the library's values of then, the clipped surrogate alone as the task loss
#: of the adaptive coefficient (the ProcGen reference's) and 10 iterations at the initial coefficient. On the
#: ``cchain_*`` settings the library's discrete-PPO values, those of the Gym-control code: the entropy bonus in the
#: task loss and 11 iterations (:data:`sb3_plastic.callbacks.churn_reduction.CCHAIN_DEFAULTS`).
CCHAIN_BEFORE_29 = dict(task_loss_entropy=False, warmup=10)
#: the envs of the settings whose ``ppo_cchain`` rows were run with :data:`CCHAIN_BEFORE_29` (the bandit, cartpole_obs)
CCHAIN_BEFORE_29_ENVS = ("sb3_plastic/RandomLabelBandit-v0", "sb3_plastic/PerturbedCartPole-v0")
#: ``ppo_cchain`` on an image PPO setting (MinAtar; C-CHAIN publishes no row there): the closest reference, C-CHAIN's
#: ProcGen PPO (``crl_procgen/agents/ppo.py``: initial coefficient 10, adapted after 21 iterations over the last 200,
#: the clipped surrogate alone as the task loss; target scale 1e4 and lower bound 1 as the library's discrete default)
CCHAIN_PROCGEN = dict(coef=10.0, warmup=21, window=200, task_loss_entropy=False)
#: Adam ``weight_decay`` of ``ppo_l2_dohare`` (Dohare et al.'s ``cfg/sant/l2.yml``, with betas :data:`EQUAL_BETAS`)
DOHARE_L2 = 1e-3


def cchain_gym(setting: Setting) -> bool:
    """Whether ``setting`` is C-CHAIN's continual Gym control (the ``cchain_*`` settings: scored by their per-iteration
    return, ``score="iteration_return"``, which no other setting uses)."""
    return setting.score == "iteration_return"


def cchain_values(setting: Setting) -> dict[str, Any]:
    """The :class:`~sb3_plastic.ChurnReduction` keywords of ``ppo_cchain`` / ``dqn_cchain`` on ``setting``: none (the
    library's reference values for the agent, :data:`sb3_plastic.callbacks.churn_reduction.CCHAIN_DEFAULTS`: the
    Gym-control code's on C-CHAIN's Gym control, C-MinAtar's for DQN, the DMC code's for continuous PPO), except the
    toy settings' rows (:data:`CCHAIN_BEFORE_29`) and image PPO (:data:`CCHAIN_PROCGEN`)."""
    if setting.algo != "ppo" or cchain_gym(setting):
        return {}
    if setting.env_id in CCHAIN_BEFORE_29_ENVS:
        return dict(CCHAIN_BEFORE_29)
    if setting.policy == "CnnPolicy":
        return dict(CCHAIN_PROCGEN)
    return {}


def _plain_cnn_kwargs(setting: Setting) -> dict[str, Any]:
    """``policy_kwargs`` that give SB3's plain algorithm the library's CNN (:class:`~sb3_plastic.networks.PlasticCNN`
    with ReLU, ``arch="auto"``: the MinAtar CNN on 10x10 frames), the network the plastic methods build; SB3's
    NatureCNN rejects MinAtar's boolean frames and is too large for them."""
    if setting.policy != "CnnPolicy":
        return {}
    from sb3_plastic.networks import PlasticCNN

    extractor = dict(activation="relu", arch="auto", **setting.policy_kwargs.get("features_extractor_kwargs", {}))
    return dict(features_extractor_class=PlasticCNN, features_extractor_kwargs=extractor)


def scaled_reward(reward: float, scale: float) -> float:
    """``reward / scale``: what the agent of a setting with ``reward_scale`` trains on (TRAC / C-CHAIN's
    ``reward / reward_scale``)."""
    return reward / scale


def wrap_env(env: Any, setting: Setting) -> Any:
    """The wrappers a setting puts around each env copy, outside SB3's ``Monitor`` (episode returns and every score
    stay in the env's units and ends): ``reward / reward_scale`` (:func:`scaled_reward`) where ``reward_scale`` is not
    1, and :class:`~sb3_plastic.envs.TruncationAsTermination` with ``time_limit_terminal``; ``env`` itself otherwise."""
    if setting.reward_scale != 1:
        from gymnasium.wrappers import TransformReward

        env = TransformReward(env, functools.partial(scaled_reward, scale=setting.reward_scale))
    if setting.time_limit_terminal:
        from sb3_plastic.envs import TruncationAsTermination

        env = TruncationAsTermination(env)
    return env


def make_env(setting: Setting, seed: int, fresh_task: Optional[int] = None, env_seed: Optional[int] = None) -> Any:
    """The vector env of run seed ``seed``: ``task_seed = seed`` (independent task sequences per seed); with
    ``fresh_task`` every copy is pinned to that task of the sequence (``pin_task``) for a fresh-agent reference;
    ``env_seed`` seeds the env copies (default ``seed``; an evaluation env's differs, its task sequence does not)."""
    from stable_baselines3.common.env_util import make_vec_env

    import sb3_plastic.envs  # noqa: F401  (registers the ids)

    env = make_vec_env(
        setting.env_id,
        n_envs=setting.n_envs,
        seed=seed if env_seed is None else env_seed,
        env_kwargs=dict(change_every=setting.change_every, task_seed=seed, **setting.env_kwargs),
        wrapper_class=functools.partial(wrap_env, setting=setting),
    )
    if fresh_task is not None:
        env.env_method("pin_task", int(fresh_task))
    return env


def task_parameters(setting: Setting, seed: int) -> Optional[list[dict[str, float]]]:
    """The simulator parameters of every task of run seed ``seed`` (``task_seed = seed``), e.g. Slippery Ant's
    friction per task, as the env draws them (each task's parameters come from its own generator,
    :meth:`~sb3_plastic.envs.schedule.TaskSchedule.rng`); ``None`` for a setting whose tasks draw no parameters
    (permutations, offsets, games)."""
    import gymnasium as gym

    import sb3_plastic.envs  # noqa: F401  (registers the ids)

    env = gym.make(setting.env_id, change_every=setting.change_every, task_seed=seed, **setting.env_kwargs)
    try:
        try:
            sample, schedule = env.get_wrapper_attr("sample_parameters"), env.get_wrapper_attr("schedule")
        except AttributeError:
            return None
        return [{k: float(v) for k, v in sample(schedule.rng(k)).items()} for k in range(setting.tasks)]
    finally:
        env.close()


def normalise_observations(env: Any, training: bool = True) -> Any:
    """``env`` wrapped in SB3's :class:`~stable_baselines3.common.vec_env.VecNormalize` with ``norm_obs=True`` and
    ``norm_reward=False`` (SB3's defaults otherwise: ``clip_obs=10``, ``epsilon=1e-8``): the observation method
    ``ppo_vecnorm`` of issue #29.

    Every observation is standardised by the running mean and variance of all observations seen so far (updated
    first, then applied), per dimension. On a setting whose tasks add a fixed offset to the observation an offset is
    exactly what a normaliser removes, so the arm tells an input-shift problem from a loss of plasticity of the
    network. Rewards are left alone (``norm_reward=False``): the control changes one thing, the observation, and the
    score (episode returns from SB3's ``Monitor``, under VecNormalize) and the value targets stay on the plain agent's
    scale; a reward normaliser would also rescale PPO's value loss and advantages, a second change that the
    comparison with plain PPO could not separate from the first.

    SB3's statistics are cumulative (:class:`~stable_baselines3.common.running_mean_std.RunningMeanStd`: a running
    mean over every step since the start, no forgetting), kept across task switches: one wrapper serves the whole
    continual run, so after task ``k`` its mean is the step-weighted mean of the offsets of tasks ``0..k`` and its
    variance includes their spread. It removes the average offset, not the current one: a new offset is removed
    only as far as the task's own steps move the running mean (less each task). A fresh agent gets a wrapper of its
    own (statistics from its first observation). A checkpoint (:mod:`run_checkpoint`) keeps the statistics with
    the env (:func:`run_checkpoint.dumps_env`).

    :param env: the vector env of :func:`make_env`.
    :param training: update the statistics (``False`` for an evaluation env, whose statistics SB3's ``EvalCallback``
        copies from the training env before every evaluation).
    """
    from stable_baselines3.common.vec_env import VecNormalize

    return VecNormalize(env, training=training, norm_obs=True, norm_reward=False)


def lecun_init_(policy: Any) -> None:
    """Dohare et al.'s ``lecun_init`` (lop/utils/miscellaneous.py) on an SB3 actor-critic policy, in place: every
    Linear layer of its MLP extractor and of both heads ``U(-sqrt(3 / fan_in), sqrt(3 / fan_in))`` (standard
    deviation ``1 / sqrt(fan_in)``), biases 0; drawn from torch's global generator (seeded by SB3 with the model's
    seed; the library's :func:`~sb3_plastic.common.unit_reset.lecun_uniform_`, which also draws Continual Backprop's new
    units with ``unit_init="lecun"``). The Gaussian policy's ``log_std`` stays 0, as theirs starts."""
    import torch as th
    from torch import nn

    from sb3_plastic.common.unit_reset import lecun_uniform_

    with th.no_grad():
        for module in (policy.mlp_extractor, policy.action_net, policy.value_net):
            for layer in module.modules():
                if isinstance(layer, nn.Linear):
                    lecun_uniform_(layer.weight, layer.in_features)
                    layer.bias.zero_()


def build_model(method: str, setting: Setting, params: MethodParams, seed: int, device: str, tb_dir: Optional[str],
                fresh_task: Optional[int] = None) -> Any:
    """The agent of ``method`` and the callbacks it trains with (besides the monitor and the recorder).

    :param method: a :data:`METHODS` name, or its name on the setting's algorithm (``dqn_l2``).
    :param fresh_task: build the fresh-agent reference of that task (pinned env; no task-change / midpoint
        interventions, which cannot trigger within one task).
    """
    import sb3_plastic
    from sb3_plastic import FIRE, ContinualBackprop, L2Init, ReDo, ShrinkPerturb, SpectralRegularisation

    if setting.algo not in ALGOS:
        raise ValueError(f"unknown algo {setting.algo!r} of the setting; allowed: {', '.join(ALGOS)}")
    allowed = methods_of(setting.algo)
    if method not in allowed and (method not in METHODS or method in PPO_ONLY_METHODS):
        raise ValueError(f"unknown method {method!r} for a {setting.algo} setting; allowed: {', '.join(allowed)}")
    canonical = canonical_method(method)
    sb3_name, plastic_name = ALGOS[setting.algo]
    import stable_baselines3

    sb3_cls = getattr(stable_baselines3, sb3_name)
    plastic_cls = getattr(sb3_plastic, plastic_name)
    env = make_env(setting, seed, fresh_task)
    if canonical == "ppo_vecnorm":
        env = normalise_observations(env)
    common = dict(setting.ppo, seed=seed, device=device, tensorboard_log=tb_dir, verbose=0)
    if setting.exploration_steps:
        steps = setting.task_timesteps if fresh_task is not None else setting.total_timesteps
        common["exploration_fraction"] = setting.exploration_steps / steps
    if "double_q" in common and not canonical.startswith("plastic_") and canonical != "ppo_nap":
        # SB3's DQN has no Double DQN target: the plain methods run PlasticDQN with plasticity off, which is SB3's
        # DQN exactly (tests/test_sb3_parity.py) plus the double_q target
        sb3_cls = functools.partial(plastic_cls, isometry_mode="off", optimizer="adam")
    net_arch = list(setting.net_arch)
    callbacks: list[Any] = []
    shared = {k: v for k, v in setting.policy_kwargs.items() if k != "optimizer_kwargs"}
    shared_optimizer = dict(setting.policy_kwargs.get("optimizer_kwargs") or {})
    # the plastic algorithms on the plain agent's network: its activation (a class through policy_kwargs where it has
    # no name of the library's), the setting's shared policy keywords
    net_kwargs = dict(net_arch=net_arch, **shared, **(dict(optimizer_kwargs=shared_optimizer) if shared_optimizer else {}))
    plain_net: dict[str, Any] = dict(activation="relu", policy_kwargs=net_kwargs)
    if setting.activation != "relu":
        plain_net = dict(activation=None, policy_kwargs=dict(net_kwargs, activation_fn=PLAIN_ACTIVATIONS[setting.activation]))
    if canonical.startswith("plastic_"):
        activation = canonical.removeprefix("plastic_").split("_")[0]
        variant = ISOMETRY_VARIANTS.get(canonical, {})
        penalty = {} if variant.get("isometry_mode") == "off" else dict(
            isometry_coef=params.isometry_coef,
            isometry_interval="auto" if params.isometry_interval == "auto" else int(params.isometry_interval),
        )
        model = plastic_cls(setting.policy, env, activation=activation, **variant, **penalty, policy_kwargs=net_kwargs,
                            **common)
        return model, callbacks
    if canonical in ("ppo_trac", "ppo_layernorm", "ppo_nap"):
        field: dict[str, Any] = dict(isometry_mode="off", optimizer="trac" if canonical == "ppo_trac" else "adam")
        if canonical == "ppo_layernorm":
            field.update(nap=True, nap_project="none")
        elif canonical == "ppo_nap":
            field.update(nap=True)
        return plastic_cls(setting.policy, env, **plain_net, **field, **common), callbacks
    if canonical in ("ppo_crelu", "ppo_fourier"):
        activation = {"ppo_crelu": "crelu", "ppo_fourier": "fourier"}[canonical]
        field = dict(activation=activation, isometry_mode="off", optimizer="adam")
        return plastic_cls(setting.policy, env, policy_kwargs=net_kwargs, **field, **common), callbacks
    activation_fn = PLAIN_ACTIVATIONS[setting.activation]
    if canonical == "ppo_tanh":
        if setting.policy != "MlpPolicy":
            raise ValueError(f"method {method!r} changes the hidden activation of an MLP policy; the setting's policy "
                             f"is {setting.policy!r} (allowed: 'MlpPolicy')")
        from torch import nn

        activation_fn = nn.Tanh
    cnn_kwargs = _plain_cnn_kwargs(setting)
    if canonical == "ppo_leaky_relu":
        if setting.activation != "relu":
            raise ValueError(f"method {method!r} replaces the plain agent's ReLU; the setting's plain activation is "
                             f"{setting.activation!r} (allowed: 'relu')")
        from torch import nn

        activation_fn = nn.LeakyReLU
        if cnn_kwargs:  # the CNN's layers too: every hidden layer of the plain agent
            cnn_kwargs["features_extractor_kwargs"] = dict(cnn_kwargs["features_extractor_kwargs"],
                                                           activation=nn.LeakyReLU)
    # the CNN keywords last: they already hold the setting's own extractor keywords (:func:`_plain_cnn_kwargs`)
    policy_kwargs: dict[str, Any] = dict(net_arch=net_arch, activation_fn=activation_fn, **{**shared, **cnn_kwargs})
    optimizer_kwargs = {**(dict(eps=1e-5) if setting.algo == "ppo" else {}), **shared_optimizer}  # SB3's defaults
    if shared_optimizer:
        policy_kwargs["optimizer_kwargs"] = optimizer_kwargs
    if canonical == "ppo_l2":
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, weight_decay=params.l2)
    elif canonical in ("ppo_cbp_dohare", "ppo_cbp_dohare_no_replace"):
        adam = {k: DOHARE_CBP[k] for k in ("betas", "weight_decay")}
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, **adam)
    elif canonical in ("ppo_adam_equal_betas", "ppo_snp_continual"):
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, betas=EQUAL_BETAS)
    elif canonical == "ppo_l2_dohare":
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, betas=EQUAL_BETAS, weight_decay=DOHARE_L2)
    model = sb3_cls(setting.policy, env, policy_kwargs=policy_kwargs, **common)
    if setting.init == "lecun":
        lecun_init_(model.policy)
    if fresh_task is not None and canonical in TASK_CHANGE_METHODS:
        return model, callbacks
    if canonical == "ppo_snp":
        callbacks.append(ShrinkPerturb("event", shrink=params.shrink, perturb=params.perturb, on_task_change=True))
    elif canonical == "ppo_l2_init":
        callbacks.append(L2Init(params.l2_init_coef))
    elif canonical == "ppo_spectral":
        callbacks.append(SpectralRegularisation(params.spectral_coef))
    elif canonical == "ppo_cbp":
        callbacks.append(ContinualBackprop(replacement_rate=params.cbp_rate, maturity_threshold=params.cbp_maturity))
    elif canonical == "ppo_cbp_dohare":
        cbp = {k: DOHARE_CBP[k] for k in ("replacement_rate", "maturity_threshold")}
        if setting.init == "lecun":  # his design (slippery_ant_dohare): his GnT's unit draws, rule and plain Adam too
            cbp.update(DOHARE_GNT)
        callbacks.append(ContinualBackprop(**cbp))
    elif canonical == "ppo_snp_continual":
        callbacks.append(ShrinkPerturb("continual"))
    elif canonical == "ppo_redo":
        callbacks.append(ReDo())
    elif canonical in ("ppo_fire", "ppo_fire_switch", "ppo_fire_switch_hidden"):
        fire: dict[str, Any] = dict(head_scale=params.fire_head_scale, iterations=params.fire_iterations or None)
        if canonical == "ppo_fire_switch_hidden":  # FIRE's own layer selection; a head scale has nothing to act on
            fire = dict(layers="hidden", iterations=fire["iterations"])
        trigger = dict(at=0.5) if canonical == "ppo_fire" else dict(at=None, on_task_change=True)
        callbacks.append(FIRE(**trigger, **fire))
    elif canonical == "ppo_parseval":
        from sb3_plastic import ParsevalRegularisation

        callbacks.append(ParsevalRegularisation(params.parseval_coef))
    elif canonical == "ppo_weight_clipping":
        from sb3_plastic import WeightClipping

        callbacks.append(WeightClipping(params.weight_clipping_kappa))
    elif canonical == "ppo_cchain":
        from sb3_plastic import ChurnReduction

        callbacks.append(ChurnReduction(**cchain_values(setting)))
    elif canonical == "ppo_injection":
        from sb3_plastic import PlasticityInjection

        callbacks.append(PlasticityInjection(layers=2, at=None, on_task_change=True))
    elif canonical in HEAD_RESET_METHODS:
        from sb3_plastic import LayerReset

        callbacks.append(LayerReset(HEAD_RESET_METHODS[canonical], on_task_change=True))
    elif canonical == "ppo_cchain_vanilla":
        import cchain_vanilla

        callbacks.append(cchain_vanilla.their_targets())
    return model, callbacks
