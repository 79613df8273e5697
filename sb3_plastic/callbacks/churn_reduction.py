"""C-CHAIN: continual churn approximated reduction (Tang, Obando-Ceron, Castro, Courville & Berseth, ICML 2025,
"Mitigating Plasticity Loss in Continual Reinforcement Learning by Reducing Churn"; code bluecontra/C-CHAIN).

Churn is the change of the network's outputs on data *outside* the minibatch of an update. C-CHAIN (from CHAIN, Tang &
Berseth, NeurIPS 2024, bluecontra/CHAIN) adds to every update's loss a regulariser that keeps the outputs on another
batch close to those of the network *before the previous update*, ``theta_{t-1}``:

* **policy churn** (PPO, A2C, MaskablePPO; the paper's Gym control, ProcGen and DMC agents): on a second minibatch
  ``B'`` drawn from the same rollout, the cross entropy ``-sum_a pi_{t-1}(a|s) log(pi_t(a|s) + 1e-8)`` averaged over
  ``B'`` for discrete actions (``crl_gym_classic_control/basic_utils.py``, ``crl_procgen/agents/ppo.py``), the mean
  squared difference of the action means for continuous ones (``crl_dmc/crl_run_ppo_c_chain_dmc.py``). The value
  function is not regularised in the PPO references.
* **value churn** (DQN, QR-DQN: the paper's C-MinAtar Double DQN, ``crl_minatar/agents/double_dqn_c_chain.py``): the
  mean squared difference of all Q-values (all quantiles) on an independent replay batch.
* **critic value churn** (SAC, TQC, TD3; not in the C-CHAIN paper, whose continual agents are PPO and DQN; this is
  CHAIN's value churn reduction of SAC, ``mujoco/algs/sac_vcr.py``): the sum over the Q-networks of the mean squared
  difference of ``Q(s, a)`` on an independent replay batch with its actions, at CHAIN's fixed coefficient 1.

The coefficient ``lambda`` adapts so that the regulariser keeps a target scale relative to the task loss (C-CHAIN's
"auto" coefficient): after ``warmup`` adaptation steps since the last reset,
``lambda = max(target_scale * mean|L_task| / (mean L_reg + 1e-8), min_coef)``, both means over the last ``window``
adaptation steps. The reference settings per agent (:data:`CCHAIN_DEFAULTS`):

==================  =============  ============  =========  =======  ========  =============  =========================
agent               initial coef   target scale  warmup     window   min coef  reset at a     reference
                                                                               task change
==================  =============  ============  =========  =======  ========  =============  =========================
PPO, discrete       1              1e4           11 it.     50 it.   1         yes            Gym control
PPO, continuous     100            0.05          50 it.     100 it.  0         yes            DMC
DQN family          50             0.01          10 000 up. 50 000    0         no             C-MinAtar
SAC family          1              (fixed)       -          -        -         no             CHAIN's SAC (no auto coef)
==================  =============  ============  =========  =======  ========  =============  =========================

(it.: PPO iterations, i.e. ``train()`` calls; up.: gradient updates.) ``warmup`` counts the adaptation steps run at
the initial coefficient: the Gym reference appends iteration ``ite``'s losses and adapts once ``ite - start >= 10``
(``ite`` 0-based), after 11 iterations; the DMC reference's 1-based ``iteration >= 50`` after 50; the C-MinAtar
reference's ``update_cnt >= 10000``, counted before the check, after 10 000 updates. ``L_task`` is SB3's own logged
loss of the ``train()`` call: for discrete PPO (``task_loss_entropy=True``) the clipped surrogate with the entropy
bonus, ``train/policy_gradient_loss + ent_coef * train/entropy_loss``, as the Gym reference's ``p_loss``
(``clipped_surrogate.mean() - c1 * entropy.mean()``, c1 = 0.01); for continuous PPO the surrogate alone
(``train/policy_gradient_loss``, the DMC reference's ``pg_loss``); ``train/loss`` (DQN, QR-DQN),
``train/critic_loss`` (SAC family). The ProcGen reference (discrete PPO) uses 10 / 1e4 / 21 / 200 / 1 (its
``level_iters >= 20`` is checked before the count's increment) and the surrogate alone: pass ``coef=10,
warmup=21, window=200, task_loss_entropy=False`` to follow it. A2C (in no reference) gets PPO's settings with
``train/policy_loss``, its unnormalised policy loss (plus ``ent_coef * train/entropy_loss`` when discrete).

Mechanism: the callback copies the network into a frozen shadow right before each optimizer step (so the shadow holds
``theta_{t-1}`` at update ``t``), and right after each ``optimizer.zero_grad()`` of a ``train()`` computes the
regulariser on its own batch and puts ``lambda * grad L_reg`` into ``.grad``
(:class:`~sb3_plastic.common.hooks.AfterZeroGrad`); the task loss's ``backward()`` adds onto it, so SB3's
``clip_grad_norm_`` clips the sum, as the ProcGen / DMC references clip ``loss + lambda L_reg``. The regularisation batch
is drawn from the callback's own numpy stream (the run's own minibatch order is unchanged): a reshuffled permutation
of the rollout for on-policy algorithms (disjoint batches until it is used up, as the references' per-epoch
permutation), SB3's ``ReplayBuffer.sample`` of ``batch_size`` for off-policy ones.

Deviations from the references (besides the adaptation unit above):

* The references keep copies of the last 10 networks and regularise towards the second last; only that one is needed,
  so one shadow copy is kept. The PPO references start regularising at their third update (their ``len(list) <= 2``
  guard, with the initial network in the list; the two skipped updates enter the first iteration's mean regulariser
  loss as zeros there); here the second update already has a previous network, and the first update does not enter
  the mean.
* The DMC reference's running windows take the *last* minibatch's surrogate and regulariser losses of each iteration;
  here (as in the Gym and ProcGen references) the means over the iteration's minibatches. The shadow is part of the
  persistent state (one copy of the network in the saved zip): a second ``learn()`` call, or a loaded model, regularises
  its first update towards the network before the last update saved, as one uninterrupted run does.
* Adaptation steps of off-policy algorithms are SB3's ``train()`` calls weighted by their updates: the task loss of a
  call is SB3's mean over its updates, counted once per update (with ``gradient_steps=1`` exactly the reference's
  per-update lists).
* A rewrite of the regularised network (for PPO / A2C: of a parameter the action distribution depends on, so not of
  the value head) between two updates by another intervention of the same ``learn()`` call (a
  :class:`~sb3_plastic.callbacks.LayerReset` re-draw, :class:`~sb3_plastic.callbacks.FIRE`, a
  :class:`~sb3_plastic.callbacks.ShrinkPerturb` event; :func:`~sb3_plastic.callbacks.base.announce_rewrite`) is not
  churn of an update, and the references, which never rewrite their networks, would otherwise measure it against the
  network before the rewrite, pulling the first update after it back to the old outputs (and entering a loss many
  times the usual one into the adaptive coefficient's window). The previous network is forgotten then: the next update
  is not regularised, the one after it is, towards the rewritten network. Unit recycling (ReDo, Continual Backprop)
  is not announced: its new units have zero outgoing weights, so it changes the outputs only by the removed units'
  small contributions, which count as churn of the next update.
* RecurrentPPO is not supported (a regularisation batch of a recurrent policy needs its LSTM states, which a random
  batch of the rollout does not have); CrossQ is not supported (its BatchRenorm layers would normalise, and count into
  their running statistics, the extra batch: the regulariser would change the statistics it regularises). Both raise a
  ``ValueError`` at training start.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import nn

from sb3_plastic.callbacks.base import (
    InterventionConfig,
    PlasticCallback,
    TaskChangeWatch,
    changed_fields,
    private_seed,
    warn_ignored_options,
)
from sb3_plastic.common.hooks import AfterZeroGrad, OutermostStepHooks

#: The reference settings per kind of agent (see the module docstring): initial coefficient, target relative scale,
#: warm-up and window (adaptation steps), lower bound of the coefficient, reset at task changes, the entropy bonus in
#: the task loss, SB3's loss key.
CCHAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "policy_discrete": dict(coef=1.0, target_scale=1e4, warmup=11, window=50, min_coef=1.0, reset_on_task_change=True,
                            task_loss_entropy=True, loss_key=("train/policy_gradient_loss", "train/policy_loss")),
    "policy_continuous": dict(coef=100.0, target_scale=0.05, warmup=50, window=100, min_coef=0.0,
                              reset_on_task_change=True, task_loss_entropy=False,
                              loss_key=("train/policy_gradient_loss", "train/policy_loss")),
    "q_values": dict(coef=50.0, target_scale=0.01, warmup=10_000, window=50_000, min_coef=0.0,
                     reset_on_task_change=False, task_loss_entropy=False, loss_key=("train/loss",)),
    "critic": dict(coef=1.0, target_scale=0.0, warmup=0, window=1, min_coef=0.0, reset_on_task_change=False,
                   task_loss_entropy=False, loss_key=("train/critic_loss",)),
}
#: Added to the probabilities inside the log of the policy cross entropy (the references' constant).
LOG_EPS = 1e-8


# ----------------------------------------------------------------------------------------------------------
# The churn measures (pure functions, tested against hand-written references)
# ----------------------------------------------------------------------------------------------------------
def _cross_entropy(old_probs: th.Tensor, new_probs: th.Tensor) -> th.Tensor:
    return -(old_probs * th.log(new_probs + LOG_EPS)).sum(-1)


def policy_churn(new: Distribution, old: Distribution) -> th.Tensor:
    """C-CHAIN's policy churn loss of SB3 action distributions on one batch (``old`` is the frozen previous policy's).

    Categorical (masked ones too: MaskablePPO): ``mean_s -sum_a p_old(a|s) log(p_new(a|s) + 1e-8)``; MultiCategorical:
    the sum over the sub-actions of that; Bernoulli (MultiBinary): the same cross entropy per binary action, summed;
    Gaussian (PPO's diagonal Gaussian, gSDE): the mean squared difference of the action means, over batch and action
    dimensions.
    """
    dist_new, dist_old = new.distribution, old.distribution
    if isinstance(dist_new, th.distributions.Categorical):
        return _cross_entropy(dist_old.probs, dist_new.probs).mean()
    if isinstance(dist_new, (list, tuple)):  # MultiCategorical
        parts = [_cross_entropy(o.probs, n.probs) for n, o in zip(dist_new, dist_old)]
        return th.stack(parts, dim=-1).sum(-1).mean()
    if isinstance(dist_new, th.distributions.Bernoulli):
        p_old, p_new = dist_old.probs, dist_new.probs
        return _cross_entropy(th.stack((p_old, 1 - p_old), -1), th.stack((p_new, 1 - p_new), -1)).sum(-1).mean()
    if isinstance(dist_new, th.distributions.Normal):
        return ((dist_new.mean - dist_old.mean.detach()) ** 2).mean()
    raise TypeError(f"ChurnReduction: no policy churn is defined for {type(new).__name__}")


def value_churn(new: Any, old: Any, critics_dim: Optional[int] = None) -> th.Tensor:
    """C-CHAIN's value churn loss: the mean squared difference of the outputs (all Q-values / quantiles), summed over
    the Q-networks when the outputs are a tuple (SAC, TD3: one tensor per Q-network) or when ``critics_dim`` names the
    dimension of a tensor that indexes them (TQC: ``(batch, critics, quantiles)``, ``critics_dim=1``)."""
    if isinstance(new, (tuple, list)):
        return th.stack([((n - o.detach()) ** 2).mean() for n, o in zip(new, old)]).sum()
    squared = (new - old.detach()) ** 2
    if critics_dim is None:
        return squared.mean()
    return squared.transpose(0, critics_dim).flatten(1).mean(dim=1).sum()


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without its optimizers (SB3 keeps them as module attributes), without the last
    distribution its action-distribution objects hold (whose tensors may belong to an autograd graph, which cannot be
    deep-copied) and without gradients: the shadow network of the previous update."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, th.optim.Optimizer):
                memo[id(value)] = None
            elif isinstance(value, Distribution):
                clone = copy.copy(value)
                clone.distribution = None
                memo[id(value)] = clone
    shadow = copy.deepcopy(module, memo)
    shadow.requires_grad_(False)
    return shadow


@th.no_grad()
def copy_into_(shadow: nn.Module, module: nn.Module) -> None:
    """Copy every parameter and buffer of ``module`` into its frozen copy ``shadow`` (same structure)."""
    for target, source in zip(shadow.parameters(), module.parameters()):
        target.copy_(source)
    for target, source in zip(shadow.buffers(), module.buffers()):
        target.copy_(source)


def agent_kind(model: Any) -> str:
    """The C-CHAIN form for ``model`` (a key of :data:`CCHAIN_DEFAULTS`).

    :raises ValueError: for RecurrentPPO and CrossQ (see the module docstring) and unknown structures.
    """
    policy = model.policy
    if hasattr(policy, "lstm_actor"):
        raise ValueError("ChurnReduction does not support RecurrentPPO: a regularisation batch of a recurrent policy "
                         "needs the LSTM states of its sequence, which a random batch of the rollout does not have")
    if type(model).__name__ in ("CrossQ", "PlasticCrossQ") or any(
            type(m).__name__ == "BatchRenorm" for m in policy.modules()):
        raise ValueError("ChurnReduction does not support CrossQ (BatchRenorm): the extra batch would pass through the "
                         "batch normalisation in training mode and enter its running statistics")
    if isinstance(model, OnPolicyAlgorithm) and hasattr(policy, "get_distribution"):
        continuous = isinstance(model.action_space, spaces.Box)
        return "policy_continuous" if continuous else "policy_discrete"
    if hasattr(policy, "q_net") or hasattr(policy, "quantile_net"):
        return "q_values"
    if hasattr(policy, "critic") and hasattr(policy, "actor"):
        return "critic"
    raise ValueError(f"ChurnReduction does not know the structure of {type(policy).__name__}")


class ChurnReduction(PlasticCallback):
    """C-CHAIN's churn reduction as an SB3 callback (Tang et al., ICML 2025; see the module docstring for the forms,
    the reference settings, the mechanism and every deviation from the reference code).

    Works on plain and plastic PPO, A2C, MaskablePPO, DQN, QR-DQN, SAC, TQC and TD3 (RecurrentPPO and CrossQ raise a
    ``ValueError`` at training start, with the reason).

    Logged (``plasticity/churn_reduction/...``, per ``train()`` call): ``coef`` (the coefficient in force) and
    ``reg_loss`` (the regulariser's mean, before the coefficient); ``churn_reduction_<name>`` with a ``name``.
    Persistent (``self.state``, saved with the model):
    ``coef``, ``task_losses`` / ``reg_losses`` (the running windows), ``since_reset``, ``task_ids``, ``np_rng`` (the
    regularisation batches' numpy stream), ``previous`` (the shadow network ``theta_{t-1}``'s state dict, ``None``
    before the first update) and ``pending`` (the updates and regulariser losses of a ``train()`` call whose adaptation
    is still to come: a model saved at a rollout start, before this callback's own, adapts after ``load``).

    :param coef: initial (or, with ``target_scale=0``, fixed) coefficient ``lambda``; ``None``: the agent's reference
        value (:data:`CCHAIN_DEFAULTS`).
    :param target_scale: the target ratio ``lambda L_reg / |L_task|`` of the adaptive coefficient; 0 keeps ``coef``
        fixed; ``None``: the reference value. ``coef=0`` with ``target_scale=0`` changes nothing and warns.
    :param warmup: adaptation steps (PPO iterations / gradient updates) after a reset before ``lambda`` adapts;
        ``None``: the reference value.
    :param window: adaptation steps the running means average over; ``None``: the reference value.
    :param min_coef: lower bound of the adapted ``lambda``; ``None``: the reference value (1 for discrete PPO, else 0).
    :param reset_on_task_change: restart ``lambda`` at ``coef`` and empty the windows when ``info["task_id"]`` changes;
        ``None``: the reference's choice (PPO yes, DQN no).
    :param batch_size: size of the regularisation batch; ``None``: the algorithm's ``batch_size``.
    :param name: distinguishes several ChurnReduction callbacks on one model.
    :param verbose: SB3 verbosity.
    :param task_loss_entropy: add the entropy bonus to the task loss the coefficient adapts to
        (``train/policy_gradient_loss + ent_coef * train/entropy_loss``); ``None``: the reference's choice (discrete PPO
        yes, the Gym-control reference; continuous PPO no, the DMC reference). Only for the PPO family and A2C (a
        ``ValueError`` at training start elsewhere: DQN, QR-DQN and the SAC family have no entropy term in their
        reference task losses).
    """

    def __init__(
        self,
        coef: Optional[float] = None,
        target_scale: Optional[float] = None,
        warmup: Optional[int] = None,
        window: Optional[int] = None,
        min_coef: Optional[float] = None,
        reset_on_task_change: Optional[bool] = None,
        batch_size: Optional[int] = None,
        name: Optional[str] = None,
        verbose: int = 0,
        task_loss_entropy: Optional[bool] = None,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        _check_settings(coef, target_scale, warmup, window, min_coef, reset_on_task_change, batch_size, "",
                        task_loss_entropy)
        self.options = dict(coef=coef, target_scale=target_scale, warmup=warmup, window=window, min_coef=min_coef,
                            reset_on_task_change=reset_on_task_change, task_loss_entropy=task_loss_entropy)
        self.batch_size = batch_size
        self.settings: dict[str, Any] = {}
        self.kind = ""
        self._hooks: list[Any] = []
        self._shadow: Optional[nn.Module] = None
        self._network: Optional[nn.Module] = None
        self._regularised: Optional[set[int]] = None  # ids of the parameters the regularised output depends on
        self._has_previous = False
        self._perm: Optional[np.ndarray] = None
        self._perm_pos = 0
        self._task_watch = TaskChangeWatch("ChurnReduction reset_on_task_change=True", "restart its coefficient")

    # ------------------------------------------------------------------ lifecycle
    def _on_training_start(self) -> None:
        super()._on_training_start()
        self.kind = agent_kind(self.model)
        defaults = CCHAIN_DEFAULTS[self.kind]
        self.settings = {k: defaults[k] if v is None else v for k, v in self.options.items()}
        self.settings["loss_key"] = defaults["loss_key"]
        if self.settings["task_loss_entropy"] and not self.kind.startswith("policy"):
            raise ValueError(f"ChurnReduction: task_loss_entropy=True adds the entropy bonus to a policy-gradient task "
                             f"loss (PPO, A2C, MaskablePPO); {type(self.model).__name__}'s task loss has no entropy "
                             "term: leave task_loss_entropy at None or False")
        s = self.state
        s.setdefault("coef", float(self.settings["coef"]))
        s.setdefault("task_losses", [])
        s.setdefault("reg_losses", [])
        s.setdefault("since_reset", 0)
        s.setdefault("task_ids", None)
        s.setdefault("previous", None)
        s.setdefault("pending", {"updates": 0, "regs": []})
        if "np_rng" not in s:
            s["np_rng"] = np.random.RandomState(private_seed(getattr(self.model, "seed", None), self.state_key)).get_state()
        self._remove_hooks()
        self._network, optimizer = self._network_and_optimizer()
        self._shadow = frozen_copy(self._network)
        self._regularised = None
        self._has_previous = False
        if s["previous"] is not None:  # a second learn() call, or a loaded model: theta_{t-1} continues
            names = set(self._shadow.state_dict())
            if set(s["previous"]) != names:
                raise ValueError(f"ChurnReduction: the saved previous network has the entries {sorted(s['previous'])}, "
                                 f"this network {sorted(names)}; the model's structure changed since it was saved")
            self._shadow.load_state_dict(s["previous"])
            self._has_previous = True
        s["previous"] = self._shadow.state_dict() if self._has_previous else None  # live views of the shadow
        self._perm = None
        self._task_watch.start()
        training = lambda: bool(self.model.policy.training)  # noqa: E731  (inside SB3's train())
        self._hooks = [
            AfterZeroGrad(optimizer, self._add_regulariser_gradient, active=training),
            OutermostStepHooks(optimizer, before=self._remember_network, active=training),
        ]

    def _network_and_optimizer(self) -> tuple[nn.Module, th.optim.Optimizer]:
        policy = self.model.policy
        if self.kind.startswith("policy"):
            return policy, policy.optimizer
        if self.kind == "q_values":
            net = policy.q_net if hasattr(policy, "q_net") else policy.quantile_net
            return net, policy.optimizer
        return policy.critic, policy.critic.optimizer

    def _on_training_end(self) -> None:
        self._adapt()
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _on_step(self) -> bool:
        if self.settings.get("reset_on_task_change") and self._task_watch.changed(self.locals.get("infos"), self.state):
            self.state["coef"] = float(self.settings["coef"])
            self.state["task_losses"], self.state["reg_losses"], self.state["since_reset"] = [], [], 0
        return True

    def _on_rollout_start(self) -> None:
        self._adapt()  # the train() call that just ended
        self._perm = None  # a new rollout: new data to permute

    def _on_rollout_end(self) -> None:
        if self.settings.get("reset_on_task_change") and self.options["reset_on_task_change"]:
            steps = int(self.model.num_timesteps) - int(getattr(self.model, "_num_timesteps_at_start", 0))
            self._task_watch.warn_if_blind(steps)

    # ------------------------------------------------------------------ the coefficient
    @property
    def _call_updates(self) -> int:
        return int(self.state["pending"]["updates"])

    @_call_updates.setter
    def _call_updates(self, value: int) -> None:
        self.state["pending"]["updates"] = int(value)

    @property
    def _call_reg(self) -> list[float]:
        return self.state["pending"]["regs"]

    @_call_reg.setter
    def _call_reg(self, value: list[float]) -> None:
        self.state["pending"]["regs"] = list(value)

    def _adapt(self) -> None:
        """After a ``train()`` call: append its task loss (SB3's logged mean) and regulariser loss to the windows and
        adapt the coefficient (see the module docstring)."""
        updates, regs = self._call_updates, list(self._call_reg)
        self._call_updates, self._call_reg = 0, []
        if updates == 0:
            return
        logged = self.model.logger.name_to_value
        task = next((logged[k] for k in self.settings["loss_key"] if k in logged), None)
        what = " or ".join(self.settings["loss_key"])
        if self.settings["task_loss_entropy"]:
            what += ", with train/entropy_loss"
            entropy = logged.get("train/entropy_loss")
            task = None if task is None or entropy is None else task + float(self.model.ent_coef) * entropy
        if task is None:
            warnings.warn(f"ChurnReduction: the task loss of the last train() call ({what}) is not in the logger (a "
                          "model saved before this callback adapted to the call, then loaded?): the coefficient skips "
                          "this adaptation step", stacklevel=2)
        s = self.state
        weight = 1 if self.kind.startswith("policy") else updates  # PPO: per iteration; off-policy: per update
        if task is not None and regs:
            window = int(self.settings["window"])
            if weight == 1:
                s["task_losses"].append(abs(float(task)))
                s["reg_losses"].append(float(np.mean(regs)))
            else:
                s["task_losses"].extend([abs(float(task))] * weight)
                s["reg_losses"].extend(regs)
            s["task_losses"], s["reg_losses"] = s["task_losses"][-window:], s["reg_losses"][-window:]
            s["since_reset"] += weight
            if self.settings["target_scale"] > 0 and s["since_reset"] >= self.settings["warmup"]:
                ratio = float(np.mean(s["task_losses"])) / (float(np.mean(s["reg_losses"])) + 1e-8)
                s["coef"] = max(float(self.settings["target_scale"]) * ratio, float(self.settings["min_coef"]))
        self.record(f"{self.log_group('churn_reduction')}/coef", s["coef"])
        if regs:
            self.record(f"{self.log_group('churn_reduction')}/reg_loss", float(np.mean(regs)))

    def _on_parameters_rewritten(self, params: Any, redrawn: bool = False) -> None:
        """A rewrite of the regularised network outside an update (a layer reset, FIRE, a Shrink & Perturb event) is not
        churn: the previous network ``theta_{t-1}`` no longer describes the network the next update starts from, so it
        is forgotten and the next update is regularised as the first one of a run (not at all; the update after it
        towards the rewritten network)."""
        if self._network is None:
            return
        own = self._regularised_parameters()
        if any(id(p) in own for p in params):
            self._has_previous = False
            self.state["previous"] = None

    def _regularised_parameters(self) -> set[int]:
        """The ids of the parameters the regularised output depends on: the whole network for the Q-value and critic
        forms; for PPO / A2C those the policy's action distribution is computed from (a rewrite of the value head or of
        a separate value path alone leaves what C-CHAIN regularises as it was). Read once per ``learn()`` call from the
        autograd graph of the envs' current observations (connectivity, not values: zero gradients count)."""
        if self._regularised is None:
            assert self._network is not None
            params = [p for p in self._network.parameters() if p.requires_grad]
            if self.kind.startswith("policy"):
                obs, _ = self._network.obs_to_tensor(self.model._last_obs)  # the envs' current observations
                with th.enable_grad():  # rewrites are announced from inside no_grad blocks
                    dist = self._network.get_distribution(obs)
                    grads = th.autograd.grad(policy_churn(dist, dist), params, allow_unused=True)
                params = [p for p, g in zip(params, grads) if g is not None]
            self._regularised = {id(p) for p in params}
        return self._regularised

    # ------------------------------------------------------------------ the regulariser
    def _remember_network(self, optimizer: th.optim.Optimizer) -> None:
        assert self._shadow is not None and self._network is not None
        if sum(1 for _ in self._shadow.parameters()) != sum(1 for _ in self._network.parameters()):
            self._shadow = frozen_copy(self._network)  # the structure changed (a plasticity injection added a head)
            self.state["previous"] = None
            self._regularised = None
        copy_into_(self._shadow, self._network)
        self._has_previous = True
        if self.state["previous"] is None:
            self.state["previous"] = self._shadow.state_dict()  # views: the saved state follows the shadow

    @contextlib.contextmanager
    def _numpy_stream(self) -> Iterator[None]:
        """numpy's global generator set to the callback's own stream for the block (SB3's buffers sample with it)."""
        saved = np.random.get_state()
        np.random.set_state(self.state["np_rng"])
        try:
            yield
        finally:
            self.state["np_rng"] = np.random.get_state()
            np.random.set_state(saved)

    def _batch_size(self) -> int:
        return int(self.batch_size or getattr(self.model, "batch_size", 64))

    def _rollout_batch(self) -> Any:
        buffer = self.model.rollout_buffer
        n = buffer.buffer_size * buffer.n_envs
        size = min(self._batch_size(), n)
        with self._numpy_stream():
            if self._perm is None or self._perm_pos + size > n:
                self._perm, self._perm_pos = np.random.permutation(n), 0
        indices = self._perm[self._perm_pos:self._perm_pos + size]
        self._perm_pos += size
        return buffer._get_samples(indices)

    def _replay_batch(self) -> Any:
        with self._numpy_stream():
            return self.model.replay_buffer.sample(self._batch_size(), env=self.model._vec_normalize_env)

    def regulariser(self) -> th.Tensor:
        """The churn loss of the current network against the previous update's on a fresh regularisation batch."""
        assert self._shadow is not None and self._network is not None
        if self.kind.startswith("policy"):
            data = self._rollout_batch()
            masks = getattr(data, "action_masks", None)
            extra = {} if masks is None else {"action_masks": masks}
            new = self._network.get_distribution(data.observations, **extra)
            with th.no_grad():
                old = self._shadow.get_distribution(data.observations, **extra)
            return policy_churn(new, old)
        data = self._replay_batch()
        inputs = (data.observations,) if self.kind == "q_values" else (data.observations, data.actions)
        new = self._network(*inputs)
        with th.no_grad():
            old = self._shadow(*inputs)
        tqc = isinstance(new, th.Tensor) and self.kind == "critic" and new.dim() == 3  # (batch, critics, quantiles)
        return value_churn(new, old, critics_dim=1 if tqc else None)

    def _add_regulariser_gradient(self, optimizer: th.optim.Optimizer) -> None:
        self._call_updates += 1
        if not self._has_previous:
            return
        loss = self.regulariser()
        coef = float(self.state["coef"])
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        grads = th.autograd.grad(loss, params, allow_unused=True)
        with th.no_grad():
            for param, grad in zip(params, grads):
                if grad is None:
                    continue
                if param.grad is None:
                    # in the parameter's own memory layout: autograd.grad returns a permuted input's convolution
                    # gradient (MinAtar's channels-last observations) in another one, and the task loss's backward()
                    # would then accumulate onto a .grad that breaks autograd's layout contract (slower, and warned)
                    param.grad = th.empty_like(param).copy_(grad).mul_(coef)
                else:
                    param.grad.add_(grad, alpha=coef)
        self._call_reg.append(float(loss.detach()))


def _check_settings(coef: Any, target_scale: Any, warmup: Any, window: Any, min_coef: Any, reset: Any, batch_size: Any,
                    prefix: str, task_loss_entropy: Any = None) -> None:
    for name, value in (("coef", coef), ("target_scale", target_scale), ("min_coef", min_coef)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value)
                                  or value < 0):
            raise ValueError(f"{prefix}{name} must be None or a finite number >= 0, got {value!r}")
    for name, value, low in (("warmup", warmup, 0), ("window", window, 1), ("batch_size", batch_size, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low):
            raise ValueError(f"{prefix}{name} must be None or an int >= {low}, got {value!r}")
    if reset is not None and not isinstance(reset, bool):
        raise ValueError(f"{prefix}reset_on_task_change must be None, True or False, got {reset!r}")
    if task_loss_entropy is not None and not isinstance(task_loss_entropy, bool):
        raise ValueError(f"{prefix}task_loss_entropy must be None, True or False, got {task_loss_entropy!r}")
    if coef is not None and target_scale is not None and coef == 0 and target_scale == 0:
        warnings.warn(
            f"{prefix}coef=0 and {prefix}target_scale=0 changes nothing: the coefficient stays 0 (target_scale=0 keeps "
            f"it fixed), so the regulariser is computed at every update and applied with weight 0; give {prefix}coef "
            f"> 0, or {prefix}target_scale > 0 to adapt it",
            stacklevel=3 if not prefix else 5,
        )


@dataclass
class ChurnReductionConfig(InterventionConfig):
    """C-CHAIN settings as top-level keywords of the plastic algorithms (and rl_zoo3 yaml / optuna samplers); see
    :class:`ChurnReduction`. ``None`` is the reference value for the agent (:data:`CCHAIN_DEFAULTS`).

    :param churn_reduction: turn C-CHAIN on.
    :param churn_reduction_coef: initial (or fixed) coefficient.
    :param churn_reduction_target_scale: target relative scale of the adaptive coefficient (0: fixed).
    :param churn_reduction_warmup: adaptation steps before the coefficient adapts.
    :param churn_reduction_window: adaptation steps of the running means.
    :param churn_reduction_reset_on_task_change: restart the coefficient at task changes.
    :param churn_reduction_batch_size: size of the regularisation batch (``None``: the algorithm's ``batch_size``).
    :param churn_reduction_task_loss_entropy: the entropy bonus in the task loss the coefficient adapts to (PPO family,
        A2C; ``None``: discrete yes, continuous no).

    Any field set while ``churn_reduction`` is off warns.
    """

    churn_reduction: bool = False
    churn_reduction_coef: Optional[float] = None
    churn_reduction_target_scale: Optional[float] = None
    churn_reduction_warmup: Optional[int] = None
    churn_reduction_window: Optional[int] = None
    churn_reduction_reset_on_task_change: Optional[bool] = None
    churn_reduction_batch_size: Optional[int] = None
    churn_reduction_task_loss_entropy: Optional[bool] = None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        if not isinstance(self.churn_reduction, bool):
            raise ValueError(f"churn_reduction must be True or False, got {self.churn_reduction!r}")
        _check_settings(self.churn_reduction_coef, self.churn_reduction_target_scale, self.churn_reduction_warmup,
                        self.churn_reduction_window, None, self.churn_reduction_reset_on_task_change,
                        self.churn_reduction_batch_size, "churn_reduction_", self.churn_reduction_task_loss_entropy)
        if not self.enabled:
            others = [f.name for f in self.__dataclass_fields__.values() if f.name != "churn_reduction"]
            warn_ignored_options(changed_fields(self, others), "churn_reduction is False (off)", stacklevel=4)

    @property
    def enabled(self) -> bool:
        """Whether C-CHAIN is on."""
        return self.churn_reduction

    def make_callback(self) -> Optional[ChurnReduction]:
        """The :class:`ChurnReduction` callback for these settings, or ``None`` when it is off."""
        if not self.enabled:
            return None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*changes nothing", category=UserWarning)  # validate() warned
            return ChurnReduction(
                coef=self.churn_reduction_coef,
                target_scale=self.churn_reduction_target_scale,
                warmup=self.churn_reduction_warmup,
                window=self.churn_reduction_window,
                reset_on_task_change=self.churn_reduction_reset_on_task_change,
                batch_size=self.churn_reduction_batch_size,
                task_loss_entropy=self.churn_reduction_task_loss_entropy,
            )

