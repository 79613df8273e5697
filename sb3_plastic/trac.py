"""TRAC: a parameter-free optimizer wrapper for continual learning (Muppidi, Zhang & Yang, NeurIPS 2024, "Fast TRAC:
A Parameter-Free Optimizer for Lifelong Reinforcement Learning"; code ComputationalRobotics/TRAC,
``package/src/trac_optimizer/trac.py``).

TRAC runs a base optimizer (Adam in the paper) and scales how far its iterate may move from a reference point, the
parameters at the first step: the parameters are ``theta_ref + S_t * Delta_t``, where ``Delta_t`` accumulates the base
optimizer's updates and the scale ``S_t`` is tuned online, parameter-free, by an ensemble of discounted 1-d
coin-betting (erfi-potential) learners over the "gradient of the loss in the scale", ``h_t = <Delta_t, g_t>``. At each
step, for discount factors ``beta_k`` (:data:`TRAC_BETAS`):

* ``Delta_t = (theta_t - theta_ref) / (sum_k s_k + eps)`` (the base iterate, recovered from the parameters),
* the base optimizer steps from ``theta_t`` with the gradient ``g_t``: its update ``u_t``; ``Delta_{t+1} = Delta_t + u_t``,
* ``h_t = sum_p <Delta_t, g_t>``; ``v_k <- beta_k^2 v_k + h_t^2``; ``sigma_k <- beta_k sigma_k - h_t``;
  ``s_k = s_prev / erfi(1 / sqrt(2)) * erfi(sigma_k / (sqrt(2) sqrt(v_k) + eps))``,
* ``theta_{t+1} = theta_ref + max(sum_k s_k, 0) * Delta_{t+1}``.

``s_prev = 1e-8`` and ``eps = 1e-8``; ``sigma_k`` starts at 1e-8, ``v_k`` and ``s_k`` at 0; ``theta_ref`` is the value of
the parameters at the first step, before the base update. The reference's settings are the defaults. Use it with
``optimizer="trac"`` (:class:`~sb3_plastic.config.IsometryConfig`): the plastic policies build :func:`trac_class` of
torch's Adam (of AdamO in ``isometry_mode="coupled"``, of the user's ``optimizer_class`` if given) with SB3's Adam
settings.

Deviations from the reference:

* The per-step scalars (``h``, ``v``, ``sigma``, ``s``) are computed in float64 on the CPU (the reference: float32 on the
  parameters' device) with an exact ``erfi`` (:func:`erfi`; the reference approximates it by a 128-term rational
  Faddeeva expansion in complex64). One host synchronisation per step (``h``).
* The state lives in ``optimizer.state["trac"]`` with the reference points as a list in parameter order (the reference
  keys them by the parameter tensors, which a ``state_dict`` cannot carry through save / load), so SB3's save / load
  resumes TRAC exactly. Interventions that drop a parameter's optimizer state (FIRE, LayerReset, Shrink & Perturb)
  leave TRAC's reference point alone; ones that zero rows of the state (Continual Backprop, ReDo) do not reach it.
  A parameter that gets its first gradient late takes its reference point then.
* No log file (the reference appends ``s`` to a file every step); the scale is in ``state["trac"]["s"]`` and
  :attr:`TRACMixin.trac_scale`.
* A ``step(closure)`` is refused (``ValueError``): TRAC needs the gradient before the base step, the reference calls
  the base step without the closure.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch as th

#: The reference's discount factors of the six scale learners.
TRAC_BETAS: tuple[float, ...] = (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)
#: The reference's initial scale ``s_prev`` (the numerator of every learner's scale).
TRAC_S_PREV = 1e-8
#: The reference's epsilon (denominators).
TRAC_EPS = 1e-8


def erfi(x: float) -> float:
    """The imaginary error function ``erfi(x) = -i erf(i x) = 2 / sqrt(pi) * int_0^x exp(t^2) dt``, in float64.

    ``|x| < 6``: its Taylor series ``2 / sqrt(pi) sum_n x^(2n+1) / (n! (2n+1))`` (all terms of one sign: no
    cancellation); beyond: the asymptotic series ``exp(x^2) / (x sqrt(pi)) (1 + 1/(2x^2) + 3/(4x^4) + ...)`` summed until
    its terms fall below 1e-17 (they keep shrinking until the ``x^2``-th, far beyond that); ``inf`` once ``exp(x^2)``
    overflows (``|x| > 26.6``).
    """
    if x < 0:
        return -erfi(-x)
    if x < 6.0:
        term, total, n = x, x, 0
        while term > 1e-17 * total:
            n += 1
            term *= x * x / n
            total += term / (2 * n + 1)
        return 2.0 / math.sqrt(math.pi) * total
    try:
        lead = math.exp(x * x) / (x * math.sqrt(math.pi))
    except OverflowError:
        return math.inf
    series, term, k = 1.0, 1.0, 0
    while term > 1e-17 and k < x * x:  # the terms shrink until k ~ x^2 (optimal truncation)
        k += 1
        term *= (2 * k - 1) / (2 * x * x)
        series += term
    return lead * series


def trac_scales(sigma: Sequence[float], variance: Sequence[float], s_prev: float = TRAC_S_PREV,
                eps: float = TRAC_EPS) -> list[float]:
    """Each learner's scale ``s_k = s_prev / erfi(1/sqrt 2) * erfi(sigma_k / (sqrt 2 sqrt(v_k) + eps))``."""
    first = s_prev / erfi(1.0 / math.sqrt(2.0))
    return [first * erfi(sg / (math.sqrt(2.0) * math.sqrt(v) + eps)) for sg, v in zip(sigma, variance)]


