"""Finding the networks, layers, optimizers and target networks of any SB3 / sb3-contrib model.

Interventions (FIRE, Continual Backprop, ReDo, Shrink & Perturb) and diagnostics act on the same
structure, which this module extracts once:

* a :class:`NetworkSpec` per online network (PPO/A2C: ``policy``; DQN: ``q_net``; QR-DQN:
  ``quantile_net``; SAC/TQC: ``actor`` and ``critic``) with the optimizer that trains it and the target
  network that mirrors it (if any);
* for each network, the *paths* an input takes through its weight layers (Linear / Conv2d), from the
  first layer to an output head; a :class:`HiddenLayer` for every non-head layer, with the activation
  module that follows it and every layer that consumes its output (several when a shared features
  extractor feeds both the policy and the value path), including the conv -> linear flatten mapping.

A *unit* is an output feature of a Linear layer or an output channel of a Conv2d layer; under MaxMin
(GroupSort-2) the two features of a sorted pair are one unit (``group_size = 2``), because each output
of the pair depends on both pre-activations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from torch import nn

from sb3_plastic.activations import MaxMin

LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)


@dataclass
class Consumer:
    """A layer reading the output of a hidden layer.

    :param layer: the consuming Linear / Conv2d.
    :param columns_per_unit: input columns of ``layer`` per output unit of the producer: 1, or ``H*W``
        when a conv feeds a Linear through an NCHW flatten (channel ``c`` owns columns ``c*P .. c*P+P-1``).
    :param offset: index of the producer's first column in ``layer``'s input (SAC critics concatenate
        features and actions: features come first, so 0).
    """

    layer: nn.Module
    columns_per_unit: int = 1
    offset: int = 0

    def columns(self, units: th.Tensor) -> th.Tensor:
        """Input-column indices of ``layer`` fed by the producer's ``units``."""
        p = self.columns_per_unit
        base = units.long().view(-1, 1) * p + th.arange(p, device=units.device).view(1, -1)
        return (base + self.offset).flatten()


@dataclass
class HiddenLayer:
    """A hidden Linear / Conv2d layer, the activation after it and the layers that read it."""

    name: str
    layer: nn.Module
    activation: Optional[nn.Module]
    consumers: list[Consumer] = field(default_factory=list)

    @property
    def group_size(self) -> int:
        """Features per unit: 2 under MaxMin (a sorted pair), else 1."""
        return 2 if isinstance(self.activation, MaxMin) else 1

    @property
    def n_features(self) -> int:
        """Output features (Linear) or channels (Conv2d)."""
        return self.layer.weight.shape[0]

    @property
    def n_units(self) -> int:
        return self.n_features // self.group_size


@dataclass
class NetworkSpec:
    """One online network of a model."""

    name: str
    module: nn.Module
    optimizer: Optional[th.optim.Optimizer]
    target: Optional[nn.Module]
    paths: list[list[nn.Module]]
    layer_names: dict[int, str]
    #: input offset of a consumer for an edge (id(producer), id(consumer)); 0 when absent. Non-zero when a
    #: Dict-observation extractor concatenates several sub-extractors' outputs.
    edge_offsets: dict[tuple[int, int], int] = field(default_factory=dict)

    def weight_layers(self) -> list[nn.Module]:
        """Every Linear / Conv2d of the network, each once, in path order (heads included)."""
        seen: dict[int, nn.Module] = {}
        for path in self.paths:
            for layer in path:
                seen.setdefault(id(layer), layer)
        return list(seen.values())

    def heads(self) -> list[nn.Module]:
        """Output layers (last layer of each path)."""
        return list({id(p[-1]): p[-1] for p in self.paths if p}.values())

    def hidden_layers(self) -> list[HiddenLayer]:
        """Every non-head layer with its activation and consumers."""
        parents = _activation_after(self.module)
        head_ids = {id(h) for h in self.heads()}
        hidden: dict[int, HiddenLayer] = {}
        for path in self.paths:
            for layer, nxt in itertools.pairwise(path):
                if id(layer) in head_ids:
                    continue
                spec = hidden.setdefault(
                    id(layer), HiddenLayer(self.layer_names.get(id(layer), "?"), layer, parents.get(id(layer)))
                )
                if any(c.layer is nxt for c in spec.consumers):
                    continue
                per_unit = 1
                if isinstance(layer, nn.Conv2d) and isinstance(nxt, nn.Linear):
                    per_unit = nxt.in_features // layer.out_channels
                spec.consumers.append(Consumer(nxt, per_unit, self.edge_offsets.get((id(layer), id(nxt)), 0)))
        return list(hidden.values())

    def parameters(self) -> list[nn.Parameter]:
        """Parameters trained by this network's optimizer (all of the module's if it has none)."""
        if self.optimizer is None:
            return list(self.module.parameters())
        return [p for group in self.optimizer.param_groups for p in group["params"]]


