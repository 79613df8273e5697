"""Plasticity diagnostics: functions of a network and a probe batch, or of tensors.

Every function here is read-only: it never changes parameters, optimizer state or ``.grad`` (the
gradient-based ones use :mod:`torch.func`, which returns gradients instead of accumulating them).

Definitions (``h``: post-activation features of a layer on a probe batch of ``N`` inputs, viewed as a
matrix ``(N, F)`` with ``F = C*H*W`` for a conv layer; ``sigma_i``: its singular values, largest first):

* **dormant fraction** (Sokar et al., 2023, "The Dormant Neuron Phenomenon in Deep Reinforcement
  Learning", ICML): fraction of units whose ReDo score ``mean|h_i| / mean_j mean|h_j|`` is ``<= tau``
  (:func:`sb3_plastic.callbacks.redo.dormant_units`; a MaxMin pair is one unit, dormant if both features are).
* **zero fraction**: fraction of units that output exactly 0 for every probe input (and every spatial
  position): "dead" units in the sense of Dohare et al., 2024 ("Loss of plasticity in deep continual
  learning", Nature). A MaxMin pair is dead if both of its features are.
* **srank** (Kumar, Agarwal, Ghosh & Levine, 2021, "Implicit Under-Parameterization Inhibits
  Data-Efficient Deep Reinforcement Learning", ICLR): ``min{k : sum_{i<=k} sigma_i >= (1 - delta) sum_i sigma_i}``
  with ``delta = 0.01``; 0 for an all-zero matrix.
* **effective rank** (Roy & Vetterli, 2007, "The effective rank: a measure of effective
  dimensionality", EUSIPCO): ``exp(H(p))`` with ``p_i = sigma_i / sum_j sigma_j`` and ``H`` the Shannon
  entropy (``0 log 0 = 0``); 0 for an all-zero matrix.
* **feature norm**: mean over the batch of the Euclidean norm of a sample's features, ``mean_n ||h_n||``
  (Lyle et al., 2024, "Disentangling the Causes of Plasticity Loss in Neural Networks").
* **feature variance**: mean over the batch of the variance of a sample's features across its ``F`` units,
  ``mean_n var_i h_{n,i}`` (unbiased, ``F - 1`` in the denominator; 0 for a single unit): Plasticine's definition
  ("Plasticine: Accelerating Research in Plasticity-Motivated Deep Reinforcement Learning", arXiv 2504.17490;
  RLE-Foundation/Plasticine ``plasticine/metrics.py``). It shrinks towards 0 as a layer's units collapse onto one
  value (dead ReLUs, a saturated tanh) and grows with the feature norm, so read it beside ``feature_norm``.
* **weight norm**: Frobenius norm ``||W||_F`` of a layer's weight; for a whole network, the Euclidean norm
  of all its trained parameters (weights and biases).
* **distance from initialisation**: ``||W - W_0||_F`` per layer, ``||theta - theta_0||`` per network.
* **DfI** (deviation from isometry, FIRE, arXiv 2602.08040): ``||W^T W - I||_F^2`` (tall) or
  ``||W W^T - I||_F^2`` (wide), ``s I`` in place of ``I`` for a target scale ``s`` (``dfi_scale``; the monitor passes
  the model's ``isometry_scale``), :func:`sb3_plastic.isometry.deviation_from_isometry` (one definition: the smaller
  Gram matrix): twice the isometry penalty ``R(W) = 1/2 ||Gram - s I||_F^2`` of the authors' convention (issue #27;
  DfI kept its definition without the 1/2 and without ``isometry_rect_scale``, so the logged ``dfi`` keys mean what
  they meant before). The scale-free DfI (``dfi_free`` keys) replaces ``s`` by each layer's mean squared singular
  value, ``sum_i (sigma_i^2 - mean_j sigma_j^2)^2``: the part of the DfI that a uniform growth or shrinkage of the
  weights does not change. The DfI split at its target (``dfi_floor`` / ``dfi_ceiling`` keys,
  :func:`sb3_plastic.isometry.deviation_from_isometry_sides`): ``sum (sigma_i^2 - s)^2`` over the singular values
  below ``sqrt(s)`` and over those above; the two add up to the DfI and are twice the penalties of
  ``isometry_side="floor"`` / ``"ceiling"``, so they show which side of the target a layer drifted to and whether a
  one-sided penalty acts at all (a floor-only penalty does nothing while ``dfi_floor`` is 0; the thirty-ninth
  session's single-task runs found plain PPO's feature layer never below the target). FIRE's reference writes
  ``||W^T W - I||_F^2`` for
  every shape, which for a wide ``W`` is this value plus the constant ``in - out``; why the smaller one: the
  :mod:`sb3_plastic.isometry` module docstring.
* **sigma_max, sigma_min, condition number** of a layer's weight (matrix view ``(out, in*k*k)`` of a
  conv kernel): the largest and smallest of its ``min(out, in)`` singular values and their ratio
  (capped at ``COND_CAP = 1e14``, the float32 round-off level, which also stands for ``sigma_min = 0``,
  an all-zero matrix included; the NTK's ``cond`` likewise).
* **gradient norm**: ``||grad_theta L||`` of a scalar loss (:func:`gradient_norm`). The monitor uses the
  *output gradient norm* (:func:`output_gradient_norm`), the root mean square over the network's
  outputs ``k`` of ``||grad_theta mean_n f_k(x_n)||``: how strongly a unit error signal on one output,
  averaged over the probe batch, moves the parameters. It needs no algorithm-specific loss, so it is
  comparable over training and across algorithms.
* **empirical NTK** (Jacot, Gabriel & Hongler, 2018, "Neural Tangent Kernel", NeurIPS): the Gram
  matrix ``K = J J^T`` of the Jacobian ``J`` of the flattened outputs ``f(x_1..x_N) in R^{N*K}`` with
  respect to the parameters, ``K[(n,k),(m,l)] = <d f_k(x_n)/d theta, d f_l(x_m)/d theta>``. Its condition
  number ``lambda_max / lambda_min`` and effective rank (Roy & Vetterli on its eigenvalues) are the
  headline diagnostics of Rosseau, Müller & Nowé (2026), "Preserving Plasticity in Continual Learning
  via Dynamical Isometry": an ill-conditioned NTK makes some output directions unlearnable.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn
from torch.func import grad as func_grad
from torch.func import jvp, vjp, vmap

from sb3_plastic.callbacks.base import preserved_numpy_rng
from sb3_plastic.callbacks.plasticity_injection import (
    branch_initial_values,
    injected_hidden_layers,
    weight_layers_with_branches,
)
from sb3_plastic.callbacks.redo import (
    _post_activation,
    _validate_tau,
    dormant_units,
    network_probe,
    recurrent_probe_outputs,
)
from sb3_plastic.common.surgery import HiddenLayer, NetworkSpec, recurrent_units_problem
from sb3_plastic.isometry import as_matrix, deviation_from_isometry, deviation_from_isometry_sides, split_at_target
from sb3_plastic.recurrent import recurrent_weights

#: ``delta`` of srank: the singular values kept cover ``1 - delta`` of their sum (Kumar et al., 2021).
SRANK_DELTA = 0.01

#: Largest relative change of the effective rank that the Gram-matrix singular values
#: (:func:`feature_singular_values`) may cause, by the error bound of :func:`_gram_ranks_are_resolved`, before
#: ``svdvals`` is used instead. The measured change is far smaller (~2e-7 on NatureCNN features, as much as rounding
#: the features to float32 precision changes the effective rank computed with ``svdvals``: 2-5e-7).
GRAM_ERANK_RTOL = 1e-4

#: :func:`weight_spectrum` takes ``sigma_min`` from the Gram eigenvalues when their rounding (``d``, see
#: :func:`_gram_eigenvalues`) moves it by at most this relative amount (``d / (2 lambda_min)``), else uses ``svdvals``.
GRAM_SIGMA_RTOL = 1e-7

#: Largest number of float entries of a Jacobian block materialised at once by the NTK / gradient code.
MAX_JACOBIAN_ELEMENTS = 2**23

#: Condition numbers are capped here. The NTK is the Gram matrix of float32 Jacobians, whose singular
#: values are resolved to about ``eps_float32 * sigma_max``, so eigenvalue ratios beyond ``~1 / eps_float32^2``
#: (about 7e13) are round-off: a capped value means "numerically singular".
COND_CAP = 1e14

#: A parameter function: ``{name: tensor} -> outputs``.
ParamFunction = Callable[[dict[str, th.Tensor]], th.Tensor]


# ---------------------------------------------------------------------------------------------------
# Activations: dormant and dead units
# ---------------------------------------------------------------------------------------------------
def dormant_fraction(activations: th.Tensor, tau: float = 0.025, group_size: int = 1) -> float:
    """Fraction of tau-dormant units of a layer (ReDo score ``<= tau``; Sokar et al., 2023).

    :param activations: post-activation outputs ``(N, F)`` or ``(N, C, H, W)`` on a probe batch.
    :param tau: dormancy threshold in (0, 1].
    :param group_size: features per unit (2 under MaxMin).
    """
    return float(dormant_units(activations, tau, group_size).float().mean())


def zero_fraction(activations: th.Tensor, group_size: int = 1) -> float:
    """Fraction of units whose output is exactly zero for every input of the batch (and every position).

    :param activations: post-activation outputs ``(N, F)`` or ``(N, C, H, W)``.
    :param group_size: features per unit (2 under MaxMin: a pair is dead if both features are).
    """
    if activations.dim() < 2:
        raise ValueError(f"activations must have shape (N, F) or (N, C, ...), got {tuple(activations.shape)}")
    dims = [d for d in range(activations.dim()) if d != 1]
    dead = (activations.detach() == 0).all(dim=dims) if dims else activations.detach() == 0
    if dead.numel() % group_size:
        raise ValueError(f"{dead.numel()} features cannot be split into units of {group_size}")
    return float(dead.view(-1, group_size).all(dim=1).float().mean())


# ---------------------------------------------------------------------------------------------------
# Features: rank and norm
# ---------------------------------------------------------------------------------------------------
def feature_matrix(features: th.Tensor) -> th.Tensor:
    """Features ``(N, ...)`` as a float64 matrix ``(N, F)``."""
    if features.dim() < 2:
        raise ValueError(f"features must have shape (N, F) or (N, C, ...), got {tuple(features.shape)}")
    return features.detach().reshape(features.shape[0], -1).double()


def singular_values(matrix: th.Tensor) -> th.Tensor:
    """Singular values (descending, float64) of a matrix; a tensor ``(N, ...)`` is flattened to ``(N, F)``."""
    return th.linalg.svdvals(feature_matrix(matrix))


def _gram_eigenvalues(x: th.Tensor) -> tuple[th.Tensor, float]:
    """Eigenvalues (ascending, float64) of the smaller Gram matrix of ``x`` (``x x^T`` or ``x^T x``), i.e. the squared
    singular values of ``x`` (as many as ``min(N, F)``), and the rounding-error level ``d`` of those eigenvalues:
    ``n * eps64 * lambda_max`` with ``n`` the Gram's size (a conservative scale of ``eigvalsh``'s backward error and
    of the Gram product's rounding; measured errors were ~0.1 ``eps64 * lambda_max``)."""
    x = x.double()
    gram = x @ x.T if x.shape[0] <= x.shape[1] else x.T @ x
    lam = th.linalg.eigvalsh(gram)
    lam_max = float(lam[-1]) if lam.numel() else 0.0
    return lam, gram.shape[0] * th.finfo(th.float64).eps * max(lam_max, 0.0)


