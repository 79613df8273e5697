"""Plasticity injection (Nikishin, Oh, Ostrovski, Lyle, Pascanu, Dabney & Barreto, NeurIPS 2023, "Deep Reinforcement
Learning with Plasticity Injection", https://arxiv.org/abs/2305.15555).

At an injection the network's head ``h_theta`` (its last layers, after the encoder ``phi``) is frozen and a new head
``h_theta'`` is added, minus a frozen copy of its initial self:

    h(x) = h_theta(phi(x)) + h_theta'(phi(x)) - h_theta'-(phi(x)),   theta'- = theta' at the injection (frozen),

so the output is unchanged at the injection while the new head brings fresh, trainable units (the encoder keeps
training). The paper injects once, in the middle of training (Atari, Double DQN with the Nature CNN: the head is the
two fully connected layers after the convolutions); the continual use injects at every task switch.

Here the head of every path of every online network (:func:`head_chains`) is its last ``layers`` Linear / Conv2d
layers (default 2: the paper's Nature-CNN head, whose 512-unit layer SB3 keeps in the features extractor), with what
lies between them (activations, layer norms, the conv -> linear flatten). A new branch (:class:`InjectedHead`) copies
that structure with a fresh draw of the model's initialiser (:func:`~sb3_plastic.callbacks.redo.model_layer_init`, from
the callback's private generator), plus its frozen twin; it is registered as a child of the path's output layer and
joins that layer's output through forward hooks (its input is the chain's first layer's input, recorded by a forward
pre-hook), so every SB3 forward (policy, value, Q-values, critics) includes it. The old head's layers stop training
(``requires_grad=False``: their gradient stays ``None``, so Adam / AdamO skip them), the new branch's trainable
parameters join the optimizer of the network as a new param group (the optimizer's defaults: Adam's settings; under
AdamO the penalty on the weights the policy's ``isometry_layers`` selects, so by default not on the branch's output
layer, a head, which joins a second group with ``isometry_coef=0``), and target networks (DQN, QR-DQN, SAC, TQC, TD3)
get the same structure with copies of the branch, so their Polyak updates stay aligned. A later injection freezes the
previous branch as well and adds another.

Deviations and choices:

* No public code of the paper. Plasticine (RLE-Foundation/Plasticine, ``*_pi.py``, "Plasticity Injection") wraps PPO's
  single-layer policy and value heads as ``original(x) + new_a(x) - new_b(x).detach()`` at the midpoint; its new layers
  are never added to the optimizer (built before the injection) and the old head is not frozen. Here the new branch is
  trained and the old head frozen, as the paper defines. With ``layers=1`` the injected head is linear and injection is
  exactly a restart of the head's optimizer state (a frozen ``W`` plus a trainable ``W'`` with the same input has the
  gradient of ``W``): use ``layers >= 2``.
* Shared layers: when a chain's first layer is shared by several paths (PPO's features extractor with ``layers`` reaching
  it) each path gets its own copy in its branch.
* CrossQ is refused (its BatchRenorm layers normalise with batch statistics in training mode: the frozen twin would not
  cancel the new branch), as are heads with running-statistics norms.
* Interventions that edit layers in place (LayerReset, FIRE, ShrinkPerturb, ContinualBackprop, ReDo) are refused
  with an injection (``ValueError`` at the start of ``learn()``, or on a model that carries branches): they would
  re-initialise or shrink the frozen old head, which never trains again, and miss the branch. Penalties
  (L2Init, spectral / Parseval regularisation), WeightClipping (which clips the trainable branch) and
  NormalizeAndProject (which holds the branch's normalised layers at their norm at the injection) combine.
* Diagnostics (:mod:`sb3_plastic.diagnostics`, the monitor) read the trainable branch as layers of the network, its
  distance from init measured from its draw at the injection.
* Save / load: the branches are in the state dict. ``PlasticX.load`` rebuilds them from the injections recorded in the
  model's persistent state before the parameters are loaded; a plain SB3 model loads with :func:`load_injected`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from sb3_plastic.callbacks.base import (
    INJECTION_SOURCES_ATTR,
    InterventionConfig,
    PrivateRNGMixin,
    changed_fields,
    has_injected_branches,
    warn_ignored_options,
)
from sb3_plastic.callbacks.redo import model_layer_init
from sb3_plastic.callbacks.triggers import UNSET, TriggeredIntervention, check_at, check_bool, check_every, check_int_at_least
from sb3_plastic.common.surgery import LAYER_TYPES, NORM_TYPES, HiddenLayer, NetworkSpec, find_networks

#: The prefix of the branch children registered on a path's output layer (``<prefix><n>``, n = 0, 1, ...).
BRANCH_PREFIX = "plasticity_injection"


class _InputSlot:
    """The last input of a chain's first layer (part of the autograd graph). A copy of the module (``deepcopy``,
    pickling) gets an empty slot: a graph tensor cannot be copied, and the next forward fills it again."""

    def __init__(self) -> None:
        self.value: Optional[th.Tensor] = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _InputSlot:
        return _InputSlot()

    def __getstate__(self) -> dict[str, Any]:
        return {"value": None}


def _capture_input(module: nn.Module, args: tuple[Any, ...]) -> None:
    """Forward pre-hook of a chain's first layer: remember its input for the branches."""
    module._injection_slot.value = args[0]