def _activation_after(module: nn.Module) -> dict[int, nn.Module]:
    """Map id(layer) -> the non-weight module right after it in its ``nn.Sequential`` parent."""
    found: dict[int, nn.Module] = {}
    for parent in module.modules():
        if isinstance(parent, nn.Sequential):
            children = list(parent.children())
            for a, b in itertools.pairwise(children):
                if isinstance(a, LAYER_TYPES) and not isinstance(b, (*LAYER_TYPES, nn.Flatten, nn.Identity)):
                    found[id(a)] = b
    return found


def layers_of(module: Optional[nn.Module]) -> list[nn.Module]:
    """Linear / Conv2d layers of ``module`` in registration order."""
    if module is None:
        return []
    return [m for m in module.modules() if isinstance(m, LAYER_TYPES)]


def _extractor_paths(
    extractor: Optional[nn.Module], tails: list[list[nn.Module]], offsets: dict[tuple[int, int], int]
) -> list[list[nn.Module]]:
    """Paths ``extractor layers + tail`` for each tail; a Dict-observation extractor (SB3's
    ``CombinedExtractor``: a ``ModuleDict`` ``extractors`` whose outputs are concatenated in key order)
    gives one path per sub-extractor with layers, and records where its output starts in the concat."""
    subs = getattr(extractor, "extractors", None)
    if not isinstance(subs, nn.ModuleDict):
        return [layers_of(extractor) + tail for tail in tails]
    spaces = getattr(extractor, "_observation_space", None)
    paths: list[list[nn.Module]] = []
    start = 0
    for key, sub in subs.items():
        layers = layers_of(sub)
        width = getattr(sub, "features_dim", None)
        if width is None:
            if spaces is None:
                raise TypeError(f"cannot tell the output width of sub-extractor {key!r}")
            width = get_flattened_obs_dim(spaces[key])
        for tail in tails:
            if layers and tail:
                offsets[(id(layers[-1]), id(tail[0]))] = start
                paths.append(layers + tail)
        start += int(width)
    paths += [tail for tail in tails if tail not in paths]
    return paths


def head_layers(head: nn.Module) -> list[nn.Module]:
    """A head is a Linear, or a Sequential whose weight layer is the head (TQC's clipped mu)."""
    return layers_of(head)[-1:] if not isinstance(head, LAYER_TYPES) else [head]


def _names(root: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in root.named_modules()}


