"""Layer reset (Nikishin et al., 2022, "The Primacy Bias in Deep Reinforcement Learning", ICML): re-initialise the last
layers of the agent now and then, keeping the replay buffer and the rest of the network.

Reference: E. Nikishin, M. Schwarzer, P. D'Oro, P.-L. Bacon, A. Courville, "The Primacy Bias in Deep Reinforcement
Learning", ICML 2022 (https://arxiv.org/abs/2205.07802); code evgenii-nikishin/rl_with_resets. Plasticine
(RLE-Foundation/Plasticine, ``plasticine/*/ppo_*_rl.py``, "Layer Resetting") runs it on PPO as a reset of the final
layers (``reset_type="final"``: the policy and value heads) or of everything (``"all"``) every ``reset_frequency``
PPO iterations.

What the references do, and what :class:`LayerReset` does:

* **Which layers.** The paper resets the last layers: for SPR on Atari 100k the final linear layer(s) of the Q head,
  for SAC on DeepMind Control every layer of actor and critic (``train_dense.py``: a completely new agent), for DrQ
  the last layers. Here ``layers`` is an int ``k`` (the last ``k`` Linear / Conv2d layers of every path of every online
  network: ``1`` is every output head), a role (``"heads"``, ``"policy_head"``, ``"value_head"``, ``"critic"``,
  ``"all"``; see :data:`LAYER_ROLES`), or ``fnmatch`` patterns over the layer names of
  :func:`~sb3_plastic.common.surgery.find_networks` (``"action_net"``, ``"mlp_extractor.value_net.*"``,
  ``"critic.qf0.*"``, ``"lstm_actor"``).
* **The fresh values** are a new draw of the initialiser the model used for that layer
  (:func:`~sb3_plastic.callbacks.redo.model_layer_init`: SB3's orthogonal init with gains sqrt(2) / 0.01 / 1 for PPO,
  PyTorch's default for DQN / SAC, the plastic policies' orthogonal init), weight then bias, written in place
  (Parameter objects are kept: optimizers and Polyak updates hold them). LSTM layers named by a pattern (or ``"all"``)
  get a fresh draw of their own initialisation (:func:`~sb3_plastic.recurrent.fresh_recurrent_parameters`). A policy
  head resets PPO's / SAC-with-gSDE's ``log_std`` parameter to ``log_std_init`` too. Normalisation layers of a reset
  layer (CrossQ's BatchRenorm, NaP's LayerNorm) get their initial state (statistics, warm-up counter, scale 1, shift 0).
* **Optimizer state.** The references build a fresh optimizer state for the reset parameters (SPR: ``optimizer.init``
  copied into the reset subtrees; SAC: a new agent). Here the whole state (Adam's moments and step) of every touched
  tensor is dropped in every optimizer holding it, so Adam treats it as a new parameter. Deviation: the SPR code also
  restarts optax's one shared step ``count`` of the untouched parameters (their bias correction restarts); here the
  untouched tensors keep their step and moments.
* **Target networks** (DQN, QR-DQN, SAC, TQC) get the reset parameters copied (the rest of the target keeps its Polyak
  lag). The SAC reference builds a whole new target with the new critic; the SPR code leaves the target to its next
  update.
* **When.** The paper resets every ``T`` updates (SPR: 2e4, SAC: 2e5); Plasticine every ``reset_frequency`` PPO
  iterations. Here the triggers of :class:`~sb3_plastic.callbacks.triggers.TriggeredIntervention`: ``every`` N
  timesteps (``num_timesteps``; ``T`` updates are ``T / (gradient_steps / train_freq)`` env steps for an off-policy
  algorithm), at task changes (``on_task_change``; the continual setting: "head reset at every switch") or once at a
  point ``at``. On-policy algorithms reset between a ``train()`` and the next rollout.
* Not done: SPR's ``updates_on_reset`` (offline updates right after a reset; 0 in the paper's runs) and SAC's entropy
  temperature reset (a new agent gets a new temperature; here the entropy coefficient is not a network layer and is
  kept, as FIRE keeps it).

Random numbers come from the callback's private generator (:class:`~sb3_plastic.callbacks.base.PrivateRNGMixin`): a
reset does not shift the run's other random draws, and a resumed run continues the same stream.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from sb3_plastic.callbacks.base import (
    InterventionConfig,
    PrivateRNGMixin,
    announce_rewrite,
    changed_fields,
    warn_ignored_options,
)
from sb3_plastic.callbacks.redo import LayerInit, model_layer_init
from sb3_plastic.callbacks.triggers import TriggeredIntervention, check_at, check_bool, check_every, is_int
from sb3_plastic.common.surgery import NORM_TYPES, NetworkSpec, find_networks, reset_norm_, sync_target
from sb3_plastic.common.unit_reset import reset_norm_features_
from sb3_plastic.optim import reset_optimizer_state
from sb3_plastic.recurrent import fresh_recurrent_parameters, recurrent_init_scheme

#: Roles ``layers`` may name. ``"heads"``: every output layer (= ``1``). ``"policy_head"``: the layers that output the
#: action distribution (PPO family: ``action_net`` and the ``log_std`` parameter; DQN / QR-DQN: the Q head; SAC, TQC,
#: CrossQ, TD3: the actor's heads). ``"value_head"``: the value outputs (PPO family: ``value_net``; DQN / QR-DQN: the
#: Q head; SAC family: the last layer of every Q-network). ``"critic"``: the value function's own layers (SAC family:
#: the whole critic; PPO family: the layers only the value path uses, ``mlp_extractor.value_net``, ``value_net``, a
#: separate value features extractor, sb3-contrib's critic LSTM / Linear; DQN / QR-DQN: the whole Q-network).
#: ``"all"``: every layer of every online network (the paper's SAC setting).
LAYER_ROLES = ("heads", "policy_head", "value_head", "critic", "all")

Selection = Union[int, str, Sequence[str]]


def check_selection(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int >= 1, a role of :data:`LAYER_ROLES` or a
    non-empty list of ``fnmatch`` patterns."""
    if is_int(value):
        if value < 1:
            raise ValueError(f"{name} must be an int >= 1 (the last k layers), a role {list(LAYER_ROLES)} or a list of "
                             f"layer-name patterns, got {value!r}")
        return
    if isinstance(value, str):
        if value not in LAYER_ROLES:
            raise ValueError(f"Unknown {name} {value!r}; allowed: an int >= 1, one of {list(LAYER_ROLES)}, or a list of "
                             "fnmatch patterns over the layer names")
        return
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, str) for p in value):
        return
    raise ValueError(f"{name} must be an int >= 1, one of {list(LAYER_ROLES)} or a non-empty list of layer-name patterns, "
                     f"got {value!r}")


