"""ReDo: recycling dormant neurons (Sokar, Agarwal, Castro & Evci, 2023).

Reference: G. Sokar, R. Agarwal, P. S. Castro, U. Evci, "The Dormant Neuron Phenomenon in Deep
Reinforcement Learning", ICML 2023 (https://arxiv.org/abs/2302.12902).

For a hidden layer with post-activation outputs ``h`` on a probe batch, the score of unit ``i`` is

    s_i = mean|h_i| / (mean_j mean|h_j| + 1e-9),

where ``mean|h_i|`` averages over the batch (and, for a conv layer, over the spatial positions) and
``j`` runs over the layer's features. Unit ``i`` is *tau-dormant* if ``s_i <= tau`` (0.025 is the
paper's default, 0.1 an aggressive setting). Every ``period`` gradient steps ReDo

* re-draws the incoming weights of every dormant unit from the layer's own initialiser,
* sets its bias to zero,
* sets its outgoing weights (the matching input columns of every consumer layer; for a conv layer
  read by a Linear through an NCHW flatten, the ``H*W`` columns of the channel) to zero,
* restarts the optimizer state of exactly those rows / entries / columns (moments zeroed; for Adam the entries'
  step count too, as the reference zeroes Adam's step: they are trained as freshly initialised entries).

Output heads are never recycled. Scores are taken on the activation output; a normalisation between the layer
and its activation (NaP's ``Linear -> LayerNorm -> act``, ``Linear -> BatchNorm -> act``) is part of the unit: the
score reads ``act(norm(W x + b))`` and a recycled unit's scale / offset of a layer norm go back to 1 / 0
(:func:`sb3_plastic.common.unit_reset.unit_norms`). When a normalisation layer follows the activation (CrossQ:
``Linear -> ReLU -> BatchRenorm``) a dead unit is still dead (its normalised output is
a constant), and a recycled unit's features of that layer get their initial statistics.
Under MaxMin (GroupSort-2) a unit is a sorted pair of features (each
output of the pair depends on both pre-activations); a pair is dormant only if *both* of its features
are dormant, and then both rows are recycled. The cells of an LSTM (RecurrentPPO) are units too, scored on
their output for probe observations taken as first steps from zero states and recycled as
:mod:`sb3_plastic.recurrent` defines (:func:`redo_recurrent_`).

The module offers the pieces without RL (:func:`neuron_scores`, :func:`dormant_units`,
:func:`probe_activity`, :func:`redo_reset_`, :func:`redo_layers_`) and :class:`ReDo`, an SB3
callback for PPO, A2C, DQN, QR-DQN, SAC, TQC, CrossQ, TD3, DDPG, RecurrentPPO and MaskablePPO (plastic or not).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import BaseModel
from stable_baselines3.common.utils import obs_as_tensor
from torch import nn

from sb3_plastic.callbacks.base import InterventionConfig, PlasticCallback, preserved_numpy_rng
from sb3_plastic.common.hooks import OutermostStepHooks
from sb3_plastic.common.surgery import HiddenLayer, NetworkSpec, RecurrentUnits, recurrent_units_problem
from sb3_plastic.common.unit_reset import (
    enable_unit_restarts,
    features_of,
    replace_cells_,
    replace_units_,
    unique_optimizers,
    zero_outgoing_last_,
)
from sb3_plastic.recurrent import lstm_first_step, lstm_first_step_layers, recurrent_init_scheme

#: ``layer -> (fresh_weight, fresh_bias)``: a new draw from a layer's initialiser; the layer is untouched.
LayerInit = Callable[[nn.Module], tuple[th.Tensor, Optional[th.Tensor]]]

#: Added to the layer mean in the score denominator (as in the paper's reference implementation).
SCORE_EPS = 1e-9


# ---------------------------------------------------------------------------------------------------
# Fresh initialisation
# ---------------------------------------------------------------------------------------------------
@th.no_grad()
def default_layer_init(layer: nn.Module) -> tuple[th.Tensor, Optional[th.Tensor]]:
    """A fresh draw of PyTorch's default initialisation of a Linear / Conv layer (``reset_parameters``):
    Kaiming-uniform weight with ``a = sqrt(5)``, bias ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    The random numbers are drawn in the same order as ``layer.reset_parameters()`` (weight, then bias),
    so under the same torch seed the result equals a reset copy of the layer. The layer is not modified.
    """
    weight = th.empty_like(layer.weight, memory_format=th.contiguous_format)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bias = None
    if getattr(layer, "bias", None) is not None:
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        bias = th.empty_like(layer.bias).uniform_(-bound, bound)
    return weight, bias


def orthogonal_layer_init(gain: Union[float, Callable[[nn.Module], float]] = 1.0) -> LayerInit:
    """Initialiser drawing an orthogonal weight (``torch.nn.init.orthogonal_`` on the matrix view, as SB3's
    ``init_weights`` and :func:`sb3_plastic.isometry.orthogonal_init_`) and a zero bias.

    :param gain: a constant gain, or ``layer -> gain``.
    """

    @th.no_grad()
    def init(layer: nn.Module) -> tuple[th.Tensor, Optional[th.Tensor]]:
        g = gain(layer) if callable(gain) else gain
        weight = th.empty_like(layer.weight, memory_format=th.contiguous_format)
        nn.init.orthogonal_(weight, gain=float(g))
        bias = th.zeros_like(layer.bias) if getattr(layer, "bias", None) is not None else None
        return weight, bias

    return init


def layer_init_scheme(model: Union[BaseAlgorithm, nn.Module]) -> Callable[[nn.Module], tuple[str, float]]:
    """How a model's policy initialised each of its layers: ``layer -> ("orthogonal", gain)`` or
    ``("default", 1.0)``. The one place that knows it (ReDo, Shrink & Perturb and Continual Backprop use it).

    * plastic policies with orthogonal initialisation (``isometry_config.use_orthogonal_init``):
      orthogonal, gain ``sqrt(isometry_scale)`` for hidden layers and the policy's head gains for heads;
    * SB3 actor-critic policies with ``ortho_init=True`` (PPO, A2C): orthogonal with SB3's gains
      (``sqrt(2)`` for features extractor and MLP, 0.01 for the action head, 1 for the value head);
    * everything else (DQN, QR-DQN, SAC, TQC, ``ortho_init=False``): PyTorch's default.

    :param model: an SB3 algorithm or its policy.
    """
    policy = model.policy if isinstance(model, BaseAlgorithm) else model
    config = getattr(policy, "isometry_config", None)
    if config is not None and config.use_orthogonal_init:
        heads = {id(h) for h in policy.plastic_heads()}
        hidden_gain = math.sqrt(config.isometry_scale)
        return lambda layer: ("orthogonal", float(policy._plastic_head_gain(layer)) if id(layer) in heads else hidden_gain)
    if getattr(policy, "ortho_init", False) and hasattr(policy, "mlp_extractor") and hasattr(policy, "action_net"):
        module_gains: list[tuple[nn.Module, float]] = [
            (policy.mlp_extractor, math.sqrt(2)),
            (policy.action_net, 0.01),
            (policy.value_net, 1.0),
        ]
        for attr in ("features_extractor", "pi_features_extractor", "vf_features_extractor"):
            if isinstance(getattr(policy, attr, None), nn.Module):
                module_gains.append((getattr(policy, attr), math.sqrt(2)))
        gains = {id(m): g for module, g in module_gains for m in module.modules()}
        return lambda layer: ("orthogonal", gains[id(layer)]) if id(layer) in gains else ("default", 1.0)
    return lambda layer: ("default", 1.0)


def model_layer_init(model: Union[BaseAlgorithm, nn.Module]) -> LayerInit:
    """The initialiser a model's policy used for its layers (:func:`layer_init_scheme`), as a :data:`LayerInit`.

    Biases are drawn as the initialiser draws them (zero for the orthogonal schemes).

    :param model: an SB3 algorithm or its policy.
    """
    scheme = layer_init_scheme(model)

    def init(layer: nn.Module) -> tuple[th.Tensor, Optional[th.Tensor]]:
        kind, gain = scheme(layer)
        return orthogonal_layer_init(gain)(layer) if kind == "orthogonal" else default_layer_init(layer)

    return init


# ---------------------------------------------------------------------------------------------------
# Scores and dormant units
# ---------------------------------------------------------------------------------------------------
def _feature_mean_abs(activations: th.Tensor) -> th.Tensor:
    if activations.dim() < 2:
        raise ValueError(f"activations must have shape (N, F) or (N, C, ...), got {tuple(activations.shape)}")
    dims = [d for d in range(activations.dim()) if d != 1]
    return activations.detach().abs().float().mean(dim=dims)


def scores_from_activity(mean_abs: th.Tensor) -> th.Tensor:
    """ReDo scores ``s_i = a_i / (mean_j a_j + 1e-9)`` from per-feature mean absolute activations ``a``."""
    return mean_abs / (mean_abs.mean() + SCORE_EPS)


def neuron_scores(activations: th.Tensor) -> th.Tensor:
    """Per-feature ReDo scores of post-activation outputs ``activations`` of shape ``(N, F)`` or
    ``(N, C, H, W)`` (mean over the batch and spatial positions), normalised by the layer mean."""
    return scores_from_activity(_feature_mean_abs(activations))


def is_real_number(value: Any) -> bool:
    """A finite real number (``numbers.Real``: Python and numpy ints and floats), not a bool: the check of a
    numeric hyper-parameter's type shared by ReDo and Continual Backprop."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


