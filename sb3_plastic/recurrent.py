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
* **FIRE** (ICLR 2026, arXiv 2602.08040): each gate block is replaced by its own polar factor (exact, by SVD; the
  reference's Newton–Schulz with ``fire_iterations``) and scaled as the reference scales a Linear layer,
  ``sqrt(out / in)`` with ``out = H`` (the block's rows): the recurrent blocks ``(H, H)`` become exactly orthogonal,
  the input blocks get singular values ``sqrt(H / in)``. Biases are untouched, the optimizer state of the rewritten
  matrices is dropped.
* **Orthogonal initialisation** (``orthogonal_init=True`` / MaxMin): every gate block orthogonal with gain
  ``sqrt(isometry_scale)``, biases zero. Otherwise an LSTM keeps PyTorch's initialisation
  ``U(-1/sqrt(H), 1/sqrt(H))`` on every weight and bias: SB3's ``ortho_init`` does not reach the LSTMs
  (sb3-contrib's ``RecurrentActorCriticPolicy`` creates them after SB3's ``_build``, which applies it).
* **Shrink & Perturb**: ``theta <- lambda theta + p theta_fresh`` on every LSTM weight and bias, with
  ``theta_fresh`` a fresh draw of the initialisation above (:func:`fresh_recurrent_parameters`); the
  continual form adds decay and noise to every LSTM parameter as to Linear layers.
* **Continual Backprop / ReDo**: a unit of an LSTM layer is a cell ``j`` (its output ``h_j``). Replacing it
  (:func:`sb3_plastic.common.unit_reset.replace_cells_`): fresh rows ``j, H+j, 2H+j, 3H+j`` (all four gate
  blocks) of ``weight_ih`` and ``weight_hh`` from the LSTM's own initialiser (:func:`fresh_gate_rows` with
  :func:`recurrent_init_scheme`: PyTorch's uniform draw, or per gate block orthogonal rows), zero biases
  ``bias_ih`` / ``bias_hh`` in those rows, zero outgoing weights: column ``j`` of ``weight_hh`` (all ``4H`` rows,
  the recurrent input from ``h_j``), of the next LSTM layer's ``weight_ih`` (below the top layer) and of the
  layers reading the LSTM output (the first Linear layers after it: ``mlp_extractor`` policy / value layers or
  the heads); the Adam / AdamO state of exactly those rows / columns restarted (moments and per-element step,
  :mod:`sb3_plastic.adam_restart`). Continual Backprop moves the
  removed cell's mean contribution into the readers' biases, ``b += W[:, j] * f_j`` (the consumers' biases and
  the next layer's ``bias_ih``) but not into ``bias_hh``: the recurrent input from ``h_j`` is absent at every
  episode start (zero state), so a constant there would add a gate input the old network never had at those
  steps; the recurrence simply loses the (low-utility) cell. ReDo absorbs nothing, as for Linear units.
  Consequence: at the first step from zero states the network after a Continual Backprop replacement equals
  the network before with ``h_j`` replaced by ``f_j`` (tested).

  *Utility* (Continual Backprop): the contribution utility of ``h_j``, ``mean|h_j| * mean_k |W_out[k, j]|``,
  where ``W_out`` pools every weight reading ``h_j``: the readers' columns *and* column ``j`` of ``weight_hh``
  (a cell used only through the recurrence is useful; the recurrent weights are as much ``h_j``'s outgoing
  weights as the next layer's); the adaptable variant divides by the mean ``|W_in|`` over the cell's ``4``
  gate rows of ``weight_ih`` and ``weight_hh``. ``mean|h_j|`` is taken over the minibatch's sequence steps of
  ``train()``: a forward hook on the ``nn.LSTM`` (training mode, autograd on) records the output
  ``(L, N, H)`` (lower layers of a multi-layer LSTM are recomputed from the same inputs and initial states,
  :func:`lstm_layer_outputs`), and the padding steps that sb3-contrib's ``RecurrentRolloutBuffer`` adds to
  equalise sequence lengths are dropped with the minibatch's ``rollout_data.mask``, which the Continual
  Backprop callback reads by wrapping the buffer's ``_get_samples`` during training. *Dormancy* (ReDo): the
  ReDo score of ``h_j`` on the probe batch, each probe observation as the first step of an episode from zero
  states (:func:`lstm_first_step_layers`), as the rest of the recurrent policy is probed.

  The layers *in front of* the LSTM (a features extractor's Linear / Conv layers) are hidden layers like any
  other (:attr:`sb3_plastic.common.surgery.NetworkSpec.extractor_paths`): the outgoing weights of the extractor's
  last layer are columns of ``weight_ih_l0`` (all ``4H`` rows, every gate block) of each LSTM reading it
  (``lstm_actor``; ``lstm_critic`` when it reads the same features), through the NCHW flatten for a CNN
  (channel ``c`` owns columns ``c*P .. c*P+P-1``, ``P = H*W``), read through a
  :class:`~sb3_plastic.common.surgery.Consumer` of ``weight_ih_l0`` / ``bias_ih_l0``. A replaced unit gets
  fresh incoming weights and a zero bias, those columns are zeroed (moments too), Continual Backprop absorbs
  the mean contribution into ``bias_ih_l0`` (``b += W_ih[:, cols] @ f``, exact at every step: the input term
  sits outside the gate nonlinearities like a Linear consumer's) and its utility uses ``|W_ih|`` over those
  columns. The MLP layers after the LSTM are replaced as in any actor-critic policy.
  :func:`sb3_plastic.common.surgery.find_networks` says which layers are which
  (:meth:`~sb3_plastic.common.surgery.NetworkSpec.recurrent_units` for the cells). Only unidirectional
  ``nn.LSTM`` layers without projection are supported (sb3-contrib builds nothing else); GRUs are skipped.
"""

from __future__ import annotations

import math
from typing import Any, Union

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from sb3_plastic.common.unit_reset import fresh_gate_rows
from sb3_plastic.isometry import as_blocks

__all__ = ["fresh_gate_rows"]  # defined with the other unit surgery; importable from here as before

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


@th.no_grad()
def lstm_layer_outputs(lstm: nn.LSTM, inputs: th.Tensor, states: Any = None) -> list[th.Tensor]:
    """Output sequences of every layer of a unidirectional, time-major ``nn.LSTM`` (``nn.LSTM`` itself returns only
    the top layer's), recomputed layer by layer with the fused kernel, without autograd.

    :param inputs: ``(L, N, input_size)`` (or ``(L, input_size)``).
    :param states: ``(h_0, c_0)`` of shape ``(num_layers, N, H)`` as given to the LSTM, or ``None`` (zeros).
    :return: one ``(L, N, H)`` tensor per layer.
    """
    x = inputs
    outs = []
    for layer in range(lstm.num_layers):
        params = [getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")]
        if lstm.bias:
            params += [getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")]
        if states is None:
            shape = (1, *x.shape[1:-1], lstm.hidden_size)
            hx = (x.new_zeros(shape), x.new_zeros(shape))
        else:
            hx = (states[0][layer : layer + 1], states[1][layer : layer + 1])
        x, _, _ = th.lstm(x, hx, params, lstm.bias, 1, 0.0, False, False, False)
        outs.append(x)
    return outs


def lstm_first_step_layers(lstm: nn.LSTM, inputs: th.Tensor) -> list[th.Tensor]:
    """:func:`lstm_first_step` for every layer: the first-step outputs ``h_1`` of each layer, bottom to top."""
    if not isinstance(lstm, nn.LSTM) or lstm.bidirectional:
        raise TypeError("lstm_first_step needs a unidirectional nn.LSTM")
    h = inputs
    outs = []
    for layer in range(lstm.num_layers):
        gates = h @ getattr(lstm, f"weight_ih_l{layer}").T
        if lstm.bias:
            gates = gates + getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        i, _, g, o = gates.chunk(4, dim=-1)  # the forget gate multiplies c_0 = 0
        h = th.sigmoid(o) * th.tanh(th.sigmoid(i) * th.tanh(g))
        if lstm.proj_size > 0:
            h = h @ getattr(lstm, f"weight_hr_l{layer}").T
        outs.append(h)
    return outs


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
    return lstm_first_step_layers(lstm, inputs)[-1]