def _is_actor_critic(spec: NetworkSpec) -> bool:
    return hasattr(spec.module, "action_net") and hasattr(spec.module, "value_net")


def _ends_at(spec: NetworkSpec, head: nn.Module) -> list[list[nn.Module]]:
    return [p for p in spec.paths if p and p[-1] is head]


def _role_modules(spec: NetworkSpec, role: str, model: BaseAlgorithm) -> list[nn.Module]:
    """The layers (and recurrent layers) of ``spec`` a role names (see :data:`LAYER_ROLES`)."""
    everything = [*spec.weight_layers(), *spec.recurrent]
    if role == "all":
        return everything
    heads = spec.heads()
    if role == "heads":
        return heads
    policy = spec.module
    if _is_actor_critic(spec):
        if role == "policy_head":
            return [policy.action_net]
        if role == "value_head":
            return [policy.value_net]
        # critic: the layers on the value paths that no policy path uses
        policy_layers = {id(m) for p in _ends_at(spec, policy.action_net) for m in p}
        value_layers = [m for p in _ends_at(spec, policy.value_net) for m in p if id(m) not in policy_layers]
        own = (getattr(policy, "lstm_critic", None), getattr(policy, "critic", None))  # sb3-contrib's recurrent critic
        extra = [m for m in own if isinstance(m, nn.Module)]
        if getattr(policy, "vf_features_extractor", None) is not getattr(policy, "pi_features_extractor", None):
            extra += [m for m in spec.extra_layers if any(m is x for x in policy.vf_features_extractor.modules())]
        return list({id(m): m for m in [*value_layers, *extra]}.values())
    if spec.name in ("q_net", "quantile_net"):
        return everything if role == "critic" else heads
    # SAC family: an "actor" and a "critic" network
    if role == "policy_head":
        return heads if spec.name == "actor" else []
    if role == "value_head":
        return heads if spec.name == "critic" else []
    return everything if spec.name == "critic" else []


