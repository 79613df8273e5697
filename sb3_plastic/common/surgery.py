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

Per-feature normalisation layers with running statistics (:data:`NORM_TYPES`: sb3-contrib's
``BatchRenorm1d`` of CrossQ, torch's ``BatchNorm1d``/``BatchNorm2d``) sitting in the same ``nn.Sequential``
right after a hidden layer's activation (CrossQ's ``Linear, ReLU, BatchRenorm, Linear``) or right after the
layer itself (``Linear, BatchNorm, ReLU``) belong to that layer: feature ``j`` of the norm normalises unit
``j``'s output, so :attr:`HiddenLayer.norm` records it and the interventions reset its statistics together
with the unit (:func:`sb3_plastic.common.unit_reset.reset_norm_features_`, :func:`reset_norm_`). A norm in
front of the first layer (CrossQ normalises its input) belongs to no hidden layer and is never touched. Any
normalisation right after a layer, NaP's ``nn.LayerNorm`` included, is also its :attr:`HiddenLayer.pre_norm`: the
activation reads the norm's output, so the units' output is ``act(norm(layer(x)))``
(:meth:`HiddenLayer.post_activation`, what ReDo scores, Continual Backprop records and the diagnostics read).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch as th
from sb3_contrib.common.torch_layers import BatchRenorm
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from torch import nn

from sb3_plastic.activations import MaxMin, doubles_width

LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
#: Per-feature normalisations with running statistics that the interventions know how to reset.
NORM_TYPES: tuple[type[nn.Module], ...] = (BatchRenorm, nn.modules.batchnorm._BatchNorm)


@dataclass
class Consumer:
    """A layer reading the output of a hidden layer.

    :param layer: the consuming Linear / Conv2d.
    :param columns_per_unit: input columns of ``layer`` per output unit of the producer: 1, or ``H*W``
        when a conv feeds a Linear through an NCHW flatten (channel ``c`` owns columns ``c*P .. c*P+P-1``).
    :param offset: index of the producer's first column in ``layer``'s input (SAC critics concatenate
        features and actions: features come first, so 0).
    :param weight_name: the attribute of ``layer`` holding the matrix whose columns read the producer
        (``"weight"``; ``"weight_ih_l0"`` for an ``nn.LSTM`` reading a features extractor: every gate block's
        columns, all ``4H`` rows).
    :param bias_name: the attribute of ``layer`` holding the bias that absorbs a removed unit's mean
        contribution (``"bias"``; ``"bias_ih_l0"`` for an LSTM; ``None`` attribute: no absorption).
    """

    layer: nn.Module
    columns_per_unit: int = 1
    offset: int = 0
    weight_name: str = "weight"
    bias_name: str = "bias"

    @property
    def weight(self) -> th.Tensor:
        """The matrix reading the producer through its input columns (:meth:`columns`)."""
        return getattr(self.layer, self.weight_name)

    @property
    def bias(self) -> Optional[th.Tensor]:
        """The bias of :attr:`weight`'s outputs, or ``None``."""
        return getattr(self.layer, self.bias_name, None)

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
    #: the per-feature normalisation (:data:`NORM_TYPES`) of this layer's units, if any
    norm: Optional[nn.Module] = None
    #: whether ``norm`` reads the activation's output (CrossQ: the consumers then read the norm's output,
    #: not the activation's) or the layer's output (``Linear, BatchNorm, ReLU``)
    norm_after_activation: bool = True
    #: the normalisation between the layer and its activation, whatever its kind (NaP's ``nn.LayerNorm`` /
    #: ``ChannelLayerNorm``, the BatchNorm of ``Linear, BatchNorm, ReLU``): the activation reads its output, so
    #: the unit's output is ``activation(pre_norm(layer(x)))`` (:meth:`post_activation`)
    pre_norm: Optional[nn.Module] = None

    @property
    def doubles_width(self) -> bool:
        """Whether the activation outputs two features per unit (CReLU, Fourier features)."""
        return doubles_width(self.activation)

    @property
    def group_size(self) -> int:
        """Features per unit in :meth:`post_activation`'s output: 2 under MaxMin (a sorted pair) and under a
        width-doubling activation (a unit's two outputs, made adjacent), else 1."""
        return 2 if isinstance(self.activation, MaxMin) or self.doubles_width else 1

    def post_activation(self, out: th.Tensor) -> th.Tensor:
        """The units' output computed from the layer's output ``out``: ``activation(pre_norm(out))`` (each part
        only where present), the tensor ReDo scores (Sokar et al., 2023: "the activations of the neurons") and
        the diagnostics read. A normalisation in training mode is applied without updating its running
        statistics (the network's own forward already did). A width-doubling activation's ``[f(x), g(x)]`` is
        reordered so that each unit's two features are adjacent (:attr:`group_size`). Errors of the modules
        propagate."""
        h = out
        if self.pre_norm is not None:
            h = norm_forward(self.pre_norm, h)
        if self.activation is not None:
            h = self.activation(h)
            if self.doubles_width:
                h = th.stack(h.chunk(2, dim=1), dim=2).flatten(1, 2)
        return h

    @property
    def n_features(self) -> int:
        """Output features (Linear) or channels (Conv2d)."""
        return self.layer.weight.shape[0]

    @property
    def n_units(self) -> int:
        """Units of the layer: its rows (output channels), a MaxMin pair counting once."""
        return self.n_features if self.doubles_width else self.n_features // self.group_size