def _validate_tau(tau: Any) -> float:
    """``tau`` as a float; any real number in (0, 1] (numpy scalars included, bools excluded)."""
    if not (is_real_number(tau) and 0 < tau <= 1):
        raise ValueError(f"tau must be a number in (0, 1], got {tau!r}")
    return float(tau)


def _units_from_scores(scores: th.Tensor, tau: float, group_size: int) -> th.Tensor:
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} features cannot be split into units of {group_size}")
    return (scores <= tau).view(-1, group_size).all(dim=1)


def dormant_units(activations: th.Tensor, tau: float = 0.025, group_size: int = 1) -> th.Tensor:
    """Boolean mask of the tau-dormant units of a layer.

    :param activations: post-activation outputs ``(N, F)`` or ``(N, C, H, W)`` on a probe batch.
    :param tau: dormancy threshold in (0, 1]: a feature is dormant if its score is ``<= tau``.
    :param group_size: features per unit (2 under MaxMin: a pair is dormant only if both features are).
    :return: a bool tensor of shape ``(F // group_size,)``.
    """
    return _units_from_scores(neuron_scores(activations), _validate_tau(tau), group_size)


#: ``(layer name, module type)`` whose post-activation output could not be computed, warned about once
_WARNED: set[tuple[str, str]] = set()


