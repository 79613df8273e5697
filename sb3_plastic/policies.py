"""Plastic policies: SB3's PPO / DQN / SAC policies with a selectable activation, orthogonal
initialisation and AdamO with the output heads kept out of the isometry penalty (sb3-contrib's policies:
:mod:`sb3_plastic.contrib_policies`, :mod:`sb3_plastic.recurrent_policies`; a user's own policy class:
:mod:`sb3_plastic.common.user_policy`).

One mixin, :class:`PlasticPolicyMixin`, does the work for every policy; each concrete class only says
which modules are output heads, which optimizers it owns and which target networks mirror which
online networks. Reference: Rosseau, Müller & Nowé (2026), "Preserving Plasticity in Continual
Learning via Dynamical Isometry".
"""

from __future__ import annotations

import fnmatch
import inspect
import math
from typing import Any, Optional, Union

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import get_device
from stable_baselines3.dqn.policies import DQNPolicy
from stable_baselines3.sac.policies import SACPolicy
from torch import nn

from sb3_plastic.activations import get_activation
from sb3_plastic.common.surgery import head_layers
from sb3_plastic.config import AUTO, EQUAL_BETA, ISOMETRY_KEYS, IsometryConfig
from sb3_plastic.isometry import WEIGHT_LAYERS, orthogonal_init_
from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor, check_even_widths, halve_for_doubling_
from sb3_plastic.optim import AdamO, IsometryStepMixin, with_isometry_step

_PLASTIC_EXTRACTORS = ("PlasticCNN", "PlasticMLP", "PlasticCombinedExtractor")


def _arch_widths(net_arch: Any) -> dict[str, int]:
    """All hidden widths named in an SB3 ``net_arch`` (list, or dict of lists; SB3's old style
    ``[dict(pi=..., vf=...)]``, which SB3 still converts with a warning, counts as its dict)."""
    if net_arch is None:
        return {}
    if isinstance(net_arch, (list, tuple)) and len(net_arch) > 0 and isinstance(net_arch[0], dict):
        net_arch = net_arch[0]  # SB3 itself converts it (and warns) when it builds the networks
    if isinstance(net_arch, dict):
        return {f"{key}[{i}]": int(w) for key, arch in net_arch.items() for i, w in enumerate(arch)}
    return {f"net_arch[{i}]": int(w) for i, w in enumerate(net_arch)}