@dataclass
class RecurrentUnits:
    """The cells of one layer of an ``nn.LSTM``: the units Continual Backprop and ReDo replace in a recurrent
    layer (see :mod:`sb3_plastic.recurrent`).

    Cell ``j`` of layer ``index`` owns rows ``j, H+j, 2H+j, 3H+j`` (one per gate) of ``weight_ih_l{index}``,
    ``weight_hh_l{index}`` and of both biases; its output ``h_j`` is read by column ``j`` of
    ``weight_hh_l{index}`` (the recurrence), by column ``j`` of ``weight_ih_l{index+1}`` below the top layer, and
    by column ``j`` of every :attr:`consumers` layer (the Linear layers reading the LSTM output) at the top.

    :param name: key of the layer's state, ``"<lstm name>.l<index>"`` (``"lstm_actor.l0"``).
    :param layer: the ``nn.LSTM``.
    :param index: the layer of the LSTM (0 = the one reading the input).
    :param consumers: Linear layers reading the LSTM output (only for the top layer; empty below it).
    """

    name: str
    layer: nn.Module
    index: int = 0
    consumers: list[Consumer] = field(default_factory=list)
    #: no activation module or normalisation: the gates are inside the LSTM (fields shared with HiddenLayer)
    activation: Optional[nn.Module] = None
    norm: Optional[nn.Module] = None
    norm_after_activation: bool = True
    pre_norm: Optional[nn.Module] = None

    @property
    def group_size(self) -> int:
        return 1

    @property
    def n_features(self) -> int:
        return int(self.layer.hidden_size)

    @property
    def n_units(self) -> int:
        return self.n_features

    @property
    def top(self) -> bool:
        """Whether this is the LSTM's last layer (the one whose output leaves the LSTM)."""
        return self.index == self.layer.num_layers - 1

    def param(self, kind: str, index: Optional[int] = None) -> Optional[nn.Parameter]:
        """``weight_ih`` / ``weight_hh`` / ``bias_ih`` / ``bias_hh`` of layer ``index`` (default: this layer)."""
        return getattr(self.layer, f"{kind}_l{self.index if index is None else index}", None)

    def gate_rows(self, units: th.Tensor) -> th.Tensor:
        """Rows of the stacked gate matrices owned by ``units``: ``j + g*H`` for the four gates ``g``."""
        h = self.n_features
        units = units.long().view(1, -1)
        return (units + h * th.arange(4, device=units.device).view(-1, 1)).flatten()

    def outgoing(self) -> list[tuple[th.Tensor, Optional[th.Tensor]]]:
        """``(weight, bias absorbing the mean contribution)`` of every matrix reading ``h`` through its columns
        ``0..H-1``: the consumers (with their biases), the next LSTM layer's ``weight_ih`` (with its
        ``bias_ih``) and this layer's ``weight_hh`` (no bias: see :mod:`sb3_plastic.recurrent`)."""
        out: list[tuple[th.Tensor, Optional[th.Tensor]]] = [(c.layer.weight, c.layer.bias) for c in self.consumers]
        if not self.top:
            out.append((self.param("weight_ih", self.index + 1), self.param("bias_ih", self.index + 1)))
        out.append((self.param("weight_hh"), None))
        return out

    def incoming(self) -> list[th.Tensor]:
        """The weight matrices whose rows :meth:`gate_rows` a cell owns (``weight_ih``, ``weight_hh``)."""
        return [self.param("weight_ih"), self.param("weight_hh")]

    def biases(self) -> list[th.Tensor]:
        """The cell's bias vectors (``bias_ih``, ``bias_hh``; none for ``bias=False``)."""
        return [b for b in (self.param("bias_ih"), self.param("bias_hh")) if b is not None]


