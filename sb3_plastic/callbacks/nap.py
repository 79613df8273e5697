"""Normalize-and-Project (NaP; Lyle, Zheng, Khetarpal, Martens, van Hasselt, Pascanu & Dabney, NeurIPS 2024,
"Normalization and effective learning rates in reinforcement learning", arXiv 2407.01800).

NaP has two parts, both implemented here:

1. **Normalize**: a layer normalisation before every nonlinearity. :func:`insert_layer_norms_` puts one between
   each Linear / Conv2d layer and the activation module that follows it in an ``nn.Sequential`` (SB3's MLPs,
   ``NatureCNN``, the plastic extractors): ``nn.LayerNorm(out_features)`` after a Linear layer and
   :class:`ChannelLayerNorm` (a LayerNorm over the channels at each spatial position, as the paper normalises conv
   layers) after a Conv2d layer, both with their learnable scale and offset (``elementwise_affine=True``, PyTorch's
   and the paper's standard layer norm). Output heads are not followed by a nonlinearity and get none. The plastic
   algorithms do this when the policy is built (keyword ``nap=True``, which sets the policy keyword
   ``layer_norm=True``), right after SB3's ``_build``: the new scale / offset parameters join the optimizer that
   trains the layer they follow, as a param group of their own (no isometry penalty on them), and the target
   networks get the same norms (then re-synced). ``save`` / ``load`` rebuild the networks with the norms.
   RecurrentPPO's LSTMs keep their own gates (no norm is inserted inside them).
2. **Project**: a layer followed by a normalisation is scale-invariant (``LN(c (W x + b)) = LN(W x + b)`` for
   ``c > 0``), so the growth of its parameter norm only shrinks its effective learning rate. After every optimizer
   step, :class:`NormalizeAndProject` rescales each such layer's parameters ``[W, b]`` (weight and bias together,
   the pair the normalisation is invariant to, so the network's function is unchanged up to the norm's ``eps``)
   back to their norm at initialisation: ``[W, b] <- [W, b] * ||[W_0, b_0]|| / ||[W, b]||``. The initial norms are
   taken at the first training start and saved with the model. ``project="all"`` also projects the layers that are
   not followed by a normalisation (output heads: not function-preserving, it fixes the output scale as well).
3. **Scale and offset of the norms** (``project_affine=True``, the default). A norm's gain ``gamma`` and offset
   ``beta`` are not normalised by anything, so they can grow as the weights did. When the activation after the norm
   is positively homogeneous (``phi(c z) = c phi(z)`` for ``c > 0``: ReLU, LeakyReLU, MaxMin;
   :data:`HOMOGENEOUS_ACTIVATIONS`) the unit's output ``phi(gamma * z_hat + beta)`` scales with the pair
   ``(gamma, beta)``, and the next normalised layer divides that scale out again: the pair behaves as one more
   scale-invariant parameter group, so it is projected jointly, after every optimizer step, back to its norm at the
   first training start: ``(gamma, beta) <- (gamma, beta) * ||(gamma_0, beta_0)|| / ||(gamma, beta)||`` (PyTorch's
   initial ``gamma = 1, beta = 0``: ``sqrt(width)``). This is the treatment of the RLE-Foundation/Plasticine
   re-implementation (``plasticine/standard/ppo_procgen_nap.py``, ``_project_weights``), which cites ReLU homogeneity
   for it; two slips of that code are not copied: its target is the constant ``sqrt(2)`` whatever the width (the
   initial joint norm of ``width`` ones and zeros is ``sqrt(width)``), and it finds the pair by the parameter name
   ``scale``, which PyTorch's ``nn.LayerNorm`` (``weight``) does not have, so on a PyTorch network it never acts. The
   invariance is exact only up to the next layer's bias (``LN(c W h + b) != LN(W h + b)`` for ``b != 0``) and does
   not hold for the last norm before the output heads, whose scale reaches the heads' inputs; the projection keeps
   the pair's effective learning rate constant as the weights' is. Norms before a non-homogeneous activation (Tanh:
   ``tanh(c z) != c tanh(z)``) keep their scale and offset unprojected; with no norm before a homogeneous activation
   ``project_affine`` has no effect, and a ``UserWarning`` says so.

**Effective learning rate.** For a scale-invariant layer of parameter norm ``rho`` an update of size ``eta * g`` moves
the normalised layer by ``eta / rho`` (Adam: the step is ~``eta`` per coordinate, so the effective learning rate is
``eta / rho``; plain SGD: ``eta / rho^2``). Without projection ``rho`` grows during training and the effective learning
rate decays implicitly; with NaP ``rho = ||[W_0, b_0]||`` stays fixed, so the effective learning rate of every projected
layer is the constant ``eta / ||[W_0, b_0]||`` and the schedule becomes the explicit one of ``learning_rate``. The paper
shows that in RL part of the benefit of the unprojected network came from that implicit decay, and pairs NaP with an
explicit schedule: a learning rate decaying over training (linearly in their Atari runs) and, for sequences of tasks,
re-warmed at each task boundary. :func:`nap_learning_rate_schedule` builds such a schedule in SB3's form (a function of
``progress_remaining``), linear from ``initial`` to ``final_fraction * initial`` within each of ``n_tasks`` equal
segments of the run (``n_tasks=1``: one decay over the run). It is not applied by default: ``nap=True`` keeps the
algorithm's ``learning_rate`` (constant in SB3's defaults), which NaP turns into a constant effective learning rate.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch as th
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from sb3_plastic.activations import CReLU, Fourier, MaxMin
from sb3_plastic.callbacks.base import InterventionConfig, PlasticCallback, changed_fields, warn_ignored_options
from sb3_plastic.callbacks.plasticity_injection import weight_layers_with_branches
from sb3_plastic.common.hooks import OutermostStepHooks, parameter_count
from sb3_plastic.common.surgery import find_networks

#: Layer selections of the projection.
PROJECT_CHOICES = ("normalized", "all")
#: Modules counted as a nonlinearity: a norm is inserted between a weight layer and one of these.
NONLINEARITIES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.Tanh,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    MaxMin,
    CReLU,
    Fourier,
)


class ChannelLayerNorm(nn.LayerNorm):
    """Layer normalisation over the channels of an ``(N, C, H, W)`` tensor, at each spatial position, with a
    learnable scale and offset per channel (the conv form of NaP's normalisation)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__(channels, eps=eps)

    def forward(self, x: th.Tensor) -> th.Tensor:
        return F.layer_norm(x.movedim(1, -1), self.normalized_shape, self.weight, self.bias, self.eps).movedim(-1, 1)


LAYER_NORMS: tuple[type[nn.Module], ...] = (nn.LayerNorm,)
#: Positively homogeneous activations (``phi(c z) = c phi(z)``, ``c > 0``): a norm before one of them has its scale and
#: offset projected jointly (``project_affine``).
HOMOGENEOUS_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.LeakyReLU, MaxMin)


