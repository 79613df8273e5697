"""What the plasticity mechanisms mean for recurrent layers (``nn.LSTM``; ``nn.GRU`` / ``nn.RNN`` alike).

An LSTM (Hochreiter & Schmidhuber, 1997, "Long Short-Term Memory", Neural Computation 9(8)) of hidden size
``H`` keeps, for each layer ``l``, the matrices of its four gates (input ``i``, forget ``f``, cell ``g``,
output ``o``, in PyTorch's order) stacked along the rows of two tensors:

* ``weight_ih_l{l}`` ``(4H, in)``: the gates' input weights, ``in`` = input size (``H`` above layer 0);
* ``weight_hh_l{l}`` ``(4H, H)``: the gates' recurrent weights (``H`` = ``proj_size`` with a projection);
* ``bias_ih_l{l}``, ``bias_hh_l{l}`` ``(4H,)`` and, with ``proj_size > 0``, ``weight_hr_l{l}`` ``(P, H)``.

Each gate is a linear map followed by its own nonlinearity (sigmoid / tanh), so the matrix the isometry
argument of Rosseau, Müller & Nowé (2026) is about is a gate *block* ``(H, in)`` / ``(H, H)``, not the
stacked ``(4H, in)`` tensor (which could only be an isometry if the four gates were mutually orthogonal
maps; nothing in the gate structure asks for that). The definitions used by sb3_plastic:

* **Isometry penalty / AdamO**: ``R = sum_gates R(W_gate)`` for ``weight_ih`` and ``weight_hh`` (each gate
  block regularised on its own, see :func:`sb3_plastic.isometry.isometry_penalty` with ``blocks=4``);
  ``weight_hr`` (a plain projection) is one block; biases are untouched. The plastic recurrent policies put
  the LSTM matrices in an AdamO param group with ``isometry_blocks=4`` (hidden layers: the LSTMs are hidden
  layers, never output heads).
* **FIRE** (ICLR 2026, arXiv 2602.08040): each gate block is replaced by its own Newton–Schulz polar factor
  and scaled as the reference scales a Linear layer, ``sqrt(out / in)`` with ``out = H`` (the block's rows):
  the recurrent blocks ``(H, H)`` become exactly orthogonal, the input blocks get singular values
  ``sqrt(H / in)``. Biases are untouched, the optimizer state of the rewritten matrices is dropped.
* **Orthogonal initialisation** (``orthogonal_init=True`` / MaxMin): every gate block orthogonal with gain
  ``sqrt(isometry_scale)``, biases zero. Otherwise an LSTM keeps PyTorch's initialisation
  ``U(-1/sqrt(H), 1/sqrt(H))`` on every weight and bias: SB3's ``ortho_init`` does not reach the LSTMs
  (sb3-contrib's ``RecurrentActorCriticPolicy`` creates them after SB3's ``_build``, which applies it).
* **Shrink & Perturb**: ``theta <- lambda theta + p theta_fresh`` on every LSTM weight and bias, with
  ``theta_fresh`` a fresh draw of the initialisation above (:func:`fresh_recurrent_parameters`); the
  continual form adds decay and noise to every LSTM parameter as to Linear layers.
* **Continual Backprop / ReDo**: units of the LSTM itself are *not* replaced. A unit of an LSTM is a cell
  ``j``: replacing it would mean fresh rows ``j`` in all four gate blocks of ``weight_ih`` and ``weight_hh``,
  zero biases, and zero outgoing weights in the next layers *and* in column ``j`` of ``weight_hh`` (the
  recurrent input from ``h_j``); its utility would be measured on the LSTM output over whole sequences.
  sb3_plastic does not do this surgery (yet): the LSTM is left out of unit resets, and so are the layers in
  front of it (a features extractor's layers, whose outgoing weights are the LSTM's input columns).
  Generate-and-test and ReDo act on the MLP layers after the LSTM (``mlp_extractor`` and, without a critic
  LSTM, the critic's Linear ``critic``); :func:`sb3_plastic.common.surgery.find_networks` says which.
"""

from __future__ import annotations

import math
from typing import Any, Union

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from sb3_plastic.isometry import as_blocks

#: Stacked gate blocks per weight matrix, by ``nn.RNNBase.mode``.
GATE_BLOCKS: dict[str, int] = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
#: Initialisers of recurrent layers: PyTorch's default or per-gate-block orthogonal.
RECURRENT_INITS: tuple[str, ...] = ("default", "orthogonal")


def gate_blocks(module: nn.RNNBase) -> int:
    """Number of gate blocks stacked in ``weight_ih`` / ``weight_hh`` of a recurrent layer (LSTM: 4, GRU: 3)."""
    if not isinstance(module, nn.RNNBase):
        raise TypeError(f"gate_blocks expects nn.LSTM / nn.GRU / nn.RNN, got {type(module).__name__}")
    if module.mode not in GATE_BLOCKS:
        raise ValueError(f"Unknown recurrent mode {module.mode!r}; known: {sorted(GATE_BLOCKS)}")
    return GATE_BLOCKS[module.mode]