class PlasticPolicyMixin:
    """Adds the isometry keywords of :class:`sb3_plastic.IsometryConfig` to an SB3 policy.

    Resolution happens before SB3 builds the networks: ``activation`` becomes ``activation_fn`` (and the
    plastic feature extractor's activation), ``optimizer`` / ``isometry_*`` become ``optimizer_class`` /
    ``optimizer_kwargs``. After SB3's ``_build`` (including its ``ortho_init``) the mixin applies the
    orthogonal initialisation, re-syncs target networks and rebuilds each AdamO with two param groups:
    regularised weights and the rest (``isometry_coef=0``).
    """

    #: default ``features_extractor_class`` of the concrete policy (None: SB3's default)
    _plastic_default_extractor: Optional[type] = None
    #: Adam epsilon SB3 uses for this policy family when the user gives no optimizer_kwargs (PPO: 1e-5)
    _plastic_adam_eps: Optional[float] = None
    #: SB3 puts no MLP layer after its NatureCNN in this policy family (PPO, DQN; not SAC)
    _plastic_cnn_no_mlp: bool = False
    #: built on a user's own policy class (:mod:`sb3_plastic.common.user_policy`): ``activation=None`` leaves its
    #: ``activation_fn`` alone
    _plastic_user_policy: bool = False

    isometry_config: IsometryConfig

    def __init__(
        self,
        *args: Any,
        activation: Optional[str] = None,
        isometry_coef: float = 0.02,
        isometry_scale: float = 1.0,
        isometry_rect_scale: bool = False,
        isometry_normalize: bool = False,
        isometry_free_scale: bool = False,
        isometry_side: str = "both",
        isometry_mode: str = "decoupled",
        isometry_layers: Union[str, list[str]] = "hidden",
        isometry_interval: int = 1,
        optimizer: str = "adamo",
        orthogonal_init: Optional[bool] = None,
        layer_norm: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(layer_norm, bool):
            raise ValueError(f"layer_norm must be True or False, got {layer_norm!r}")
        #: NaP's layer norms before every nonlinearity (:func:`sb3_plastic.callbacks.nap.insert_layer_norms_`)
        self.plastic_layer_norm = layer_norm
        config = IsometryConfig(
            activation=activation,
            isometry_coef=isometry_coef,
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
        self._plastic_user_kwargs = {k: kwargs[k] for k in ("optimizer_class", "optimizer_kwargs") if k in kwargs}
        kwargs = self._resolve_plastic_kwargs(config, kwargs)
        self.isometry_config = config
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ construction
    def _resolve_plastic_kwargs(self, config: IsometryConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(kwargs)
        user_fn = kwargs.get("activation_fn")
        if config.activation is None:
            # SB3's own activation for every part of the network: the policy family's MLP default (Tanh for
            # PPO-style actor-critics, ReLU for DQN / SAC style) or the user's activation_fn, and SB3's NatureCNN
            # (always ReLU) for images. SB3 only calls activation_fn(): any callable that builds a module (a class,
            # functools.partial(nn.LeakyReLU, 0.2), ...) is kept as given; a name is resolved
            if user_fn is None:
                act = self.sb3_default_activation()
            else:
                act = get_activation(user_fn) if isinstance(user_fn, str) else user_fn
            cnn_act: type[nn.Module] = nn.ReLU
        else:
            act = cnn_act = get_activation(config.activation)
            if user_fn is not None and user_fn is not act:
                raise ValueError(
                    f"activation={config.activation!r} conflicts with policy_kwargs activation_fn={user_fn!r}; "
                    "set only one of them"
                )
        if config.activation is not None or not self._plastic_user_policy:
            kwargs["activation_fn"] = act
        check_even_widths(act, _arch_widths(kwargs.get("net_arch")))
        if self._plastic_default_extractor is not None:
            kwargs.setdefault("features_extractor_class", self._plastic_default_extractor)
        extractor = kwargs.get("features_extractor_class")
        if self._plastic_cnn_no_mlp and kwargs.get("net_arch") is None and extractor is PlasticCNN:
            kwargs["net_arch"] = []
        name = getattr(extractor, "__name__", "")
        if extractor is not None and name in _PLASTIC_EXTRACTORS:
            fe_kwargs = dict(kwargs.get("features_extractor_kwargs") or {})
            fe_kwargs.setdefault("activation", act if name == "PlasticMLP" else cnn_act)
            if name != "PlasticMLP" and kwargs.get("normalize_images", True) is False:
                fe_kwargs["normalized_image"] = True  # what SB3 does for its NatureCNN / CombinedExtractor
            kwargs["features_extractor_kwargs"] = fe_kwargs

        user_class = kwargs.get("optimizer_class")
        user_opt_kwargs = dict(kwargs.get("optimizer_kwargs") or {})
        if config.optimizer == "adam_equal_betas":
            if user_class is not None:
                raise ValueError(
                    f"optimizer='adam_equal_betas' builds torch Adam with beta1 = beta2 and conflicts with policy_kwargs "
                    f"optimizer_class={getattr(user_class, '__name__', user_class)}; pass betas=(b, b) in "
                    "optimizer_kwargs with optimizer='adam' (isometry_mode 'coupled' or 'off') or optimizer='adamo' instead"
                )
            betas = tuple(user_opt_kwargs.get("betas", (EQUAL_BETA, EQUAL_BETA)))
            if len(betas) != 2 or betas[0] != betas[1]:
                raise ValueError(f"optimizer='adam_equal_betas' needs beta1 == beta2, got optimizer_kwargs betas={betas}")
            user_opt_kwargs["betas"] = betas
        if self._plastic_adam_eps is not None and kwargs.get("optimizer_kwargs") is None:
            if user_class is None or user_class in (th.optim.Adam, AdamO):
                user_opt_kwargs.setdefault("eps", self._plastic_adam_eps)  # what SB3 does for this policy's Adam
        use_adamo = config.optimizer == "adamo" or config.isometry_mode == "coupled"
        if config.isometry_interval == AUTO:
            raise ValueError(
                f"isometry_interval='auto' is resolved from the algorithm's batch_size by the plastic algorithms; "
                f"{type(self).__name__} built directly needs an int >= 1 (1: the exact AdamO step)"
            )
        # every isometry setting of the optimizer, in one place for every optimizer that carries the step
        isometry_kwargs = dict(
            isometry_coef=float(config.isometry_coef) if config.isometry_mode != "off" else 0.0,
            isometry_scale=float(config.isometry_scale),
            isometry_mode="coupled" if config.isometry_mode == "coupled" else "decoupled",
            isometry_interval=int(config.isometry_interval),
            isometry_rect_scale=config.isometry_rect_scale,
            isometry_normalize=config.isometry_normalize,
            isometry_free_scale=config.isometry_free_scale,
            isometry_side=config.isometry_side,
        )
        if config.optimizer == "trac":  # TRAC (Muppidi et al., 2024) around the base optimizer, as its reference
            from sb3_plastic.trac import trac_class

            base = user_class if user_class is not None else AdamO if use_adamo else th.optim.Adam
            if use_adamo:  # the coupled penalty (TRAC refuses the decoupled step: IsometryConfig)
                base = with_isometry_step(base)
                user_opt_kwargs.update(isometry_kwargs)
            kwargs["optimizer_class"] = trac_class(base)
            kwargs["optimizer_kwargs"] = user_opt_kwargs
            return kwargs
        if user_class is not None and not use_adamo:
            return kwargs  # plasticity off: the user's optimizer exactly as SB3 would build it
        if use_adamo:
            user_opt_kwargs.update(isometry_kwargs)
            # a user's optimizer_class keeps its own update and gets AdamO's isometry step on top of it
            kwargs["optimizer_class"] = AdamO if user_class is None else with_isometry_step(user_class)
        else:
            kwargs["optimizer_class"] = th.optim.Adam
        kwargs["optimizer_kwargs"] = user_opt_kwargs
        return kwargs

    def sb3_default_activation(self) -> type[nn.Module]:
        """The default ``activation_fn`` of the SB3 / sb3-contrib policy class this plastic policy extends
        (``nn.Tanh`` for ``ActorCriticPolicy`` and its maskable / recurrent versions, ``nn.ReLU`` for the DQN,
        QR-DQN, SAC, TQC and CrossQ policies): what ``activation=None`` uses for the MLP layers."""
        for cls in type(self).__mro__:
            if issubclass(cls, PlasticPolicyMixin) or cls is object:
                continue
            parameter = inspect.signature(cls.__init__).parameters.get("activation_fn")
            if parameter is not None and parameter.default is not inspect.Parameter.empty:
                return parameter.default
        return nn.ReLU

    def _build(self, lr_schedule: Schedule) -> None:
        super()._build(lr_schedule)  # type: ignore[misc]
        self._plastic_halve_for_doubling()
        self._plastic_insert_layer_norms()
        if self.isometry_config.use_orthogonal_init:
            self._plastic_orthogonal_init()
        self._plastic_regroup_optimizers()

    def _plastic_halve_for_doubling(self) -> None:
        """With a width-doubling activation (``activation="crelu"`` / ``"fourier"``), every layer before one keeps half
        its units (:func:`sb3_plastic.networks.halve_for_doubling_`); the optimizers get the new parameters in place of
        the old ones (they hold no state yet) and the targets are synced."""
        mapping = halve_for_doubling_(self)  # type: ignore[arg-type]
        if not mapping:
            return
        for owner, attr in self.plastic_optimizers():
            optimizer = getattr(owner, attr, None)
            if optimizer is None:
                continue
            for group in optimizer.param_groups:
                group["params"] = [mapping.get(p, p) for p in group["params"]]
        self.sync_targets()

    def _plastic_insert_layer_norms(self) -> None:
        """With ``layer_norm=True`` (NaP, Lyle et al., 2024): a layer norm between every hidden layer and its
        activation, online and target networks alike, its parameters added to the optimizer of the layer it follows
        (:mod:`sb3_plastic.callbacks.nap`)."""
        if not self.plastic_layer_norm:
            return
        from sb3_plastic.callbacks.nap import add_norm_parameters_to_optimizers, insert_layer_norms_

        inserted = insert_layer_norms_(self)  # type: ignore[arg-type]
        optimizers = [getattr(owner, attr, None) for owner, attr in self.plastic_optimizers()]
        add_norm_parameters_to_optimizers(inserted, [o for o in optimizers if o is not None])
        self.sync_targets()

    # ------------------------------------------------------------------ per-policy hooks
    def plastic_heads(self) -> list[nn.Module]:
        """Output layers (action logits / mean, log_std, value, Q-values): excluded from the penalty."""
        raise NotImplementedError

    def plastic_optimizers(self) -> list[tuple[Any, str]]:
        """``(owner, attribute)`` of every optimizer the policy owns."""
        return [(self, "optimizer")]

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(target, online)`` pairs of target networks (copies, never optimised)."""
        return []

    def _plastic_head_gain(self, head: nn.Module) -> float:
        return 1.0

    def plastic_isometry_blocks(self) -> dict[int, int]:
        """``id(parameter) -> k`` for weights made of ``k`` stacked matrices that the isometry penalty treats
        one by one (an LSTM's gate blocks: 4); weights not listed are one matrix. AdamO gets them in their own
        param group with ``isometry_blocks=k``."""
        return {}

    # ------------------------------------------------------------------ plastic steps
    def sync_targets(self) -> None:
        """Copy every online network into its target network (hard update)."""
        for target, online in self.plastic_targets():
            target.load_state_dict(online.state_dict())

    def _plastic_orthogonal_init(self) -> None:
        heads = {id(m) for m in self.plastic_heads()}
        in_targets = {id(m) for target, _ in self.plastic_targets() for m in target.modules()}
        gain = math.sqrt(self.isometry_config.isometry_scale)
        for module in self.modules():  # type: ignore[attr-defined]
            if isinstance(module, WEIGHT_LAYERS) and id(module) not in in_targets:
                orthogonal_init_(module, self._plastic_head_gain(module) if id(module) in heads else gain)
        self.sync_targets()

    def regularised_parameters(self) -> list[nn.Parameter]:
        """The parameters the isometry penalty acts on, per ``isometry_layers``."""
        layers = self.isometry_config.isometry_layers
        named = list(self.named_parameters())  # type: ignore[attr-defined]
        if layers == "all":
            return [p for _, p in named if p.dim() >= 2]
        if layers == "hidden":  # an injected branch's output layer is a head too
            from sb3_plastic.callbacks.plasticity_injection import branch_output_layers

            heads = {id(m) for m in [*self.plastic_heads(), *branch_output_layers(self)]}  # type: ignore[arg-type]
            hidden = {
                id(m.weight)
                for m in self.modules()  # type: ignore[attr-defined]
                if isinstance(m, WEIGHT_LAYERS) and id(m) not in heads
            }
            return [p for _, p in named if id(p) in hidden]
        chosen = [p for name, p in named if p.dim() >= 2 and any(fnmatch.fnmatchcase(name, pat) for pat in layers)]
        if not chosen:
            matched = [name for name, _ in named if any(fnmatch.fnmatchcase(name, pat) for pat in layers)]
            matrices = [name for name, p in named if p.dim() >= 2]
            why = (
                f"they match only {matched[:6]}, which are not weight matrices (biases, normalisation scales / shifts)"
                if matched
                else "they match no parameter name"
            )
            raise ValueError(
                f"isometry_layers={list(layers)!r} selects no weight matrix of {type(self).__name__}: {why}; "
                f"weight matrices: {matrices[:8]}{' ...' if len(matrices) > 8 else ''}"
            )
        return chosen

    def _plastic_regroup_optimizers(self) -> None:
        optimizer_class = self.optimizer_class  # type: ignore[attr-defined]
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, IsometryStepMixin)):
            return
        regularised = {id(p) for p in self.regularised_parameters()}
        for owner, attr in self.plastic_optimizers():
            old: th.optim.Optimizer = getattr(owner, attr)
            params = [p for group in old.param_groups for p in group["params"]]
            blocks = self.plastic_isometry_blocks()
            stacked = {id(p) for p in params if id(p) in regularised and blocks.get(id(p), 1) > 1}
            groups = [
                {"params": [p for p in params if id(p) in regularised and id(p) not in stacked]},
                *(
                    {"params": [p for p in params if id(p) in stacked and blocks[id(p)] == k], "isometry_blocks": k}
                    for k in sorted({blocks[i] for i in stacked})
                ),
                {"params": [p for p in params if id(p) not in regularised], "isometry_coef": 0.0},
            ]
            groups = [g for g in groups if g["params"]]
            optimizer = optimizer_class(groups, lr=old.param_groups[0]["lr"], **self.optimizer_kwargs)  # type: ignore[attr-defined]
            optimizer.flat_param_order = params  # SB3's order: a one-group SB3 checkpoint loads into these groups
            setattr(owner, attr, optimizer)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        """What ``policy.save`` writes to rebuild the policy: SB3's constructor parameters with the plastic keywords.
        With plasticity off (``isometry_mode="off", optimizer="adam"``, ``activation=None``, no orthogonal
        initialisation, no layer norms) they are SB3's own, so the SB3 / sb3-contrib policy class loads the file as it
        loads its own (``MlpPolicy.load``) and :meth:`load` reads it back with plasticity off."""
        data = super()._get_constructor_parameters()  # type: ignore[misc]
        config = self.isometry_config
        if (
            config.isometry_mode == "off"
            and config.optimizer == "adam"
            and config.activation is None
            and not config.use_orthogonal_init
            and not self.plastic_layer_norm
        ):
            return data
        for key in ("optimizer_class", "optimizer_kwargs"):
            if key in self._plastic_user_kwargs:
                data[key] = self._plastic_user_kwargs[key]
            else:
                data.pop(key, None)
        data.update(self.isometry_config.to_kwargs())
        if self.plastic_layer_norm:
            data["layer_norm"] = True
        return data

    @classmethod
    def load(cls, path: str, device: Union[th.device, str] = "auto") -> Any:
        """SB3's ``load`` of a file written by ``policy.save``. A file without the plastic keywords (written by the SB3
        / sb3-contrib policy class, or by a plastic policy with plasticity off, :meth:`_get_constructor_parameters`)
        loads with plasticity off, ``isometry_mode="off", optimizer="adam"``: SB3's networks and optimizer, as the
        plastic algorithms' ``load`` of an SB3 zip.

        :param path: the file.
        :param device: device on which the policy is loaded.
        :return: the policy.
        """
        device = get_device(device)
        saved = th.load(path, map_location=device, weights_only=False)  # as SB3: gymnasium spaces are pickled
        data = saved["data"]
        if not set(ISOMETRY_KEYS) & set(data):
            data = {**data, "isometry_mode": "off", "optimizer": "adam"}
        model = cls(**data)
        model.load_state_dict(saved["state_dict"])
        model.to(device)
        return model


class PlasticActorCriticPolicy(PlasticPolicyMixin, ActorCriticPolicy):
    """SB3's ``ActorCriticPolicy`` (PPO, A2C) with the isometry keywords of :class:`IsometryConfig`.

    Heads: ``action_net`` and ``value_net`` (and the ``log_std`` vector). Under orthogonal init the heads
    keep SB3's gains (0.01 for the action head, 1 for the value head).
    """

    _plastic_adam_eps = 1e-5
    _plastic_cnn_no_mlp = True

    def plastic_heads(self) -> list[nn.Module]:
        return [self.action_net, self.value_net]

    def _plastic_head_gain(self, head: nn.Module) -> float:
        return 0.01 if head is self.action_net else 1.0


class PlasticActorCriticCnnPolicy(PlasticActorCriticPolicy):
    """:class:`PlasticActorCriticPolicy` with :class:`sb3_plastic.networks.PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticMultiInputActorCriticPolicy(PlasticActorCriticPolicy):
    """:class:`PlasticActorCriticPolicy` for ``Dict`` observations (:class:`PlasticCombinedExtractor`)."""

    _plastic_default_extractor = PlasticCombinedExtractor


class PlasticDQNPolicy(PlasticPolicyMixin, DQNPolicy):
    """SB3's ``DQNPolicy`` with the isometry keywords. Head: the last Linear of the Q-network."""

    _plastic_cnn_no_mlp = True

    def plastic_heads(self) -> list[nn.Module]:
        return [self.q_net.q_net[-1]]

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.q_net_target, self.q_net)]


class PlasticDQNCnnPolicy(PlasticDQNPolicy):
    """:class:`PlasticDQNPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticDQNMultiInputPolicy(PlasticDQNPolicy):
    """:class:`PlasticDQNPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor


class PlasticActorQCriticMixin(PlasticPolicyMixin):
    """The plastic structure of SAC-style policies (SAC, sb3-contrib's TQC): an actor and Q critics.

    Heads: the actor's ``mu`` Linear (inside ``Sequential(Linear, Hardtanh)`` under gSDE), its ``log_std``
    Linear (without gSDE) and the last Linear of every critic network. Actor and critic each have an
    optimizer; the critic target mirrors the critic. The entropy-coefficient optimizer belongs to the
    algorithm and stays SB3's Adam.
    """

    def plastic_heads(self) -> list[nn.Module]:
        heads: list[nn.Module] = head_layers(self.actor.mu)
        if isinstance(self.actor.log_std, nn.Module):
            heads += head_layers(self.actor.log_std)
        heads += [q_net[-1] for q_net in self.critic.q_networks]
        return heads

    def plastic_optimizers(self) -> list[tuple[Any, str]]:
        return [(self.actor, "optimizer"), (self.critic, "optimizer")]

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.critic_target, self.critic)]


class PlasticSACPolicy(PlasticActorQCriticMixin, SACPolicy):
    """SB3's ``SACPolicy`` with the isometry keywords; actor and critic each get an AdamO
    (heads and targets: :class:`PlasticActorQCriticMixin`)."""


class PlasticSACCnnPolicy(PlasticSACPolicy):
    """:class:`PlasticSACPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticSACMultiInputPolicy(PlasticSACPolicy):
    """:class:`PlasticSACPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor
