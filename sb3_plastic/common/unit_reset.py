"""Replacing hidden units: the one operation behind Continual Backprop and ReDo.

Continual Backprop (Dohare et al., 2024, Nature) and ReDo (Sokar et al., 2023, ICML) differ in *which* units they
replace (lowest utility vs dormant) and in one detail of *how*: Continual Backprop moves the removed unit's mean
contribution into the readers' biases, ReDo does not. Everything else is the same operation, defined here once:

* **Linear / Conv2d unit** (:func:`replace_units_`, on a :class:`~sb3_plastic.common.surgery.HiddenLayer`):
  fresh incoming weights (rows drawn by the caller from the layer's own initialiser: :func:`fresh_incoming_weights`
  or a full fresh draw such as :func:`sb3_plastic.callbacks.redo.default_layer_init`), zero bias, zero outgoing
  weights (the matching input columns of every consumer; at a conv -> linear NCHW flatten channel ``c`` owns
  columns ``c*P .. c*P+P-1``; an LSTM reading a features extractor: the columns of its ``weight_ih_l0``), with the
  optional bias absorption ``b_next += W_out[:, j] * f_j`` before the columns are zeroed; a normalisation layer of
  the unit (CrossQ's BatchRenorm) gets that feature's initial state (:func:`reset_norm_features_`, and the
  absorption reads the norm's output ``gain_j * f_j + shift_j``); a layer norm between the layer and its activation
  (NaP's) gets the unit's scale 1 and offset 0 (:func:`unit_norms`). When several layers are replaced in one step,
  :func:`zero_outgoing_last_` zeroes every replaced unit's outgoing weights again at the end (a consumer's fresh row
  must not re-open them).
* **LSTM cell** (:func:`replace_cells_`, on a :class:`~sb3_plastic.common.surgery.RecurrentUnits`): fresh gate rows
  ``j, H+j, 2H+j, 3H+j`` (:func:`fresh_gate_rows`), zero biases in those rows, zero column ``j`` of every reader,
  the optional absorption into the readers' biases (not ``bias_hh``); see :mod:`sb3_plastic.recurrent`.
* **Optimizer state** of every touched row / column / entry, in every optimizer holding the tensor
  (:func:`reset_moments_`, :func:`sb3_plastic.optim.reset_optimizer_state`): moments zeroed and, for Adam and its
  subclasses, the entries' step count restarted, so the new unit is trained exactly as a freshly initialised Adam
  entry (:mod:`sb3_plastic.adam_restart`).

The unit statistics (ages, utilities, scores) stay with the methods.

Under a layer norm between the layer and its activation (Normalize-and-Project) a replacement is not confined to the
replaced unit: the norm's mean and variance are taken over all units of the layer, so the fresh incoming row moves
every other unit's normalised output as well (zero outgoing weights silence only the new unit itself). This is
inherent to combining unit resets with a layer norm, not a defect of the operation; running-statistics norms
(BatchNorm, BatchRenorm) are per feature and have no such coupling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Optional, Union

import torch as th
from torch import nn

from sb3_plastic.adam_restart import enable_restart, supports_restart
from sb3_plastic.common.surgery import Consumer, HiddenLayer, RecurrentUnits, _norm_tensors, norm_affine
from sb3_plastic.isometry import as_blocks

#: Initialisers of new units: ``"default"`` (PyTorch's default Linear / Conv2d / LSTM init), ``"orthogonal"`` or
#: ``"lecun"`` (LeCun uniform, Dohare et al.'s ``init='lecun'``).
INITS: tuple[str, ...] = ("default", "orthogonal", "lecun")


def lecun_uniform_(tensor: th.Tensor, fan_in: int, gain: float = 1.0) -> th.Tensor:
    """Fill ``tensor`` in place with ``U(-b, b)``, ``b = gain * sqrt(3 / fan_in)`` (variance ``gain^2 / fan_in``):
    LeCun uniform, the ``init='lecun'`` of Dohare et al.'s reference code (``get_layer_bound`` in
    shibhansh/loss-of-plasticity ``lop/utils/miscellaneous.py``), their RL runs' initialiser of every layer and of
    Continual Backprop's new units."""
    bound = gain * math.sqrt(3.0 / fan_in) if fan_in > 0 else 0.0
    return tensor.uniform_(-bound, bound)


def _check_init(init: str) -> None:
    if init not in INITS:
        raise ValueError(f"Unknown init {init!r}; allowed: {list(INITS)}")


# ---------------------------------------------------------------------------------------------- optimizer state
def unique_optimizers(optimizers: Iterable[Optional[th.optim.Optimizer]]) -> list[th.optim.Optimizer]:
    """The optimizers of ``optimizers`` without ``None``, each once, in order."""
    return list({id(o): o for o in optimizers if o is not None}.values())


def enable_unit_restarts(optimizers: Iterable[Optional[th.optim.Optimizer]]) -> None:
    """Give every Adam-family optimizer of ``optimizers`` per-element restarts
    (:func:`sb3_plastic.adam_restart.enable_restart`; others are left alone). The callbacks call it at training
    start, so that an optimizer rebuilt by SB3's ``load`` continues the restarts saved in its state."""
    for opt in unique_optimizers(optimizers):
        if supports_restart(opt):
            enable_restart(opt)


def reset_moments_(optimizers: Iterable[Optional[th.optim.Optimizer]], param: th.Tensor, index: th.Tensor, dim: int) -> None:
    """Restart the optimizer state of the entries ``index`` along ``dim`` of ``param`` in every optimizer of
    ``optimizers`` that holds it (:func:`sb3_plastic.optim.reset_optimizer_state`: moments zeroed, Adam's
    per-element step restarted)."""
    from sb3_plastic.optim import reset_optimizer_state  # optim imports the surgery module's neighbours

    for opt in unique_optimizers(optimizers):
        if any(param is p for group in opt.param_groups for p in group["params"]):
            reset_optimizer_state(opt, param, index, dim)


# ---------------------------------------------------------------------------------------------- fresh weights
def fresh_orthogonal_rows(matrix: th.Tensor, rows: th.Tensor, gain: float = 1.0) -> th.Tensor:
    """Orthogonal rows for ``rows`` of a matrix ``(n_out, fan_in)``, float32, shape ``(len(rows), fan_in)``.

    Wide or square (``n_out <= fan_in``, rows can be orthonormal): rows of norm ``gain``, orthonormal to each other
    and to the span of the rows that are kept, so the new rows add singular values exactly ``gain`` and leave the
    others untouched (an isometric layer stays isometric). The Gaussian draw is float32 (the same random numbers
    as before), the projections and the QR are computed in float64: in float32 an unlucky draw with a small part
    outside the kept rows' span left the new rows orthogonal only to ~1e-3. Tall (``n_out > fan_in``, an orthogonal
    init has orthonormal *columns*): the rows of a fresh ``orthogonal_(gain)`` matrix of the full shape.
    """
    n_out, fan_in = matrix.shape
    device = matrix.device
    k = int(rows.numel())
    if k == 0:
        return th.empty(0, fan_in, device=device)
    if n_out > fan_in:
        full = th.empty(n_out, fan_in, device=device)
        nn.init.orthogonal_(full, gain=gain)
        return full[rows]
    keep = th.ones(n_out, dtype=th.bool, device=device)
    keep[rows] = False
    draw = th.randn(k, fan_in, device=device).double()
    kept = matrix[keep].double()
    if kept.shape[0] > 0:
        basis, _ = th.linalg.qr(kept.T)  # (fan_in, n_kept), orthonormal columns spanning the kept rows
        for _ in range(2):  # project twice: "twice is enough" for numerical orthogonality
            draw = draw - (draw @ basis) @ basis.T
    q, r = th.linalg.qr(draw.T)  # (fan_in, k)
    signs = th.sign(th.diagonal(r))
    signs[signs == 0] = 1.0
    return ((q * signs).T * gain).float()


def fresh_incoming_weights(weight: th.Tensor, rows: th.Tensor, init: str = "default", gain: float = 1.0) -> th.Tensor:
    """Fresh incoming weights for the output rows ``rows`` of a Linear / Conv2d ``weight``.

    * ``"default"``: PyTorch's default init of a fresh layer of the same shape,
      ``kaiming_uniform_(a=sqrt(5))``, i.e. ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (what SB3's DQN, SAC, TQC,
      QR-DQN and non-orthogonal PPO layers are built with). ``gain`` is ignored.
    * ``"orthogonal"``: on the matrix view ``(out, fan_in)`` of the weight, :func:`fresh_orthogonal_rows`:
      for a wide or square layer rows of norm ``gain`` orthonormal to each other and to the kept rows (replacing
      units never moves an isometric layer away from isometry), for a tall layer the rows of a fresh
      ``orthogonal_(gain)`` matrix of the full shape.
    * ``"lecun"``: :func:`lecun_uniform_`, ``U(-gain * sqrt(3 / fan_in), gain * sqrt(3 / fan_in))`` with ``fan_in``
      the inputs of one output row (``in * kh * kw`` for a convolution).

    :param weight: the layer's weight ``(out, in)`` or ``(out, in, kh, kw)``.
    :param rows: indices of the output rows to draw.
    :param init: ``"default"``, ``"orthogonal"`` or ``"lecun"``.
    :param gain: gain of the orthogonal and LeCun inits.
    :return: a tensor of shape ``(len(rows), *weight.shape[1:])`` on the weight's device and dtype.
    """
    _check_init(init)
    rows = rows.to(weight.device).long()
    k = int(rows.numel())
    shape = (k, *weight.shape[1:])
    with th.no_grad():
        if init == "default":
            out = th.empty(shape, device=weight.device, dtype=weight.dtype)
            if k:
                nn.init.kaiming_uniform_(out, a=math.sqrt(5))
            return out
        if init == "lecun":
            return lecun_uniform_(th.empty(shape, device=weight.device, dtype=weight.dtype), weight[0].numel(), gain)
        matrix = weight.detach().reshape(weight.shape[0], -1).float()
        return fresh_orthogonal_rows(matrix, rows, gain).reshape(shape).to(weight.dtype)


@th.no_grad()
def fresh_gate_rows(weight: th.Tensor, cells: th.Tensor, init: str = "default", gain: float = 1.0) -> th.Tensor:
    """Fresh rows for ``cells`` in every gate block of a stacked LSTM matrix ``weight`` ``(4H, in)``: the rows
    ``j, H+j, 2H+j, 3H+j`` of each cell ``j``, drawn from the LSTM's initialiser (the layer is not modified).

    * ``"default"``: PyTorch's ``U(-1/sqrt(H), 1/sqrt(H))``.
    * ``"orthogonal"``: per gate block ``(H, in)``, as a Linear layer's new units are drawn
      (:func:`fresh_orthogonal_rows`): for a wide or square block (``H <= in``, the recurrent blocks) rows of norm
      ``gain``, orthogonal to each other and to the block's kept rows, so an orthogonal block stays orthogonal; for
      a tall block the rows of a fresh ``orthogonal_(gain)`` block.
    * ``"lecun"``: :func:`lecun_uniform_` with ``fan_in = in``, every gate row.

    :return: ``(4 * len(cells), in)``, block by block (gate 0's rows of every cell first), matching the row order
        of :meth:`sb3_plastic.common.surgery.RecurrentUnits.gate_rows`.
    """
    _check_init(init)
    n_rows, fan_in = weight.shape
    hidden = n_rows // 4
    cells = cells.to(weight.device).long().flatten()
    k = int(cells.numel())
    if init == "default":
        stdv = 1.0 / math.sqrt(hidden) if hidden > 0 else 0.0
        return th.empty(4 * k, fan_in, device=weight.device, dtype=weight.dtype).uniform_(-stdv, stdv)
    if init == "lecun":
        return lecun_uniform_(th.empty(4 * k, fan_in, device=weight.device, dtype=weight.dtype), fan_in, gain)
    blocks = as_blocks(weight.detach().float(), 4)
    return th.cat([fresh_orthogonal_rows(block, cells, gain) for block in blocks]).to(weight.dtype)


# ---------------------------------------------------------------------------------------------- units
def features_of(spec: Union[HiddenLayer, RecurrentUnits], units: th.Tensor) -> th.Tensor:
    """Feature (row) indices of ``units``: unit ``u`` is features ``u*g .. u*g+g-1`` (``g = spec.group_size``, 2
    for a MaxMin pair)."""
    g = spec.group_size
    if g == 1:
        return units
    return (units.view(-1, 1) * g + th.arange(g, device=units.device).view(1, -1)).flatten()


def consumer_columns(consumer: Consumer, features: th.Tensor) -> th.Tensor:
    """Input columns (Conv2d: input channels) of ``consumer`` reading the producer's ``features``."""
    if isinstance(consumer.layer, nn.Conv2d):
        return features + consumer.offset
    return consumer.columns(features)


@th.no_grad()
def zero_outgoing_(
    spec: Union[HiddenLayer, RecurrentUnits],
    features: th.Tensor,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
) -> None:
    """Zero the outgoing weights of ``features`` (every reader's columns) and restart their optimizer state."""
    if isinstance(spec, RecurrentUnits):
        readers = [(w, features.to(w.device).long()) for w, _ in spec.outgoing()]
    else:
        readers = [(c.weight, consumer_columns(c, features.to(c.weight.device).long())) for c in spec.consumers]
    for weight, cols in readers:
        weight.index_fill_(1, cols, 0.0)
        reset_moments_(optimizers, weight, cols, 1)


@th.no_grad()
def _absorb_(hidden: HiddenLayer, features: th.Tensor, mean: th.Tensor) -> None:
    """``b_next += W_out[:, j] * f_j`` for every consumer with a bias (``mean``: ``(k, positions)``, the mean
    activation of ``features`` per spatial position; one position for a Linear layer)."""
    norm = hidden.norm
    if norm is not None and hidden.norm_after_activation:
        # the consumers read the norm's output: its mean is the norm's map of the mean activation
        gain, shift = norm_affine(norm)
        mean = gain[features].to(mean.device)[:, None] * mean + shift[features].to(mean.device)[:, None]
    for consumer in hidden.consumers:
        # a Linear / Conv2d, or an LSTM reading a features extractor (weight_ih_l0 / bias_ih_l0: every gate block's
        # columns; the absorption is exact at every step, the input term is outside the gates)
        w_next, b_next = consumer.weight, consumer.bias
        if b_next is None:
            continue
        cols = consumer_columns(consumer, features)
        if isinstance(consumer.layer, nn.Conv2d):
            # a constant input map f_bar on channel c adds sum_taps W[k, c] * f_bar to every output position
            # (exact where no zero padding is involved)
            taps = w_next[:, cols].sum(dim=(2, 3))
            b_next.add_((taps.float() @ mean.mean(dim=1)).to(b_next.dtype))
            continue
        p = consumer.columns_per_unit
        if mean.shape[1] == p:
            f_cols = mean.reshape(-1)  # per column: channel c, position q -> column c*P + q
        else:
            f_cols = mean.mean(dim=1).repeat_interleave(p)
        b_next.add_((w_next[:, cols].float() @ f_cols).to(b_next.dtype))