def _add_branches(module: nn.Module, args: tuple[Any, ...], output: th.Tensor) -> th.Tensor:
    """Forward hook of a path's output layer: add every branch's output (new head minus its frozen twin)."""
    for name, source in getattr(module, INJECTION_SOURCES_ATTR).items():
        output = output + getattr(module, name)(source._injection_slot.value)
    return output


class InjectedHead(nn.Module):
    """A new head and its frozen initial twin: ``forward(x) = new(x) - frozen(x)`` (zero at the injection).

    :param new: the new head (trainable).
    """

    def __init__(self, new: nn.Module) -> None:
        super().__init__()
        self.new = new
        self.frozen = copy.deepcopy(new).requires_grad_(False)

    def forward(self, x: th.Tensor) -> th.Tensor:
        with th.no_grad():
            twin = self.frozen(x)
        return self.new(x) - twin


def head_chains(spec: NetworkSpec, layers: int) -> list[list[nn.Module]]:
    """The head of every path of ``spec``: its last ``layers`` Linear / Conv2d layers (the whole path if shorter)."""
    return [path[-layers:] for path in spec.paths if path]


def _between(spec: NetworkSpec, layer: nn.Module, following: Optional[nn.Module]) -> list[nn.Module]:
    """Fresh copies of what the network applies between ``layer`` and the next layer of the chain: a layer norm, the
    activation, a flatten from a conv to a linear layer.

    :raises ValueError: for a running-statistics normalisation (BatchNorm, BatchRenorm) in the head.
    """
    hidden = {id(h.layer): h for h in spec.hidden_layers()}.get(id(layer))
    out: list[nn.Module] = []
    if hidden is not None:
        for norm in (hidden.pre_norm, hidden.norm):
            if norm is not None and isinstance(norm, NORM_TYPES):
                raise ValueError(f"PlasticityInjection does not support a head with {type(norm).__name__} (batch "
                                 "statistics: the frozen twin would not cancel the new head)")
        if hidden.pre_norm is not None:
            norm = copy.deepcopy(hidden.pre_norm)
            if hasattr(norm, "reset_parameters"):
                norm.reset_parameters()
            out.append(norm)
        if hidden.activation is not None:
            out.append(copy.deepcopy(hidden.activation))
    if isinstance(layer, nn.Conv2d) and isinstance(following, nn.Linear):
        out.append(nn.Flatten())
    return out