def find_networks(model: BaseAlgorithm) -> list[NetworkSpec]:
    """The online networks of an SB3 / sb3-contrib model, with optimizers, targets and layer paths.

    Supports actor-critic policies (PPO, A2C, RecurrentPPO's MLP part, MaskablePPO), DQN, QR-DQN, SAC,
    TQC, TD3 and DDPG (and their plastic versions), with Box or Dict observations.

    Limitation: with SAC/TQC's ``share_features_extractor=True`` (off by default) the shared extractor
    belongs to the actor, and its last layer lists only the actor's first layer as consumer, not the
    critics' first layers.

    :raises TypeError: for a policy whose structure is not known.
    """
    policy = model.policy
    off: dict[tuple[int, int], int] = {}
    if hasattr(policy, "mlp_extractor") and hasattr(policy, "action_net"):
        pi_tail = [*layers_of(policy.mlp_extractor.policy_net), policy.action_net]
        vf_tail = [*layers_of(policy.mlp_extractor.value_net), policy.value_net]
        if policy.pi_features_extractor is policy.vf_features_extractor:
            paths = _extractor_paths(policy.pi_features_extractor, [pi_tail, vf_tail], off)
        else:
            paths = _extractor_paths(policy.pi_features_extractor, [pi_tail], off)
            paths += _extractor_paths(policy.vf_features_extractor, [vf_tail], off)
        return [NetworkSpec("policy", policy, policy.optimizer, None, paths, _names(policy), off)]
    if hasattr(policy, "q_net") and hasattr(policy, "q_net_target"):
        q = policy.q_net
        paths = _extractor_paths(q.features_extractor, [layers_of(q.q_net)], off)
        return [NetworkSpec("q_net", q, policy.optimizer, policy.q_net_target, paths, _names_with_prefix(q, "q_net"), off)]
    if hasattr(policy, "quantile_net") and hasattr(policy, "quantile_net_target"):
        q = policy.quantile_net
        paths = _extractor_paths(q.features_extractor, [layers_of(q.quantile_net)], off)
        names = _names_with_prefix(q, "quantile_net")
        return [NetworkSpec("quantile_net", q, policy.optimizer, policy.quantile_net_target, paths, names, off)]
    if hasattr(policy, "actor") and hasattr(policy, "critic") and hasattr(policy, "critic_target"):
        actor, critic = policy.actor, policy.critic
        shared = policy.share_features_extractor
        if hasattr(actor, "latent_pi"):  # SAC, TQC
            body = layers_of(actor.latent_pi)
            tails = [body + head_layers(actor.mu)]
            if isinstance(actor.log_std, nn.Module):
                tails.append(body + head_layers(actor.log_std))
            actor_target = None
        elif isinstance(getattr(actor, "mu", None), nn.Sequential):  # TD3, DDPG
            tails = [layers_of(actor.mu)]
            actor_target = getattr(policy, "actor_target", None)
        else:
            raise TypeError(f"sb3_plastic does not know the actor structure of {type(policy).__name__}")
        actor_paths = _extractor_paths(actor.features_extractor, tails, off)
        critic_tails = [layers_of(q_net) for q_net in critic.q_networks]
        critic_paths = critic_tails if shared else _extractor_paths(critic.features_extractor, critic_tails, off)
        return [
            NetworkSpec("actor", actor, actor.optimizer, actor_target, actor_paths, _names_with_prefix(actor, "actor"), off),
            NetworkSpec(
                "critic",
                critic,
                critic.optimizer,
                policy.critic_target,
                critic_paths,
                _names_with_prefix(critic, "critic"),
                off,
            ),
        ]
    raise TypeError(f"sb3_plastic does not know the network structure of {type(policy).__name__}")


def _names_with_prefix(module: nn.Module, prefix: str) -> dict[int, str]:
    return {id(m): f"{prefix}.{name}" if name else prefix for name, m in module.named_modules()}


def sync_target(spec: NetworkSpec) -> None:
    """Hard-copy the online network into its target (no-op without a target).

    ``load_state_dict`` copies values in place, so the target keeps its Parameter objects and the
    polyak updates of SB3 (which zip parameter lists) stay valid.
    """
    if spec.target is not None:
        own = spec.module.state_dict()
        target_keys = spec.target.state_dict().keys()
        spec.target.load_state_dict({k: v for k, v in own.items() if k in target_keys}, strict=False)


class PlasticStateStore:
    """Holder of the interventions' persistent state on a model (``model.plastic_state``).

    SB3's ``save`` writes an attribute as JSON whenever ``json.dumps`` accepts it (turning tuples into
    lists and int keys into strings) and pickles it otherwise; this class is not JSON-serialisable, so
    the state is always pickled and comes back after ``load`` with its exact types (tensors included).
    """

    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}

    def __getitem__(self, key: str) -> dict[str, Any]:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def keys(self) -> Any:
        return self.data.keys()

    def __repr__(self) -> str:
        return f"PlasticStateStore({sorted(self.data)})"


def model_state(model: BaseAlgorithm, key: str) -> dict[str, Any]:
    """The dict ``model.plastic_state.data[key]``: saved and restored with the model by SB3's
    ``save`` / ``load``, so an intervention's counters and statistics survive save -> load -> learn."""
    store = model.__dict__.get("plastic_state")
    if not isinstance(store, PlasticStateStore):
        old = store
        store = PlasticStateStore()
        if isinstance(old, dict):  # state written as a plain dict (older saves): keep it
            store.data.update(old)
        model.__dict__["plastic_state"] = store
    return store.data.setdefault(key, {})