@th.no_grad()
def replace_units_(
    hidden: HiddenLayer,
    features: th.Tensor,
    fresh_rows: th.Tensor,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
    mean_activation: Optional[th.Tensor] = None,
) -> None:
    """Replace the units of a hidden Linear / Conv2d layer owning ``features``, in place (Parameter objects kept).

    With ``mean_activation`` every consumer's bias first absorbs the features' mean contribution (Continual
    Backprop); the outgoing weights are zeroed, the incoming rows set to ``fresh_rows``, the bias entries to zero,
    the features of the unit's normalisation layers reset (:func:`unit_norms`, :func:`reset_norm_features_`), and
    the optimizer state of exactly those rows / columns / entries restarted in every optimizer of ``optimizers``
    holding the tensor (:func:`reset_moments_`).

    :param hidden: the layer with its consumers.
    :param features: feature (row) indices (whole units: :func:`features_of`).
    :param fresh_rows: the new incoming weights, ``(len(features), *weight.shape[1:])``.
    :param optimizers: optimizers whose state of the touched entries is restarted.
    :param mean_activation: ``(len(features), positions)`` mean activation per feature (and spatial position of a
        conv layer) to absorb into the consumers' biases, or ``None`` (no absorption: ReDo).
    """
    layer = hidden.layer
    features = features.to(layer.weight.device).long()
    if features.numel() == 0:
        return
    optimizers = unique_optimizers(optimizers)
    if mean_activation is not None:
        _absorb_(hidden, features, mean_activation.to(layer.weight.device).float())
    zero_outgoing_(hidden, features, optimizers)
    layer.weight[features] = fresh_rows.to(layer.weight.dtype)
    reset_moments_(optimizers, layer.weight, features, 0)
    if getattr(layer, "bias", None) is not None:
        layer.bias[features] = 0.0
        reset_moments_(optimizers, layer.bias, features, 0)
    for norm in unit_norms(hidden):  # the fresh unit starts with its norms' initial statistics and affine
        reset_norm_features_(norm, features, optimizers)


def unit_norms(hidden: HiddenLayer) -> list[nn.Module]:
    """The normalisation layers with per-unit state that a replaced unit of ``hidden`` gets reset: its
    :attr:`~sb3_plastic.common.surgery.HiddenLayer.norm` (running statistics, scale, shift) and a layer norm
    between the layer and its activation (:attr:`~sb3_plastic.common.surgery.HiddenLayer.pre_norm`, NaP's
    ``nn.LayerNorm`` / ``ChannelLayerNorm``: its scale and offset of the unit's features, when they are indexed by
    the layer's features). Each once."""
    found: dict[int, nn.Module] = {}
    if hidden.norm is not None:
        found[id(hidden.norm)] = hidden.norm
    pre = hidden.pre_norm
    if isinstance(pre, nn.LayerNorm) and pre.weight is not None and pre.weight.shape[0] == hidden.n_features:
        found.setdefault(id(pre), pre)
    return list(found.values())


@th.no_grad()
def zero_outgoing_last_(
    replaced: Iterable[tuple[Union[HiddenLayer, RecurrentUnits], th.Tensor]],
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
) -> None:
    """The last pass of a step that replaced units in several layers: zero the outgoing weights of every
    replaced unit again (and restart their optimizer state, :func:`zero_outgoing_`). Layers are replaced one
    after another, and a fresh incoming row of a consumer replaced after its producer would otherwise re-open a
    replaced unit's outgoing columns; a new unit must start with zero outgoing weights (Dohare et al., 2024;
    Sokar et al., 2023, whose reference draws all incoming weights before zeroing the outgoing ones).

    :param replaced: ``(layer, feature indices)`` per replaced layer (LSTM cells: cell indices).
    :param optimizers: optimizers whose state of the touched columns is restarted.
    """
    optimizers = unique_optimizers(optimizers)
    for spec, features in replaced:
        if features.numel():
            zero_outgoing_(spec, features, optimizers)