def _fresh_layer(layer: nn.Module) -> nn.Module:
    """A new Linear / Conv2d of ``layer``'s configuration (no hooks, no children), on its device and dtype, its values
    not initialised (``torch.nn.utils.skip_init``: nothing is drawn; the caller writes them)."""
    where = dict(device=layer.weight.device, dtype=layer.weight.dtype, bias=layer.bias is not None)
    if isinstance(layer, nn.Linear):
        return th.nn.utils.skip_init(nn.Linear, layer.in_features, layer.out_features, **where)
    return th.nn.utils.skip_init(nn.Conv2d, layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                 layer.padding, layer.dilation, layer.groups, padding_mode=layer.padding_mode, **where)


def build_head(spec: NetworkSpec, chain: Sequence[nn.Module], model: BaseAlgorithm) -> nn.Sequential:
    """A new head of the same structure as ``chain`` (:func:`_between`), each layer a fresh draw of the model's
    initialiser (weight, then bias, layer by layer)."""
    init = model_layer_init(model)
    parts: list[nn.Module] = []
    for i, layer in enumerate(chain):
        fresh = _fresh_layer(layer)
        weight, bias = init(layer)
        with th.no_grad():
            fresh.weight.copy_(weight)
            if fresh.bias is not None and bias is not None:
                fresh.bias.copy_(bias)
        parts.append(fresh)
        parts += _between(spec, layer, chain[i + 1] if i + 1 < len(chain) else None)
    return nn.Sequential(*parts)


def _attach(first: nn.Module, last: nn.Module, branch: InjectedHead) -> str:
    """Register ``branch`` on ``last`` and the hooks that feed it ``first``'s input; returns its child name."""
    index = sum(1 for n, _ in last.named_children() if n.startswith(BRANCH_PREFIX))
    name = f"{BRANCH_PREFIX}{index}"
    last.add_module(name, branch)
    if not hasattr(first, "_injection_slot"):
        first.register_forward_pre_hook(_capture_input)
        first._injection_slot = _InputSlot()
    if not hasattr(last, INJECTION_SOURCES_ATTR):
        setattr(last, INJECTION_SOURCES_ATTR, {})
        last.register_forward_hook(_add_branches)
    getattr(last, INJECTION_SOURCES_ATTR)[name] = first
    return name


def injected_layers(spec: NetworkSpec) -> list[tuple[nn.Module, bool]]:
    """The Linear / Conv2d layers of the trainable (latest) branch of every path of ``spec`` that has had an injection:
    ``(layer, is_output_layer)`` pairs, in forward order within each branch; ``[]`` without injections. The frozen twins
    and the branches of earlier injections (frozen by the later one) are left out."""
    out: list[tuple[nn.Module, bool]] = []
    for _, branch in _trainable_branches(spec):
        layers = [m for m in branch.new.modules() if isinstance(m, LAYER_TYPES)]
        out += [(layer, i == len(layers) - 1) for i, layer in enumerate(layers)]
    return out


def _trainable_branches(spec: NetworkSpec) -> list[tuple[str, InjectedHead]]:
    """``(name, branch)`` of the trainable (latest) injected branch of every path of ``spec``."""
    return [(name, branch) for head in spec.heads() for name, branch in head.named_children()
            if name.startswith(BRANCH_PREFIX) and isinstance(branch, InjectedHead)
            and any(p.requires_grad for p in branch.new.parameters())]


#: the normalisations a branch can apply between a layer and its activation (:func:`_between` refuses batch statistics)
_PRE_NORMS = (nn.LayerNorm, nn.GroupNorm)


def weight_layers_with_branches(spec: NetworkSpec) -> list[tuple[nn.Module, bool]]:
    """``(layer, is_output_layer)`` of every Linear / Conv2d layer of ``spec``'s paths followed by the layers of its
    trainable injected branches (:func:`injected_layers`): what a per-layer penalty or constraint acts on."""
    heads = {id(h) for h in spec.heads()}
    return [(layer, id(layer) in heads) for layer in spec.weight_layers()] + injected_layers(spec)