def recurrent_units_problem(units: RecurrentUnits) -> Optional[str]:
    """Why the cells of ``units`` cannot be replaced (``None`` when they can): only unidirectional ``nn.LSTM``
    layers without projection, read through exactly ``H`` input columns by Linear consumers."""
    lstm = units.layer
    if not isinstance(lstm, nn.LSTM):
        return f"{units.name!r} is a {type(lstm).__name__}; cell replacement is defined for nn.LSTM"
    if lstm.bidirectional or lstm.proj_size > 0 or lstm.batch_first:
        return f"{units.name!r}: bidirectional, projected or batch_first LSTMs are not supported"
    for consumer in units.consumers:
        nxt = consumer.layer
        if not isinstance(nxt, nn.Linear) or consumer.offset != 0 or nxt.in_features != lstm.hidden_size:
            return f"{units.name!r} feeds {type(nxt).__name__} that does not read exactly its {lstm.hidden_size} outputs"
    return None


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
    #: output width of the (sub-)extractor whose last layer is the producer of an edge (id(producer),
    #: id(consumer)): a conv extractor's flatten size, which gives the columns per channel when the reader reads
    #: more than it (a critic's ``cat(features, actions)``, a Dict extractor's concat). Absent: the reader's width.
    edge_widths: dict[tuple[int, int], int] = field(default_factory=dict)
    #: recurrent layers (``nn.LSTM``, ...) of the network; they are in no path (see :mod:`sb3_plastic.recurrent`)
    recurrent: list[nn.Module] = field(default_factory=list)
    #: Linear / Conv2d layers outside the paths: those feeding a recurrent layer (a features extractor in front
    #: of an LSTM). They are weight layers (FIRE, Shrink & Perturb, diagnostics) and, through
    #: :attr:`extractor_paths`, hidden layers of unit resets whose outgoing weights are the LSTM's
    #: ``weight_ih_l0`` input columns (:mod:`sb3_plastic.recurrent`).
    extra_layers: list[nn.Module] = field(default_factory=list)
    #: layers reading each recurrent layer's output, by ``id(recurrent layer)`` (the first layer after it)
    recurrent_consumers: dict[int, list[nn.Module]] = field(default_factory=dict)
    #: paths through a features extractor in front of a recurrent layer, each ending at the module reading the
    #: extractor output (an ``nn.LSTM``, read through ``weight_ih_l0`` / ``bias_ih_l0``, or sb3-contrib's critic
    #: Linear): they give the extractor's layers their consumers in :meth:`hidden_layers` (no head: the last
    #: element is not a head and is not itself made a hidden layer by these paths)
    extractor_paths: list[list[nn.Module]] = field(default_factory=list)
    #: consumers in *other* networks of a hidden layer, by ``id(producer)``: SAC / TQC / TD3 / CrossQ with
    #: ``share_features_extractor=True``, where every q-network's first layer of the critic reads the actor's
    #: features extractor. :meth:`hidden_layers` lists them after the network's own consumers.
    external_consumers: dict[int, list[Consumer]] = field(default_factory=dict)
    #: optimizers training the :attr:`external_consumers` (the critic's): a unit reset zeroes their moments too
    external_optimizers: list[th.optim.Optimizer] = field(default_factory=list)

    def recurrent_units(self) -> list[RecurrentUnits]:
        """The cells of every layer of every recurrent layer, as :class:`RecurrentUnits` (Continual Backprop,
        ReDo); the top layer of each LSTM lists the layers reading its output as consumers."""
        out = []
        for module in self.recurrent:
            name = self.layer_names.get(id(module), "?")
            readers = [Consumer(m) for m in self.recurrent_consumers.get(id(module), [])]
            for index in range(int(module.num_layers)):
                top = index == module.num_layers - 1
                out.append(RecurrentUnits(f"{name}.l{index}", module, index, list(readers) if top else []))
        return out

    def weight_layers(self) -> list[nn.Module]:
        """Every Linear / Conv2d of the network, each once: :attr:`extra_layers` first, then in path order
        (heads included). Recurrent layers are not listed (:attr:`recurrent`)."""
        seen: dict[int, nn.Module] = {id(m): m for m in self.extra_layers}
        for path in self.paths:
            for layer in path:
                seen.setdefault(id(layer), layer)
        return list(seen.values())

    def heads(self) -> list[nn.Module]:
        """Output layers (last layer of each path)."""
        return list({id(p[-1]): p[-1] for p in self.paths if p}.values())

    def hidden_layers(self) -> list[HiddenLayer]:
        """Every non-head layer with its activation and consumers."""
        parents, pre_norms = _activation_after(self.module)
        norms = _norm_after(self.module)
        head_ids = {id(h) for h in self.heads()}
        hidden: dict[int, HiddenLayer] = {}
        for path in [*self.extractor_paths, *self.paths]:
            for layer, nxt in itertools.pairwise(path):
                if id(layer) in head_ids:
                    continue
                norm, after_act = norms.get(id(layer), (None, True))
                spec = hidden.setdefault(
                    id(layer),
                    HiddenLayer(
                        self.layer_names.get(id(layer), "?"),
                        layer,
                        parents.get(id(layer)),
                        [],
                        norm,
                        after_act,
                        pre_norms.get(id(layer)),
                    ),
                )
                if any(c.layer is nxt for c in spec.consumers):
                    continue
                per_unit = 1
                if isinstance(layer, nn.Conv2d) and isinstance(nxt, (nn.Linear, nn.RNNBase)):
                    width = nxt.in_features if isinstance(nxt, nn.Linear) else nxt.input_size
                    per_unit = self.edge_widths.get((id(layer), id(nxt)), width) // layer.out_channels
                offset = self.edge_offsets.get((id(layer), id(nxt)), 0)
                if isinstance(nxt, nn.RNNBase):  # an LSTM reading the extractor: its layer-0 input matrix
                    spec.consumers.append(Consumer(nxt, per_unit, offset, "weight_ih_l0", "bias_ih_l0"))
                else:
                    spec.consumers.append(Consumer(nxt, per_unit, offset))
        for key, extra in self.external_consumers.items():
            if key in hidden:
                own = hidden[key].consumers
                own.extend(c for c in extra if not any(c.layer is o.layer for o in own))
        return list(hidden.values())

    def optimizers(self) -> list[th.optim.Optimizer]:
        """The optimizers holding parameters that a unit reset of this network touches: its own, then
        :attr:`external_optimizers` (each once)."""
        found = [o for o in (self.optimizer, *self.external_optimizers) if o is not None]
        return list({id(o): o for o in found}.values())

    def parameters(self) -> list[nn.Parameter]:
        """Parameters trained by this network's optimizer (all of the module's if it has none)."""
        if self.optimizer is None:
            return list(self.module.parameters())
        return [p for group in self.optimizer.param_groups for p in group["params"]]


