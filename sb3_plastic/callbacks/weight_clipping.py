"""Weight clipping (Elsayed, Lan, Lyle & Mahmood, "Weight Clipping for Deep Continual and Reinforcement Learning",
Reinforcement Learning Journal 5, 2024, https://arxiv.org/abs/2407.01704; reference code: mohmdelsayed/weight-clipping,
``core/optim/weight_clipping.py`` and, for its RL runs, ``rl_experiments/weight_clipping.py``).

After every optimizer step each weight is clamped into ``[-kappa * b, kappa * b]``, where ``b`` is the bound of PyTorch's
default (Kaiming-uniform) initialisation of its layer: ``b = 1 / sqrt(fan_in)`` for the weight of a Linear layer
(``fan_in = in_features``) or of a Conv2d layer (``in_channels * kh * kw``), and the same ``b`` for that layer's bias.
Weights cannot grow without bound, so units cannot saturate or die through ever larger weights, and a weight stays
within a few initialisation scales of where a fresh network would put it; the paper reports it keeping plasticity in
continual supervised problems and helping PPO / SAC. C-CHAIN's continual Gym-control table (Tang et al., ICML 2025)
lists it beside TRAC, L2-init and C-CHAIN.

Reference settings: ``kappa = 3`` in the RL runs (PPO on cleanRL's agent, ``weight_clipping=3.0``), every layer clipped,
the output layers included (``clip_last_layer=1``); the clamp follows the optimizer's step (Adam there), after the
gradient clipping of the step.

Deviations from the reference code:

* The reference walks the optimizer's parameter list in order and takes every 1-D tensor for the bias of the last 2-D /
  4-D tensor before it. Here the layers come from the module structure (each Linear / Conv2d layer's weight and bias,
  :meth:`~sb3_plastic.common.surgery.NetworkSpec.weight_layers`), which gives the same bounds on SB3's networks, where
  a bias follows its weight. Parameters outside those layers are not clipped: SB3's state-independent ``log_std`` of a
  continuous PPO policy (the reference, by its parameter order, clips cleanRL's ``actor_logstd``, a ``(1, d)`` tensor,
  to ``+-kappa / sqrt(d)``: a bound on the policy's standard deviation that comes from the order, not the method),
  layer-norm scales and offsets, and LSTM matrices (in no reference network).
* The reference's ``clip_last_layer=False`` skips the last two tensors of the parameter list (in cleanRL's agent the
  actor's output bias and ``actor_logstd``); here ``heads=False`` skips the output layers of every network.
* A plasticity injection's new branch (:class:`~sb3_plastic.callbacks.PlasticityInjection`) is clipped from the
  first optimizer step after it joins the optimizer, each layer with its own bound, its last layer counted as an
  output layer; the frozen old head and the branch's frozen twin are not (they no longer move).
* Only parameters an optimizer trains are clipped (target networks follow their online network by copy or Polyak
  average, which stays inside the bounds; frozen layers, e.g. a plasticity injection's, do not move).
* SB3's initialisations are not PyTorch's default: PPO / A2C initialise orthogonally (gain ``sqrt(2)`` in hidden
  layers), as cleanRL does in the reference's RL runs, so some initial weights lie outside ``kappa * b`` and are clipped
  at the first step there as here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch as th
from torch import nn

from sb3_plastic.callbacks.base import InterventionConfig, PlasticCallback, changed_fields, warn_ignored_options
from sb3_plastic.callbacks.plasticity_injection import weight_layers_with_branches
from sb3_plastic.common.hooks import OutermostStepHooks, parameter_count
from sb3_plastic.common.surgery import find_networks

#: the reference's RL value of ``kappa`` (``rl_experiments/ppo_continuous_action_clipped.py``)
DEFAULT_WEIGHT_CLIPPING_KAPPA = 3.0


def init_bound(weight: th.Tensor) -> float:
    """``1 / sqrt(fan_in)``: the bound of PyTorch's default uniform initialisation of a Linear / Conv2d layer with this
    weight (``fan_in`` = the weight's second dimension times its kernel size)."""
    if weight.dim() < 2:
        raise ValueError(f"init_bound needs a Linear / Conv weight (2 or more dimensions), got shape {tuple(weight.shape)}")
    return 1.0 / math.sqrt(weight.shape[1] * math.prod(weight.shape[2:]))


def _check_kappa(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class WeightClipping(PlasticCallback):
    """Weight clipping as an SB3 callback (Elsayed et al., 2024; see the module docstring for the bounds and every
    deviation from the reference code): after every ``optimizer.step()`` inside ``train()``, each weight and bias of the
    clipped Linear / Conv2d layers is clamped into ``[-kappa / sqrt(fan_in), kappa / sqrt(fan_in)]``. Works on PPO, A2C,
    RecurrentPPO, MaskablePPO, DQN, QR-DQN, SAC, TQC, CrossQ and TD3, plain or plastic, with any torch optimizer.

    Combined with another intervention that rewrites weights after each step (Normalize-and-Project, Continual
    Backprop, continual Shrink & Perturb) the callback later in the list has the last word; by keyword, clipping comes
    last, so its bounds hold after every step (:mod:`sb3_plastic.common.hooks`).

    Logged at each rollout end: ``plasticity/weight_clipping/at_bound`` (the fraction of the clipped entries that sit
    on their bound; ``weight_clipping_<name>`` with a ``name``). Persistent: ``steps`` (the optimizer steps followed by a
    clamp).

    :param kappa: the clipping bound in units of the initialisation bound (> 0; the reference's RL value 3).
    :param heads: clip the output layers too (the reference's default ``clip_last_layer=True``).
    :param name: distinguishes several WeightClipping callbacks on one model.
    :param verbose: SB3 verbosity.
    """

    def __init__(self, kappa: float = DEFAULT_WEIGHT_CLIPPING_KAPPA, heads: bool = True, name: Optional[str] = None,
                 verbose: int = 0) -> None:
        super().__init__(name=name, verbose=verbose)
        self.kappa = _check_kappa("kappa", kappa)
        self.heads = _check_bool("heads", heads)
        self._clipped: dict[int, list[tuple[nn.Parameter, float]]] = {}
        self._sizes: dict[int, int] = {}
        self._hooks: list[OutermostStepHooks] = []

    def clipped(self) -> list[tuple[str, nn.Parameter, float]]:
        """``(name, parameter, bound)`` of every clipped tensor, each once (see the class docstring)."""
        out: dict[int, tuple[str, nn.Parameter, float]] = {}
        for spec in self.networks:
            trained = {id(p) for o in spec.optimizers() for g in o.param_groups for p in g["params"]}
            names = {id(m): n for n, m in spec.module.named_modules()}
            for layer, is_head in weight_layers_with_branches(spec):
                if not self.heads and is_head:
                    continue
                bound = self.kappa * init_bound(layer.weight)
                name = f"{spec.name}:{spec.layer_names.get(id(layer)) or names.get(id(layer), '?')}"
                for suffix, param in (("weight", layer.weight), ("bias", layer.bias)):
                    if param is not None and param.requires_grad and id(param) in trained:
                        out.setdefault(id(param), (f"{name}.{suffix}", param, bound))
        return list(out.values())

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._remove_hooks()
        self.state.setdefault("steps", 0)
        optimizers = {id(o): o for spec in self.networks for o in spec.optimizers()}
        self._bind()
        training = lambda: bool(self.model.policy.training)  # noqa: E731  (inside SB3's train())
        self._hooks = [OutermostStepHooks(o, self._after_step, active=training) for o in optimizers.values()]

    def _bind(self) -> None:
        """Group the clipped tensors by the optimizer that trains them and remember each optimizer's parameter count,
        so that parameters added later (a plasticity injection's new branch) rebind at the next step."""
        optimizers = [o for spec in self.networks for o in spec.optimizers()]
        owner = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
        self._sizes = {id(o): parameter_count(o) for o in optimizers}
        self._clipped = {}
        for _, param, bound in self.clipped():
            self._clipped.setdefault(id(owner[id(param)]), []).append((param, bound))

    @th.no_grad()
    def _after_step(self, optimizer: th.optim.Optimizer) -> None:
        if parameter_count(optimizer) != self._sizes.get(id(optimizer)):
            self.networks = find_networks(self.model)
            self._bind()
        for param, bound in self._clipped.get(id(optimizer), []):
            param.clamp_(-bound, bound)
        self.state["steps"] = int(self.state["steps"]) + 1

    def at_bound(self) -> float:
        """The fraction of the clipped entries whose magnitude is at their bound (within float32 rounding), over the
        tensors bound at the last training start or rebinding (no walk over the networks: it runs at every rollout end)."""
        with th.no_grad():
            total = at = 0
            for pairs in self._clipped.values():
                for param, bound in pairs:
                    total += param.numel()
                    at += int((param.detach().abs() >= bound * (1 - 1e-6)).sum())
        return at / total if total else 0.0

    def _on_rollout_end(self) -> None:
        self.record(f"{self.log_group('weight_clipping')}/at_bound", self.at_bound())

    def _on_training_end(self) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for hooks in self._hooks:
            hooks.remove()
        self._hooks = []


@dataclass
class WeightClippingConfig(InterventionConfig):
    """Weight clipping as top-level keywords of the plastic algorithms (and rl_zoo3 yaml / optuna samplers); see
    :class:`WeightClipping`.

    :param weight_clipping: turn weight clipping on.
    :param weight_clipping_kappa: the bound in units of each layer's initialisation bound ``1 / sqrt(fan_in)`` (> 0;
        default 3, the reference's RL value).
    :param weight_clipping_heads: clip the output layers too (default ``True``, as the reference).

    ``weight_clipping_kappa`` / ``weight_clipping_heads`` set while ``weight_clipping`` is off warn.
    """

    weight_clipping: bool = False
    weight_clipping_kappa: float = DEFAULT_WEIGHT_CLIPPING_KAPPA
    weight_clipping_heads: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        _check_bool("weight_clipping", self.weight_clipping)
        _check_kappa("weight_clipping_kappa", self.weight_clipping_kappa)
        _check_bool("weight_clipping_heads", self.weight_clipping_heads)
        if not self.enabled:
            warn_ignored_options(changed_fields(self, ("weight_clipping_kappa", "weight_clipping_heads")),
                                 "weight_clipping is False (off)", stacklevel=4)

    @property
    def enabled(self) -> bool:
        """Whether weight clipping is on."""
        return self.weight_clipping

    def make_callback(self) -> Optional[WeightClipping]:
        """The :class:`WeightClipping` callback, or ``None`` when it is off."""
        if not self.enabled:
            return None
        return WeightClipping(self.weight_clipping_kappa, self.weight_clipping_heads)