def injected_hidden_layers(spec: NetworkSpec) -> list[HiddenLayer]:
    """The hidden layers of the trainable (latest) branch of every injected path of ``spec``: each Linear / Conv2d but
    the branch's output layer, with the normalisation and the activation the branch applies after it (the copies
    :func:`_between` made), for the diagnostics to read their units."""
    out: list[HiddenLayer] = []
    for name, branch in _trainable_branches(spec):
        parts = list(branch.new.children())
        at = [i for i, m in enumerate(parts) if isinstance(m, LAYER_TYPES)]
        for i, j in itertools.pairwise(at):
            between = [m for m in parts[i + 1:j] if not isinstance(m, nn.Flatten)]
            norm = between.pop(0) if between and isinstance(between[0], _PRE_NORMS) else None
            activation = between[0] if between else None
            layer_name = spec.layer_names.get(id(parts[i]), f"{name}.new.{i}")
            out.append(HiddenLayer(layer_name, parts[i], activation, pre_norm=norm))
    return out


def branch_output_layers(module: nn.Module) -> list[nn.Module]:
    """The output layer (the last Linear / Conv2d) of every injected branch in ``module``, new and frozen: heads of the
    network, as the layers they join are."""
    out: list[nn.Module] = []
    for branch in module.modules():
        if isinstance(branch, InjectedHead):
            for part in (branch.new, branch.frozen):
                layers = [m for m in part.modules() if isinstance(m, LAYER_TYPES)]
                out += layers[-1:]
    return out


def _branch_param_groups(model: BaseAlgorithm, optimizer: th.optim.Optimizer, params: list[nn.Parameter]) -> list[dict]:
    """The param groups a branch's trainable parameters join ``optimizer`` as: one group with the optimizer's defaults;
    for an isometry optimizer (AdamO) the weights the policy's ``isometry_layers`` selects
    (``regularised_parameters``: under ``"hidden"`` not the branch's output layer, a head) keep the default penalty and
    the rest join with ``isometry_coef=0``."""
    from sb3_plastic.optim import IsometryStepMixin

    select = getattr(model.policy, "regularised_parameters", None)
    if not isinstance(optimizer, IsometryStepMixin) or select is None:
        return [{"params": params}]
    regularised = {id(p) for p in select()}
    groups = [{"params": [p for p in params if id(p) in regularised]},
              {"params": [p for p in params if id(p) not in regularised], "isometry_coef": 0.0}]
    return [g for g in groups if g["params"]]


def branch_initial_values(module: nn.Module) -> dict[int, th.Tensor]:
    """``id(parameter) -> its value at the injection`` for every parameter of every injected branch in ``module``:
    the frozen twin's matching tensor (a copy of the branch when it was drawn, never trained)."""
    out: dict[int, th.Tensor] = {}
    for branch in module.modules():
        if isinstance(branch, InjectedHead):
            for new, twin in zip(branch.new.parameters(), branch.frozen.parameters()):
                out[id(new)] = twin.detach()
    return out


def _relative_names(root: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in root.named_modules()}


def inject_(model: BaseAlgorithm, layers: int, networks: Optional[list[NetworkSpec]] = None) -> list[nn.Parameter]:
    """One plasticity injection on every online network of ``model`` (see the module docstring), in place. The fresh
    weights come from torch's global generator (the callback runs this inside its private stream). Returns the new
    trainable parameters.

    :raises ValueError: for CrossQ / heads with running-statistics norms.
    """
    if type(model).__name__ in ("CrossQ", "PlasticCrossQ"):
        raise ValueError("PlasticityInjection does not support CrossQ: its BatchRenorm layers normalise with batch "
                         "statistics, so the frozen twin would not cancel the new head")
    networks = find_networks(model) if networks is None else networks
    trainable: list[nn.Parameter] = []
    for spec in networks:
        online_names = _relative_names(spec.module)
        target_modules = dict(spec.target.named_modules()) if spec.target is not None else {}
        new_params: list[nn.Parameter] = []
        frozen: list[nn.Module] = []
        pre_norms = {id(h.layer): h.pre_norm for h in spec.hidden_layers() if h.pre_norm is not None}
        for chain in head_chains(spec, layers):
            first, last = chain[0], chain[-1]
            branch = InjectedHead(build_head(spec, chain, model)).to(last.weight.device)
            frozen += [*chain, *(m for n, m in last.named_children() if n.startswith(BRANCH_PREFIX))]
            frozen += [pre_norms[id(m)] for m in chain if id(m) in pre_norms]
            name = _attach(first, last, branch)
            new_params += list(branch.new.parameters())
            if spec.target is not None:  # the target mirrors the structure, with a copy of the branch
                t_first = target_modules[online_names[id(first)]]
                t_last = target_modules[online_names[id(last)]]
                twin = copy.deepcopy(branch)
                twin.requires_grad_(False)
                assert _attach(t_first, t_last, twin) == name
        for module in frozen:
            for param in module.parameters():
                if all(param is not p for p in new_params):
                    param.requires_grad_(False)
        if spec.optimizer is not None and new_params:
            for group in _branch_param_groups(model, spec.optimizer, new_params):
                spec.optimizer.add_param_group(group)
        trainable += new_params
    return trainable