def _gram_ranks_are_resolved(sigma: th.Tensor, lam: th.Tensor, d: float, delta: float) -> bool:
    """Whether srank and effective rank computed from ``sigma = sqrt(max(lam, 0))`` (descending) are those of the exact
    singular values, given eigenvalue errors up to ``d``.

    A singular value with ``lam_i > 2 d`` is resolved: its error is at most ``d / sqrt(lam_i - d)`` (``|sqrt a - sqrt b| =
    |a - b| / (sqrt a + sqrt b)``). The others are not: the true value may be anything in ``[0, sqrt(lam_i + d)]``.
    These errors may change the srank only if a cumulative share lies within their total, relative to the sum,
    of ``1 - delta``; the effective rank's entropy ``H`` moves by at most ``-p log p`` per unresolved
    value (``p`` its largest possible share, ``-p log p`` increasing for ``p < 1/e``) plus ``(|log p_i| + 1)`` times the
    share error of each resolved one. The Gram values are used when the srank cannot change and the bound on ``H``
    (= the relative change of ``exp(H)``) is below :data:`GRAM_ERANK_RTOL`.
    """
    total = float(sigma.sum())
    if total <= 0:
        return d <= 0  # all-zero within rounding: exact only if the matrix is exactly zero
    lam_desc = th.flip(lam, (0,)).clamp(min=0)
    resolved = lam_desc > 2 * d
    err = th.where(resolved, d / th.sqrt((lam_desc - d).clamp(min=d)), th.sqrt(lam_desc + d))
    total_err = float(err.sum())
    if total_err >= 0.5 * total:
        return False
    # srank: shares c_k = S_k / S move by at most 2 E / (S - E)
    margin = 2 * total_err / (total - total_err) + 1e-12
    covered = th.cumsum(sigma, 0) / total
    if bool(((covered - (1.0 - delta)).abs() <= margin).any()):
        return False
    # effective rank: |dH| <= sum over unresolved of -p log p (p <= upper / (S - E)) + sum over resolved of
    # (|log p_i| + 1) * |dp_i| with |dp_i| <= (e_i + p_i E) / (S - E)
    low = total - total_err
    bound = 0.0
    upper = ((sigma + err)[~resolved] / low).clamp(max=1 / math.e)
    upper = upper[upper > 0]
    bound += float(-(upper * upper.log()).sum())
    p = sigma[resolved] / total
    dp = (err[resolved] + p * total_err) / low
    bound += float(((p.log().abs() + 1) * dp).sum())
    return bound <= GRAM_ERANK_RTOL