def _sequentials(module: nn.Module) -> Iterator[nn.Sequential]:
    for child in module.modules():
        if isinstance(child, nn.Sequential):
            yield child


def insert_layer_norms_(module: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """Insert a layer normalisation between every Linear / Conv2d layer and the nonlinearity right after it, in
    every ``nn.Sequential`` inside ``module`` (in place; existing layers keep their Parameter objects). Layers already
    followed by a layer norm are left as they are (the call is idempotent).

    Only the activation modules of :data:`NONLINEARITIES` count: a layer followed by another activation module of
    ``torch.nn`` (``SELU``, ``PReLU``, ``Hardswish``, ...: a user's ``activation_fn``) gets no norm, and a
    ``UserWarning`` names those activations (a custom activation class outside ``torch.nn`` is not recognised).

    :return: ``(layer, norm)`` for every inserted norm.
    """
    inserted: list[tuple[nn.Module, nn.Module]] = []
    unknown: dict[str, None] = {}
    for seq in list(_sequentials(module)):
        children = list(seq)
        index = 0
        while index < len(children) - 1:
            layer, nxt = children[index], children[index + 1]
            if isinstance(layer, (nn.Linear, nn.Conv2d)) and _unknown_activation(nxt):
                unknown[type(nxt).__name__] = None
            if isinstance(layer, (nn.Linear, nn.Conv2d)) and isinstance(nxt, NONLINEARITIES):
                if isinstance(layer, nn.Linear):
                    norm: nn.Module = nn.LayerNorm(layer.out_features)
                else:
                    norm = ChannelLayerNorm(layer.out_channels)
                norm.to(layer.weight.device, layer.weight.dtype)
                seq.insert(index + 1, norm)
                children.insert(index + 1, norm)
                inserted.append((layer, norm))
                index += 1
            index += 1
    if unknown:
        warnings.warn(
            f"Normalize-and-Project: no layer norm inserted before {sorted(unknown)}: only activations in "
            f"sb3_plastic.callbacks.nap.NONLINEARITIES ({[t.__name__ for t in NONLINEARITIES]}) get one; add the class "
            "to NONLINEARITIES to normalise before it",
            stacklevel=2,
        )
    return inserted


def _unknown_activation(module: nn.Module) -> bool:
    """Whether ``module`` is an activation module of ``torch.nn`` that is not in :data:`NONLINEARITIES`."""
    return (
        type(module).__module__ == "torch.nn.modules.activation"
        and not isinstance(module, (*NONLINEARITIES, nn.MultiheadAttention))
    )


def normalized_layers(module: nn.Module) -> list[nn.Module]:
    """Linear / Conv2d layers of ``module`` directly followed by a layer norm in their ``nn.Sequential``."""
    found: dict[int, nn.Module] = {}
    for seq in _sequentials(module):
        children = list(seq)
        for layer, nxt in itertools.pairwise(children):
            if isinstance(layer, (nn.Linear, nn.Conv2d)) and isinstance(nxt, LAYER_NORMS):
                found[id(layer)] = layer
    return list(found.values())


def homogeneous_norms(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, norm)`` of every layer norm with a learnable scale and offset that is directly followed by a positively
    homogeneous activation (:data:`HOMOGENEOUS_ACTIVATIONS`) in its ``nn.Sequential``, ``name`` its module name in
    ``module``."""
    names = {id(m): name for name, m in module.named_modules()}
    found: dict[int, tuple[str, nn.Module]] = {}
    for seq in _sequentials(module):
        for norm, nxt in itertools.pairwise(list(seq)):
            affine = isinstance(norm, LAYER_NORMS) and norm.weight is not None and norm.bias is not None
            if affine and isinstance(nxt, HOMOGENEOUS_ACTIVATIONS):
                found[id(norm)] = (names.get(id(norm), "?"), norm)
    return list(found.values())


def add_norm_parameters_to_optimizers(
    inserted: Iterable[tuple[nn.Module, nn.Module]], optimizers: Iterable[th.optim.Optimizer]
) -> None:
    """Give each inserted norm's scale and offset to the optimizer that trains the layer it follows, as one new
    param group per optimizer (with ``isometry_coef=0`` for AdamO-style optimizers: norms are not regularised)."""
    from sb3_plastic.optim import IsometryStepMixin

    for optimizer in {id(o): o for o in optimizers}.values():
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = [p for layer, norm in inserted if id(layer.weight) in held for p in norm.parameters()]
        if not params:
            continue
        group: dict[str, Any] = {"params": params}
        if isinstance(optimizer, IsometryStepMixin):
            group["isometry_coef"] = 0.0
        optimizer.add_param_group(group)


def _layer_params(layer: nn.Module) -> list[th.Tensor]:
    return [p for p in (layer.weight, getattr(layer, "bias", None)) if p is not None]


def _norm(params: Iterable[th.Tensor]) -> th.Tensor:
    return th.sqrt(sum(p.detach().double().pow(2).sum() for p in params))


@th.no_grad()
def project_(layer: nn.Module, target_norm: float) -> None:
    """Rescale ``layer``'s weight and bias together, in place, so that ``||[W, b]|| = target_norm``."""
    params = _layer_params(layer)
    current = float(_norm(params))
    if current > 0:
        for p in params:
            p.mul_(target_norm / current)


class NormalizeAndProject(PlasticCallback):
    """The projection step of Normalize-and-Project (Lyle et al., 2024; see :mod:`sb3_plastic.callbacks.nap`) as an
    SB3 callback for every SB3 / sb3-contrib algorithm.

    After every optimizer step of a network optimizer taken in training mode (a step post-hook installed at
    training start, removed at training end), each projected layer's ``[W, b]`` is rescaled to its norm at the first
    training start: ``[W, b] <- [W, b] * ||[W_0, b_0]|| / ||[W, b]||``. Projected layers: those followed by a layer
    norm (``project="normalized"``, the default: the rescaling does not change the network's function) or every
    Linear / Conv2d layer of every online network (``project="all"``). Target networks follow their online network
    by SB3's own updates. The initial norms (``self.state["norms"]``) are saved and restored with the model.
    Layers that join an optimizer later (a plasticity injection's new branch) are projected from their first step on,
    to their norm when they joined; frozen layers are left alone. A layer another intervention rewrites in place (a
    :class:`~sb3_plastic.callbacks.LayerReset` re-draw, FIRE's polar factor, a Shrink & Perturb event) keeps its
    recorded target and is projected back to it after its next optimizer step (for a normalised layer only the
    direction of the new ``[W, b]`` matters; a reset norm's scale 1 and offset 0 have its initial joint norm).

    Combined with another intervention that rewrites weights after each step (weight clipping, Continual Backprop,
    continual Shrink & Perturb) the callback later in the list has the last word (:mod:`sb3_plastic.common.hooks`):
    by keyword, weight clipping comes after NaP, and its clamp can leave a projected layer below its recorded norm.

    The "normalize" part needs layer norms in the networks: the plastic algorithms' ``nap=True`` builds them; for a
    plain SB3 model call :func:`insert_layer_norms_` on its policy and :func:`add_norm_parameters_to_optimizers` before
    training (such a model cannot be re-loaded by SB3's ``load``, which rebuilds the policy without them). A model
    without a layer norm and ``project="normalized"`` has nothing to project: ``ValueError``.

    With ``project_affine`` (default) the scale and offset of every norm before a positively homogeneous activation are
    projected jointly to their norm at the first training start (module docstring, part 3; ``self.state["affine"]``;
    a model saved before this option existed gets PyTorch's initial ``sqrt(width)``).

    Logged at each rollout end: ``plasticity/nap/projections`` (optimizer steps projected so far; ``nap_<name>``
    with a ``name`` other than the keywords' ``"auto"``: :meth:`~.base.PlasticCallback.log_group`).

    :param project: ``"normalized"`` or ``"all"``.
    :param project_affine: also project each norm's ``(scale, offset)`` before a homogeneous activation (default).
    :param name: distinguishes two callbacks of this class on one model.
    :param verbose: SB3 verbosity.
    """

    def __init__(
        self, project: str = "normalized", project_affine: bool = True, name: Optional[str] = None, verbose: int = 0
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        _check_project("project", project)
        if not isinstance(project_affine, bool):
            raise ValueError(f"project_affine must be True or False, got {project_affine!r}")
        self.project = project
        self.project_affine = project_affine
        self._affine: dict[int, list[tuple[str, nn.Module]]] = {}
        self._warned_affine = False
        self._handles: list[RemovableHandle] = []
        self._layers: dict[int, list[tuple[str, nn.Module]]] = {}
        self._sizes: dict[int, int] = {}

    def projected_layers(self) -> list[tuple[str, nn.Module, Optional[th.optim.Optimizer]]]:
        """``(key, layer, optimizer)`` of every projected layer (frozen layers, e.g. a plasticity injection's old head
        and frozen twin, are left out: nothing moves them)."""
        out = []
        seen: set[int] = set()
        for spec in self.networks:
            if self.project == "all":
                chosen = [layer for layer, _ in weight_layers_with_branches(spec)]
            else:
                chosen = normalized_layers(spec.module)
            for layer in chosen:
                if id(layer) in seen or not any(p.requires_grad for p in _layer_params(layer)):
                    continue
                seen.add(id(layer))
                name = spec.layer_names.get(id(layer), "?")
                key = name if name.startswith(f"{spec.name}.") else f"{spec.name}.{name}"
                out.append((key, layer, spec.optimizer))
        return out

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._remove_hooks()
        resumed = "norms" in self.state
        self.state.setdefault("norms", {})
        self.state.setdefault("projections", 0)
        if not self._bind(resumed):
            raise ValueError(
                "NormalizeAndProject(project='normalized') found no layer followed by a layer norm: build the model "
                "with nap=True (plastic algorithms) or insert_layer_norms_(model.policy), or use project='all'"
            )
        training = lambda: bool(self.model.policy.training)  # noqa: E731  (inside SB3's train())
        optimizers = {id(o): o for spec in self.networks for o in spec.optimizers()}
        for optimizer in optimizers.values():
            self._handles += OutermostStepHooks(optimizer, self._after_step, before=self._before_step,
                                                active=training).handles

    def _bind(self, resumed: bool) -> int:
        """Group the projected layers and norms by the optimizer that trains them, record the target norm of each one
        not seen before (its norm now: before its first step), and remember each optimizer's parameter count, so that
        parameters added later (a plasticity injection's new branch) are bound before their first step. Returns how
        many layers are projected."""
        norms = self.state["norms"]
        self._bind_affine(resumed)
        self._layers = {}
        layers = self.projected_layers()
        for key, layer, optimizer in layers:
            norms.setdefault(key, float(_norm(_layer_params(layer))))
            if optimizer is not None:
                self._layers.setdefault(id(optimizer), []).append((key, layer))
        self._sizes = {id(o): parameter_count(o) for spec in self.networks for o in spec.optimizers()}
        return len(layers)

    def _before_step(self, optimizer: th.optim.Optimizer) -> None:
        if parameter_count(optimizer) != self._sizes.get(id(optimizer)):
            self.networks = find_networks(self.model)
            self._bind(resumed=False)

    def _bind_affine(self, resumed: bool) -> None:
        """The norms whose (scale, offset) are projected, per optimizer holding them, and their target norms."""
        self._affine = {}
        if not self.project_affine:
            return
        targets = self.state.setdefault("affine", {})
        found = 0
        for spec in self.networks:
            held = {id(p): o for o in spec.optimizers() for g in o.param_groups for p in g["params"]}
            for name, norm in homogeneous_norms(spec.module):
                optimizer = held.get(id(norm.weight))
                if optimizer is None:
                    continue
                key = f"{spec.name}.{name}"
                if key not in targets:  # a model saved before the option existed: PyTorch's initial 1 / 0
                    initial = math.sqrt(norm.weight.numel()) if resumed else float(_norm(_layer_params(norm)))
                    targets[key] = initial
                self._affine.setdefault(id(optimizer), []).append((key, norm))
                found += 1
        if not found and not self._warned_affine:
            self._warned_affine = True
            warnings.warn(
                "NormalizeAndProject(project_affine=True) has no effect: no layer norm is followed by a positively "
                f"homogeneous activation ({[t.__name__ for t in HOMOGENEOUS_ACTIVATIONS]}); scale and offset are "
                "projected only there (sb3_plastic.callbacks.nap)",
                stacklevel=4,
            )

    def _after_step(self, optimizer: th.optim.Optimizer) -> None:
        if id(optimizer) not in self._layers and id(optimizer) not in self._affine:
            return
        norms = self.state["norms"]
        for key, layer in self._layers.get(id(optimizer), []):
            project_(layer, norms[key])
        for key, norm in self._affine.get(id(optimizer), []):
            project_(norm, self.state["affine"][key])
        self.state["projections"] = int(self.state.get("projections", 0)) + 1

    def _on_training_end(self) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_rollout_end(self) -> None:
        prefix = self.log_group("nap")
        self.record(f"{prefix}/projections", int(self.state.get("projections", 0)))


def nap_learning_rate_schedule(initial: float, final_fraction: float = 0.0, n_tasks: int = 1) -> Callable[[float], float]:
    """The explicit learning-rate schedule NaP is paired with in the paper (see the module docstring), in SB3's form
    ``progress_remaining -> learning rate``: within each of ``n_tasks`` equal segments of the run, linear from
    ``initial`` down to ``final_fraction * initial``, re-warmed to ``initial`` at each segment start.

    :param initial: learning rate at the start of each segment (> 0).
    :param final_fraction: fraction of ``initial`` reached at the end of each segment, in [0, 1].
    :param n_tasks: number of segments (tasks of equal length; 1: one decay over the whole run).
    :raises ValueError: for values outside those ranges.
    """
    if isinstance(initial, bool) or not isinstance(initial, (int, float)) or not initial > 0:
        raise ValueError(f"initial must be a number > 0, got {initial!r}")
    if isinstance(final_fraction, bool) or not isinstance(final_fraction, (int, float)) or not 0 <= final_fraction <= 1:
        raise ValueError(f"final_fraction must be in [0, 1], got {final_fraction!r}")
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, int) or n_tasks < 1:
        raise ValueError(f"n_tasks must be an integer >= 1, got {n_tasks!r}")

    def schedule(progress_remaining: float) -> float:
        elapsed = min(max(1.0 - float(progress_remaining), 0.0), 1.0) * n_tasks
        within = 1.0 if elapsed >= n_tasks else elapsed - int(elapsed)
        return float(initial) * (1.0 - (1.0 - float(final_fraction)) * within)

    return schedule


def _check_project(name: str, value: Any, choices: tuple[str, ...] = PROJECT_CHOICES) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {list(choices)}")


#: ``nap_project`` of the keyword form: the callback's choices, or ``"none"`` (the layer norms alone).
CONFIG_PROJECT_CHOICES = (*PROJECT_CHOICES, "none")


@dataclass
class NaPConfig(InterventionConfig):
    """Normalize-and-Project settings as top-level keywords of the plastic algorithms (and rl_zoo3 / optuna).

    :param nap: Lyle et al.'s (2024) Normalize-and-Project: layer norms before every nonlinearity of the policy's
        networks (built with the networks, :func:`insert_layer_norms_`) and, after every optimizer step, each
        normalised layer's ``[W, b]`` projected back to its initial norm (:class:`NormalizeAndProject`). ``False``
        (the default): off.
    :param nap_project: ``"normalized"`` (project the layers followed by a layer norm), ``"all"`` (every
        Linear / Conv2d layer, output heads included) or ``"none"``: no projection, the layer norms alone ("LayerNorm"
        of the plasticity benchmarks, e.g. Plasticine's ``*_ln.py``; there the norms sit after the activations of its
        residual blocks, here between each layer and its activation, where NaP puts them).
    :param nap_project_affine: also project the scale and offset of every layer norm before a positively homogeneous
        activation (ReLU, LeakyReLU, MaxMin) jointly to their initial norm (default; :mod:`sb3_plastic.callbacks.nap`
        says what and why).
    """

    nap: bool = False
    nap_project: str = "normalized"
    nap_project_affine: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        if not isinstance(self.nap, bool):
            raise ValueError(f"nap must be True or False, got {self.nap!r}")
        _check_project("nap_project", self.nap_project, CONFIG_PROJECT_CHOICES)
        if not isinstance(self.nap_project_affine, bool):
            raise ValueError(f"nap_project_affine must be True or False, got {self.nap_project_affine!r}")
        if not self.nap:
            warn_ignored_options(
                changed_fields(self, ("nap_project", "nap_project_affine")), "nap=False (NaP is off); set nap=True", 4
            )

    @property
    def enabled(self) -> bool:
        """Whether NaP is on."""
        return self.nap

    def make_callback(self) -> Optional[NormalizeAndProject]:
        """The :class:`NormalizeAndProject` callback for these settings, or ``None`` when NaP is off or
        ``nap_project="none"`` (the layer norms alone: they are part of the networks, nothing runs during training)."""
        if not self.enabled or self.nap_project == "none":
            return None
        return NormalizeAndProject(self.nap_project, self.nap_project_affine)