def restore_injections(model: BaseAlgorithm) -> int:
    """Rebuild, on a freshly constructed model, the branches of every injection recorded in its persistent state (the
    structure only: the values come with the parameters loaded next). Called by ``PlasticX.load`` / :func:`load_injected`
    before SB3 loads the parameters. Returns the number of injections rebuilt."""
    store = model.__dict__.get("plastic_state")
    data = getattr(store, "data", store) if store is not None else None
    if not isinstance(data, dict) or has_injected_branches(model):
        return 0  # nothing recorded, or the branches are there already
    done = 0
    for key, state in data.items():
        if not key.startswith("PlasticityInjection") or not isinstance(state, dict):
            continue
        for _ in range(int(state.get("count", 0))):
            inject_(model, int(state["layers"]))
            done += 1
    return done


class InjectionLoadMixin:
    """SB3's ``set_parameters`` preceded by :func:`restore_injections` (the loaded state dict has the branches)."""

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: Any = "auto") -> None:
        restore_injections(self)  # type: ignore[arg-type]
        super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)  # type: ignore[misc]


def load_injected(algorithm_class: type[BaseAlgorithm], path: Any, **kwargs: Any) -> BaseAlgorithm:
    """``algorithm_class.load(path, **kwargs)`` for a plain SB3 model saved after a plasticity injection: the branches
    are rebuilt before the parameters are loaded (the plastic algorithms' ``load`` does this itself). The returned model
    is an instance of a subclass of ``algorithm_class``."""
    loader = type(algorithm_class.__name__, (InjectionLoadMixin, algorithm_class), {})
    return loader.load(path, **kwargs)  # type: ignore[attr-defined]