def feature_singular_values(features: th.Tensor, delta: float = SRANK_DELTA) -> th.Tensor:
    """Singular values (descending, float64) of a feature matrix ``(N, F)`` (or ``(N, C, H, W)``, flattened), fast:
    from the eigenvalues of its smaller float64 Gram matrix (negative round-off clamped to 0, square roots), with
    :func:`torch.linalg.svdvals` as the fallback when the Gram's rounding could change the srank (at ``delta``) or
    the effective rank by more than :data:`GRAM_ERANK_RTOL` (relative; see :func:`_gram_ranks_are_resolved`).

    The Gram values agree with ``svdvals`` to ~1e-8 of ``sigma_max``, so singular values below that are not
    resolved; srank and effective rank only need the values relative to their sum, and the fallback catches the
    spectra where unresolved values could carry enough of it to matter. On NatureCNN features (256 x 12 800) this
    is 2.5-10x faster than ``svdvals``; use :func:`singular_values` for the exact small singular values.
    """
    x = feature_matrix(features)
    if min(x.shape) == 0:
        return th.linalg.svdvals(x)
    lam, d = _gram_eigenvalues(x)
    sigma = th.flip(lam, (0,)).clamp(min=0).sqrt()
    if _gram_ranks_are_resolved(sigma, lam, d, delta):
        return sigma
    return th.linalg.svdvals(x)


def srank_from_singular_values(sigma: th.Tensor, delta: float = SRANK_DELTA) -> int:
    """``min{k : sum_{i<=k} sigma_i >= (1 - delta) sum_i sigma_i}`` (Kumar et al., 2021); 0 if all are 0."""
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    s = th.sort(sigma.double().clamp(min=0), descending=True).values
    total = s.sum()
    if total <= 0:
        return 0
    covered = th.cumsum(s, 0) / total
    threshold = th.tensor([1.0 - delta - 1e-12], dtype=covered.dtype, device=covered.device)
    return int(th.searchsorted(covered, threshold).item()) + 1


def effective_rank_from_values(values: th.Tensor) -> float:
    """``exp(H(p))`` with ``p = v / sum v`` for non-negative values ``v`` (Roy & Vetterli, 2007); 0 if all are 0."""
    v = values.double().clamp(min=0)
    total = v.sum()
    if total <= 0:
        return 0.0
    p = v / total
    p = p[p > 0]
    return float(th.exp(-(p * p.log()).sum()))


def srank(features: th.Tensor, delta: float = SRANK_DELTA) -> int:
    """srank of a feature matrix ``(N, F)`` (or ``(N, C, H, W)``, flattened): the number of singular values
    covering ``1 - delta`` of their sum (Kumar et al., 2021, "Implicit Under-Parameterization")."""
    return srank_from_singular_values(feature_singular_values(features, delta), delta)


def effective_rank(features: th.Tensor) -> float:
    """Effective rank ``exp(H(sigma / sum sigma))`` of a feature matrix (Roy & Vetterli, 2007)."""
    return effective_rank_from_values(feature_singular_values(features))


def feature_norm(features: th.Tensor) -> float:
    """Mean over the batch of the Euclidean norm of each sample's (flattened) features."""
    return float(feature_matrix(features).norm(dim=1).mean())


def feature_variance(features: th.Tensor) -> float:
    """Mean over the batch of the unbiased variance of each sample's (flattened) features across its units
    (Plasticine's ``compute_feature_variance``); 0 for a layer of one unit."""
    h = feature_matrix(features)
    if h.shape[1] < 2:
        return 0.0
    return float(h.var(dim=1).mean())


# ---------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------
def weight_norm(weight: th.Tensor) -> float:
    """Frobenius norm of a weight tensor."""
    return float(weight.detach().double().norm())


def distance_from_init(weight: th.Tensor, initial: th.Tensor) -> float:
    """``||W - W_0||_F`` (``initial`` may live on another device)."""
    w = weight.detach().double()
    return float((w - initial.detach().to(w.device, th.float64)).norm())


def network_norms(
    params: Mapping[str, th.Tensor], initial: Optional[Mapping[str, th.Tensor]] = None
) -> tuple[float, Optional[float]]:
    """Euclidean norm of a set of parameters and (given ``initial``, keyed alike) their distance from it.

    Parameters missing from ``initial`` or of another shape are left out of the distance (``network_diagnostics``
    warns about them).
    """
    sq = 0.0
    dist = 0.0
    for name, p in params.items():
        w = p.detach().double()
        sq += float(w.square().sum())
        if initial is not None and name in initial and initial[name].shape == p.shape:
            dist += float((w - initial[name].to(w.device, th.float64)).square().sum())
    return math.sqrt(sq), (math.sqrt(dist) if initial is not None else None)


def weight_spectrum(weight: th.Tensor) -> dict[str, float]:
    """``sigma_max``, ``sigma_min`` and ``cond = sigma_max / sigma_min`` of the matrix view of a weight
    (a conv kernel ``(out, in, kh, kw)`` is viewed as ``(out, in*kh*kw)``); ``cond`` is capped at :data:`COND_CAP`.

    Computed from the eigenvalues of the smaller float64 Gram matrix when that resolves ``sigma_min`` to
    :data:`GRAM_SIGMA_RTOL` (condition numbers up to ~1e3-1e4), else (ill-conditioned or singular) with ``svdvals``."""
    return _weight_spectrum(weight)[0]


def _weight_spectrum(weight: th.Tensor) -> tuple[dict[str, float], th.Tensor]:
    """:func:`weight_spectrum` and the smaller Gram matrix's eigenvalues (float64, ascending) it read them from."""
    w = as_matrix(weight.detach()).double()
    lam, d = _gram_eigenvalues(w) if w.numel() else (w.new_zeros(0), 0.0)
    if lam.numel() and float(lam[0]) > 0 and d <= 2 * GRAM_SIGMA_RTOL * float(lam[0]):
        # well conditioned: sigma = sqrt(lambda) of the Gram, sigma_min within GRAM_SIGMA_RTOL (relative)
        s_max, s_min = math.sqrt(float(lam[-1])), math.sqrt(float(lam[0]))
    else:
        s = th.linalg.svdvals(w)
        s_max, s_min = float(s.max()), float(s.min())
    return {"sigma_max": s_max, "sigma_min": s_min, "cond": capped_ratio(s_max, s_min)}, lam