def recurrent_weights(module: nn.RNNBase) -> list[tuple[str, nn.Parameter, int]]:
    """``(name, parameter, blocks)`` of every weight matrix of a recurrent layer, in registration order:
    ``weight_ih_l*`` and ``weight_hh_l*`` (``blocks`` = :func:`gate_blocks`), ``weight_hr_l*`` (1 block).
    Biases are not listed."""
    gates = gate_blocks(module)
    out = []
    for name, param in module.named_parameters(recurse=False):
        if name.startswith(("weight_ih", "weight_hh")):
            out.append((name, param, gates))
        elif name.startswith("weight_hr"):
            out.append((name, param, 1))
    return out


def recurrent_modules(module: nn.Module) -> list[nn.RNNBase]:
    """Every ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` inside ``module`` (itself included), in registration order."""
    return [m for m in module.modules() if isinstance(m, nn.RNNBase)]


def _check_init(init: str) -> None:
    if init not in RECURRENT_INITS:
        raise ValueError(f"Unknown recurrent init {init!r}; allowed: {list(RECURRENT_INITS)}")


@th.no_grad()
def fresh_recurrent_parameters(module: nn.RNNBase, init: str = "default", gain: float = 1.0) -> dict[str, th.Tensor]:
    """A fresh draw of a recurrent layer's initialisation, per parameter name (the layer is not modified).

    * ``"default"``: PyTorch's ``nn.RNNBase.reset_parameters``, ``U(-1/sqrt(H), 1/sqrt(H))`` on every weight
      and bias, drawn in the same order (under the same torch seed the result equals a reset copy).
    * ``"orthogonal"``: every gate block of every weight matrix orthogonal with ``gain``
      (``torch.nn.init.orthogonal_`` per block), biases zero.

    :param module: the recurrent layer.
    :param init: ``"default"`` or ``"orthogonal"``.
    :param gain: gain of the orthogonal initialisation.
    """
    _check_init(init)
    blocks = {name: b for name, _, b in recurrent_weights(module)}
    out: dict[str, th.Tensor] = {}
    stdv = 1.0 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0.0
    for name, param in module.named_parameters(recurse=False):
        fresh = th.empty_like(param, memory_format=th.contiguous_format)
        if init == "default":
            fresh.uniform_(-stdv, stdv)
        elif name in blocks:
            for block in as_blocks(fresh, blocks[name]):
                nn.init.orthogonal_(block, gain=gain)
        else:
            fresh.zero_()
        out[name] = fresh
    return out


@th.no_grad()
def orthogonal_recurrent_init_(module: nn.RNNBase, gain: float = 1.0) -> nn.RNNBase:
    """Per-gate-block orthogonal weights with ``gain`` and zero biases, written in place (Parameters kept)."""
    for name, fresh in fresh_recurrent_parameters(module, "orthogonal", gain).items():
        getattr(module, name).copy_(fresh)
    return module


def recurrent_init_scheme(model: Union[BaseAlgorithm, nn.Module]) -> tuple[str, float]:
    """How a model's policy initialised its recurrent layers, as ``(init, gain)``: ``("orthogonal",
    sqrt(isometry_scale))`` for a plastic policy with orthogonal initialisation, else ``("default", 1.0)``
    (SB3's ``ortho_init`` never reaches sb3-contrib's LSTMs).

    :param model: an SB3 algorithm or its policy.
    """
    policy: Any = model.policy if isinstance(model, BaseAlgorithm) else model
    config = getattr(policy, "isometry_config", None)
    if config is not None and config.use_orthogonal_init:
        return "orthogonal", math.sqrt(config.isometry_scale)
    return "default", 1.0


def lstm_first_step(lstm: nn.LSTM, inputs: th.Tensor) -> th.Tensor:
    """Output ``h_1`` of an ``nn.LSTM`` for a batch of single inputs ``(N, in)`` from zero states, computed from
    the layer's parameters with plain tensor operations (no fused LSTM kernel).

    From ``h_0 = c_0 = 0``: ``c_1 = sigmoid(i) * tanh(g)``, ``h_1 = sigmoid(o) * tanh(c_1)`` with the gate
    pre-activations ``W_ih x + b_ih + b_hh`` (the recurrent term vanishes), layer after layer, ``h_1`` projected
    by ``weight_hr`` when the LSTM has one. Equal (up to rounding) to ``lstm(inputs[None])[0][0]``; unlike the
    fused kernel it can be differentiated under ``torch.func.vmap`` (per-sample Jacobians, the NTK of the
    diagnostics). The parameters are read at call time, so ``torch.func.functional_call`` can swap them.

    :param lstm: a unidirectional ``nn.LSTM``.
    :param inputs: ``(N, input_size)``.
    :return: ``(N, hidden_size)`` (``proj_size`` with a projection).
    """
    if not isinstance(lstm, nn.LSTM) or lstm.bidirectional:
        raise TypeError("lstm_first_step needs a unidirectional nn.LSTM")
    h = inputs
    for layer in range(lstm.num_layers):
        gates = h @ getattr(lstm, f"weight_ih_l{layer}").T
        if lstm.bias:
            gates = gates + getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        i, _, g, o = gates.chunk(4, dim=-1)  # the forget gate multiplies c_0 = 0
        h = th.sigmoid(o) * th.tanh(th.sigmoid(i) * th.tanh(g))
        if lstm.proj_size > 0:
            h = h @ getattr(lstm, f"weight_hr_l{layer}").T
    return h
