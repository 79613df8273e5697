"""Gradient penalties of the isometry paper's baselines: L2-init and spectral regularisation, as SB3 callbacks.

References:

* S. Kumar, H. Marklund, B. Van Roy, "Maintaining Plasticity in Continual Learning via Regenerative
  Regularization", 2023 (arXiv 2308.11958; CoLLAs 2024): *L2 Init*, the training loss plus
  ``lambda * ||theta - theta_0||_2^2`` with ``theta_0`` the parameters at time step 0, on every parameter.
* A. Lewandowski, M. Bortkiewicz, S. Kumar, A. György, D. Schuurmans, M. Ostaszewski, M. C. Machado,
  "Learning Continually by Spectral Regularization", ICLR 2025 (arXiv 2406.06811): the training loss plus
  ``lambda * sum_l (sigma_1(W_l)^k - 1)^2``, the largest singular value of each layer pulled towards 1,
  estimated by power iteration whose vectors persist across updates (as in Miyato et al.'s spectral
  normalisation).

How a penalty acts (one mechanism, :class:`GradientPenalty`). Both methods are "loss + lambda * R" with the
usual optimizer, so the penalty gradient ``lambda * grad R`` must be part of the gradient the optimizer sees,
exactly as if SB3 had differentiated ``loss + lambda * R``. SB3's ``train()`` calls ``loss.backward()``, then
``clip_grad_norm_`` (PPO, A2C, DQN, QR-DQN, RecurrentPPO, MaskablePPO), then ``optimizer.step()``. The penalty
gradient is added by a post-accumulate-grad hook on each regularised parameter
(``Tensor.register_post_accumulate_grad_hook``): it runs inside ``backward()`` once the parameter's gradient
is complete, so the penalty is **clipped together with the task gradient**, as the gradient of ``loss +
lambda * R`` would be, and Adam's (AdamO's) moments see the sum. Consequences, documented rather than hidden:

* a parameter the loss does not reach in a backward pass (its ``.grad`` stays ``None``) gets no penalty in that
  update (autograd of ``loss + lambda * R`` would give it one); every parameter of the SB3 networks is reached by
  its own loss in every update;
* the hooks act only while the policy is in training mode (``model.policy.training``: inside ``train()``),
  never for backward passes of rollouts, evaluation or diagnostics;
* a backward pass that reaches another network's parameters (SAC's actor loss flows through the critic) adds
  the penalty to a gradient SB3 then discards (``zero_grad`` before the critic's next update): no effect on the
  run, a little extra work.

The hooks are installed at training start and removed at training end; with the penalty off (coefficient 0,
the default of the plastic algorithms' keywords) no callback exists and a run is bit-identical to SB3.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import torch as th
from torch import nn
from torch.utils.hooks import RemovableHandle

from sb3_plastic.callbacks.base import PlasticCallback

#: Layer selections of :class:`SpectralRegularisation`.
SPECTRAL_LAYERS = ("all", "hidden")
#: Seed of the private generator drawing the initial power-iteration vectors (the global RNG is not touched).
POWER_ITERATION_SEED = 0


def _check_coef(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------------
class GradientPenalty(PlasticCallback):
    """Base of the penalties that act as ``loss + coef * R(theta)``: adds ``coef * grad R`` to each regularised
    parameter's gradient inside ``backward()`` (before SB3's gradient clipping; see the module docstring).

    Subclasses implement :meth:`_regularised` (the parameters, with stable names used as keys of the persistent
    state) and :meth:`_penalty_grad` (``coef * grad R`` for one parameter, from its current value).

    :param coef: ``lambda`` >= 0 (0: the callback does nothing).
    :param name: distinguishes two callbacks of the same class on one model.
    :param verbose: SB3 verbosity.
    """

    def __init__(self, coef: float, name: Optional[str] = None, verbose: int = 0) -> None:
        super().__init__(name=name, verbose=verbose)
        self.coef = _check_coef("coef", coef)
        self._handles: list[RemovableHandle] = []

    # ------------------------------------------------------------------ subclass interface
    def _regularised(self) -> Iterator[tuple[str, nn.Parameter]]:
        raise NotImplementedError

    def _penalty_grad(self, key: str, param: th.Tensor) -> Optional[th.Tensor]:
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle
    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._remove_hooks()
        self._prepare()
        if self.coef > 0:
            for key, param in self._regularised():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._make_hook(key)))

    def _prepare(self) -> None:
        """Set up the persistent state at training start (before the hooks are installed)."""

    def _on_training_end(self) -> None:
        self._remove_hooks()

    def _make_hook(self, key: str) -> Any:
        def hook(param: th.Tensor) -> None:
            if param.grad is None or not self.model.policy.training:
                return
            grad = self._penalty_grad(key, param)
            if grad is not None:
                param.grad.add_(grad.to(param.grad.dtype))

        return hook

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def named_network_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Every parameter trained by a network optimizer (each once), named ``"<network>.<parameter name>"``
        (``"policy.mlp_extractor.policy_net.0.weight"``, ``"critic.qf0.2.bias"``)."""
        seen: set[int] = set()
        for spec in self.networks:
            names = {id(p): n for n, p in spec.module.named_parameters()}
            for index, param in enumerate(spec.parameters()):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                yield f"{spec.name}.{names.get(id(param), f'param{index}')}", param