def capped_ratio(largest: float, smallest: float, cap: float = COND_CAP) -> float:
    """``largest / smallest`` capped at ``cap`` (``cap`` when ``smallest <= largest / cap``, e.g. 0): ``cap`` means
    "numerically singular", which an all-zero matrix (``largest = smallest = 0``) is too; NaN if either is NaN."""
    if math.isnan(largest) or math.isnan(smallest):
        return math.nan
    if largest <= 0:
        return cap
    return largest / smallest if smallest * cap > largest else cap


def _add_sides(out: dict[str, float], sums: dict[str, float], name: str, sides: tuple[float, float], hidden: bool) -> None:
    """Write a layer's ``dfi_floor`` / ``dfi_ceiling`` (:func:`~sb3_plastic.isometry.deviation_from_isometry_sides`)
    and add them to the network's sums (``sums``, its ``..._hidden`` sums too for a non-head layer)."""
    for key, value in zip(("dfi_floor", "dfi_ceiling"), sides):
        out[f"{name}/{key}"] = value
        sums[key] += value
        if hidden:
            sums[f"{key}_hidden"] += value


def dfi(weight: th.Tensor, scale: float = 1.0) -> float:
    """Deviation from isometry of one weight: ``||Gram - s I||_F^2`` on the smaller Gram matrix (``2 R(W)``)
    (:func:`sb3_plastic.isometry.deviation_from_isometry`)."""
    return deviation_from_isometry(weight, scale)


# ---------------------------------------------------------------------------------------------------
# Gradients and the empirical NTK (torch.func: nothing is accumulated into .grad)
# ---------------------------------------------------------------------------------------------------
class ParameterSwap:
    """Runs code with some of a module's parameters replaced by given tensors, then puts the original
    ``Parameter`` objects back: a functional call (as :func:`torch.func.functional_call`) that cannot leave a trace.

    Each parameter is found by its name in ``module`` (as ``module.named_parameters()`` gives it) and replaced in
    *every* place that holds that ``Parameter`` object: a submodule reachable under several names (SB3's
    ``ActorCriticPolicy`` holds one extractor as ``features_extractor``, ``pi_features_extractor`` and
    ``vf_features_extractor``) or a weight tied between two modules sees the new tensor wherever the computation
    reads it. The entries of the owners' ``_parameters`` dicts are set directly and restored, last swapped first, in
    a ``finally``. (``torch.func.functional_call`` does not restore an aliased submodule's parameters in torch 2.13:
    after the call they stay plain tensors with ``requires_grad=False`` that no optimizer holds, which froze SB3's
    shared feature extractors under the monitor, issue #12.) The swapped-in tensors may be those of
    :func:`torch.func.vmap`, :func:`~torch.func.jvp` and :func:`~torch.func.vjp`. A fused ``nn.RNNBase`` (LSTM, GRU)
    also gets its cached weight list swapped and restored.

    :param module: the module whose parameters are replaced.
    :param names: the parameter names (in ``module``) that :meth:`swap` replaces.
    """

    def __init__(self, module: nn.Module, names: Iterable[str]) -> None:
        self.module = module
        self.names = list(names)
        by_id: dict[int, str] = {}
        for name in self.names:
            try:
                param = module.get_parameter(name)
            except AttributeError as error:
                known = [n for n, _ in module.named_parameters()]
                raise ValueError(f"{name!r} is not a parameter of the module; its parameters are {known}") from error
            by_id[id(param)] = name
        #: ``(owner, attribute, name)`` of every place holding one of the parameters.
        self.slots: list[tuple[nn.Module, str, str]] = [
            (owner, attr, by_id[id(p)])
            for owner in module.modules()
            for attr, p in owner._parameters.items()
            if p is not None and id(p) in by_id
        ]
        self._rnns = list({id(o): o for o, _, _ in self.slots if isinstance(o, nn.RNNBase)}.values())

    @contextlib.contextmanager
    def swap(self, values: Mapping[str, th.Tensor]) -> Iterator[None]:
        """Within the block the parameters named by ``values`` (a subset of ``names``) are ``values``' tensors."""
        unknown = set(values) - set(self.names)
        if unknown:
            raise ValueError(f"parameters {sorted(unknown)} are not among those this swap was built for: {self.names}")
        saved: list[tuple[nn.Module, str, Any]] = []
        saved_flat: list[tuple[nn.Module, Any]] = []
        try:
            for owner, attr, name in self.slots:
                if name in values:
                    saved.append((owner, attr, owner._parameters[attr]))
                    owner._parameters[attr] = values[name]
            for rnn in self._rnns:
                saved_flat.append((rnn, rnn.__dict__.get("_flat_weights")))
                rnn.__dict__["_flat_weights"] = [getattr(rnn, n, None) for n in rnn._flat_weights_names]
            yield
        finally:
            for rnn, flat in reversed(saved_flat):
                rnn.__dict__["_flat_weights"] = flat
            for owner, attr, original in reversed(saved):
                owner._parameters[attr] = original


def swapped_parameters(module: nn.Module, values: Mapping[str, th.Tensor]) -> contextlib.AbstractContextManager:
    """``with swapped_parameters(module, {name: tensor}):`` runs the block with those parameters replaced and
    restores the original ``Parameter`` objects afterwards (:class:`ParameterSwap`)."""
    return ParameterSwap(module, values).swap(values)


def module_function(module: nn.Module, *args: Any, **kwargs: Any) -> tuple[ParamFunction, dict[str, th.Tensor]]:
    """``(fn, params)``: ``fn(params) = module(*args, **kwargs)`` with the module's parameters swapped for ``params``
    (:class:`ParameterSwap`), and a detached copy-free view of the module's trainable parameters."""
    params = {name: p.detach() for name, p in module.named_parameters() if p.requires_grad}
    swap = ParameterSwap(module, params)

    def fn(p: dict[str, th.Tensor]) -> th.Tensor:
        with swap.swap(p):
            return module(*args, **kwargs)

    return fn, params


def gradient_norm(loss: ParamFunction, params: Mapping[str, th.Tensor]) -> float:
    """Euclidean norm of ``grad_theta loss(theta)`` at ``params`` (over all tensors of ``params``).

    :param loss: ``{name: tensor} -> scalar tensor``.
    :param params: the point, e.g. from :func:`module_function`.
    """
    grads = func_grad(loss)(dict(params))
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads.values()))


def _rows_of_jacobian(
    fn: ParamFunction, params: Mapping[str, th.Tensor]
) -> tuple[th.Tensor, Callable[[th.Tensor], tuple[dict[str, th.Tensor]]], Callable[..., th.Tensor]]:
    names = list(params)
    primals = tuple(params[n] for n in names)

    def flat(*ps: th.Tensor) -> th.Tensor:
        return fn(dict(zip(names, ps))).reshape(-1)

    out, vjp_fn = vjp(flat, *primals)

    def tangent_product(*tangents: th.Tensor) -> th.Tensor:
        return jvp(flat, primals, tangents)[1]

    return out, vjp_fn, tangent_product