def _post_activation(hidden: HiddenLayer, out: th.Tensor) -> th.Tensor:
    """The units' output from the output ``out`` of ``hidden.layer``: the activation applied to the
    normalisation between them, if any (:meth:`~sb3_plastic.common.surgery.HiddenLayer.post_activation`; NaP's
    ``Linear -> LayerNorm -> act`` is scored on ``act(LayerNorm(out))``). When the module after the layer is not
    element-/feature-wise (it raises, or changes the shape) the layer output itself is used and a warning names
    the layer and the module (once per layer and module type)."""
    if hidden.activation is None and hidden.pre_norm is None:
        return out
    problem = None
    try:
        h = hidden.post_activation(out)
    except Exception as error:  # an unusual module after the layer
        problem = f"raised {type(error).__name__}: {error}"
    else:
        wide = (out.shape[0], out.shape[1] * 2, *out.shape[2:])
        if isinstance(h, th.Tensor) and (h.shape == out.shape or (hidden.doubles_width and tuple(h.shape) == wide)):
            return h
        shape = tuple(getattr(h, "shape", ()))
        problem = f"returned {type(h).__name__} of shape {shape} for an input of shape {tuple(out.shape)}"
    module = hidden.activation if hidden.activation is not None else hidden.pre_norm
    key = (hidden.name, type(module).__name__)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(
            f"layer {hidden.name!r}: the module after it ({type(module).__name__}) {problem}; it is not an element-wise "
            "activation, so its units are scored on the layer's own output instead",
            stacklevel=2,
        )
    return out


@th.no_grad()
def probe_activity(layers: Sequence[HiddenLayer], forward: Callable[[], Any]) -> list[Optional[th.Tensor]]:
    """Per-feature mean absolute post-activation output of each layer over what ``forward`` computes.

    Forward hooks on the layers record ``|act(norm(layer(x)))|`` while ``forward()`` runs under ``torch.no_grad``
    (the normalisation between the layer and its activation, if any, and the activation module are re-applied to
    the layer output, :func:`_post_activation`, so a module shared by several layers is no problem);
    the hooks are removed afterwards. A layer run several times (a features extractor shared
    by the policy and the value path) is averaged over all its calls.

    :return: one tensor of shape ``(n_features,)`` per layer, or ``None`` for a layer ``forward`` never ran.
    """
    sums: list[Optional[th.Tensor]] = [None] * len(layers)
    counts = [0] * len(layers)

    def make_hook(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: th.Tensor) -> None:
            h = _post_activation(layers[i], output).abs().float()
            dims = [d for d in range(h.dim()) if d != 1]
            s = h.sum(dim=dims)
            sums[i] = s if sums[i] is None else sums[i] + s
            counts[i] += h.numel() // h.shape[1]

        return hook

    handles = [hidden.layer.register_forward_hook(make_hook(i)) for i, hidden in enumerate(layers)]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return [None if s is None else s / max(c, 1) for s, c in zip(sums, counts)]