# ---------------------------------------------------------------------------------------------------
# L2-init (Kumar et al., 2023)
# ---------------------------------------------------------------------------------------------------
def l2_init_grad(param: th.Tensor, theta0: th.Tensor, coef: float) -> th.Tensor:
    """Gradient of ``coef * ||param - theta0||^2``: ``2 * coef * (param - theta0)``."""
    return (2.0 * coef) * (param.detach() - theta0.to(param.device, param.dtype))


class L2Init(GradientPenalty):
    """L2-init / regenerative regularisation (Kumar, Marklund & Van Roy, 2023, "Maintaining Plasticity in
    Continual Learning via Regenerative Regularization") as an SB3 callback for every SB3 / sb3-contrib algorithm
    (plain or plastic).

    Adds ``coef * ||theta - theta_0||_2^2`` to the loss of every network optimizer (its gradient
    ``2 * coef * (theta - theta_0)`` joins the task gradient inside ``backward()``, before SB3's gradient
    clipping: :class:`GradientPenalty`). As in the paper the penalty covers every parameter the network optimizers
    train: weights and biases of every layer (output heads included), LSTM gates, PPO's ``log_std``, CrossQ's
    BatchRenorm scale and shift. SAC's / TQC's entropy coefficient (its own optimizer) and target networks are
    not regularised.

    ``theta_0`` is a copy of the parameters taken the first time this callback starts training on the model
    (for the plastic algorithms' ``l2_init_coef`` keyword: the parameters at construction, since nothing changes
    them before the first ``learn()``). It is kept in the model's persistent state (``self.state["theta0"]``,
    saved and restored by SB3's ``save`` / ``load``), so a resumed run keeps pulling towards the same point.

    Logged: ``plasticity/l2_init/distance`` (``||theta - theta_0||_2`` at each rollout end).

    :param coef: ``lambda`` >= 0 (Kumar et al. tune it in {1e-2, 1e-3, 1e-4, 1e-5}; 0: off).
    :param name: distinguishes two L2Init callbacks on one model.
    :param verbose: SB3 verbosity.
    """

    def _prepare(self) -> None:
        theta0 = self.state.get("theta0")
        current = dict(self.named_network_parameters())
        if theta0 is None:
            self.state["theta0"] = {key: p.detach().clone() for key, p in current.items()}
            return
        for key, param in current.items():
            saved = theta0.get(key)
            if saved is None or tuple(saved.shape) != tuple(param.shape):
                raise ValueError(
                    f"L2Init: the saved initial parameters have no entry of shape {tuple(param.shape)} for {key!r} "
                    f"(saved: {None if saved is None else tuple(saved.shape)}); the model's networks changed since "
                    "theta_0 was taken. Use another callback name (name=...) to start from the current parameters"
                )

    def _regularised(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.named_network_parameters()

    def _penalty_grad(self, key: str, param: th.Tensor) -> th.Tensor:
        return l2_init_grad(param, self.state["theta0"][key], self.coef)

    def distance(self) -> float:
        """``||theta - theta_0||_2`` over every regularised parameter."""
        theta0 = self.state.get("theta0") or {}
        total = 0.0
        for key, param in self.named_network_parameters():
            if key in theta0:
                total += float((param.detach() - theta0[key].to(param.device)).double().pow(2).sum())
        return math.sqrt(total)

    def _on_rollout_end(self) -> None:
        if "theta0" in self.state:
            prefix = "l2_init" if self.name in (None, "auto") else f"l2_init_{self.name}"
            self.record(f"{prefix}/distance", self.distance())


@dataclass
class L2InitConfig:
    """L2-init settings as top-level keywords of the plastic algorithms (and rl_zoo3 / optuna).

    :param l2_init_coef: ``lambda`` >= 0 of Kumar et al.'s (2023) regenerative regularisation
        ``lambda * ||theta - theta_0||^2`` towards the initial parameters (:class:`L2Init`); 0 (the default): off.
    """

    l2_init_coef: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        self.l2_init_coef = _check_coef("l2_init_coef", self.l2_init_coef)

    @property
    def enabled(self) -> bool:
        """Whether L2-init is on."""
        return self.l2_init_coef > 0

    def make_callback(self) -> Optional[L2Init]:
        """The :class:`L2Init` callback for these settings, or ``None`` when it is off."""
        return L2Init(self.l2_init_coef) if self.enabled else None

    def to_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments."""
        return asdict(self)