def _chunk_rows(n_rows: int, n_params: int, max_elements: int) -> int:
    return max(1, min(n_rows, max_elements // max(n_params, 1)))


@th.no_grad()
def empirical_ntk(fn: ParamFunction, params: Mapping[str, th.Tensor], max_elements: int = MAX_JACOBIAN_ELEMENTS) -> th.Tensor:
    """Empirical NTK ``K = J J^T`` (float64) of the flattened output of ``fn`` at ``params``.

    ``J[r] = d out_flat[r] / d theta``; for an output ``(N, K)`` the rows are ordered ``(n, k)``, so
    ``K[(n,k),(m,l)] = <d f_k(x_n)/d theta, d f_l(x_m)/d theta>``. The Jacobian rows come from vectorised
    vector-Jacobian products (:func:`torch.func.vjp` under :func:`torch.func.vmap`). When the whole Jacobian
    has more than ``max_elements`` entries, ``K`` is built a block of rows at a time as ``J (J^T E)`` with
    a forward-mode product (:func:`torch.func.jvp`), so memory stays bounded.

    :param fn: ``{name: tensor} -> outputs`` (e.g. from :func:`module_function`); must be side-effect free.
    :param params: the parameters to differentiate (others stay fixed inside ``fn``).
    :param max_elements: memory budget in Jacobian entries.
    """
    out, vjp_fn, tangent_product = _rows_of_jacobian(fn, params)
    n_rows = out.numel()
    n_params = sum(p.numel() for p in params.values())
    eye = th.eye(n_rows, dtype=out.dtype, device=out.device)
    if n_rows * n_params <= max_elements:
        ntk = th.zeros(n_rows, n_rows, dtype=th.float64, device=out.device)
        for block in vmap(vjp_fn)(eye):
            block = block.reshape(n_rows, -1).double()
            ntk += block @ block.T
        return ntk
    chunk = _chunk_rows(n_rows, n_params, max_elements)
    ntk = th.empty(n_rows, n_rows, dtype=th.float64, device=out.device)
    for start in range(0, n_rows, chunk):
        cotangents = vmap(vjp_fn)(eye[start : start + chunk])
        ntk[start : start + chunk] = vmap(tangent_product)(*cotangents).double()
    return 0.5 * (ntk + ntk.T)


@th.no_grad()
def output_gradient_norm(
    fn: ParamFunction, params: Mapping[str, th.Tensor], max_elements: int = MAX_JACOBIAN_ELEMENTS
) -> float:
    """``sqrt(mean_k ||grad_theta mean_n f_k(x_n)||^2)`` for an output ``f`` of shape ``(N, K)``
    (``(N, ...)`` is flattened to ``(N, K)``): the root mean square over outputs of the gradient norm of
    the batch-mean output."""

    def mean_output(p: dict[str, th.Tensor]) -> th.Tensor:
        y = fn(p)
        return y.reshape(y.shape[0], -1).mean(dim=0)

    out, vjp_fn, _ = _rows_of_jacobian(mean_output, params)
    n_rows = out.numel()
    n_params = sum(p.numel() for p in params.values())
    eye = th.eye(n_rows, dtype=out.dtype, device=out.device)
    chunk = _chunk_rows(n_rows, n_params, max_elements)
    total = 0.0
    for start in range(0, n_rows, chunk):
        rows = vmap(vjp_fn)(eye[start : start + chunk])
        total += sum(float(r.double().square().sum()) for r in rows)
    return math.sqrt(total / max(n_rows, 1))


def kernel_stats(kernel: th.Tensor) -> dict[str, float]:
    """Statistics of a symmetric PSD kernel matrix (e.g. the empirical NTK).

    * ``cond``: ``lambda_max / lambda_min`` of its eigenvalues (negative round-off clipped to 0), capped at
      :data:`COND_CAP` (numerically singular);
    * ``erank``: effective rank ``exp(H(lambda / sum lambda))`` (Roy & Vetterli, 2007);
    * ``trace``: ``trace(K) / dim``, the mean squared norm of a Jacobian row;
    * ``lambda_max``, ``lambda_min``.
    """
    lam = th.linalg.eigvalsh(kernel.double()).clamp(min=0)
    l_max, l_min = float(lam.max()), float(lam.min())
    return {
        "cond": capped_ratio(l_max, l_min),
        "erank": effective_rank_from_values(lam),
        "trace": float(lam.sum()) / max(lam.numel(), 1),
        "lambda_max": l_max,
        "lambda_min": l_min,
    }


# ---------------------------------------------------------------------------------------------------
# SB3 networks
# ---------------------------------------------------------------------------------------------------
def _capture(layers: Sequence[nn.Module], forward: Callable[[], Any], transform: Callable[[int, th.Tensor], th.Tensor]):
    outs: list[list[th.Tensor]] = [[] for _ in layers]

    def make_hook(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: th.Tensor) -> None:
            outs[i].append(transform(i, output))

        return hook

    handles = [layer.register_forward_hook(make_hook(i)) for i, layer in enumerate(layers)]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return outs


@th.no_grad()
def capture_features(layers: Sequence[HiddenLayer], forward: Callable[[], Any]) -> list[Optional[th.Tensor]]:
    """Post-activation outputs of hidden layers during ``forward()`` (under ``torch.no_grad``).

    The activation after each layer is re-applied to the layer output, as in
    :func:`sb3_plastic.callbacks.redo.probe_activity`. A layer run several times is concatenated along the
    batch, except that an output equal to one already captured for that layer is kept once (PPO's shared feature
    extractor runs twice on the same batch, for the action and for the value: stacking a copy would only scale every
    singular value by ``sqrt(2)``, leave each per-unit mean unchanged and double the cost of the rank diagnostics);
    a layer ``forward`` never reaches gives ``None``.
    """
    outs = _capture([h.layer for h in layers], forward, lambda i, out: _post_activation(layers[i], out).detach())
    kept: list[list[th.Tensor]] = []
    for o in outs:
        unique: list[th.Tensor] = []
        for t in o:
            if not any(u.shape == t.shape and th.equal(u, t) for u in unique):
                unique.append(t)
        kept.append(unique)
    return [th.cat(o, dim=0) if o else None for o in kept]


def probe_forward(
    model: BaseAlgorithm, spec: NetworkSpec, observations: Any, actions: Optional[th.Tensor] = None
) -> Callable[[], Any]:
    """:func:`sb3_plastic.callbacks.redo.network_probe`, extended to deterministic actors (TD3 / DDPG),
    which have no ``get_action_dist_params``: their probe is ``actor(observations)``."""
    if spec.name == "actor" and not hasattr(spec.module, "get_action_dist_params"):
        return lambda: spec.module(observations)
    return network_probe(model, spec, observations, actions)


def spec_parameters(spec: NetworkSpec) -> dict[str, th.Tensor]:
    """Trainable parameters of a network (those its optimizer updates), detached, keyed by name in ``spec.module``."""
    trained = {id(p) for p in spec.parameters()}
    return {name: p.detach() for name, p in spec.module.named_parameters() if id(p) in trained and p.requires_grad}


def network_output_function(
    model: BaseAlgorithm, spec: NetworkSpec, observations: Any, actions: Optional[th.Tensor] = None
) -> tuple[ParamFunction, dict[str, th.Tensor]]:
    """``(fn, params)`` with ``fn(params)`` the outputs ``(N, K)`` of the network's heads on a probe batch.

    The network runs as in :func:`probe_forward` (PPO ``policy``: action distribution and value;
    ``q_net`` / ``quantile_net``; SAC/TQC ``actor``: distribution parameters; TD3 ``actor``: actions;
    ``critic``: Q-values of ``actions``) with its parameters swapped for ``fn``'s argument (:class:`ParameterSwap`,
    which puts the original ``Parameter`` objects back); the outputs of its head
    layers (:meth:`NetworkSpec.heads`: action and value heads, every critic's head, ...) are captured by
    forward hooks, flattened per sample and concatenated in head order. A head the probe never reaches is left out:
    after each call ``fn.missing_heads`` lists their names (:func:`network_diagnostics` warns); when no head runs the
    output has shape ``(N, 0)``.
    """
    heads = spec.heads()
    forward = probe_forward(model, spec, observations, actions)
    params = spec_parameters(spec)
    swap = ParameterSwap(spec.module, params)
    n = _batch_size(observations)
    missing: list[str] = []

    def fn(p: dict[str, th.Tensor]) -> th.Tensor:
        with swap.swap(p):
            outs = _capture(heads, forward, lambda i, out: out.reshape(out.shape[0], -1))
        missing[:] = [spec.layer_names.get(id(h), "?") for h, o in zip(heads, outs) if not o]
        kept = [o[-1] for o in outs if o]
        if not kept:
            device = next(iter(p.values())).device if p else None
            return th.zeros(n, 0, device=device)
        return th.cat(kept, dim=1)

    fn.missing_heads = missing  # type: ignore[attr-defined]
    return fn, params


def _rows(observations: Any, index: th.Tensor) -> Any:
    if isinstance(observations, dict):
        return {k: v[index.to(v.device)] for k, v in observations.items()}
    return observations[index.to(observations.device)]


def unique_probe_rows(observations: Any, actions: Optional[th.Tensor] = None) -> th.Tensor:
    """Indices (ascending) of the first occurrence of each distinct probe sample: an observation (every entry of a
    ``Dict`` observation) and, given ``actions``, its action; samples are equal when their bytes are.

    Repeated samples (repeated MinAtar / Atari frames in a rollout) give identical Jacobian rows, which make the
    empirical NTK singular: its condition number would be "infinite" for a reason that has nothing to do with the
    network.
    """
    n = _batch_size(observations)
    tensors = list(observations.values()) if isinstance(observations, dict) else [observations]
    if actions is not None:
        tensors.append(actions)
    parts = [th.as_tensor(t).detach().reshape(n, -1).contiguous() for t in tensors]
    device = parts[0].device
    rows = th.cat([p.to(device).view(th.uint8) if p.dtype != th.bool else p.to(device, th.uint8) for p in parts], dim=1)
    _, inverse = th.unique(rows, dim=0, return_inverse=True)
    first = th.full((int(inverse.max()) + 1 if n else 0,), n, dtype=th.long, device=device)
    first.scatter_reduce_(0, inverse, th.arange(n, device=device), reduce="amin")
    return th.sort(first).values


@contextlib.contextmanager
def unchanged_model(modules: Iterable[nn.Module], device: Optional[th.device] = None) -> Iterator[None]:
    """Runs a diagnostics computation so that it changes nothing: every module in evaluation mode (no dropout,
    batch / batch-renorm statistics read, never updated: CrossQ's BatchRenorm), each module's own ``training`` flag
    restored afterwards; torch's (CPU and, for a CUDA ``device``, that device's) and numpy's global random states
    saved and restored."""
    flags = {id(m): (m, m.training) for root in modules for m in root.modules()}
    rng_devices = [device] if device is not None and th.device(device).type == "cuda" else []
    try:
        with th.random.fork_rng(devices=rng_devices), preserved_numpy_rng():
            for m, _ in flags.values():
                m.training = False
            yield
    finally:
        for m, training in flags.values():
            m.training = training


def _batch_size(observations: Any) -> int:
    if isinstance(observations, dict):
        return int(next(iter(observations.values())).shape[0])
    return int(observations.shape[0])


def network_diagnostics(
    model: BaseAlgorithm,
    spec: NetworkSpec,
    observations: Any,
    actions: Optional[th.Tensor] = None,
    tau: float = 0.025,
    initial: Optional[Mapping[str, th.Tensor]] = None,
    ntk_size: int = 32,
    ntk_max_rows: int = 256,
    max_elements: int = MAX_JACOBIAN_ELEMENTS,
    dfi_scale: float = 1.0,
    warned: Optional[set] = None,
) -> dict[str, float]:
    """All diagnostics of one network of a model on a probe batch, as ``{"<layer>/<metric>" or "<metric>": value}``.

    Per hidden layer (on the probe batch): ``dormant_fraction``, ``zero_fraction``, ``srank``,
    ``effective_rank``, ``feature_norm``, ``feature_variance``; likewise per LSTM layer of a recurrent policy
    (``<lstm>.l<index>``, on
    the cells' outputs ``h`` at the first step from zero states, as ReDo scores them,
    :func:`sb3_plastic.callbacks.redo.recurrent_probe_outputs`), counted in the network-level fractions.
    Per weight layer (heads included): ``weight_norm``,
    ``dist_from_init`` (with ``initial``), ``dfi``, ``dfi_floor``, ``dfi_ceiling``, ``sigma_max``, ``sigma_min``,
    ``cond``; per recurrent weight matrix (``<lstm>.weight_ih_l0``, ...): ``weight_norm``, ``dist_from_init``,
    ``dfi``, ``dfi_floor``, ``dfi_ceiling`` (summed over its gate blocks, :mod:`sb3_plastic.recurrent`).
    Network-level:
    ``dormant_fraction`` and ``zero_fraction`` over all hidden units, ``weight_norm`` and ``dist_from_init``
    over all trained parameters, ``dfi`` (sum over all weight layers, heads included), ``dfi_hidden`` (the sum
    without the heads, :meth:`~sb3_plastic.common.surgery.NetworkSpec.heads`: the layers AdamO's default
    ``isometry_layers="hidden"`` regularises, so that an unpenalised head's growth does not hide the hidden layers'
    isometry), ``dfi_free`` and ``dfi_free_hidden`` (the same two sums of the scale-free DfI,
    ``deviation_from_isometry(W, free_scale=True)``: the spread of each layer's squared singular values about their own
    mean, which ``isometry_free_scale`` penalises and which ``dfi`` mixes with the weights' level), ``dfi_floor`` /
    ``dfi_ceiling`` and ``dfi_floor_hidden`` / ``dfi_ceiling_hidden`` (the same two sums of the DfI's parts below and
    above the target: :func:`~sb3_plastic.isometry.deviation_from_isometry_sides`), ``grad_norm``
    (:func:`output_gradient_norm` on
    the probe batch) and, on the first ``ntk_size`` distinct probe samples (:func:`unique_probe_rows`: a repeated
    sample would make the kernel singular; fewer when the outputs would exceed ``ntk_max_rows`` rows), ``ntk_cond``,
    ``ntk_log10_cond`` (its base-10 logarithm, at most ``log10(COND_CAP) = 14``), ``ntk_erank``, ``ntk_trace`` and
    ``ntk_size`` (the samples used; see :func:`kernel_stats`). When one sample has more outputs than
    ``ntk_max_rows`` (QR-DQN: actions x quantiles), the NTK is still computed, on one sample (``ntk_size = 1``), and so
    has more rows than ``ntk_max_rows``; a one-sample kernel holds only the outputs' coupling within one input, not
    comparable with kernels over several samples (a ``UserWarning`` says so).

    Nothing here stops training and nothing is dropped silently (each case raises a ``UserWarning`` naming the
    network and layer, once per cause given ``warned``):

    * non-finite (NaN / inf) features of a hidden layer: its five feature metrics and the network's
      ``dormant_fraction`` / ``zero_fraction`` are NaN; non-finite weights of a layer: its ``sigma_max``,
      ``sigma_min``, ``cond``, ``dfi_floor``, ``dfi_ceiling`` (and so the network's sums of the last two) are NaN
      (its norm, distance and DfI are whatever the arithmetic gives: NaN or inf);
      a non-finite NTK: every ``ntk_*`` metric except ``ntk_size`` is NaN;
    * a hidden layer the probe never reaches has no feature metrics; a head it never reaches is left out of the
      NTK and of ``grad_norm`` (no head at all: both NaN);
    * an initial value missing from ``initial`` or of another shape (a layer resized by surgery): the layer has no
      ``dist_from_init``, and the network's ``dist_from_init`` is over the parameters that have one.

    A plasticity injection's trainable branch is read as layers of the network (keys under its module name,
    ``action_net.plasticity_injection0.new.0``): its hidden layers' units, its layers' weight metrics, and their
    distance from their draw at the injection (the frozen twin's values, when ``initial`` has none).

    Nothing of the model is changed (:func:`unchanged_model`): the networks run in evaluation mode (as they act in
    SB3's rollouts; batch-norm statistics are read, not updated) and every module's mode is restored; parameters
    are swapped by :class:`ParameterSwap`, which puts the same ``Parameter`` objects back; no optimizer state or
    ``.grad`` is touched (gradients come from :mod:`torch.func`); torch's and numpy's random states are restored.

    :param initial: initial values of the trained parameters, keyed by name in ``spec.module``
        (see :func:`spec_parameters`); ``None`` skips the distances.
    :param ntk_size: probe samples for the NTK (0 skips the NTK).
    :param dfi_scale: target scale ``s`` of the DfI ``||W^T W - s I||_F^2`` (the model's ``isometry_scale``).
    :param warned: keys of the warnings already given; each warning is given once per key and its key added (the
        :class:`~sb3_plastic.callbacks.monitor.PlasticityMonitor` keeps one set per monitor). ``None``: every
        call warns.
    """
    tau = _validate_tau(tau)
    with unchanged_model([model.policy, spec.module], getattr(model, "device", None)):
        return _network_diagnostics(
            model,
            spec,
            observations,
            actions,
            tau,
            initial,
            ntk_size,
            ntk_max_rows,
            max_elements,
            dfi_scale,
            set() if warned is None else warned,
        )


def _warn_once(warned: set, key: Any, message: str) -> None:
    if key not in warned:
        warned.add(key)
        warnings.warn(message, stacklevel=4)


def _is_finite(t: th.Tensor) -> bool:
    return bool(th.isfinite(t).all())


_FEATURE_METRICS = (
    "dormant_fraction", "zero_fraction", "srank", "effective_rank", "feature_norm", "feature_variance",
)


def _network_diagnostics(
    model: BaseAlgorithm,
    spec: NetworkSpec,
    observations: Any,
    actions: Optional[th.Tensor],
    tau: float,
    initial: Optional[Mapping[str, th.Tensor]],
    ntk_size: int,
    ntk_max_rows: int,
    max_elements: int,
    dfi_scale: float,
    warned: set,
) -> dict[str, float]:
    out: dict[str, float] = {}
    net = spec.name
    forward = probe_forward(model, spec, observations, actions)
    hidden: list[Any] = spec.hidden_layers() + injected_hidden_layers(spec)
    features: list[Optional[th.Tensor]] = capture_features(hidden, forward)
    if spec.recurrent and spec.name == "policy":  # LSTM cells: first-step outputs from zero states
        cells = [u for u in spec.recurrent_units() if recurrent_units_problem(u) is None]
        if cells:
            hidden += cells
            features += recurrent_probe_outputs(model.policy, cells, observations)
    n_units = n_dormant = n_dead = 0.0
    for layer, h in zip(hidden, features):
        if h is None:
            _warn_once(
                warned,
                ("no_activations", net, layer.name),
                f"diagnostics: hidden layer '{layer.name}' of network '{net}' produced no activations on the probe "
                "batch (the probe's forward pass never reaches it): it has no dormant / rank / feature metrics and "
                "is not counted in the network's dormant_fraction and zero_fraction",
            )
            continue
        if not _is_finite(h):
            _warn_once(
                warned,
                ("nonfinite_features", net, layer.name),
                f"diagnostics: hidden layer '{layer.name}' of network '{net}' has non-finite (NaN / inf) activations "
                f"on the probe batch: its {', '.join(_FEATURE_METRICS)} and the network's dormant_fraction and "
                "zero_fraction are logged as NaN",
            )
            for key in _FEATURE_METRICS:
                out[f"{layer.name}/{key}"] = math.nan
            n_units += layer.n_units
            n_dormant = n_dead = math.nan
            continue
        d = dormant_fraction(h, tau, layer.group_size)
        z = zero_fraction(h, layer.group_size)
        sigma = feature_singular_values(h)
        out[f"{layer.name}/dormant_fraction"] = d
        out[f"{layer.name}/zero_fraction"] = z
        out[f"{layer.name}/srank"] = float(srank_from_singular_values(sigma))
        out[f"{layer.name}/effective_rank"] = effective_rank_from_values(sigma)
        out[f"{layer.name}/feature_norm"] = feature_norm(h)
        out[f"{layer.name}/feature_variance"] = feature_variance(h)
        n_units += layer.n_units
        n_dormant += d * layer.n_units
        n_dead += z * layer.n_units
    if n_units:
        out["dormant_fraction"] = n_dormant / n_units
        out["zero_fraction"] = n_dead / n_units
    param_names = {id(p): name for name, p in spec.module.named_parameters()}
    params = spec_parameters(spec)
    if initial is not None:  # an injected branch starts from its draw, which its frozen twin keeps
        drawn = {param_names[i]: t for i, t in branch_initial_values(spec.module).items() if i in param_names}
        initial = {**drawn, **initial}
        no_origin = [
            f"{k} {tuple(p.shape)} (initial: {tuple(initial[k].shape) if k in initial else 'none'})"
            for k, p in params.items()
            if k not in initial or initial[k].shape != p.shape
        ]
        if no_origin:
            # once per network: an intervention that adds layers repeatedly (plasticity injection at every task
            # switch) would otherwise warn at every pass after every addition
            _warn_once(
                warned,
                ("init_shape", net),
                f"diagnostics: network '{net}' has parameters without a saved initial value of their shape (a layer "
                f"resized or added after the initial weights were taken): {', '.join(no_origin)}; their layers, and "
                "those added later, have no dist_from_init and the network's dist_from_init leaves them out (this "
                "warning is not repeated for this network)",
            )
    total_dfi = hidden_dfi = total_free = hidden_free = 0.0
    sides = {"dfi_floor": 0.0, "dfi_ceiling": 0.0, "dfi_floor_hidden": 0.0, "dfi_ceiling_hidden": 0.0}
    for layer, is_head in weight_layers_with_branches(spec):
        name = spec.layer_names.get(id(layer), "?")
        w = layer.weight
        out[f"{name}/weight_norm"] = weight_norm(w)
        init_w = initial.get(param_names.get(id(w), ""), None) if initial is not None else None
        if init_w is not None and init_w.shape == w.shape:
            out[f"{name}/dist_from_init"] = distance_from_init(w, init_w)
        layer_dfi = dfi(w, dfi_scale)
        layer_free = deviation_from_isometry(w, free_scale=True)
        total_dfi += layer_dfi
        total_free += layer_free
        if not is_head:
            hidden_dfi += layer_dfi
            hidden_free += layer_free
        out[f"{name}/dfi"] = layer_dfi
        if _is_finite(w.detach()):
            spectrum, lam = _weight_spectrum(w)  # the Gram's eigenvalues serve the DfI's two sides too
            for key, value in spectrum.items():
                out[f"{name}/{key}"] = value
            _add_sides(out, sides, name, split_at_target(lam, dfi_scale), hidden=not is_head)
        else:
            _warn_once(
                warned,
                ("nonfinite_weight", net, name),
                f"diagnostics: layer '{name}' of network '{net}' has non-finite (NaN / inf) weights: its sigma_max, "
                "sigma_min, cond, dfi_floor and dfi_ceiling are logged as NaN (its weight_norm, dist_from_init and dfi "
                "are NaN or inf)",
            )
            for key in ("sigma_max", "sigma_min", "cond"):
                out[f"{name}/{key}"] = math.nan
            _add_sides(out, sides, name, (math.nan, math.nan), hidden=not is_head)
    for module in spec.recurrent:  # LSTM matrices: norm, distance and DfI summed over the gate blocks
        for pname, w, blocks in recurrent_weights(module):
            name = f"{spec.layer_names.get(id(module), '?')}.{pname}"
            out[f"{name}/weight_norm"] = weight_norm(w)
            init_w = initial.get(param_names.get(id(w), ""), None) if initial is not None else None
            if init_w is not None and init_w.shape == w.shape:
                out[f"{name}/dist_from_init"] = distance_from_init(w, init_w)
            layer_dfi = deviation_from_isometry(w, dfi_scale, blocks)
            layer_free = deviation_from_isometry(w, blocks=blocks, free_scale=True)
            total_dfi += layer_dfi
            hidden_dfi += layer_dfi
            total_free += layer_free
            hidden_free += layer_free
            out[f"{name}/dfi"] = layer_dfi
            _add_sides(out, sides, name, deviation_from_isometry_sides(w, dfi_scale, blocks), hidden=True)
    norm, dist = network_norms(params, initial)
    out["weight_norm"] = norm
    if dist is not None:
        out["dist_from_init"] = dist
    out["dfi"] = total_dfi
    out["dfi_hidden"] = hidden_dfi
    out["dfi_free"] = total_free
    out["dfi_free_hidden"] = hidden_free
    out.update(sides)
    fn, params = network_output_function(model, spec, observations, actions)
    with th.no_grad():
        n_outputs = fn(params).shape[1]
    missing = list(fn.missing_heads)  # type: ignore[attr-defined]
    if missing:
        _warn_once(
            warned,
            ("missing_heads", net, tuple(missing)),
            f"diagnostics: head(s) {', '.join(repr(m) for m in missing)} of network '{net}' never ran on the probe "
            "batch: they are left out of its NTK and grad_norm" + (" (no head ran: both are NaN)" if not n_outputs else ""),
        )
    out["grad_norm"] = output_gradient_norm(fn, params, max_elements) if n_outputs else math.nan
    if ntk_size > 0:
        unique = unique_probe_rows(observations, actions)
        n = max(1, min(ntk_size, unique.numel(), ntk_max_rows // max(n_outputs, 1)))
        if n_outputs > ntk_max_rows:
            _warn_once(
                warned,
                ("ntk_rows", net),
                f"diagnostics: network '{net}' has {n_outputs} outputs per sample, more than ntk_max_rows="
                f"{ntk_max_rows}: its NTK is computed on 1 sample ({n_outputs} x {n_outputs}, ntk_size=1), over the "
                "row cap; a one-sample kernel only couples the outputs of one input and is not comparable with "
                "kernels over several samples (raise ntk_max_rows for several samples)",
            )
        index = unique[:n]
        sub_actions = _rows(actions, index) if actions is not None else None
        ntk_fn, ntk_params = network_output_function(model, spec, _rows(observations, index), sub_actions)
        kernel = empirical_ntk(ntk_fn, ntk_params, max_elements) if n_outputs else None
        if kernel is not None and _is_finite(kernel):
            stats = kernel_stats(kernel)
        else:
            if kernel is not None:
                _warn_once(
                    warned,
                    ("nonfinite_ntk", net),
                    f"diagnostics: the NTK of network '{net}' has non-finite (NaN / inf) entries (non-finite "
                    "parameters or outputs): ntk_cond, ntk_log10_cond, ntk_erank and ntk_trace are logged as NaN",
                )
            stats = {"cond": math.nan, "erank": math.nan, "trace": math.nan}
        out["ntk_cond"] = stats["cond"]
        out["ntk_log10_cond"] = math.log10(stats["cond"]) if stats["cond"] > 0 else math.nan
        out["ntk_erank"] = stats["erank"]
        out["ntk_trace"] = stats["trace"]
        out["ntk_size"] = float(n)
    return out