def selected_modules(model: BaseAlgorithm, selection: Selection, networks: Optional[list[NetworkSpec]] = None) -> list[
        tuple[NetworkSpec, nn.Module]]:
    """``(network, layer)`` of every Linear / Conv2d / recurrent layer that ``selection`` names (see :class:`LayerReset`),
    each once, in network order.

    :raises ValueError: for a bad selection, or patterns that match no layer (the layer names are listed).
    """
    check_selection("layers", selection)
    networks = find_networks(model) if networks is None else networks
    chosen: dict[int, tuple[NetworkSpec, nn.Module]] = {}
    for spec in networks:
        if is_int(selection):
            modules = [m for path in spec.paths for m in path[-int(selection):]]
        elif isinstance(selection, str):
            modules = _role_modules(spec, selection, model)
        else:
            named = [*spec.weight_layers(), *spec.recurrent]
            modules = [m for m in named if any(fnmatch.fnmatchcase(spec.layer_names.get(id(m), "?"), p) for p in selection)]
        for module in modules:
            chosen.setdefault(id(module), (spec, module))
    if not chosen:
        names = [spec.layer_names.get(id(m), "?") for spec in networks for m in [*spec.weight_layers(), *spec.recurrent]]
        raise ValueError(f"layers={selection!r} selects no layer of {type(model).__name__}; its layers: {names}")
    return list(chosen.values())


@th.no_grad()
def reinitialise_(modules: Iterable[nn.Module], init: LayerInit, recurrent_init: tuple[str, float] = ("default", 1.0)) -> list[
        nn.Parameter]:
    """Overwrite every parameter of ``modules`` with a fresh draw of its initialiser, in place (Parameter objects kept):
    a Linear / Conv2d layer gets ``init(layer)`` (weight, then bias), a recurrent layer
    :func:`~sb3_plastic.recurrent.fresh_recurrent_parameters` with ``recurrent_init`` (``(kind, gain)``). Optimizer
    state and target networks are not touched here (:class:`LayerReset` does that).

    :return: the overwritten parameters.
    """
    touched: list[nn.Parameter] = []
    for module in {id(m): m for m in modules}.values():
        if isinstance(module, nn.RNNBase):
            kind, gain = recurrent_init
            fresh = fresh_recurrent_parameters(module, kind, gain)
            for name, param in module.named_parameters(recurse=False):
                param.copy_(fresh[name])
                touched.append(param)
            continue
        weight, bias = init(module)
        module.weight.copy_(weight)
        touched.append(module.weight)
        if getattr(module, "bias", None) is not None and bias is not None:
            module.bias.copy_(bias)
            touched.append(module.bias)
    return touched


def _norms_of(spec: NetworkSpec, modules: Sequence[nn.Module]) -> list[nn.Module]:
    """The normalisation layers owned by the reset layers (a running-statistics norm after the layer or its
    activation, a layer norm between the layer and its activation)."""
    ids = {id(m) for m in modules}
    found: dict[int, nn.Module] = {}
    for hidden in spec.hidden_layers():
        if id(hidden.layer) in ids:
            for norm in (hidden.norm, hidden.pre_norm):
                if norm is not None:
                    found.setdefault(id(norm), norm)
    return list(found.values())