class PlasticityInjection(PrivateRNGMixin, TriggeredIntervention):
    """Plasticity injection as an SB3 callback (Nikishin et al., 2023; see the module docstring for the mechanism and
    every deviation), on PPO, A2C, MaskablePPO, RecurrentPPO (the heads after the LSTM), DQN, QR-DQN, SAC, TQC and TD3,
    plain or plastic (CrossQ is refused).

    Triggers (:class:`~sb3_plastic.callbacks.triggers.TriggeredIntervention`): ``at`` (default 0.5: the paper's
    midpoint, when no other trigger is given), ``every``, ``on_task_change``; on-policy algorithms inject between a
    ``train()`` and the next rollout.

    Logged: ``plasticity/injection/count`` and ``plasticity/injection/parameters`` (new trainable parameters);
    ``injection_<name>`` with a ``name``.
    Persistent: the trigger state, ``layers`` (what :func:`restore_injections` needs), ``rng``.

    :param layers: the head's size in Linear / Conv2d layers from the output (>= 1; default 2, see the module docstring).
    :param at: inject once at this point (float fraction of the run, or int timestep); default 0.5 without other trigger.
    :param every: inject every ``every`` timesteps, or ``None``.
    :param on_task_change: inject when ``info["task_id"]`` changes.
    :param name: distinguishes several PlasticityInjection callbacks on one model.
    :param verbose: 1 prints a line per injection.
    """

    title = "PlasticityInjection"
    injects_layers = True
    keyword_prefix = "plasticity_injection"
    action = "inject"

    def __init__(
        self,
        layers: int = 2,
        at: Optional[Union[float, int]] = UNSET,
        every: Optional[int] = None,
        on_task_change: bool = False,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        check_int_at_least("layers", layers, 1)
        if at is UNSET:
            at = 0.5 if every is None and not on_task_change else None
        super().__init__(at=at, every=every, on_task_change=on_task_change, name=name, verbose=verbose)
        self.layers = int(layers)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._bind_private_rng()
        previous = self.state.get("layers")
        if previous is not None and int(previous) != self.layers and self.state.get("count", 0):
            raise ValueError(f"PlasticityInjection layers={self.layers}: this model's earlier injections used "
                             f"layers={previous}; a restore would not know the branches' shapes")
        self.state["layers"] = self.layers
        if type(self.model).__name__ in ("CrossQ", "PlasticCrossQ"):
            raise ValueError("PlasticityInjection does not support CrossQ (BatchRenorm's batch statistics)")

    def _act(self, reasons: list[str]) -> None:
        device = th.device(self.model.device)
        with self._private_global_rng(device):
            new = inject_(self.model, self.layers)
        self.networks = find_networks(self.model)
        count = self._count_event(reasons)
        n_params = int(sum(p.numel() for p in new))
        self.record(f"{self.log_group('injection')}/count", count)
        self.record(f"{self.log_group('injection')}/parameters", n_params)
        if self.verbose >= 1:
            print(f"PlasticityInjection #{count} at num_timesteps={self.model.num_timesteps} ({'+'.join(reasons)}): "
                  f"{n_params} new trainable parameters")


@dataclass
class PlasticityInjectionConfig(InterventionConfig):
    """Plasticity injection as top-level keywords of the plastic algorithms (and rl_zoo3 yaml / optuna samplers);
    see :class:`PlasticityInjection`.

    :param plasticity_injection_at: inject once at this point (float fraction of the run: 0.5 is the paper's midpoint;
        int timestep), or ``None``.
    :param plasticity_injection_every: inject every this many timesteps, or ``None``.
    :param plasticity_injection_on_task_change: inject when ``info["task_id"]`` changes.
    :param plasticity_injection_layers: the head's size in layers from the output (default 2).

    ``plasticity_injection_layers`` set without a trigger warns: the injection is off.
    """

    plasticity_injection_at: Optional[Union[float, int]] = None
    plasticity_injection_every: Optional[int] = None
    plasticity_injection_on_task_change: bool = False
    plasticity_injection_layers: int = 2

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        check_at("plasticity_injection_at", self.plasticity_injection_at)
        check_every("plasticity_injection_every", self.plasticity_injection_every)
        check_bool("plasticity_injection_on_task_change", self.plasticity_injection_on_task_change)
        check_int_at_least("plasticity_injection_layers", self.plasticity_injection_layers, 1)
        if not self.enabled:
            warn_ignored_options(
                changed_fields(self, ("plasticity_injection_layers",)),
                "no plasticity injection trigger is set (plasticity_injection_at, plasticity_injection_every, "
                "plasticity_injection_on_task_change), so the injection is off",
                stacklevel=4,
            )

    @property
    def enabled(self) -> bool:
        """Whether any trigger is set."""
        return (self.plasticity_injection_at is not None or self.plasticity_injection_every is not None
                or self.plasticity_injection_on_task_change)

    def make_callback(self) -> Optional[PlasticityInjection]:
        """The :class:`PlasticityInjection` callback for these settings, or ``None`` when no trigger is set."""
        if not self.enabled:
            return None
        return PlasticityInjection(
            layers=self.plasticity_injection_layers,
            at=self.plasticity_injection_at,
            every=self.plasticity_injection_every,
            on_task_change=self.plasticity_injection_on_task_change,
        )