def _activation_after(module: nn.Module) -> tuple[dict[int, nn.Module], dict[int, nn.Module]]:
    """``(activations, pre_norms)``: maps id(layer) -> the non-weight module right after it in its
    ``nn.Sequential`` parent, and id(layer) -> the normalisation right after the layer (a running-statistics
    norm or NaP's ``nn.LayerNorm``), which the activation then reads: the activation is the module after the
    norm, and :meth:`HiddenLayer.post_activation` applies both."""
    found: dict[int, nn.Module] = {}
    pre_norms: dict[int, nn.Module] = {}
    for parent in module.modules():
        if isinstance(parent, nn.Sequential):
            children = list(parent)  # not children(): it lists a module shared by two places once
            for i, a in enumerate(children[:-1]):
                if not isinstance(a, LAYER_TYPES):
                    continue
                b = children[i + 1]
                if isinstance(b, (*NORM_TYPES, nn.LayerNorm)):
                    pre_norms[id(a)] = b
                    b = children[i + 2] if i + 2 < len(children) else None
                if b is not None and not isinstance(b, (*LAYER_TYPES, *NORM_TYPES, nn.LayerNorm, nn.Flatten, nn.Identity)):
                    found[id(a)] = b
    return found, pre_norms


@th.no_grad()
def norm_forward(norm: nn.Module, x: th.Tensor) -> th.Tensor:
    """``norm(x)`` without side effects: a normalisation in training mode (BatchNorm, BatchRenorm) normalises
    ``x`` with its batch statistics as in the network's forward, and its running statistics and counters are
    restored afterwards (re-applying a norm to a recorded output must not count that batch twice)."""
    buffers = list(norm.buffers()) if norm.training else []
    saved = [b.clone() for b in buffers]
    try:
        return norm(x)
    finally:
        for b, value in zip(buffers, saved):
            b.copy_(value)