# ---------------------------------------------------------------------------------------------------
# Resetting
# ---------------------------------------------------------------------------------------------------
@th.no_grad()
def redo_reset_(
    hidden: HiddenLayer,
    units: th.Tensor,
    optimizers: Iterable[th.optim.Optimizer] = (),
    init: LayerInit = default_layer_init,
) -> th.Tensor:
    """Recycle units of a hidden layer in place (ReDo's reset; Parameter objects are kept).

    Incoming weights of the units are re-drawn from ``init`` (a full fresh draw of which only the
    units' rows are used), their bias entries set to zero, their outgoing weights (input columns of every
    consumer, with the conv -> linear flatten mapping) set to zero, and the optimizer state of exactly
    those rows / entries / columns restarted in every optimizer of ``optimizers`` that holds the tensor:
    moments zeroed and, for Adam / AdamO, the entries' step count restarted, so that they are trained as
    freshly initialised Adam entries (the reference zeroes Adam's step: :mod:`sb3_plastic.adam_restart`). A
    normalisation layer of the units (:attr:`HiddenLayer.norm`, CrossQ's BatchRenorm) gets those features reset to
    its initial state (running mean 0, variance 1, scale 1, shift 0, state restarted). No bias absorption. The
    operation is :func:`sb3_plastic.common.unit_reset.replace_units_`, shared with Continual Backprop.

    :param hidden: the layer with its consumers (see :meth:`sb3_plastic.common.surgery.NetworkSpec.hidden_layers`).
    :param units: a bool mask over the layer's units or unit indices (a unit is ``hidden.group_size`` features).
    :param optimizers: optimizers whose state of the touched entries is restarted.
    :param init: the initialiser of fresh incoming weights.
    :return: the feature (row) indices that were reset.
    """
    units = th.as_tensor(units).cpu()
    if units.dtype == th.bool:
        if units.numel() != hidden.n_units:
            raise ValueError(f"unit mask has {units.numel()} entries, layer {hidden.name} has {hidden.n_units} units")
        units = units.nonzero().flatten()
    units = units.long().flatten()
    features = features_of(hidden, units)
    if features.numel() == 0:
        return features
    fresh_weight, _ = init(hidden.layer)
    replace_units_(hidden, features, fresh_weight[features.to(fresh_weight.device)], optimizers)
    return features.to(hidden.layer.weight.device)


@dataclass
class ReDoLayerResult:
    """What :func:`redo_layers_` found and did in one layer."""

    name: str
    n_units: int
    n_dormant: int
    dormant_fraction: float


def redo_layers_(
    layers: Sequence[HiddenLayer],
    forward: Callable[[], Any],
    tau: float = 0.025,
    optimizers: Iterable[th.optim.Optimizer] = (),
    init: LayerInit = default_layer_init,
    replaced: Optional[list[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]]] = None,
) -> list[ReDoLayerResult]:
    """One ReDo step on a set of hidden layers: score every layer on the probe computation ``forward``
    first, then recycle the dormant units of every layer (scores are not recomputed between layers), and
    last zero the outgoing weights of every recycled unit once more
    (:func:`~sb3_plastic.common.unit_reset.zero_outgoing_last_`): a recycled unit of layer ``L + 1`` gets a whole
    fresh incoming row, which would otherwise re-open the columns of layer ``L``'s recycled units. The
    reference implementation (dopamine ``labs/redo``) likewise draws all incoming weights before it zeroes the
    outgoing ones, so every recycled unit starts with zero outgoing weights, as the paper asks.

    Layers that ``forward`` does not reach are skipped.

    :param replaced: a list to which ``(layer, reset feature indices)`` is appended for every recycled layer,
        leaving the final zeroing pass to the caller (:meth:`ReDo.recycle` makes one pass over every network and
        the LSTM cells); ``None``: this function makes the pass.
    """
    tau = _validate_tau(tau)
    optimizers = unique_optimizers(optimizers)
    activity = probe_activity(layers, forward)
    results = []
    done: list[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]] = [] if replaced is None else replaced
    for hidden, mean_abs in zip(layers, activity):
        if mean_abs is None:
            continue
        dormant = _units_from_scores(scores_from_activity(mean_abs), tau, hidden.group_size)
        n_dormant = int(dormant.sum())
        if n_dormant:
            done.append((hidden, redo_reset_(hidden, dormant.cpu(), optimizers, init)))
        results.append(ReDoLayerResult(hidden.name, hidden.n_units, n_dormant, n_dormant / max(hidden.n_units, 1)))
    if replaced is None:
        zero_outgoing_last_(done, optimizers)
    return results


@th.no_grad()
@th.no_grad()
def recurrent_probe_outputs(policy: Any, cells: Sequence[RecurrentUnits], observations: Any) -> list[th.Tensor]:
    """First-step outputs ``h`` ``(N, H)`` of each LSTM cell layer of sb3-contrib's recurrent policy on probe
    observations, each seen as the first step of an episode (zero states,
    :func:`sb3_plastic.recurrent.lstm_first_step_layers`), as the ReDo probe of the rest of the policy does.
    ``lstm_critic`` reads the value features, other LSTMs the policy features."""
    outputs: dict[int, list[th.Tensor]] = {}
    out = []
    for spec in cells:
        lstm = spec.layer
        if id(lstm) not in outputs:
            critic = lstm is getattr(policy, "lstm_critic", None)
            extractor = policy.vf_features_extractor if critic else policy.pi_features_extractor
            features = BaseModel.extract_features(policy, observations, extractor)
            outputs[id(lstm)] = lstm_first_step_layers(lstm, features)
        out.append(outputs[id(lstm)][spec.index])
    return out


