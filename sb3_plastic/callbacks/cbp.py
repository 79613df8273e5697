"""Continual Backprop: generate-and-test replacement of the least useful hidden units.

Reference: Dohare, Hernandez-Garcia, Lan, Rahman, Mahmood & Sutton (2024), "Loss of plasticity in deep
continual learning", Nature 632, 768-774.

After every optimizer step, on the post-activation outputs ``h`` of the minibatch that produced the
step, each hidden unit ``j`` of each hidden layer is updated as

* ``age_j += 1``
* ``f_j <- eta f_j + (1 - eta) mean(h_j)`` (running mean activation)
* ``u_j <- eta u_j + (1 - eta) y_j`` with the *contribution* utility
  ``y_j = mean_k |W_out[k, j]| * mean|h_j|`` or the *adaptable contribution*
  ``y_j = mean_k |W_out[k, j]| * mean|h_j - f_hat_j| / mean_i |W_in[j, i]|`` (GnT's: the activation centred on
  its bias-corrected running mean, updated with this minibatch; per spatial position for a conv layer),

and the bias-corrected utility is ``u_hat_j = u_j / (1 - eta^age_j)``. Units older than the maturity
threshold are eligible; ``rho * #eligible`` units per step are replaced, lowest ``u_hat`` first, by one of two rules
(``replacement_rule``): ``"accumulate"`` (default) adds ``rho * #eligible`` to a per-layer accumulator and replaces
its integer part; ``"stochastic"`` is the rule of the reference's RL runs (``gnt.py`` with ``accumulate=False``):
``x = rho * #eligible``; if ``x < 1`` one unit is replaced with probability ``x``, else ``floor(x)`` units (the
fraction is dropped). A replaced unit gets fresh incoming weights from the layer's own initialiser, a zero bias and
zero outgoing weights; its statistics restart and the optimizer moments of every touched row / column are zeroed.
With ``bias_absorption=True`` the next layer's bias first absorbs its mean contribution
``b_next += W_out[:, j] * f_hat_j`` (the paper's description: the network output at the mean activation is
unchanged); off by default, as in the reference's runs (see below).

What a *unit* is:

* Linear layer: an output feature; Conv2d layer: an output channel (statistics averaged over the batch
  and the spatial positions).
* Under MaxMin (GroupSort-2) the sorted pair of features ``(2k, 2k+1)`` is one unit: each output of the
  pair depends on both pre-activations, so replacing one half would leave a unit half made of old weights.
  The utility of a pair is the mean of its two features' utilities; both incoming rows and both outgoing
  column groups are replaced together.
* At a conv -> linear boundary (an NCHW flatten) channel ``c`` owns the next layer's columns
  ``c*P .. c*P+P-1`` (``P = H*W``); the running mean activation of a conv layer is kept per spatial
  position, so the bias absorption is exact column by column.
* LSTM layer (RecurrentPPO): a cell ``j``, i.e. rows ``j, H+j, 2H+j, 3H+j`` of ``weight_ih`` / ``weight_hh`` /
  biases in, column ``j`` of ``weight_hh``, of the next LSTM layer and of the layers after the LSTM out; its
  statistics are taken on the LSTM output over the minibatch's real (unpadded) sequence steps. The full
  definition (utility with the recurrent column, no absorption into ``bias_hh``) is in
  :mod:`sb3_plastic.recurrent`.

Normalisation layers (CrossQ's ``Linear -> ReLU -> BatchRenorm -> Linear``; see
:attr:`~sb3_plastic.common.surgery.HiddenLayer.norm`): ``h`` is still the activation output, but the consumers
read the norm's output ``gain_j * h_j + shift_j`` (running statistics: ``gain_j = scale_j / sqrt(var_j +
eps)``). The contribution utility therefore weighs ``mean|h_j|`` by ``|gain_j|``, the bias absorption uses
``gain_j * f_hat_j + shift_j``, and a replaced unit's feature of the norm gets its initial state (running mean
0, variance 1, scale 1, shift 0, moments of the scale / shift entries zeroed). CrossQ's critic runs the current and
the next state-action rows as one forward (BatchRenorm's joint statistics); its utilities and mean activations use
the current rows only, the rows of the loss (:func:`joint_forward_loss_rows`). A layer norm between the layer and
its activation (NaP's ``Linear -> LayerNorm -> act``): ``h`` is ``act(LayerNorm(z))`` and a replaced unit's scale /
offset of the norm go back to 1 / 0 with their optimizer state restarted.

Differences from the public reference code (shibhansh/loss-of-plasticity, ``lop/algos/gnt.py`` as its PPO runs use
it, ``lop/algos/rl/ppo.py`` and ``lop/rl/cfg/ant/cbp.yml``; ``convGnT.py`` for convolutions), every one:

* **Optimizer state**: the state of the touched rows and columns is restarted (the RL code skipped it: its PPO
  builds plain Adam, and ``update_optim_params`` acts only on an ``AdamGnT``): Adam's moments zeroed and the
  entries' step count restarted, so a new unit is trained as a freshly initialised Adam entry, as Dohare's AdamGnT
  does for its per-feature steps (:mod:`sb3_plastic.adam_restart`). ``optimizer_restart=False`` leaves the state
  alone, as the RL code's plain Adam did.
* **Bias absorption**: none by default, as the reference's runs: ``gnt.py`` zeroes the running mean activation of
  the units it replaces (``test_features``) *before* ``gen_new_features`` reads it for the absorption, so its
  absorption adds exactly 0, and ``convGnT.py`` has none. ``bias_absorption=True`` gives the absorption the paper
  describes (before issue #27 this library always absorbed, so its default mixed the paper's absorption with the
  reference's other choices).
* **Replacement count**: ``replacement_rule="accumulate"`` (default) where the reference's RL runs draw
  (``"stochastic"``, offered). Both replace ``rho * #eligible`` units per step in expectation while that is
  below 1 (every RL setting: 1e-4 x 256 units = 0.0256); the accumulator does it deterministically (one unit every
  ``1 / x`` steps, reproducible from the data alone, no random draw that would need a generator and its saved
  state) and keeps the rate exact above 1, where the reference's rule drops the fraction (``x = 1.9`` replaces 1
  per step). The reference's own supervised and convolutional code (``convGnT.py``, ``cbp_linear.py``, permuted
  MNIST's ``accumulate: true``) accumulates too; ``convGnT.py`` (the ImageNet runs) adds ``rho * #units`` (all of
  the layer's units, not the eligible ones) whenever one unit is eligible, so at ``rho * maturity = 1`` its rate is
  about twice this one's; this library, ``gnt.py`` (the RL runs) and ``cbp_linear.py`` count the eligible units.
  ``"stochastic"`` draws from a private CPU generator seeded from
  the model's seed and the callback's state key (:func:`~sb3_plastic.callbacks.shrink_perturb.shrink_perturb_seed`;
  torch's global generator, which the reference uses, is left alone), whose state is saved with the model.
* **Conv utility**: the product of the means over positions (the reference averages per-position products).
* **New incoming weights**: the layer's own initialiser (:func:`resolve_init`); the reference draws
  ``U(-b, b)`` with ``b = sqrt(3 / fan_in)`` in its RL runs (``init='lecun'``, ``run_ppo.py``'s default;
  ``get_layer_bound`` in ``lop/utils/miscellaneous.py``) and ``b = gain * sqrt(3 / fan_in)`` (Kaiming uniform) with
  ``init='kaiming'`` for linear layers, while for ``Conv2d`` layers ``get_layer_bound`` returns PyTorch's default
  bound ``sqrt(1 / fan_in)`` whatever ``init`` says (``unit_init="default"`` here). ``unit_init="lecun"`` draws the
  reference's RL bound (the layer's own initialiser is what a policy built with LeCun weights should get, but an SB3
  policy whose weights were redrawn after it was built still reports its own scheme).
* **Two layers replacing in one step**: every new unit's outgoing weights end at 0 (the paper's rule); ``gnt.py``
  replaces layer by layer, so a new unit's outgoing column, zeroed first, is overwritten when the next layer's new
  unit draws its incoming row in the same step (one weight per such pair; ~0.07 % of steps at the RL rate).
* **Units**: MaxMin pairs, LSTM cells, normalisation features and every consumer of a unit (actor and critics of a
  shared extractor) are handled as above; the reference knows only ``nn.Sequential`` MLPs (and CNNs in
  ``convGnT.py``) with one consumer per layer.

The unit surgery itself (fresh weights, zero bias and outgoing weights, absorption, normalisation features, LSTM
cells, optimizer state) is :mod:`sb3_plastic.common.unit_reset`, shared with ReDo.

Maturity: :class:`ContinualBackprop` and the ``maturity_threshold`` keyword default to 10 000 updates, the value of
Dohare et al.'s RL runs (PPO on Slippery Ant); 100 is their supervised setting, the default of the RL-free core
:class:`GenerateAndTest`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Union

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn
from torch.utils.hooks import RemovableHandle

from sb3_plastic.callbacks.base import InterventionConfig, PlasticCallback, changed_fields, warn_ignored_options
from sb3_plastic.callbacks.redo import _post_activation, is_real_number, layer_init_scheme
from sb3_plastic.callbacks.shrink_perturb import shrink_perturb_seed
from sb3_plastic.common.hooks import OutermostStepHooks
from sb3_plastic.common.surgery import (
    HiddenLayer,
    RecurrentUnits,
    find_networks,
    norm_affine,
    recurrent_units_problem,
)
from sb3_plastic.common.unit_reset import (
    INITS,
    enable_unit_restarts,
    features_of,
    fresh_incoming_weights,
    replace_cells_,
    replace_units_,
    zero_outgoing_last_,
)
from sb3_plastic.recurrent import lstm_layer_outputs, recurrent_init_scheme

#: A unit layer of :class:`GenerateAndTest`: a Linear / Conv2d hidden layer or the cells of an LSTM layer.
UnitLayer = Union[HiddenLayer, RecurrentUnits]

#: Utility measures: "contribution" and "adaptable_contribution" (contribution / mean |incoming weight|).
UTILITIES: tuple[str, ...] = ("contribution", "adaptable_contribution")
#: Activations whose outputs are >= 0, so that mean|h| = mean(h) (one reduction less per step).
NONNEGATIVE_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Softplus)
#: Slack when taking the integer part of the accumulated replacement count (0.1 added ten times is 1).
_FLOOR_EPS = 1e-9


# ---------------------------------------------------------------------------------------------- arguments
#: A finite real number (numpy scalars included), not a bool (shared with ReDo).
_is_number = is_real_number


def check_cbp_args(
    replacement_rate: Any,
    maturity_threshold: Any,
    decay_rate: Any,
    utility: Any,
    names: tuple[str, str, str, str] = ("replacement_rate", "maturity_threshold", "decay_rate", "utility"),
) -> tuple[float, int, float, str]:
    """Validate the Continual Backprop hyper-parameters.

    :param names: the keywords the user typed (the algorithms say ``cbp_decay_rate`` / ``cbp_utility``).
    :return: ``(replacement_rate, maturity_threshold, decay_rate, utility)`` normalised (float, int, float, str).
    :raises ValueError: naming the bad value and what is allowed.
    """
    n_rate, n_mat, n_decay, n_util = names
    if not (_is_number(replacement_rate) and 0.0 <= replacement_rate <= 1.0):
        raise ValueError(
            f"{n_rate} must be a number in [0, 1] (fraction of eligible units replaced per update; 0 = off), "
            f"got {replacement_rate!r}"
        )
    if not (_is_number(maturity_threshold) and maturity_threshold >= 0 and float(maturity_threshold).is_integer()):
        raise ValueError(f"{n_mat} must be an integer >= 0 (gradient updates), got {maturity_threshold!r}")
    if not (_is_number(decay_rate) and 0.0 <= decay_rate < 1.0):
        raise ValueError(f"{n_decay} must be a number in [0, 1), got {decay_rate!r}")
    if utility not in UTILITIES:
        raise ValueError(f"Unknown {n_util} {utility!r}; allowed: {list(UTILITIES)}")
    return float(replacement_rate), int(maturity_threshold), float(decay_rate), str(utility)


#: How many units a step replaces: ``"accumulate"`` (fractions carried over) or ``"stochastic"`` (the reference's draw).
REPLACEMENT_RULES: tuple[str, ...] = ("accumulate", "stochastic")


def check_cbp_rule(
    bias_absorption: Any, replacement_rule: Any, names: tuple[str, str] = ("bias_absorption", "replacement_rule")
) -> tuple[bool, str]:
    """Validate the absorption switch and the replacement rule; ``ValueError`` naming the bad value otherwise."""
    if not isinstance(bias_absorption, bool):
        raise ValueError(f"{names[0]} must be True or False, got {bias_absorption!r}")
    if replacement_rule not in REPLACEMENT_RULES:
        raise ValueError(f"Unknown {names[1]} {replacement_rule!r}; allowed: {list(REPLACEMENT_RULES)}")
    return bias_absorption, str(replacement_rule)


def check_optimizer_restart(optimizer_restart: Any, name: str = "optimizer_restart") -> bool:
    """Validate the optimizer-restart switch; ``ValueError`` naming the bad value otherwise."""
    if not isinstance(optimizer_restart, bool):
        raise ValueError(f"{name} must be True or False, got {optimizer_restart!r}")
    return optimizer_restart


def check_unit_init(unit_init: Any, name: str = "unit_init") -> Optional[str]:
    """Validate the new units' initialiser (``None``: the layer's own); ``ValueError`` naming the bad value otherwise."""
    if unit_init is not None and unit_init not in INITS:
        raise ValueError(f"Unknown {name} {unit_init!r}; allowed: None (the layer's own initialiser), "
                         f"{', '.join(map(repr, INITS))}")
    return unit_init


# ---------------------------------------------------------------------------------------------- core
def layer_problem(spec: UnitLayer) -> Optional[str]:
    """Why generate-and-test cannot act on ``spec`` (``None`` when it can): a layer that is not a Linear /
    Conv2d, an odd width under MaxMin, or a consumer whose input does not fit the producer's units (a
    network structure that :func:`~sb3_plastic.common.surgery.find_networks` did not understand); for LSTM
    cells :func:`~sb3_plastic.common.surgery.recurrent_units_problem`."""
    if isinstance(spec, RecurrentUnits):
        return recurrent_units_problem(spec)
    if not isinstance(spec.layer, (nn.Linear, nn.Conv2d)):
        return f"layer {spec.name!r} is a {type(spec.layer).__name__}; expected Linear or Conv2d"
    if spec.doubles_width:
        return (f"layer {spec.name!r} feeds a width-doubling activation ({type(spec.activation).__name__}): a unit's "
                "outgoing weights are two column sets, which unit replacement does not handle")
    if spec.n_features % spec.group_size:
        return f"layer {spec.name!r} has {spec.n_features} features, not a multiple of {spec.group_size}"
    for consumer in spec.consumers:
        nxt = consumer.layer
        if isinstance(nxt, nn.Conv2d):
            if nxt.groups != 1:
                return f"layer {spec.name!r} feeds a grouped convolution (not supported)"
            needed, has = consumer.offset + spec.n_features, nxt.in_channels
        elif isinstance(nxt, nn.Linear) or (isinstance(nxt, nn.RNNBase) and consumer.weight_name == "weight_ih_l0"):
            if isinstance(nxt, nn.RNNBase) and (nxt.bidirectional or nxt.batch_first):
                return f"layer {spec.name!r} feeds a bidirectional or batch_first {type(nxt).__name__} (not supported)"
            needed, has = consumer.offset + spec.n_features * consumer.columns_per_unit, consumer.weight.shape[1]
        else:
            return f"layer {spec.name!r} feeds a {type(nxt).__name__}; expected Linear, Conv2d or an LSTM's input"
        if has < needed:
            return (
                f"layer {spec.name!r} ({spec.n_features} features) cannot feed {type(nxt).__name__} with {has} inputs "
                f"at offset {consumer.offset} ({consumer.columns_per_unit} columns per feature)"
            )
    return None


@dataclass
class _LayerInfo:
    """Per-layer constants of a :class:`GenerateAndTest` step (looked up once, not on every step)."""

    weight: th.Tensor
    is_conv: bool
    n_features: int
    group_size: int
    n_units: int
    fan_in: int
    out_count: int  # outgoing weights per feature over all consumers
    whole_consumer: Optional[th.Tensor]  # weight of the only consumer when it reads exactly this layer
    nonneg: bool  # the recorded activation is >= 0 (ReLU-like): |h| = h
    post_norm: Optional[nn.Module]  # a normalisation between the activation and the consumers (CrossQ)

    @staticmethod
    def of(spec: UnitLayer) -> _LayerInfo:
        if isinstance(spec, RecurrentUnits):  # h = o * tanh(c): signed; no norm; several readers (see _outgoing_sum)
            weight_ih, weight_hh = spec.incoming()
            return _LayerInfo(
                weight=weight_ih,
                is_conv=False,
                n_features=spec.n_features,
                group_size=1,
                n_units=spec.n_units,
                fan_in=weight_ih.shape[1] * 4 + weight_hh.shape[1] * 4,
                out_count=sum(w.shape[0] for w, _ in spec.outgoing()),
                whole_consumer=None,
                nonneg=False,
                post_norm=None,
            )
        weight = spec.layer.weight
        n = spec.n_features
        out_count = 0
        for consumer in spec.consumers:
            w = consumer.weight
            out_count += w.shape[0] * (w.shape[2] * w.shape[3] if w.dim() == 4 else consumer.columns_per_unit)
        whole = None
        if len(spec.consumers) == 1:
            consumer = spec.consumers[0]
            w = consumer.weight
            per_unit = 1 if w.dim() == 4 else consumer.columns_per_unit
            if consumer.offset == 0 and w.shape[1] == n * per_unit:
                whole = w
        return _LayerInfo(
            weight=weight,
            is_conv=isinstance(spec.layer, nn.Conv2d),
            n_features=n,
            group_size=spec.group_size,
            n_units=spec.n_units,
            fan_in=weight[0].numel(),
            out_count=out_count,
            whole_consumer=whole,
            nonneg=isinstance(spec.activation, NONNEGATIVE_ACTIVATIONS),
            post_norm=spec.norm if spec.norm is not None and spec.norm_after_activation else None,
        )


class GenerateAndTest:
    """The generate-and-test core of Continual Backprop (Dohare et al., 2024, Nature), usable without RL.

    It acts on a list of :class:`~sb3_plastic.common.surgery.HiddenLayer` specs (a layer, the activation
    after it, the layers consuming its output with the conv -> linear column mapping) and
    :class:`~sb3_plastic.common.surgery.RecurrentUnits` specs (the cells of an LSTM layer, see
    :mod:`sb3_plastic.recurrent`), and the optimizer that trains them. Feed it the post-activation outputs of
    the minibatch that produced each optimizer step (for LSTM cells: the layer's outputs ``h`` of the valid
    sequence steps, ``(steps, H)``), either explicitly with :meth:`step` or automatically with :meth:`attach`,
    which installs a forward hook on each activation and LSTM (recording only training-mode, grad-enabled
    forwards) and an optimizer step-post hook.

    LSTM cells: the utility is the contribution utility of ``h_j`` with ``W_out`` every weight reading ``h_j``
    (the consumers' columns, the next LSTM layer's ``weight_ih`` column and this layer's ``weight_hh`` column,
    pooled); a replaced cell goes through :func:`~sb3_plastic.common.unit_reset.replace_cells_` with the
    bias-corrected mean activation. The hook on an ``nn.LSTM`` collects its output sequences (``(L, N, H)``;
    several calls of one step each when sb3-contrib resets states inside a sequence) until the step;
    :meth:`set_sequence_mask` gives the padding mask of the minibatch (sb3-contrib's ``rollout_data.mask``) so
    that padded steps are left out; without a mask every step counts.

    :param layers: hidden layers and LSTM cell layers; their ``name`` keys the state (must be unique).
    :param optimizer: optimizer of the layers (its moments of touched rows / columns are zeroed on
        replacement; :meth:`attach` hooks its steps); ``None`` for no optimizer state to reset. Parameters it
        does not hold are skipped.
    :param replacement_rate: ``rho``, fraction of eligible units replaced per step (see ``replacement_rule``).
    :param maturity_threshold: units with ``age > maturity_threshold`` steps are eligible (default 100: Dohare et al.'s
        supervised setting; their RL runs, and :class:`ContinualBackprop`, use 10 000).
    :param decay_rate: ``eta`` of the running utility and mean activation.
    :param utility: ``"contribution"`` or ``"adaptable_contribution"`` (``|h - f_hat|``, see the module docstring).
    :param init: initialiser of new incoming weights, ``"default"``, ``"orthogonal"`` or ``"lecun"``
        (see :func:`~sb3_plastic.common.unit_reset.fresh_incoming_weights`).
    :param init_gain: gain of the orthogonal and LeCun initialisers.
    :param bias_absorption: move a replaced unit's mean contribution into its consumers' biases (the paper's
        description); ``False`` (default): none, as the reference's runs (module docstring).
    :param replacement_rule: ``"accumulate"`` (default; fractions accumulate per layer) or ``"stochastic"`` (the
        reference's RL rule: below one unit per step, one unit with probability ``rho * #eligible``; above, the
        integer part). See the module docstring for why the default differs.
    :param generator: CPU generator of the ``"stochastic"`` rule's draws (one ``rand`` per layer and step where
        ``rho * #eligible < 1``); ``None``: a generator seeded with 0.
    :param optimizer_restart: restart the optimizer state of the rows / columns a replacement touches (default;
        Dohare's ``AdamGnT``); ``False`` leaves every optimizer's state as it is, as the reference's RL runs did (their
        PPO builds torch's plain Adam, which ``gnt.py``'s ``update_optim_params`` does not touch): a new unit then
        trains with the moments its predecessor left.
    :param state: dict to keep the per-layer statistics in (persisted by the RL callback); created if None.
        Entry per layer name: ``age`` (units, int64, kept on the CPU), ``utility`` (units), ``mean_activation``
        (features, positions; positions = 1 for Linear, H*W for Conv2d), ``accumulated`` (0-dim float64),
        ``replaced`` (0-dim int64, cumulative).
    :param after_step: called with ``{layer name: replaced unit indices}`` after every :meth:`step`.
    :param recurrent_init: ``(init, gain)`` of new LSTM cells (:func:`sb3_plastic.recurrent.fresh_gate_rows`;
        the model's is :func:`sb3_plastic.recurrent.recurrent_init_scheme`).
    :param other_optimizers: further optimizers whose moments of touched entries are zeroed (those training
        consumers in another network: the critic's, for an actor's shared features extractor); not hooked.
    :param loss_rows: for a network whose training forward runs the loss rows and other rows as one batch (CrossQ's
        critic: ``cat([obs, next_obs])``, so that BatchRenorm sees their joint statistics): the number ``n`` of
        loss rows, which come first; a recorded forward of exactly ``2 * n`` rows keeps its first ``n`` rows (the
        next-state half feeds only the detached target, which Continual Backprop does not learn from, as it never
        records SAC's no-grad target forward). ``None``: every row of a training forward counts.
    """

    def __init__(
        self,
        layers: Sequence[UnitLayer],
        optimizer: Optional[th.optim.Optimizer] = None,
        replacement_rate: float = 1e-4,
        maturity_threshold: int = 100,
        decay_rate: float = 0.99,
        utility: str = "contribution",
        init: str = "default",
        init_gain: float = 1.0,
        state: Optional[dict[str, dict[str, th.Tensor]]] = None,
        after_step: Optional[Callable[[dict[str, th.Tensor]], None]] = None,
        recurrent_init: tuple[str, float] = ("default", 1.0),
        other_optimizers: Sequence[th.optim.Optimizer] = (),
        loss_rows: Optional[int] = None,
        bias_absorption: bool = False,
        replacement_rule: str = "accumulate",
        generator: Optional[th.Generator] = None,
        optimizer_restart: bool = True,
    ) -> None:
        (
            self.replacement_rate,
            self.maturity_threshold,
            self.decay_rate,
            self.utility,
        ) = check_cbp_args(replacement_rate, maturity_threshold, decay_rate, utility)
        self.bias_absorption, self.replacement_rule = check_cbp_rule(bias_absorption, replacement_rule)
        self.optimizer_restart = check_optimizer_restart(optimizer_restart)
        self.generator = th.Generator().manual_seed(0) if generator is None else generator
        if init not in INITS:
            raise ValueError(f"Unknown init {init!r}; allowed: {list(INITS)}")
        if not (_is_number(init_gain) and init_gain > 0):
            raise ValueError(f"init_gain must be a finite number > 0, got {init_gain!r}")
        names = [spec.name for spec in layers]
        if len(set(names)) != len(names):
            raise ValueError(f"GenerateAndTest needs unique layer names, got {names}")
        for spec in layers:
            problem = layer_problem(spec)
            if problem is not None:
                raise ValueError(problem)
        self.layers: dict[str, UnitLayer] = {spec.name: spec for spec in layers}
        self.optimizer = optimizer
        self.init = init
        self.init_gain = float(init_gain)
        if recurrent_init[0] not in INITS or not (_is_number(recurrent_init[1]) and recurrent_init[1] > 0):
            raise ValueError(f"recurrent_init must be (one of {list(INITS)}, gain > 0), got {recurrent_init!r}")
        self.recurrent_init = (str(recurrent_init[0]), float(recurrent_init[1]))
        if loss_rows is not None and (isinstance(loss_rows, bool) or not isinstance(loss_rows, int) or loss_rows < 1):
            raise ValueError(f"loss_rows must be None or an int >= 1, got {loss_rows!r}")
        self.loss_rows = loss_rows
        #: LSTM output sequences recorded since the last step, per cell layer name
        self._sequences: dict[str, list[th.Tensor]] = {}
        self._mask: Optional[th.Tensor] = None
        self.state: dict[str, dict[str, th.Tensor]] = {} if state is None else state
        self.after_step = after_step
        #: every optimizer of the layers (``optimizer`` first), each once
        self.optimizers = list({id(o): o for o in (optimizer, *other_optimizers) if o is not None}.values())
        #: the optimizers whose state of touched entries a replacement restarts (none without ``optimizer_restart``)
        self.restarted_optimizers = self.optimizers if self.optimizer_restart else []
        self._info = {spec.name: _LayerInfo.of(spec) for spec in layers}
        self._stored: dict[str, th.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        self._steps: Optional[OutermostStepHooks] = None
        for spec in layers:
            self._bind_state(spec)

    # ------------------------------------------------------------------ state
    def _bind_state(self, spec: UnitLayer) -> None:
        device = self._info[spec.name].weight.device
        entry = self.state.setdefault(spec.name, {})
        if "age" in entry and entry["age"].shape != (spec.n_units,):
            raise ValueError(
                f"stored Continual Backprop state of layer {spec.name!r} has {entry['age'].numel()} units, "
                f"the layer has {spec.n_units}"
            )
        # Ages stay on the CPU: eligibility is counted every step, and a CPU count never waits for the GPU.
        entry["age"] = entry.get("age", th.zeros(spec.n_units, dtype=th.long)).cpu()
        entry["utility"] = entry.get("utility", th.zeros(spec.n_units)).to(device)
        if "mean_activation" in entry:
            entry["mean_activation"] = entry["mean_activation"].to(device)
        elif not isinstance(spec.layer, nn.Conv2d):
            entry["mean_activation"] = th.zeros(spec.n_features, 1, device=device)
        # Conv2d: allocated at the first step, when the number of spatial positions is known.
        entry["accumulated"] = entry.get("accumulated", th.zeros((), dtype=th.float64)).cpu()
        entry["replaced"] = entry.get("replaced", th.zeros((), dtype=th.long)).cpu()

    def ages(self, name: str) -> th.Tensor:
        """Ages (optimizer steps since creation) of the units of layer ``name`` (a CPU tensor)."""
        return self.state[name]["age"]

    def _correction(self, age: th.Tensor, device: th.device) -> th.Tensor:
        """``1 - eta^age`` as float on ``device`` (0 where ``age == 0``)."""
        return 1.0 - th.pow(th.full_like(age, self.decay_rate, dtype=th.float32), age.float()).to(device)

    def bias_corrected_utility(self, name: str) -> th.Tensor:
        """``u_hat = u / (1 - eta^age)`` per unit (0 for units of age 0)."""
        entry = self.state[name]
        u = entry["utility"]
        correction = self._correction(entry["age"], u.device)
        return th.where(correction > 0, u / correction.clamp_min(1e-30), th.zeros_like(u))

    def bias_corrected_mean_activation(self, name: str) -> th.Tensor:
        """``f_hat = f / (1 - eta^age)`` per feature and position, shape (features, positions)."""
        entry = self.state[name]
        if "mean_activation" not in entry:
            raise ValueError(f"layer {name!r} has seen no activations yet")
        f = entry["mean_activation"]
        correction = self._correction(entry["age"].repeat_interleave(self.layers[name].group_size), f.device)[:, None]
        return th.where(correction > 0, f / correction.clamp_min(1e-30), th.zeros_like(f))

    def eligible(self, name: str) -> th.Tensor:
        """Boolean mask of the units of layer ``name`` older than the maturity threshold (CPU)."""
        return self.state[name]["age"] > self.maturity_threshold

    def replaced(self, name: str) -> int:
        """Cumulative number of units replaced in layer ``name``."""
        return int(self.state[name]["replaced"])

    # ------------------------------------------------------------------ statistics
    def _outgoing_sum(self, name: str) -> tuple[th.Tensor, int]:
        """``(sum_k |W_out[k, j]|`` per feature over every outgoing weight of every consumer, number of summed
        weights per feature``)``; their ratio is the pooled ``mean_k |W_out[k, j]|``."""
        info = self._info[name]
        n = info.n_features
        spec = self.layers[name]
        if isinstance(spec, RecurrentUnits):  # every reader of h: columns 0..H-1 of each outgoing matrix
            return sum(w[:, :n].abs().sum(dim=0) for w, _ in spec.outgoing()), info.out_count
        if info.whole_consumer is not None:  # fast path: the whole input of a single consumer
            w = info.whole_consumer
            if w.dim() == 4:
                return w.abs().sum(dim=(0, 2, 3)), info.out_count
            if w.shape[1] == n:
                return w.abs().sum(dim=0), info.out_count
            return w.abs().view(w.shape[0], n, -1).sum(dim=(0, 2)), info.out_count
        total = th.zeros(n, device=info.weight.device)
        for consumer in self.layers[name].consumers:
            w = consumer.weight
            start = consumer.offset
            if isinstance(consumer.layer, nn.Conv2d):
                total += w[:, start : start + n].abs().sum(dim=(0, 2, 3)).to(total.device)
            else:
                p = consumer.columns_per_unit
                total += w[:, start : start + n * p].abs().reshape(w.shape[0], n, p).sum(dim=(0, 2)).to(total.device)
        if info.out_count == 0:
            return th.ones_like(total), 1
        return total, info.out_count

    def update(self, activations: Mapping[str, th.Tensor]) -> None:
        """The statistics part of a step: ages, running mean activations and utilities of the layers in
        ``activations`` (post-activation outputs of one minibatch); other layers are left untouched.

        The means of the formulas are computed as sums with the ``1/count`` factors folded into the running
        average updates (fewer tensor operations per step)."""
        eta = self.decay_rate
        with th.no_grad():
            for name, h in activations.items():
                info = self._info[name]
                entry = self.state[name]
                n = info.n_features
                weight = info.weight
                h = h.detach()
                if h.device != weight.device or h.dtype != th.float32:
                    h = h.to(device=weight.device, dtype=th.float32)
                if info.is_conv:
                    h = h.reshape(h.shape[0], n, -1)  # (batch, channels, positions)
                    n_batch, n_pos = h.shape[0], h.shape[2]
                    h_sum = h.sum(dim=0)
                    abs_sum = h_sum.sum(dim=1) if info.nonneg else h.abs().sum(dim=(0, 2))
                else:
                    h = h.reshape(-1, n)
                    n_batch, n_pos = h.shape[0], 1
                    h_sum = h.sum(dim=0)
                    abs_sum = h_sum if info.nonneg else h.abs().sum(dim=0)
                    h_sum = h_sum.unsqueeze(1)
                f = entry.get("mean_activation")
                if f is None:
                    f = entry["mean_activation"] = th.zeros_like(h_sum)
                elif f.shape != h_sum.shape:
                    raise ValueError(
                        f"layer {name!r}: activations have {h_sum.shape[1]} positions per feature, the stored "
                        f"statistics {f.shape[1]}; Continual Backprop needs a fixed input size"
                    )
                ages = entry["age"].numpy()  # shares memory with the CPU tensor: += is in place, no torch dispatch
                ages += 1
                # f <- eta f + (1 - eta) mean(h)
                f.mul_(eta).add_(h_sum, alpha=(1.0 - eta) / n_batch)
                if self.utility == "adaptable_contribution":
                    # GnT's adaptable contribution reads |h - f_hat|, centred on the updated bias-corrected mean
                    f_hat = self.bias_corrected_mean_activation(name)  # (features, positions)
                    centred = h - (f_hat.unsqueeze(0) if info.is_conv else f_hat[:, 0])
                    abs_sum = centred.abs().sum(dim=(0, 2) if info.is_conv else 0)
                if info.post_norm is not None:  # the consumers read gain * h + shift: weigh |h| by |gain|
                    abs_sum = abs_sum * norm_affine(info.post_norm)[0].abs().to(abs_sum.device)
                # y = mean|W_out| * mean|h|  [/ mean|W_in|], averaged over the features of a unit
                out_sum, out_count = self._outgoing_sum(name)
                scale = (1.0 - eta) / (out_count * n_batch * n_pos * info.group_size)
                u = entry["utility"]
                if self.utility == "adaptable_contribution":
                    y = out_sum.mul_(abs_sum).div_(self._incoming_sum(name).clamp_min(1e-12))
                    scale *= info.fan_in
                    if info.group_size > 1:
                        y = y.view(info.n_units, info.group_size).sum(dim=1)
                    u.mul_(eta).add_(y, alpha=scale)
                elif info.group_size > 1:
                    y = out_sum.mul_(abs_sum).view(info.n_units, info.group_size).sum(dim=1)
                    u.mul_(eta).add_(y, alpha=scale)
                else:
                    u.mul_(eta).addcmul_(out_sum, abs_sum, value=scale)

    def _incoming_sum(self, name: str) -> th.Tensor:
        """``sum_i |W_in[j, i]|`` per feature (LSTM cells: over the four gate rows of ``weight_ih`` and ``weight_hh``)."""
        spec = self.layers[name]
        n = self._info[name].n_features
        if isinstance(spec, RecurrentUnits):
            return sum(w.abs().view(4, n, -1).sum(dim=(0, 2)) for w in spec.incoming())
        return self._info[name].weight.abs().reshape(n, -1).sum(dim=1)

    def select(self, names: Optional[Sequence[str]] = None) -> dict[str, th.Tensor]:
        """The test part of a step: for each layer, the number of units to replace (``"accumulate"``: add
        ``rho * #eligible`` to its accumulator and take the integer part; ``"stochastic"``: the reference's draw) and
        that many eligible units with the lowest bias-corrected utility (ties: lower index first). Mutates the
        accumulators (and draws from :attr:`generator`); returns the unit indices of the layers where units are
        replaced."""
        chosen: dict[str, th.Tensor] = {}
        for name in self.layers if names is None else names:
            entry = self.state[name]
            n_eligible = int((entry["age"].numpy() > self.maturity_threshold).sum())
            if n_eligible == 0 or self.replacement_rate == 0:
                continue
            expected = self.replacement_rate * n_eligible
            if self.replacement_rule == "stochastic":
                # gnt.py (accumulate=False): one unit with probability x below 1, else int(x) (fraction dropped)
                draw = expected < 1 and float(th.rand(1, generator=self.generator)) <= expected
                n = min(1 if draw else int(expected), n_eligible)
            else:
                acc = float(entry["accumulated"]) + expected
                n = min(math.floor(acc + _FLOOR_EPS), n_eligible)
                entry["accumulated"].fill_(acc - n)
            if n == 0:
                continue
            u_hat = self.bias_corrected_utility(name)
            candidates = self.eligible(name).nonzero().flatten().to(u_hat.device)
            order = th.sort(u_hat[candidates], stable=True).indices
            chosen[name] = candidates[order[:n]]
        return chosen

    def replace(self, name: str, units: th.Tensor) -> None:
        """The generate part: replace ``units`` of layer ``name`` (fresh incoming weights from the layer's
        initialiser, zero bias, zero outgoing weights, with ``bias_absorption`` their mean contribution moved into
        the consumers' biases first,
        the optimizer state of the touched rows / columns restarted: :func:`~sb3_plastic.common.unit_reset.replace_units_`
        / :func:`~sb3_plastic.common.unit_reset.replace_cells_`) and restart their statistics."""
        spec = self.layers[name]
        entry = self.state[name]
        units = units.to(self._info[name].weight.device).long()
        if units.numel() == 0:
            return
        recurrent = isinstance(spec, RecurrentUnits)
        feats = units if recurrent else features_of(spec, units)
        with th.no_grad():
            absorb = self.bias_absorption and "mean_activation" in entry
            f_hat = self.bias_corrected_mean_activation(name)[feats] if absorb else None
            if recurrent:
                init, gain = self.recurrent_init
                replace_cells_(spec, units, self.restarted_optimizers, init, gain,
                               None if f_hat is None else f_hat[:, 0])
            else:
                fresh = fresh_incoming_weights(spec.layer.weight, feats, self.init, self.init_gain)
                replace_units_(spec, feats, fresh, self.restarted_optimizers, f_hat)
            entry["age"][units.cpu()] = 0
            entry["utility"][units] = 0.0
            if "mean_activation" in entry:
                entry["mean_activation"][feats] = 0.0
            entry["replaced"] += int(units.numel())

    def restart_statistics(self, params: Sequence[th.Tensor]) -> list[str]:
        """Restart the age, running utility and mean activation of every unit of the layers whose incoming weight is
        among ``params`` (a layer re-drawn whole by another intervention: its units are new, as replaced ones are).

        :return: the names of the restarted layers.
        """
        ids = {id(p) for p in params}
        restarted = [name for name, info in self._info.items() if id(info.weight) in ids]
        for name in restarted:
            entry = self.state[name]
            entry["age"].zero_()
            entry["utility"].zero_()
            if "mean_activation" in entry:
                entry["mean_activation"].zero_()
        return restarted

    def step(self, activations: Optional[Mapping[str, th.Tensor]] = None) -> dict[str, th.Tensor]:
        """One generate-and-test step (call it after each optimizer step).

        :param activations: post-activation outputs per layer name of the minibatch that produced the
            optimizer step; ``None`` uses (and clears) those recorded by the hooks of :meth:`attach`.
            Layers without activations are skipped (no ageing, no replacement).
        :return: replaced unit indices per layer name (only layers where units were replaced).
        """
        if activations is None:
            activations, self._stored = self._stored, {}
            activations.update(self._pop_sequences())
        if not activations:
            return {}
        unknown = sorted(set(activations) - set(self.layers))
        if unknown:
            raise KeyError(f"no hidden layer named {unknown}; known: {sorted(self.layers)}")
        self.update(activations)
        chosen = self.select(list(activations))
        for name, units in chosen.items():
            self.replace(name, units)
        if len(chosen) > 1:
            # a fresh row of a consumer replaced in the same step must not re-open a replaced unit's output
            zero_outgoing_last_(
                [
                    (spec, units if isinstance(spec, RecurrentUnits) else features_of(spec, units))
                    for spec, units in ((self.layers[name], units) for name, units in chosen.items())
                ],
                self.restarted_optimizers,
            )
        if self.after_step is not None:
            self.after_step(chosen)
        return chosen

    # ------------------------------------------------------------------ hooks
    @property
    def attached(self) -> bool:
        """Whether the hooks of :meth:`attach` are installed."""
        return bool(self._handles)

    def observe(self, name: str, h: th.Tensor) -> None:
        """Record ``h`` as the latest post-activation output of layer ``name`` (what the hooks do)."""
        self._stored[name] = h.detach()

    def attach(self) -> None:
        """Install the hooks (idempotent).

        * A forward hook per layer on its activation module (on the layer itself, applying the normalisation
          between the layer and its activation, if any, and the activation, when an activation module is shared by
          several layers: :func:`sb3_plastic.callbacks.redo._post_activation`; on the layer output when there is
          none)
          that records the output only when the module is in training mode and autograd is on: SB3 switches
          training mode on inside ``train()`` and off for rollouts, ``predict`` and evaluation, and the
          no-grad forwards of ``train()`` (SAC/TQC's next-state actions) compute targets, not the loss being
          stepped. The recorded output is therefore the last loss forward before the optimizer step.
        * With an optimizer: step pre/post hooks; the post hook runs :meth:`step` once per outermost
          ``optimizer.step()`` (an optimizer whose ``step`` calls a hooked parent ``step``, such as AdamO
          calling ``Adam.step``, fires hooks twice; the depth count keeps one step per update).
        """
        if self._handles:
            return
        counts: dict[int, int] = {}
        for spec in self.layers.values():
            if spec.activation is not None:
                counts[id(spec.activation)] = counts.get(id(spec.activation), 0) + 1
        lstms: dict[int, list[RecurrentUnits]] = {}
        for spec in self.layers.values():
            if isinstance(spec, RecurrentUnits):
                lstms.setdefault(id(spec.layer), []).append(spec)
        for cells in lstms.values():
            self._handles.append(cells[0].layer.register_forward_hook(self._sequence_recorder(cells)))
        for name, spec in self.layers.items():
            if isinstance(spec, RecurrentUnits):
                continue
            act = spec.activation
            if act is not None and counts[id(act)] == 1:
                self._handles.append(act.register_forward_hook(self._recorder(name)))
            elif act is None and spec.pre_norm is None:
                self._handles.append(spec.layer.register_forward_hook(self._recorder(name)))
            else:  # a shared activation (or a norm without one): act(norm(layer output)), as ReDo scores it
                self._handles.append(spec.layer.register_forward_hook(self._recorder(name, partial(_post_activation, spec))))
        if self.optimizer is not None:
            self._steps = OutermostStepHooks(self.optimizer, self._after_step)
            self._handles += self._steps.handles

    def detach(self) -> None:
        """Remove the hooks and drop recorded activations."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stored = {}
        self._sequences = {}
        self._mask = None
        self._steps = None

    def set_sequence_mask(self, mask: Optional[th.Tensor]) -> None:
        """Start a new minibatch for the LSTM hooks: drop the sequences recorded so far and use ``mask`` (sb3-contrib's
        ``rollout_data.mask``: ``(n_seq * max_len,)``, sequence-major, > 0 on real steps, 0 on padding) to select the
        real steps of the sequences recorded next; ``None``: every step counts."""
        self._sequences = {}
        self._mask = None if mask is None else (mask.detach().reshape(-1) > 1e-8)

    def _sequence_recorder(self, cells: list[RecurrentUnits]) -> Callable[..., None]:
        """Forward hook on an ``nn.LSTM`` (time-major ``(L, N, in)`` input, as sb3-contrib calls it): record each
        layer's output sequence for ``cells`` (the top layer's is the LSTM output; lower layers are recomputed
        from the same input and initial states, :func:`sb3_plastic.recurrent.lstm_layer_outputs`). A call of
        several steps is a whole minibatch forward and replaces what was recorded; one-step calls (sb3-contrib
        steps through a sequence in which an episode starts) are appended."""

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            self._reset_step_depth()
            if not (module.training and th.is_grad_enabled()):
                return
            seq = output[0] if isinstance(output, tuple) else output
            if seq.dim() == 2:  # unbatched (L, H)
                seq = seq.unsqueeze(1)
            per_layer = {module.num_layers - 1: seq.detach()}
            if any(not c.top for c in cells):
                x = inputs[0] if inputs[0].dim() == 3 else inputs[0].unsqueeze(1)
                states = inputs[1] if len(inputs) > 1 else None
                if states is not None and states[0].dim() == 2:
                    states = (states[0].unsqueeze(1), states[1].unsqueeze(1))
                per_layer.update(enumerate(lstm_layer_outputs(module, x, states)[:-1]))
            for c in cells:
                h = per_layer[c.index]
                recorded = self._sequences.get(c.name)
                if h.shape[0] > 1 or not recorded or recorded[0].shape[1] != h.shape[1]:
                    self._sequences[c.name] = [h]
                else:
                    recorded.append(h)

        return hook

    def _pop_sequences(self) -> dict[str, th.Tensor]:
        """The recorded LSTM outputs per cell layer as ``(valid steps, H)``, with the padding mask applied when its
        size fits ``steps * sequences``; clears the record and the mask."""
        out = {}
        for name, parts in self._sequences.items():
            h = th.cat(parts) if len(parts) > 1 else parts[0]  # (L, N, H)
            mask = self._mask
            if mask is not None and mask.numel() == h.shape[0] * h.shape[1]:
                # the mask is sequence-major (N, L); the LSTM output time-major (L, N)
                h = h[mask.to(h.device).view(h.shape[1], h.shape[0]).T]
            if h.numel():
                out[name] = h.reshape(-1, h.shape[-1])
        self._sequences = {}
        self._mask = None
        return out

    def _recorder(self, name: str, apply: Optional[Callable[[th.Tensor], th.Tensor]] = None) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: th.Tensor) -> None:
            self._reset_step_depth()
            if module.training and th.is_grad_enabled():
                if apply is not None:
                    with th.no_grad():
                        output = apply(output)
                if self.loss_rows is not None and output.shape[0] == 2 * self.loss_rows:
                    output = output[: self.loss_rows]  # a joint forward: its loss rows come first (CrossQ)
                self._stored[name] = output.detach()

        return hook

    def _after_step(self, optimizer: th.optim.Optimizer) -> None:
        self.step()

    def _reset_step_depth(self) -> None:
        # forwards happen outside optimizer steps: recover from a step that raised
        if self._steps is not None:
            self._steps.reset()


# ---------------------------------------------------------------------------------------------- SB3
def resolve_init(model: BaseAlgorithm) -> tuple[str, float]:
    """The initialiser the model's hidden layers were built with, as ``(init, gain)``: the scheme of
    :func:`sb3_plastic.callbacks.redo.layer_init_scheme` (hidden layers of a model all share one), e.g.
    ``("orthogonal", sqrt(isometry_scale))`` for plastic orthogonal init, ``("orthogonal", sqrt(2))`` for SB3's
    ``ortho_init`` (PPO, A2C), ``("default", 1.0)`` otherwise (DQN, QR-DQN, SAC, TQC).
    """
    scheme = layer_init_scheme(model)
    for spec in find_networks(model):
        for hidden in spec.hidden_layers():
            return scheme(hidden.layer)
    return "default", 1.0


def joint_forward_loss_rows(model: BaseAlgorithm, network: str) -> Optional[int]:
    """The ``loss_rows`` of :class:`GenerateAndTest` for ``network`` of ``model``: CrossQ's critic (sb3-contrib, and
    :class:`~sb3_plastic.PlasticCrossQ`) runs ``cat([obs, next_obs])`` with ``(actions, next_actions)`` through one
    training forward of ``2 * batch_size`` rows, the first ``batch_size`` of which make the loss; ``None`` for
    every other network and algorithm."""
    from sb3_contrib import CrossQ

    if isinstance(model, CrossQ) and network == "critic":
        return int(model.batch_size)
    return None


class ContinualBackprop(PlasticCallback):
    """Continual Backprop (Dohare et al., 2024, "Loss of plasticity in deep continual learning", Nature)
    for any SB3 / sb3-contrib algorithm: PPO, A2C, DQN, QR-DQN, SAC, TQC, CrossQ, TD3, DDPG, RecurrentPPO and
    MaskablePPO, and their plastic versions.

    Each network found by :func:`~sb3_plastic.common.surgery.find_networks` (PPO/A2C: ``policy``; DQN:
    ``q_net``; QR-DQN: ``quantile_net``; SAC/TQC: ``actor`` and ``critic``) gets a :class:`GenerateAndTest`
    over its hidden Linear / Conv2d layers (output heads are never replaced) and, for RecurrentPPO, the cells
    of its LSTM layers (:mod:`sb3_plastic.recurrent`; during training the callback wraps the rollout buffer's
    ``_get_samples`` to hand each minibatch's padding mask to the LSTM hooks). SB3 callbacks never run inside
    ``train()``, so at training start the callback installs forward hooks on the activations and a
    step-post hook on each network's optimizer; generate-and-test runs after every optimizer step on the
    activations of the minibatch that produced it. Only training-mode, grad-enabled forwards are recorded
    (rollouts, ``predict`` and evaluation run in eval mode and change nothing). The hooks are removed at
    training end and never installed twice.

    SAC / TQC: at the critic's optimizer step the recorded critic activations are those of the critic
    forward on the replay actions (the last training-mode, grad-enabled critic forward before that step);
    at the actor's step the actor activations are those of the actor forward on the replay observations
    (the next-observation forward runs without grad and is not recorded). Target networks are not touched:
    they follow the online network through SB3's own (polyak or periodic) updates. With
    ``share_features_extractor=True`` the shared extractor's units belong to the actor (recorded at the actor's
    forward, replaced after the actor's step); their outgoing weights are the actor's first layer and every
    q-network's first layer of the critic (utility over all of them, bias absorption and zeroing in each,
    moments zeroed in the critic's optimizer too).

    New units get incoming weights from the layer's own initialiser (:func:`resolve_init`,
    :func:`fresh_incoming_weights`): orthogonal rows for orthogonally initialised layers (MaxMin / plastic
    ``orthogonal_init``, SB3's ``ortho_init``), PyTorch's default init otherwise. Units, MaxMin pairs and
    the conv -> linear mapping: see the module docstring. Maturity counts optimizer steps (PPO: minibatch
    updates), not environment steps.

    Logged: ``plasticity/cbp/<network>/<layer>/replaced`` (cumulative) and ``plasticity/cbp/replaced``
    (total); ``cbp_<name>`` with a ``name`` (:meth:`~.base.PlasticCallback.log_group`).
    Utilities, ages, mean activations, accumulators and counts live in ``self.state`` (stored on
    the model, keyed ``state[network][layer]``; the ``"stochastic"`` rule's generator state in ``state["rng"]``), so
    they survive save -> load -> learn.

    :param replacement_rate: ``rho`` in [0, 1]: fraction of the eligible units replaced per optimizer step
        (see ``replacement_rule``); 0 turns the callback off. Dohare et al. use 1e-4 for PPO.
    :param maturity_threshold: units are eligible after this many optimizer steps (default 10 000, Dohare et al.'s RL
        value for PPO; 100 is their supervised setting). A run of fewer updates replaces nothing: PPO with SB3's
        defaults (one env) makes 320 updates per 2 048 env steps, so its first units mature after 64 000 env steps.
    :param decay_rate: ``eta`` in [0, 1) of the running utility and mean activation (0.99).
    :param utility: ``"contribution"`` or ``"adaptable_contribution"`` (GnT's centred ``|h - f_hat|``).
    :param bias_absorption: move a replaced unit's mean contribution into its consumers' biases (the paper);
        ``False`` (default): none, as the reference's runs (see the module docstring).
    :param replacement_rule: ``"accumulate"`` (default: fractions carried over, deterministic) or ``"stochastic"``
        (the reference's RL rule, drawn from a private generator whose state is saved in ``self.state["rng"]``).
    :param unit_init: initialiser of a new unit's incoming weights (an LSTM cell's gate rows too): ``None`` (default)
        the layer's own (:func:`resolve_init`, :func:`~sb3_plastic.recurrent.recurrent_init_scheme`: what the policy
        was built with), or ``"lecun"`` (``U(+-sqrt(3 / fan_in))``, the reference's RL runs, ``init='lecun'``),
        ``"orthogonal"`` (gain 1) or ``"default"`` (PyTorch's). Set it where
        the weights were redrawn after the policy was built (a LeCun-initialised SB3 policy still reports SB3's
        orthogonal scheme).
    :param optimizer_restart: restart the optimizer state of the rows / columns a replacement touches (default, as
        Dohare's ``AdamGnT``); ``False``: leave it, as the reference's RL runs did with torch's plain Adam (a new unit
        trains with the moments its predecessor left).
    :param name: distinguishes two instances on one model (part of the state key).
    :param verbose: 1 prints the replacement counts at training end, 2 every replacement.

    Options that cannot act say so: with ``replacement_rate > 0`` a warning at training start when no network has
    a hidden layer with an optimizer to act on (e.g. ``net_arch=[]``), and once at training end when no unit has yet
    become eligible (a run shorter than ``maturity_threshold`` updates replaces nothing).
    """

    edits_layers = True  # refused with a plasticity injection (PlasticCallback._refuse_with_injection)

    def __init__(
        self,
        replacement_rate: float = 1e-4,
        maturity_threshold: int = 10_000,
        decay_rate: float = 0.99,
        utility: str = "contribution",
        bias_absorption: bool = False,
        replacement_rule: str = "accumulate",
        unit_init: Optional[str] = None,
        optimizer_restart: bool = True,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        (
            self.replacement_rate,
            self.maturity_threshold,
            self.decay_rate,
            self.utility,
        ) = check_cbp_args(replacement_rate, maturity_threshold, decay_rate, utility)
        self.bias_absorption, self.replacement_rule = check_cbp_rule(bias_absorption, replacement_rule)
        self.unit_init = check_unit_init(unit_init)
        self.optimizer_restart = check_optimizer_restart(optimizer_restart)
        #: the private CPU generator of the ``"stochastic"`` rule (its state: ``self.state["rng"]``)
        self.generator: Optional[th.Generator] = None
        self.engines: dict[str, GenerateAndTest] = {}
        #: (rollout buffer, its own ``_get_samples`` attribute before ours or None, our wrapper) while installed
        self._watch: Optional[tuple[Any, Any, Callable[..., Any]]] = None
        #: whether the "no unit ever became eligible" warning was given
        self._warned_immature = False

    @property
    def enabled(self) -> bool:
        """Whether any unit can be replaced (``replacement_rate > 0``)."""
        return self.replacement_rate > 0

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._detach()
        if not self.enabled:
            return
        init, gain = resolve_init(self.model) if self.unit_init is None else (self.unit_init, 1.0)
        recurrent_init = recurrent_init_scheme(self.model) if self.unit_init is None else (self.unit_init, 1.0)
        self.generator = th.Generator()
        if isinstance(self.state.get("rng"), th.Tensor):
            self.generator.set_state(self.state["rng"])
        else:
            self.generator.manual_seed(shrink_perturb_seed(getattr(self.model, "seed", None), self.state_key))
        idle: list[str] = []
        for spec in self.networks:
            layers: list[UnitLayer] = []
            for layer in [*spec.hidden_layers(), *spec.recurrent_units()]:
                problem = layer_problem(layer)
                if problem is None:
                    layers.append(layer)
                else:
                    warnings.warn(f"ContinualBackprop skips {spec.name}/{layer.name}: {problem}")
            if not layers:
                idle.append(f"{spec.name}: no hidden layer (output heads are never replaced)")
                continue
            if spec.optimizer is None:
                idle.append(f"{spec.name}: no optimizer (replacement runs after optimizer steps)")
                warnings.warn(f"ContinualBackprop skips network {spec.name!r}: it has no optimizer whose steps it follows")
                continue
            engine = GenerateAndTest(
                layers,
                spec.optimizer,
                replacement_rate=self.replacement_rate,
                maturity_threshold=self.maturity_threshold,
                decay_rate=self.decay_rate,
                utility=self.utility,
                init=init,
                init_gain=gain,
                state=self.state.setdefault(spec.name, {}),
                after_step=self._logger_for(spec.name),
                recurrent_init=recurrent_init,
                other_optimizers=spec.optimizers()[1:],
                loss_rows=joint_forward_loss_rows(self.model, spec.name),
                bias_absorption=self.bias_absorption,
                replacement_rule=self.replacement_rule,
                generator=self.generator,
                optimizer_restart=self.optimizer_restart,
            )
            # also after SB3's load, which rebuilds the optimizer as plain Adam; without restarts it stays torch's
            enable_unit_restarts(engine.restarted_optimizers)
            engine.attach()
            self.engines[spec.name] = engine
        if not self.engines:
            warnings.warn(
                f"ContinualBackprop(replacement_rate={self.replacement_rate}) has nothing to act on "
                f"({'; '.join(idle)}): it will replace no unit",
                stacklevel=2,
            )
        self._watch_minibatches()
        self._record_counts()

    def _watch_minibatches(self) -> None:
        """For LSTM cells: wrap the rollout buffer's ``_get_samples`` (sb3-contrib's ``RecurrentRolloutBuffer``
        builds each padded minibatch there) so that every minibatch hands its padding mask
        (``rollout_data.mask``) to the engines before ``train()`` runs the policy on it
        (:meth:`GenerateAndTest.set_sequence_mask`). Removed at training end."""
        engines = [e for e in self.engines.values() if any(isinstance(s, RecurrentUnits) for s in e.layers.values())]
        buffer = getattr(self.model, "rollout_buffer", None)
        if not engines or buffer is None or not callable(getattr(buffer, "_get_samples", None)):
            return
        inner = buffer._get_samples
        previous = vars(buffer).get("_get_samples")

        def get_samples(*args: Any, **kwargs: Any) -> Any:
            samples = inner(*args, **kwargs)
            mask = getattr(samples, "mask", None)
            for engine in engines:
                engine.set_sequence_mask(mask if isinstance(mask, th.Tensor) else None)
            return samples

        buffer._get_samples = get_samples
        self._watch = (buffer, previous, get_samples)

    def _unwatch_minibatches(self) -> None:
        if self._watch is None:
            return
        buffer, previous, ours = self._watch
        self._watch = None
        if vars(buffer).get("_get_samples") is ours:
            if previous is None:
                del buffer._get_samples
            else:
                buffer._get_samples = previous

    def _on_parameters_rewritten(self, params: Sequence[th.Tensor], redrawn: bool = False) -> None:
        """A layer reset re-drew whole layers (``redrawn``): their units are new units, so their age, utility and mean
        activation restart (:meth:`GenerateAndTest.restart_statistics`), as a replaced unit's do. Transformations of
        existing units (FIRE's polar factor, a Shrink & Perturb event) keep the statistics: the units stay."""
        if redrawn:
            for engine in self.engines.values():
                engine.restart_statistics(params)

    def _on_training_end(self) -> None:
        self._record_counts()
        if self.verbose >= 1 and self.engines:
            print(f"ContinualBackprop: {self.counts()}")
        self._warn_if_never_eligible()
        self._detach()

    def _warn_if_never_eligible(self) -> None:
        """Warn (once per callback) when units could be replaced but none ever reached the maturity threshold: no
        replacement so far and every unit's age still ``<= maturity_threshold`` (ages only restart on replacement)."""
        if self._warned_immature or not self.engines or self.total_replaced > 0:
            return
        ages = [engine.ages(name) for engine in self.engines.values() for name in engine.layers]
        oldest = max((int(age.max()) for age in ages if age.numel()), default=0)
        if oldest > self.maturity_threshold:
            return
        self._warned_immature = True
        warnings.warn(
            f"ContinualBackprop(replacement_rate={self.replacement_rate}): no unit has become eligible, the oldest is "
            f"{oldest} optimizer steps old and maturity_threshold={self.maturity_threshold}; nothing was replaced. "
            "Lower maturity_threshold or train for more updates",
            stacklevel=2,
        )

    def _detach(self) -> None:
        self._unwatch_minibatches()
        for engine in self.engines.values():
            engine.detach()
        self.engines = {}

    def _logger_for(self, network: str) -> Callable[[dict[str, th.Tensor]], None]:
        def after_step(chosen: dict[str, th.Tensor]) -> None:
            if self.verbose >= 2:
                for layer, units in chosen.items():
                    if units.numel():
                        print(f"ContinualBackprop: {network}/{layer}: replaced units {units.tolist()}")
            if chosen:  # counts change only here; _on_rollout_end re-records them for every log dump
                self._record_counts()
            if self.replacement_rule == "stochastic" and self.generator is not None:
                self.state["rng"] = self.generator.get_state()  # saved with the model: a resumed run draws on

        return after_step

    def _on_rollout_end(self) -> None:
        self._record_counts()

    def counts(self) -> dict[str, int]:
        """Cumulative replacements per ``<network>/<layer>``."""
        return {
            f"{network}/{layer}": int(entry["replaced"])
            for network, layers in self.state.items()
            if isinstance(layers, dict)  # not the generator state "rng"
            for layer, entry in layers.items()
        }

    @property
    def total_replaced(self) -> int:
        """Cumulative replacements over every network and layer."""
        return sum(self.counts().values())

    def _record_counts(self) -> None:
        if self.model is None or not self.engines:
            return
        counts = self.counts()
        for key, value in counts.items():
            self.record(f"{self.log_group('cbp')}/{key}/replaced", value)
        self.record(f"{self.log_group('cbp')}/replaced", sum(counts.values()))


# ---------------------------------------------------------------------------------------------- config
@dataclass
class ContinualBackpropConfig(InterventionConfig):
    """Continual Backprop settings as the top-level keywords of the plastic algorithms (and rl_zoo3 yaml /
    optuna samplers). Dohare et al. (2024), "Loss of plasticity in deep continual learning", Nature.

    :param replacement_rate: ``rho`` in [0, 1], fraction of eligible hidden units replaced per optimizer
        step (see ``cbp_replacement_rule``); 0 (default) turns Continual Backprop off. Reference RL value: 1e-4.
    :param maturity_threshold: optimizer steps before a unit may be replaced (default 10 000, the reference RL value).
    :param cbp_decay_rate: ``eta`` in [0, 1) of the running utility and mean activation (0.99).
    :param cbp_utility: ``"contribution"`` (``mean|W_out| * mean|h|``) or ``"adaptable_contribution"``
        (``mean|W_out| * mean|h - f_hat| / mean|W_in|``, GnT's).
    :param cbp_bias_absorption: a replaced unit's mean contribution moved into its consumers' biases (the paper's
        description); ``False`` (default): none, as the reference's runs, whose ``gnt.py`` zeroes the mean activation
        before reading it (:mod:`sb3_plastic.callbacks.cbp` lists every difference from the reference).
    :param cbp_replacement_rule: ``"accumulate"`` (default: fractions of a unit carried over, deterministic) or
        ``"stochastic"`` (the reference's RL rule: below one unit per step, one unit with probability
        ``rho * #eligible``).
    :param cbp_unit_init: initialiser of a new unit's incoming weights: ``None`` (default) the layer's own, or
        ``"lecun"`` (the reference's RL runs), ``"orthogonal"``, ``"default"``.
    :param cbp_optimizer_restart: restart the optimizer state of the entries a replacement touches (default);
        ``False``: keep it, as the reference's RL runs (plain Adam).

    The other fields set away from their defaults while ``replacement_rate`` is 0 warn (``UserWarning``: they cannot
    act), as Shrink & Perturb's do without its mode.
    """

    replacement_rate: float = 0.0
    maturity_threshold: int = 10_000
    cbp_decay_rate: float = 0.99
    cbp_utility: str = "contribution"
    cbp_bias_absorption: bool = False
    cbp_replacement_rule: str = "accumulate"
    cbp_unit_init: Optional[str] = None
    cbp_optimizer_restart: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed; normalise the types."""
        (
            self.replacement_rate,
            self.maturity_threshold,
            self.cbp_decay_rate,
            self.cbp_utility,
        ) = check_cbp_args(
            self.replacement_rate,
            self.maturity_threshold,
            self.cbp_decay_rate,
            self.cbp_utility,
            names=("replacement_rate", "maturity_threshold", "cbp_decay_rate", "cbp_utility"),
        )
        self.cbp_bias_absorption, self.cbp_replacement_rule = check_cbp_rule(
            self.cbp_bias_absorption, self.cbp_replacement_rule, names=("cbp_bias_absorption", "cbp_replacement_rule")
        )
        self.cbp_unit_init = check_unit_init(self.cbp_unit_init, "cbp_unit_init")
        self.cbp_optimizer_restart = check_optimizer_restart(self.cbp_optimizer_restart, "cbp_optimizer_restart")
        if not self.enabled:
            warn_ignored_options(
                changed_fields(self, ("maturity_threshold", "cbp_decay_rate", "cbp_utility", "cbp_bias_absorption",
                                      "cbp_replacement_rule", "cbp_unit_init", "cbp_optimizer_restart")),
                "replacement_rate is 0 (Continual Backprop is off); set replacement_rate > 0",
                stacklevel=4,
            )

    @property
    def enabled(self) -> bool:
        """Whether Continual Backprop is on (``replacement_rate > 0``)."""
        return self.replacement_rate > 0

    def make_callback(self, name: Optional[str] = None, verbose: int = 0) -> ContinualBackprop:
        """The :class:`ContinualBackprop` callback with these settings (a no-op when not :attr:`enabled`)."""
        return ContinualBackprop(
            replacement_rate=self.replacement_rate,
            maturity_threshold=self.maturity_threshold,
            decay_rate=self.cbp_decay_rate,
            utility=self.cbp_utility,
            bias_absorption=self.cbp_bias_absorption,
            replacement_rule=self.cbp_replacement_rule,
            unit_init=self.cbp_unit_init,
            optimizer_restart=self.cbp_optimizer_restart,
            name=name,
            verbose=verbose,
        )



#: Names of the Continual Backprop keywords of the plastic algorithms, in signature order.
CBP_KEYS: tuple[str, ...] = tuple(ContinualBackpropConfig.__dataclass_fields__)