@th.no_grad()
def replace_cells_(
    units: RecurrentUnits,
    cells: th.Tensor,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
    init: str = "default",
    gain: float = 1.0,
    mean_activation: Optional[th.Tensor] = None,
) -> th.Tensor:
    """Replace LSTM cells in place (Continual Backprop, ReDo; definition in :mod:`sb3_plastic.recurrent`).

    For each cell ``j``: with ``mean_activation`` (``f``, one value per cell), every reader with a bias absorbs
    the cell's mean contribution, ``b += W[:, j] * f_j`` (the consumers' biases, ``bias_ih`` of the next LSTM
    layer; not the recurrence); rows ``j, H+j, 2H+j, 3H+j`` of ``weight_ih`` and ``weight_hh`` are drawn afresh
    (:func:`fresh_gate_rows` with ``init`` / ``gain``), those rows of ``bias_ih`` and ``bias_hh`` set to zero;
    column ``j`` of every reader (consumers, next layer's ``weight_ih``, this layer's ``weight_hh``, all ``4H``
    rows) set to zero, last, so the fresh rows leave no recurrent input from a replaced cell. The optimizer state
    of exactly those rows / columns / entries is restarted (:func:`reset_moments_`) in every optimizer of
    ``optimizers`` holding the tensor.

    :param cells: cell indices, or a boolean mask over the ``H`` cells.
    :return: the cell indices replaced.
    """
    weight_ih = units.param("weight_ih")
    device = weight_ih.device
    cells = th.as_tensor(cells, device=device)
    cells = (cells.nonzero().flatten() if cells.dtype == th.bool else cells).long().flatten()
    if cells.numel() == 0:
        return cells
    opts = unique_optimizers(optimizers)
    if mean_activation is not None:
        f = mean_activation.reshape(-1).to(device=device, dtype=th.float32)
        for weight, bias in units.outgoing():
            if bias is not None:
                bias.add_((weight[:, cells].float() @ f).to(bias.dtype))
    rows = units.gate_rows(cells)
    for weight in units.incoming():
        weight[rows] = fresh_gate_rows(weight, cells, init, gain)
        reset_moments_(opts, weight, rows, 0)
    for bias in units.biases():
        bias[rows] = 0.0
        reset_moments_(opts, bias, rows, 0)
    zero_outgoing_(units, cells, opts)
    return cells


@th.no_grad()
def reset_norm_features_(
    norm: nn.Module, features: th.Tensor, optimizers: Iterable[Optional[th.optim.Optimizer]] = ()
) -> None:
    """Give ``features`` of a normalisation layer their initial state, in place: running mean 0, running
    variance 1, scale 1, shift 0; the optimizer state of those scale / shift entries is restarted
    (:func:`reset_moments_`) in every optimizer of ``optimizers`` that holds them. The layer-wide warm-up / batch
    counter is left alone (the other features keep their statistics). Used when hidden units are replaced
    (Continual Backprop, ReDo): a fresh unit must not be normalised with the statistics of the unit it replaces.

    A layer norm (``nn.LayerNorm``, NaP's ``ChannelLayerNorm``) has no running statistics: its scale and offset
    entries of ``features`` (indexed along their first dimension) go back to 1 and 0.

    :param norm: a :data:`~sb3_plastic.common.surgery.NORM_TYPES` module or an ``nn.LayerNorm``.
    :param features: feature indices (or a boolean mask).
    :param optimizers: optimizers whose state of the touched entries is restarted.
    """
    if isinstance(norm, nn.LayerNorm):
        mean = var = None
        scale, shift = norm.weight, norm.bias
        if scale is None and shift is None:  # elementwise_affine=False: nothing per unit
            return
    else:
        mean, var, scale, shift, _ = _norm_tensors(norm)
    some = next(t for t in (mean, scale, shift) if t is not None)
    idx = th.as_tensor(features, device=some.device)
    idx = (idx.nonzero().flatten() if idx.dtype == th.bool else idx).long()
    if idx.numel() == 0:
        return
    if mean is not None and var is not None:
        mean[idx] = 0.0
        var[idx] = 1.0
    for param, value in ((scale, 1.0), (shift, 0.0)):
        if param is not None:
            param[idx] = value
            reset_moments_(optimizers, param, idx, 0)