def recurrent_probe_activity(policy: Any, cells: Sequence[RecurrentUnits], observations: Any) -> list[th.Tensor]:
    """Per-cell mean ``|h|`` of each LSTM cell layer on probe observations (:func:`recurrent_probe_outputs`)."""
    return [h.abs().float().mean(dim=0) for h in recurrent_probe_outputs(policy, cells, observations)]


def redo_recurrent_(
    model: BaseAlgorithm,
    spec: NetworkSpec,
    observations: Any,
    tau: float = 0.025,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
    activity: Optional[Sequence[th.Tensor]] = None,
    replaced: Optional[list[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]]] = None,
) -> list[ReDoLayerResult]:
    """One ReDo step on the LSTM cells of a recurrent policy's network (:meth:`NetworkSpec.recurrent_units`):
    scores from :func:`recurrent_probe_activity`, dormant cells replaced by
    :func:`~sb3_plastic.common.unit_reset.replace_cells_` (fresh gate rows from the LSTM's initialiser,
    :func:`sb3_plastic.recurrent.recurrent_init_scheme`; zero biases, zero outgoing columns, restarted optimizer state; no
    bias absorption, as ReDo does for every layer). LSTMs whose cells cannot be replaced are skipped.

    :param activity: the cells' scores computed beforehand (:func:`recurrent_probe_activity` over the replaceable
        cell layers, in order), so that a step scores every layer before any reset (:meth:`ReDo.recycle`).
    :param replaced: as in :func:`redo_layers_`: collects ``(cells, cell indices)`` for the caller's final zeroing
        pass; ``None``: this function makes it."""
    tau = _validate_tau(tau)
    cells = [u for u in spec.recurrent_units() if recurrent_units_problem(u) is None]
    if not cells:
        return []
    init, gain = recurrent_init_scheme(model)
    if activity is None:
        activity = recurrent_probe_activity(model.policy, cells, observations)
    results = []
    done: list[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]] = [] if replaced is None else replaced
    for units, mean_abs in zip(cells, activity):
        dormant = _units_from_scores(scores_from_activity(mean_abs), tau, 1)
        n_dormant = int(dormant.sum())
        if n_dormant:
            done.append((units, replace_cells_(units, dormant, optimizers, init, gain)))
        results.append(ReDoLayerResult(units.name, units.n_units, n_dormant, n_dormant / max(units.n_units, 1)))
    if replaced is None:
        zero_outgoing_last_(done, optimizers)
    return results


# ---------------------------------------------------------------------------------------------------
# The callback
# ---------------------------------------------------------------------------------------------------
def _validate_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value!r}")
    return int(value)


def network_probe(
    model: BaseAlgorithm, spec: NetworkSpec, observations: Any, actions: Optional[th.Tensor]
) -> Callable[[], Any]:
    """The forward computation of one of the model's networks on probe data (no sampling, no side effects).

    ``policy`` (PPO / A2C): action distribution and value; ``q_net`` / ``quantile_net``: the network;
    ``actor`` (SAC / TQC): the action distribution parameters (TD3 / DDPG: the actions); ``critic``: Q-values
    of ``actions``.
    A recurrent policy (RecurrentPPO) sees each probe observation as the first step of an episode (zero LSTM
    states): the probe is a batch of single observations, not sequences.
    """
    policy = model.policy
    if spec.name == "policy" and spec.recurrent:
        return lambda: _recurrent_policy_probe(policy, observations)
    if spec.name == "policy":
        return lambda: (policy.get_distribution(observations), policy.predict_values(observations))
    if spec.name == "actor" and hasattr(spec.module, "get_action_dist_params"):  # SAC / TQC / CrossQ
        return lambda: spec.module.get_action_dist_params(observations)
    if spec.name == "critic":
        if actions is None:
            raise ValueError("the critic probe needs actions")
        return lambda: spec.module(observations, actions)
    return lambda: spec.module(observations)


def _recurrent_policy_probe(policy: Any, observations: Any) -> Any:
    """Action distribution and value of sb3-contrib's recurrent policy for single observations from zero LSTM
    states: ``get_distribution`` / ``predict_values`` with the LSTM step written out
    (:func:`sb3_plastic.recurrent.lstm_first_step`, which the diagnostics can differentiate per sample)."""
    features_pi = BaseModel.extract_features(policy, observations, policy.pi_features_extractor)
    latent_pi = policy.mlp_extractor.forward_actor(lstm_first_step(policy.lstm_actor, features_pi))
    features_vf = BaseModel.extract_features(policy, observations, policy.vf_features_extractor)
    if policy.lstm_critic is not None:
        latent_vf = lstm_first_step(policy.lstm_critic, features_vf)
    elif policy.shared_lstm:
        latent_vf = lstm_first_step(policy.lstm_actor, features_vf).detach()
    else:
        latent_vf = policy.critic(features_vf)
    values = policy.value_net(policy.mlp_extractor.forward_critic(latent_vf))
    return policy._get_action_dist_from_latent(latent_pi), values