def _norm_after(module: nn.Module) -> dict[int, tuple[nn.Module, bool]]:
    """Map id(layer) -> ``(norm, after_activation)`` for a :data:`NORM_TYPES` module of the same width right
    after the layer (``after_activation=False``) or right after the activation that follows it (``True``)."""
    found: dict[int, tuple[nn.Module, bool]] = {}
    for parent in module.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent)  # not children(): it lists a module shared by two places once
        for i, a in enumerate(children):
            if not isinstance(a, LAYER_TYPES):
                continue
            width = a.weight.shape[0]
            nxt = children[i + 1 : i + 3]
            if nxt and isinstance(nxt[0], NORM_TYPES) and norm_width(nxt[0]) == width:
                found[id(a)] = (nxt[0], False)
            elif (
                len(nxt) == 2
                and not isinstance(nxt[0], (*LAYER_TYPES, *NORM_TYPES, nn.Flatten))
                and isinstance(nxt[1], NORM_TYPES)
                and norm_width(nxt[1]) == width
            ):
                found[id(a)] = (nxt[1], True)
    return found


def _norm_tensors(norm: nn.Module) -> tuple[Optional[th.Tensor], ...]:
    """``(running mean, running var, scale, shift, counter)`` of a :data:`NORM_TYPES` module (``None`` where absent).

    sb3-contrib's ``BatchRenorm``: ``ra_mean``, ``ra_var``, ``scale``, ``bias``, ``steps`` (the warm-up
    counter: batch statistics are used until it passes ``warmup_steps``); torch's batch norms:
    ``running_mean``, ``running_var``, ``weight``, ``bias``, ``num_batches_tracked``.
    """
    if isinstance(norm, BatchRenorm):
        return norm.ra_mean, norm.ra_var, norm.scale, norm.bias, norm.steps
    if isinstance(norm, nn.modules.batchnorm._BatchNorm):
        return norm.running_mean, norm.running_var, norm.weight, norm.bias, norm.num_batches_tracked
    raise TypeError(f"{type(norm).__name__} is not a known normalisation layer; known: {[t.__name__ for t in NORM_TYPES]}")


def norm_width(norm: nn.Module) -> int:
    """Number of features a :data:`NORM_TYPES` module normalises."""
    return int(norm.num_features)


@th.no_grad()
def reset_norm_(norm: nn.Module) -> None:
    """Restart a normalisation layer's statistics, in place: running mean 0, running variance 1 and the
    warm-up / batch counter 0 (BatchRenorm then normalises with batch statistics again until its warm-up has
    passed, exactly as after construction). The learnt scale and shift are kept (they are parameters, like
    biases). Used after FIRE and a Shrink & Perturb event, which rewrite every weight of the layer feeding it.
    """
    mean, var, _, _, counter = _norm_tensors(norm)
    if mean is not None and var is not None:
        mean.zero_()
        var.fill_(1.0)
    if counter is not None:
        counter.zero_()


@th.no_grad()
def norm_affine(norm: nn.Module) -> tuple[th.Tensor, th.Tensor]:
    """``(gain, shift)`` per feature of the map ``x -> gain * x + shift`` a normalisation layer applies with
    its running statistics (its evaluation-mode map; after BatchRenorm's warm-up also its training map, up to
    the clipping of ``r`` and ``d``). Without running statistics the gain is 0 and the shift the layer's
    shift (a batch-normalised feature has mean ``shift``)."""
    mean, var, scale, shift, _ = _norm_tensors(norm)
    affine = bool(getattr(norm, "affine", True))
    n = norm_width(norm)
    device = next(t for t in (mean, scale, shift) if t is not None).device
    w = scale.detach().float() if affine and scale is not None else th.ones(n, device=device)
    b = shift.detach().float() if affine and shift is not None else th.zeros(n, device=device)
    if mean is None or var is None:
        return th.zeros(n, device=device), b
    gain = w / th.sqrt(var.float() + float(norm.eps))
    return gain, b - gain * mean.float()


def norms_fed_by(spec: NetworkSpec, layers: Iterable[nn.Module]) -> list[nn.Module]:
    """The normalisation layers of ``spec``'s hidden layers among ``layers`` (each once)."""
    ids = {id(layer) for layer in layers}
    found = {id(h.norm): h.norm for h in spec.hidden_layers() if h.norm is not None and id(h.layer) in ids}
    return list(found.values())