class TRACMixin:
    """TRAC around any torch optimizer's own ``step`` (the base); see the module docstring. Mixed in front of the base
    class by :func:`trac_class`."""

    param_groups: list[dict[str, Any]]
    state: Any

    def _init_trac(self, trac_betas: Sequence[float], trac_s_prev: float, trac_eps: float) -> None:
        numbers = isinstance(trac_betas, (list, tuple)) and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in trac_betas
        )  # a scalar or a string is not iterable into numbers
        betas = tuple(float(b) for b in trac_betas) if numbers else ()
        if not betas or any(not 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"trac_betas must be a non-empty sequence of numbers in [0, 1), got {trac_betas!r}")
        for name, value in (("trac_s_prev", trac_s_prev), ("trac_eps", trac_eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.trac_settings = {"betas": betas, "s_prev": float(trac_s_prev), "eps": float(trac_eps)}

    def _trac_params(self) -> list[th.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _trac_state(self, before: Sequence[th.Tensor]) -> dict[str, Any]:
        state = self.state.get("trac")
        if not isinstance(state, dict):
            k = len(self.trac_settings["betas"])
            state = {"s": [0.0] * k, "variance": [0.0] * k, "sigma": [1e-8] * k, "iter_count": 0,
                     "ref": [x.clone() for x in before]}
            self.state["trac"] = state
        refs = state["ref"]
        for i, x in enumerate(before):  # a reference saved on another device, or a parameter added since
            if i >= len(refs):
                refs.append(x.clone())
            elif refs[i] is None or refs[i].shape != x.shape:
                refs[i] = x.clone()
            elif refs[i].device != x.device:
                refs[i] = refs[i].to(x.device)
        return state

    @property
    def trac_scale(self) -> float:
        """The current scale ``max(sum_k s_k, 0)`` (0 before the first step)."""
        state = self.state.get("trac")
        return max(sum(state["s"]), 0.0) if isinstance(state, dict) else 0.0

    def step(self, closure: Optional[Any] = None) -> Any:  # type: ignore[override]
        """One TRAC step: the base optimizer's step, then the rescaling of its iterate (see the module docstring).

        :raises ValueError: for a closure (see the module docstring).
        """
        if closure is not None:
            raise ValueError("TRAC's step takes no closure: it needs the gradient before the base step")
        params = self._trac_params()
        with th.no_grad():
            grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
            before = [p.detach().clone() for p in params]
        result = super().step()  # type: ignore[misc]
        settings = self.trac_settings
        with th.no_grad():
            state = self._trac_state(before)
            scale_sum = sum(state["s"]) + settings["eps"]
            deltas: list[Optional[th.Tensor]] = []
            products = []
            for p, g, x, ref in zip(params, grads, before, state["ref"]):
                if g is None:
                    deltas.append(None)
                    continue
                delta = (x - ref) / scale_sum
                products.append(th.dot(delta.flatten().double(), g.flatten().double()))
                deltas.append(delta.add_(p - x))  # Delta_{t+1} = Delta_t + u_t
            if not products:
                return result
            h = float(th.stack([v.cpu() for v in products]).sum())
            if math.isnan(h):
                raise ValueError("TRAC: NaN in <Delta, grad> (a NaN gradient or parameter)")
            state["iter_count"] += 1
            state["variance"] = [b * b * v + h * h for b, v in zip(settings["betas"], state["variance"])]
            state["sigma"] = [b * sg - h for b, sg in zip(settings["betas"], state["sigma"])]
            state["s"] = trac_scales(state["sigma"], state["variance"], settings["s_prev"], settings["eps"])
            total = sum(state["s"])
            if not math.isfinite(total):
                raise FloatingPointError(f"TRAC: the scale overflowed (sum s = {total}); erfi grows as exp(x^2)")
            scale = max(total, 0.0)
            for p, ref, delta in zip(params, state["ref"], deltas):
                if delta is not None:
                    p.copy_(ref + delta * scale)
        return result


@functools.cache
def trac_class(base: type[th.optim.Optimizer]) -> type[th.optim.Optimizer]:
    """``base`` wrapped by TRAC (the reference's ``start_trac(Base=...)``): the class takes ``base``'s arguments plus
    ``trac_betas`` (default :data:`TRAC_BETAS`), ``trac_s_prev`` (:data:`TRAC_S_PREV`) and ``trac_eps``
    (:data:`TRAC_EPS`). The same class is returned for the same ``base``.

    :raises ValueError: for a class that is not a torch optimizer, or ``LBFGS`` (it needs a closure).
    """
    if not (isinstance(base, type) and issubclass(base, th.optim.Optimizer)) or issubclass(base, th.optim.LBFGS):
        raise ValueError(f"TRAC wraps a torch optimizer class whose step needs no closure, got {base!r}")
    if issubclass(base, TRACMixin):
        return base

    def __init__(self: Any, params: Any, *args: Any, trac_betas: Sequence[float] = TRAC_BETAS,
                 trac_s_prev: float = TRAC_S_PREV, trac_eps: float = TRAC_EPS, **kwargs: Any) -> None:
        base.__init__(self, params, *args, **kwargs)
        self._init_trac(trac_betas, trac_s_prev, trac_eps)

    name = f"TRAC{base.__name__}"
    doc = f"``{base.__module__}.{base.__qualname__}`` wrapped by TRAC (see :mod:`sb3_plastic.trac`)."
    cls = type(name, (TRACMixin, base), {"__init__": __init__, "__doc__": doc, "__module__": __name__})
    cls.__qualname__ = name
    return cls


#: TRAC over torch's Adam, the paper's optimizer.
TRACAdam = trac_class(th.optim.Adam)