class ReDo(PlasticCallback):
    """ReDo, "Recycling Dormant neurons" (Sokar et al., 2023, "The Dormant Neuron Phenomenon in Deep
    Reinforcement Learning", ICML), as an SB3 callback for PPO, A2C, DQN, QR-DQN, SAC, TQC, CrossQ, TD3, DDPG,
    RecurrentPPO and MaskablePPO.

    Every ``period`` gradient steps the hidden layers of every online network are scored on a probe
    batch and the tau-dormant units are recycled (see :mod:`sb3_plastic.callbacks.redo` and
    :func:`redo_reset_`): fresh incoming weights from the initialiser the model used
    (:func:`model_layer_init`), zero bias, zero outgoing weights, restarted optimizer state (moments, Adam's step) of exactly
    those entries. Output heads are excluded; under MaxMin a sorted pair is one unit (dormant only if
    both features are); LSTM cells of a recurrent policy are units (:func:`redo_recurrent_`).

    * Off-policy (DQN, QR-DQN, SAC, TQC): checked in ``_on_step``; the probe is
      ``replay_buffer.sample(probe_size)`` (observations, and its actions for the critics).
    * On-policy (PPO, A2C): a probe of ``probe_size`` observations is drawn from the rollout buffer at each
      rollout end; the check and reset happen at the next rollout start (or at training end), i.e. after
      ``train()`` and before the next rollout is collected. A rollout is therefore always collected and
      trained on with one and the same network (its stored log-probabilities and values stay valid).
    * Gradient steps are optimizer updates, counted as Continual Backprop counts them: a step hook on each
      network's optimizer (:class:`~sb3_plastic.common.hooks.OutermostStepHooks`, installed at training start and
      removed at training end) counts its outermost ``step()`` calls, and :attr:`gradient_steps` is the largest
      count over the networks (SAC / TQC: one per gradient step, as the critic and the actor step once each;
      TD3: the critic's). PPO / A2C therefore count minibatch updates (``n_epochs * n_minibatches`` per
      ``train()``), not SB3's ``_n_updates`` (which PPO increments once per epoch). On PPO a check happens at the
      first rollout boundary at which ``period`` updates have passed.
    * Target networks are **not** touched, as in the reference implementation: a DQN / QR-DQN target
      receives the recycled units at its next scheduled hard update, SAC / TQC targets through polyak
      averaging. Copying online -> target here would shorten the target's schedule.

    Logged (``plasticity/redo/...``; ``redo_<name>`` with a ``name`` other than the keywords' ``"auto"``):
    ``<network>/<layer>/dormant_fraction``
    and ``<network>/<layer>/resets`` at each check, ``dormant_fraction``, ``resets``, ``total_resets``
    and ``events``. Persistent (``self.state``; survives save -> load -> learn): ``optimizer_steps`` (the step
    count per network, so a resumed run continues the period), ``last_step`` (gradient step of the last check),
    ``events``, ``total_resets`` and ``layer_resets`` per layer.

    Warnings: at training start when no network has a hidden layer (or LSTM cell) to recycle (e.g.
    ``net_arch=[]``); once when the on-policy probe is smaller than ``probe_size`` (the rollout has fewer rows).

    :param period: gradient steps (optimizer updates; PPO / A2C: minibatch updates) between two checks (> 0).
    :param tau: dormancy threshold in (0, 1] (0.025: the paper's default; 0.1: aggressive).
    :param probe_size: number of probe samples (> 0).
    :param name: distinguishes two ReDo callbacks on one model.
    :param verbose: SB3 verbosity (1: print a line per check).
    """

    edits_layers = True  # refused with a plasticity injection (PlasticCallback._refuse_with_injection)

    def __init__(
        self,
        period: int = 1000,
        tau: float = 0.025,
        probe_size: int = 256,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        self.period = _validate_positive_int("period", period)
        self.tau = _validate_tau(tau)
        self.probe_size = _validate_positive_int("probe_size", probe_size)
        self._init: LayerInit = default_layer_init
        self._on_policy = False
        self._stash: Optional[tuple[Any, Optional[th.Tensor]]] = None
        self._step_hooks: list[OutermostStepHooks] = []
        #: warnings already given by this callback (each once)
        self._warned: set[str] = set()

    @property
    def log_prefix(self) -> str:
        return self.log_group("redo")

    def _init_callback(self) -> None:
        super()._init_callback()
        self._init = model_layer_init(self.model)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._attach_step_counters()
        last = int(self.state.setdefault("last_step", self.gradient_steps))
        if last > self.gradient_steps:  # a state saved before steps were counted here (SB3's _n_updates)
            self.state["last_step"] = self.gradient_steps
        self.state.setdefault("events", 0)
        self.state.setdefault("total_resets", 0)
        self.state.setdefault("layer_resets", {})
        self._init = model_layer_init(self.model)
        # Adam restarts the recycled entries per element (also after SB3's load, which rebuilds plain Adam)
        enable_unit_restarts(opt for spec in self.networks for opt in spec.optimizers())
        self._on_policy = isinstance(self.model, OnPolicyAlgorithm)
        self._stash = None
        n_units = sum(
            len(spec.hidden_layers()) + sum(recurrent_units_problem(u) is None for u in spec.recurrent_units())
            for spec in self.networks
        )
        if n_units == 0:
            self._warn_once(
                "layers",
                f"ReDo found no hidden layer to recycle in {[spec.name for spec in self.networks]} (output heads are "
                "never recycled; e.g. net_arch=[]): it will do nothing and log dormant_fraction 0",
            )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    # ------------------------------------------------------------------ counting gradient steps
    def _attach_step_counters(self) -> None:
        """Count the outermost ``step()`` calls of every network's optimizer in ``state["optimizer_steps"]``."""
        self._detach_step_counters()
        counts = self.state.setdefault("optimizer_steps", {})
        seen: set[int] = set()
        for spec in self.networks:
            if spec.optimizer is None or id(spec.optimizer) in seen:
                continue
            seen.add(id(spec.optimizer))
            counts.setdefault(spec.name, 0)
            self._step_hooks.append(OutermostStepHooks(spec.optimizer, after=self._counter(spec.name)))

    def _counter(self, network: str) -> Callable[[th.optim.Optimizer], None]:
        def count(optimizer: th.optim.Optimizer) -> None:
            counts = self.state["optimizer_steps"]
            counts[network] = int(counts.get(network, 0)) + 1

        return count

    def _detach_step_counters(self) -> None:
        for hooks in self._step_hooks:
            hooks.remove()
        self._step_hooks = []

    @property
    def gradient_steps(self) -> int:
        """Gradient steps done so far: the largest count of optimizer updates over the networks (see the class
        docstring; PPO: minibatch updates). Kept in the persistent state, so it continues after save -> load."""
        counts = self.state.get("optimizer_steps") or {}
        return max((int(c) for c in counts.values()), default=0)

    @property
    def due(self) -> bool:
        """Whether ``period`` gradient steps have passed since the last check."""
        return self.gradient_steps - int(self.state.get("last_step", 0)) >= self.period

    # ------------------------------------------------------------------ triggers
    def _on_step(self) -> bool:
        if not self._on_policy and self.due:
            probe = self._replay_probe()
            if probe is not None:
                self.recycle(*probe)
        return True

    def _on_rollout_end(self) -> None:
        if self._on_policy:
            self._stash = self._rollout_probe()
            buffer = getattr(self.model, "rollout_buffer", None)
            if self._stash is not None and buffer is not None:
                n_rows = (buffer.buffer_size if buffer.full else buffer.pos) * buffer.n_envs
                if n_rows < self.probe_size:
                    self._warn_once(
                        "probe",
                        f"ReDo probe_size={self.probe_size} but the rollout has only {n_rows} rows (n_steps * n_envs): "
                        f"units are scored on a probe of {n_rows} observations",
                    )

    def _on_rollout_start(self) -> None:
        if self._on_policy and self.due and self._stash is not None:
            self.recycle(*self._stash)

    def _on_training_end(self) -> None:
        # after the last train() of this learn() call, also between rollouts (covers learn() called
        # repeatedly for one rollout at a time)
        self._on_rollout_start()
        self._detach_step_counters()

    # ------------------------------------------------------------------ probes
    def _replay_probe(self) -> Optional[tuple[Any, Optional[th.Tensor]]]:
        buffer = getattr(self.model, "replay_buffer", None)
        if buffer is None or buffer.size() == 0:
            return None
        with preserved_numpy_rng():  # the run's own sampling stays as without ReDo
            data = buffer.sample(self.probe_size, env=getattr(self.model, "_vec_normalize_env", None))
        return data.observations, data.actions

    def _rollout_probe(self) -> Optional[tuple[Any, Optional[th.Tensor]]]:
        buffer = getattr(self.model, "rollout_buffer", None)
        if buffer is None or not (buffer.full or buffer.pos > 0):
            return None
        n_rows = (buffer.buffer_size if buffer.full else buffer.pos) * buffer.n_envs
        with preserved_numpy_rng():  # the run's own sampling stays as without ReDo
            idx = np.random.choice(n_rows, size=min(self.probe_size, n_rows), replace=False)

        def take(arr: np.ndarray) -> np.ndarray:
            flat = arr[: n_rows // buffer.n_envs].reshape(n_rows, *arr.shape[2:])
            return flat[idx].copy()

        obs = buffer.observations
        sample = {k: take(v) for k, v in obs.items()} if isinstance(obs, dict) else take(obs)
        actions = th.as_tensor(take(buffer.actions), device=self.model.device)
        return obs_as_tensor(sample, self.model.device), actions

    # ------------------------------------------------------------------ the step
    def recycle(self, observations: Any, actions: Optional[th.Tensor] = None) -> list[tuple[str, ReDoLayerResult]]:
        """Score every online network on ``observations`` (and ``actions`` for critics) and recycle its
        dormant units now; updates counters and logs. Returns ``(network, result)`` per layer."""
        optimizers = unique_optimizers(opt for spec in self.networks for opt in spec.optimizers())
        out: list[tuple[str, ReDoLayerResult]] = []
        replaced: list[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]] = []
        for spec in self.networks:
            forward = network_probe(self.model, spec, observations, actions)
            cell_activity = None
            if spec.recurrent:  # score the LSTM cells first: the extractor's resets below change the LSTM's input
                cells = [u for u in spec.recurrent_units() if recurrent_units_problem(u) is None]
                cell_activity = recurrent_probe_activity(self.model.policy, cells, observations) if cells else []
            hidden = [h for h in spec.hidden_layers() if not h.doubles_width]
            if len(hidden) < len(spec.hidden_layers()):
                self._warn_once("doubling", f"ReDo skips the layers of {spec.name!r} before a width-doubling activation "
                                "(CReLU, Fourier features): recycling a unit there is not defined here")
            for result in redo_layers_(hidden, forward, self.tau, optimizers, self._init, replaced):
                out.append((spec.name, result))
            if spec.recurrent:
                out += [
                    (spec.name, r)
                    for r in redo_recurrent_(self.model, spec, observations, self.tau, optimizers, cell_activity, replaced)
                ]
        # every network's units are recycled first, then their outgoing weights zeroed: a reader reset later (the
        # critic's first layer reading a shared extractor, an LSTM reading the features) must not re-open them
        zero_outgoing_last_(replaced, optimizers)
        layer_resets = self.state.setdefault("layer_resets", {})
        total_units = sum(r.n_units for _, r in out)
        total_dormant = sum(r.n_dormant for _, r in out)
        prefix = self.log_prefix
        for net, r in out:
            key = f"{net}/{r.name}"
            layer_resets[key] = layer_resets.get(key, 0) + r.n_dormant
            self.record(f"{prefix}/{key}/dormant_fraction", r.dormant_fraction)
            self.record(f"{prefix}/{key}/resets", r.n_dormant)
        self.state["last_step"] = self.gradient_steps
        self.state["events"] = int(self.state.get("events", 0)) + 1
        self.state["total_resets"] = int(self.state.get("total_resets", 0)) + total_dormant
        self.record(f"{prefix}/dormant_fraction", total_dormant / max(total_units, 1))
        self.record(f"{prefix}/resets", total_dormant)
        self.record(f"{prefix}/total_resets", self.state["total_resets"])
        self.record(f"{prefix}/events", self.state["events"])
        if self.verbose >= 1:
            print(
                f"ReDo at gradient step {self.gradient_steps}: {total_dormant}/{total_units} units dormant "
                f"(tau={self.tau}) recycled"
            )
        return out


@dataclass
class ReDoConfig(InterventionConfig):
    """ReDo settings as top-level keywords of the plastic algorithms (and rl_zoo3 / optuna).

    :param redo_period: gradient steps (optimizer updates, PPO: minibatch updates) between two ReDo checks; ``None``
        switches ReDo off.
    :param redo_tau: dormancy threshold in (0, 1] (0.025 default, 0.1 aggressive).
    :param redo_probe_size: probe batch size.
    """

    redo_period: Optional[int] = None
    redo_tau: float = 0.025
    redo_probe_size: int = 256

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        if self.redo_period is not None:
            self.redo_period = _validate_positive_int("redo_period", self.redo_period)
        try:
            self.redo_tau = _validate_tau(self.redo_tau)
        except ValueError:
            raise ValueError(f"redo_tau must be a number in (0, 1], got {self.redo_tau!r}") from None
        self.redo_probe_size = _validate_positive_int("redo_probe_size", self.redo_probe_size)

    @property
    def enabled(self) -> bool:
        """Whether ReDo is on (``redo_period`` is set)."""
        return self.redo_period is not None

    def make_callback(self) -> Optional[ReDo]:
        """The :class:`ReDo` callback for these settings, or ``None`` when ReDo is off."""
        if not self.enabled:
            return None
        assert self.redo_period is not None
        return ReDo(period=self.redo_period, tau=self.redo_tau, probe_size=self.redo_probe_size)



#: Names of the ReDo keywords, in signature order.
REDO_KEYS: tuple[str, ...] = tuple(ReDoConfig.__dataclass_fields__)