class LayerReset(PrivateRNGMixin, TriggeredIntervention):
    """Re-initialise chosen layers at chosen moments (Nikishin et al., 2022; see the module docstring for the
    references and every deviation), on PPO, A2C, DQN, QR-DQN, SAC, TQC, CrossQ, TD3, RecurrentPPO and MaskablePPO,
    plain or plastic.

    At each event: every selected layer (:func:`selected_modules`) gets a fresh draw of the model's own initialiser,
    the ``log_std`` vector of a reset policy head its ``log_std_init``, their normalisation layers their initial state;
    the whole optimizer state of every touched tensor is dropped; the target networks get the reset parameters; the
    other interventions of the ``learn()`` call are told (:func:`~sb3_plastic.callbacks.base.announce_rewrite`:
    spectral regularisation re-warms its vectors, C-CHAIN forgets its previous network, Continual Backprop restarts the
    age, utility and mean activation of the re-drawn layers' units, new units; L2-init's ``theta_0`` and
    NaP's target norms stay those of the first training start).
    Triggers (``at``, ``every``, ``on_task_change``) and the on-policy timing: :class:`TriggeredIntervention`.

    "Head reset at every switch" is ``LayerReset("heads", on_task_change=True)`` (``"policy_head"`` / ``"value_head"``
    for one of them).

    Logged: ``plasticity/layer_reset/count`` and ``plasticity/layer_reset/parameters`` (parameters reset at the last
    event); ``layer_reset_<name>`` with a ``name``. Persistent: the trigger state, ``rng`` (the private generator).

    :param layers: an int ``k`` >= 1 (the last ``k`` Linear / Conv2d layers of every path of every online network; ``1``:
        the output heads; recurrent layers are not counted), a role of :data:`LAYER_ROLES`, or a list of ``fnmatch``
        patterns over the layer names of :func:`~sb3_plastic.common.surgery.find_networks` (e.g. ``["action_net"]``,
        ``["critic.*"]``, ``["lstm_actor"]``).
    :param at: reset once at this point (float fraction of the run, or int timestep), or ``None``.
    :param every: reset every ``every`` timesteps, or ``None``.
    :param on_task_change: reset when ``info["task_id"]`` changes.
    :param name: distinguishes several LayerReset callbacks on one model.
    :param verbose: 1 prints a line per reset.
    :raises ValueError: for a bad ``layers`` or trigger, no trigger at all, and (at training start) patterns that
        match no layer.
    """

    edits_layers = True  # refused with a plasticity injection (PlasticCallback._refuse_with_injection)

    title = "LayerReset"
    keyword_prefix = "layer_reset"
    action = "reset layers"

    def __init__(
        self,
        layers: Selection = 1,
        at: Optional[Union[float, int]] = None,
        every: Optional[int] = None,
        on_task_change: bool = False,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        check_selection("layers", layers)
        super().__init__(at=at, every=every, on_task_change=on_task_change, name=name, verbose=verbose)
        self.layers = list(layers) if isinstance(layers, (list, tuple)) else layers

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._bind_private_rng()
        self.selected()  # a selection that names nothing fails here, not at the first event

    def selected(self) -> list[tuple[NetworkSpec, nn.Module]]:
        """``(network, layer)`` of every layer a reset rewrites."""
        return selected_modules(self.model, self.layers, self.networks or find_networks(self.model))

    def reset(self) -> list[nn.Parameter]:
        """Reset the selected layers now (optimizer state of the touched tensors dropped, targets given the new
        values). Returns the touched parameters."""
        chosen = self.selected()
        modules = [m for _, m in chosen]
        device = next((p.device for m in modules for p in m.parameters()), th.device(self.model.device))
        with self._private_global_rng(device):
            touched = reinitialise_(modules, model_layer_init(self.model), recurrent_init_scheme(self.model))
            touched += self._reset_log_std(modules)
        by_spec: dict[int, tuple[NetworkSpec, list[nn.Module]]] = {}
        for spec, module in chosen:
            by_spec.setdefault(id(spec), (spec, []))[1].append(module)
        norms = [norm for spec, mods in by_spec.values() for norm in _norms_of(spec, mods)]
        for norm in norms:
            if isinstance(norm, NORM_TYPES):
                reset_norm_(norm)  # running statistics and warm-up counter
            width = next((p.shape[0] for p in norm.parameters()), 0)
            reset_norm_features_(norm, th.arange(width))  # scale 1, shift 0
            touched += list(norm.parameters())
        held = {id(t) for t in touched}
        buffers = [b for m in [*modules, *norms] for b in m.buffers()]
        for spec in self.networks or find_networks(self.model):
            for optimizer in spec.optimizers():
                for param in [p for group in optimizer.param_groups for p in group["params"] if id(p) in held]:
                    reset_optimizer_state(optimizer, param)
            sync_target(spec, [*touched, *buffers])
        announce_rewrite(self.model, touched, self, redrawn=True)  # spectral vectors, C-CHAIN, CBP's statistics
        return touched

    @th.no_grad()
    def _reset_log_std(self, modules: Sequence[nn.Module]) -> list[nn.Parameter]:
        """A reset action head takes the policy's state-dependent-free ``log_std`` vector (PPO family) or gSDE matrix
        (SAC family, PPO with gSDE) back to ``log_std_init``."""
        out = []
        ids = {id(m) for m in modules}
        for owner in (self.model.policy, getattr(self.model.policy, "actor", None)):
            head = getattr(owner, "action_net", None)
            head = getattr(owner, "mu", None) if head is None else head
            log_std = getattr(owner, "log_std", None)
            if not isinstance(head, nn.Module) or not isinstance(log_std, nn.Parameter):
                continue
            if any(id(m) in ids for m in head.modules()):
                log_std.fill_(float(getattr(owner, "log_std_init", 0.0)))
                out.append(log_std)
        return out

    def _act(self, reasons: list[str]) -> None:
        start = time.perf_counter()
        touched = self.reset()
        seconds = time.perf_counter() - start
        count = self._count_event(reasons)
        n_params = int(sum(t.numel() for t in touched))
        self.record(f"{self.log_group('layer_reset')}/count", count)
        self.record(f"{self.log_group('layer_reset')}/parameters", n_params)
        if self.verbose >= 1:
            print(f"LayerReset #{count} at num_timesteps={self.model.num_timesteps} ({'+'.join(reasons)}): "
                  f"{n_params} parameters, {seconds * 1e3:.1f} ms")


@dataclass
class LayerResetConfig(InterventionConfig):
    """Layer reset settings as top-level keywords of the plastic algorithms (and rl_zoo3 yaml / optuna samplers).
    Nikishin et al. (2022); see :class:`LayerReset`.

    :param layer_reset_layers: what is reset: an int ``k`` (the last ``k`` layers of every path), a role of
        :data:`LAYER_ROLES` or a list of layer-name patterns. Default ``"heads"``.
    :param layer_reset_at: reset once at this point (float fraction of the run, int timestep), or ``None``.
    :param layer_reset_every: reset every this many timesteps, or ``None``.
    :param layer_reset_on_task_change: reset when ``info["task_id"]`` changes (warns when the env has no ``task_id``).

    ``layer_reset_layers`` set away from its default without a trigger warns: the reset is off.
    """

    layer_reset_layers: Selection = "heads"
    layer_reset_at: Optional[Union[float, int]] = None
    layer_reset_every: Optional[int] = None
    layer_reset_on_task_change: bool = False

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        check_selection("layer_reset_layers", self.layer_reset_layers)
        check_at("layer_reset_at", self.layer_reset_at)
        check_every("layer_reset_every", self.layer_reset_every)
        check_bool("layer_reset_on_task_change", self.layer_reset_on_task_change)
        if not self.enabled:
            warn_ignored_options(
                changed_fields(self, ("layer_reset_layers",)),
                "no layer reset trigger is set (layer_reset_at, layer_reset_every, layer_reset_on_task_change), so the "
                "layer reset is off",
                stacklevel=4,
            )

    @property
    def enabled(self) -> bool:
        """Whether any trigger is set."""
        return self.layer_reset_at is not None or self.layer_reset_every is not None or self.layer_reset_on_task_change

    def make_callback(self) -> Optional[LayerReset]:
        """The :class:`LayerReset` callback for these settings, or ``None`` when no trigger is set."""
        if not self.enabled:
            return None
        return LayerReset(
            layers=self.layer_reset_layers,
            at=self.layer_reset_at,
            every=self.layer_reset_every,
            on_task_change=self.layer_reset_on_task_change,
        )