def layers_of(module: Optional[nn.Module]) -> list[nn.Module]:
    """Linear / Conv2d layers of ``module`` in registration order (each once). The modules a layer holds as its own
    children (the new heads :class:`~sb3_plastic.callbacks.PlasticityInjection` attaches to an output layer) are not
    layers of the sequence."""
    found: dict[int, nn.Module] = {}

    def walk(m: nn.Module) -> None:
        if isinstance(m, LAYER_TYPES):
            found.setdefault(id(m), m)
            return
        for child in m.children():
            walk(child)

    if module is not None:
        walk(module)
    return list(found.values())


def _extractor_paths(
    extractor: Optional[nn.Module],
    tails: list[list[nn.Module]],
    offsets: dict[tuple[int, int], int],
    widths: Optional[dict[tuple[int, int], int]] = None,
) -> list[list[nn.Module]]:
    """Paths ``extractor layers + tail`` for each tail; a Dict-observation extractor (SB3's
    ``CombinedExtractor``: a ``ModuleDict`` ``extractors`` whose outputs are concatenated in key order)
    gives one path per sub-extractor with layers, and records where its output starts in the concat.
    ``widths`` receives the output width of the (sub-)extractor for each edge from its last layer to a tail
    (``features_dim``): the columns per channel of a conv read through a flatten."""
    widths = {} if widths is None else widths
    subs = getattr(extractor, "extractors", None)
    if not isinstance(subs, nn.ModuleDict):
        layers = layers_of(extractor)
        width = getattr(extractor, "features_dim", None)
        if layers and width is not None:
            for tail in tails:
                if tail:
                    widths[(id(layers[-1]), id(tail[0]))] = int(width)
        return [layers + tail for tail in tails]
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
                widths[(id(layers[-1]), id(tail[0]))] = int(width)
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

    Supports actor-critic policies (PPO, A2C, RecurrentPPO, MaskablePPO), DQN, QR-DQN, SAC,
    TQC, CrossQ (no target network; its BatchRenorm layers become :attr:`HiddenLayer.norm`), TD3 and DDPG
    (and their plastic versions), with Box or Dict observations.

    RecurrentPPO (sb3-contrib's LSTM policies): the LSTMs go to :attr:`NetworkSpec.recurrent`, the features
    extractor's layers (which feed them) to :attr:`NetworkSpec.extra_layers` and, with the LSTM (or the critic
    Linear) reading them, to :attr:`NetworkSpec.extractor_paths` (hidden layers whose consumer is the LSTM's
    ``weight_ih_l0``, with the conv -> flatten column mapping); the paths start after the LSTM:
    ``mlp_extractor.policy_net -> action_net`` and ``[critic ->] mlp_extractor.value_net -> value_net``
    (``critic``: the Linear sb3-contrib uses instead of a critic LSTM). The cells of every LSTM layer are units
    too (:meth:`NetworkSpec.recurrent_units`), read by the first layer after the LSTM
    (:attr:`NetworkSpec.recurrent_consumers`). See :mod:`sb3_plastic.recurrent`.

    Actor-critic policies with ``share_features_extractor=True`` (off by default): the shared extractor belongs
    to the actor (SB3 trains it with the actor's optimizer), and its last layer's consumers are the actor's
    first layer and the first layer of every q-network of the critic (:attr:`NetworkSpec.external_consumers`;
    the critic's optimizer is in :attr:`NetworkSpec.external_optimizers`, see :meth:`NetworkSpec.optimizers`).
    The critic target keeps its own copy of the extractor and follows the shared one through SB3's polyak
    update of ``critic.parameters()`` (which include it), as for every other critic weight.

    :raises TypeError: for a policy whose structure is not known.
    """
    policy = model.policy
    off: dict[tuple[int, int], int] = {}
    wid: dict[tuple[int, int], int] = {}
    if isinstance(getattr(policy, "lstm_actor", None), nn.RNNBase) and hasattr(policy, "mlp_extractor"):
        return [_recurrent_actor_critic_spec(policy)]
    if hasattr(policy, "mlp_extractor") and hasattr(policy, "action_net"):
        pi_tail = [*layers_of(policy.mlp_extractor.policy_net), policy.action_net]
        vf_tail = [*layers_of(policy.mlp_extractor.value_net), policy.value_net]
        if policy.pi_features_extractor is policy.vf_features_extractor:
            paths = _extractor_paths(policy.pi_features_extractor, [pi_tail, vf_tail], off, wid)
        else:
            paths = _extractor_paths(policy.pi_features_extractor, [pi_tail], off, wid)
            paths += _extractor_paths(policy.vf_features_extractor, [vf_tail], off, wid)
        return [NetworkSpec("policy", policy, policy.optimizer, None, paths, _names(policy), off, edge_widths=wid)]
    if hasattr(policy, "q_net") and hasattr(policy, "q_net_target"):
        q = policy.q_net
        paths = _extractor_paths(q.features_extractor, [layers_of(q.q_net)], off, wid)
        names = _names_with_prefix(q, "q_net")
        return [NetworkSpec("q_net", q, policy.optimizer, policy.q_net_target, paths, names, off, edge_widths=wid)]
    if hasattr(policy, "quantile_net") and hasattr(policy, "quantile_net_target"):
        q = policy.quantile_net
        paths = _extractor_paths(q.features_extractor, [layers_of(q.quantile_net)], off, wid)
        names = _names_with_prefix(q, "quantile_net")
        target = policy.quantile_net_target
        return [NetworkSpec("quantile_net", q, policy.optimizer, target, paths, names, off, edge_widths=wid)]
    if hasattr(policy, "actor") and hasattr(policy, "critic"):  # CrossQ: no critic target
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
        actor_paths = _extractor_paths(actor.features_extractor, tails, off, wid)
        critic_tails = [layers_of(q_net) for q_net in critic.q_networks]
        critic_paths = critic_tails if shared else _extractor_paths(critic.features_extractor, critic_tails, off, wid)
        actor_names = _names_with_prefix(actor, "actor")
        actor_spec = NetworkSpec("actor", actor, actor.optimizer, actor_target, actor_paths, actor_names, off, edge_widths=wid)
        if shared:
            _add_shared_extractor_readers(actor_spec, critic_tails, critic.optimizer)
        return [
            actor_spec,
            NetworkSpec(
                "critic",
                critic,
                critic.optimizer,
                getattr(policy, "critic_target", None),
                critic_paths,
                _names_with_prefix(critic, "critic"),
                off,
                edge_widths=wid,
            ),
        ]
    raise TypeError(f"sb3_plastic does not know the network structure of {type(policy).__name__}")


def _add_shared_extractor_readers(
    actor_spec: NetworkSpec, critic_tails: list[list[nn.Module]], critic_optimizer: Optional[th.optim.Optimizer]
) -> None:
    """``share_features_extractor=True`` (SAC, TQC, TD3, CrossQ): the actor's features extractor is also read
    by the first layer of every q-network of the critic. Its last layer(s) get those layers as
    :attr:`NetworkSpec.external_consumers` of the actor (same column mapping as the actor's own first layer:
    the critic concatenates ``[features, actions]``, features first, so the offset is the one of the actor's
    reader), and the critic's optimizer joins :attr:`NetworkSpec.external_optimizers` (SB3 trains the shared
    extractor with the actor's optimizer only; the critic's optimizer holds the q-networks' first layers)."""
    firsts = [t[0] for t in critic_tails if t]
    if not firsts:
        return
    found = False
    for hidden in actor_spec.hidden_layers():
        if not hidden.consumers or not any(h is hidden.layer for h in layers_of(actor_spec.module.features_extractor)):
            continue
        # the actor's reader of an extractor output layer is outside the extractor (latent_pi / mu)
        own = [c for c in hidden.consumers if not any(c.layer is m for m in layers_of(actor_spec.module.features_extractor))]
        if not own:
            continue
        ref = own[0]
        actor_spec.external_consumers[id(hidden.layer)] = [Consumer(q, ref.columns_per_unit, ref.offset) for q in firsts]
        found = True
    if found and critic_optimizer is not None:
        actor_spec.external_optimizers.append(critic_optimizer)


def _recurrent_actor_critic_spec(policy: nn.Module) -> NetworkSpec:
    """The network of sb3-contrib's ``RecurrentActorCriticPolicy`` (see :func:`find_networks`)."""
    pi_tail = [*layers_of(policy.mlp_extractor.policy_net), policy.action_net]
    vf_tail = [*layers_of(policy.mlp_extractor.value_net), policy.value_net]
    critic = getattr(policy, "critic", None)
    if isinstance(critic, LAYER_TYPES):
        vf_tail = [critic, *vf_tail]
    extractors = {id(m): m for m in (policy.pi_features_extractor, policy.vf_features_extractor)}
    extra = [layer for m in extractors.values() for layer in layers_of(m)]
    lstm_critic = getattr(policy, "lstm_critic", None)
    recurrent = [m for m in (policy.lstm_actor, lstm_critic) if isinstance(m, nn.RNNBase)]
    # the first layer after each LSTM: sb3-contrib's evaluate_actions feeds lstm_actor's output to the policy MLP
    # (and, with shared_lstm, detached to the value MLP), lstm_critic's to the value MLP
    value_first = [*layers_of(policy.mlp_extractor.value_net), policy.value_net][0]
    readers = {id(policy.lstm_actor): [pi_tail[0]]}
    if isinstance(lstm_critic, nn.RNNBase):
        readers[id(lstm_critic)] = [value_first]
    elif getattr(policy, "shared_lstm", False):
        readers[id(policy.lstm_actor)].append(value_first)
    # in front of the LSTMs: lstm_actor reads the policy features; the value features go to lstm_critic or to the
    # critic Linear (with shared_lstm they are not used)
    off: dict[tuple[int, int], int] = {}
    wid: dict[tuple[int, int], int] = {}
    entries = _extractor_paths(policy.pi_features_extractor, [[policy.lstm_actor]], off, wid)
    vf_reader = lstm_critic if isinstance(lstm_critic, nn.RNNBase) else critic if isinstance(critic, LAYER_TYPES) else None
    if vf_reader is not None:
        entries += _extractor_paths(policy.vf_features_extractor, [[vf_reader]], off, wid)
    return NetworkSpec(
        "policy",
        policy,
        policy.optimizer,
        None,
        [pi_tail, vf_tail],
        _names(policy),
        off,
        edge_widths=wid,
        recurrent=recurrent,
        extra_layers=extra,
        recurrent_consumers=readers,
        extractor_paths=[path for path in entries if len(path) > 1],
    )


def _names_with_prefix(module: nn.Module, prefix: str) -> dict[int, str]:
    return {id(m): f"{prefix}.{name}" if name else prefix for name, m in module.named_modules()}


def sync_target(spec: NetworkSpec, tensors: Optional[Iterable[th.Tensor]] = None) -> None:
    """Hard-copy the online network into its target (no-op without a target).

    ``load_state_dict`` copies values in place, so the target keeps its Parameter objects and the
    polyak updates of SB3 (which zip parameter lists) stay valid.

    :param spec: the network.
    :param tensors: ``None`` (the whole network) or the online parameters / buffers to copy (the rest of the target
        keeps its values, e.g. its Polyak lag).
    """
    if spec.target is not None:
        own = spec.module.state_dict(keep_vars=True)
        target_keys = spec.target.state_dict().keys()
        wanted = None if tensors is None else {id(t) for t in tensors}
        chosen = {k: v.detach() for k, v in own.items() if k in target_keys and (wanted is None or id(v) in wanted)}
        spec.target.load_state_dict(chosen, strict=False)


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

    def __getstate__(self) -> dict[str, Any]:
        """What pickling writes (SB3's ``save``, of plastic and plain SB3 models alike): a copy of the state whose
        tensors are on the CPU (:func:`plastic_state_to`), so a model trained on a GPU loads on a CPU-only machine
        (SB3 would otherwise fail to unpickle the CUDA tensors there, warn, and drop the whole state, so that e.g.
        FIRE fires again). The live state keeps its device. A loaded state stays on the CPU: each callback moves
        what it reads to its network's device when it binds to it (L2-init's ``theta_0``, the spectral power-iteration
        vectors, Continual Backprop's statistics), and keeps on the CPU what it keeps there on purpose (the monitor's
        copy of the initial weights, CBP's ages, the private generators' states)."""
        return {"data": plastic_state_to(self.data, "cpu")}


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


def plastic_state_to(state: Any, device: Union[str, th.device]) -> Any:
    """A copy of an interventions' persistent state (a :class:`PlasticStateStore`, or
    any nest of dicts, lists and tuples) with its tensors moved to ``device`` (detached; other values shared).

    :param state: the state (not modified).
    :param device: the target device.
    """
    device = th.device(device)

    def move(obj: Any) -> Any:
        if isinstance(obj, th.Tensor):
            return obj.detach().to(device)
        if isinstance(obj, PlasticStateStore):
            out = PlasticStateStore()
            out.data = move(obj.data)
            return out
        if isinstance(obj, dict):
            return {key: move(value) for key, value in obj.items()}
        if isinstance(obj, list):
            return [move(value) for value in obj]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(move(value) for value in obj)
        return obj

    return move(state)
