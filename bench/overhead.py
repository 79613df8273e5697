"""Overhead of the plastic algorithms and the plasticity interventions against plain Stable-Baselines3 (issue 7).

Every benchmark is an entry of :data:`REGISTRY`, of one of two kinds.

**A/B entries** (``kind="ab"``): a named pair of factories, the *baseline* (plain SB3) and the *candidate* (a
plastic algorithm, or plain SB3 with a plasticity callback such as ``ContinualBackprop``) on the same env, the
same network and the same hyperparameters. For each entry the script builds both models, warms both up (this
also fills the rollout / replay buffers), then runs ``--repeats`` interleaved repetitions A/B/A/B of
``model.learn(steps, reset_num_timesteps=False)`` (the candidate's callback, if any, is passed to every
``learn()`` of its arm). ``model.train`` is wrapped with a timer, so one ``learn()`` call gives three numbers
per arm:

* ``learn fps``: env steps per wall-clock second of the whole ``learn()`` (rollout + train);
* ``train() speed``: the time spent inside ``train()`` (the part AdamO and Continual Backprop change);
* ``rollout speed``: the rest (env stepping, action selection, buffer writes, callbacks between rollouts): the
  same work in both arms apart from the candidate's forward pass (and the episodes its actions lead to), so
  with the same network and no callback this ratio should be ~1 and shows how noisy the machine was.

Each repetition gives a ratio candidate/baseline (speed per env step, higher is better:
``fps_cand / fps_base`` and ``time_base / time_cand``).

**Event entries** (``kind="event"``): the cost of an intervention that runs every so often (a FIRE call, a
ReDo check, a PlasticityMonitor pass), as a share of training time at a realistic period. One plain SB3 model
is warmed up with the intervention's callback attached (so that it binds the networks and draws its probe batch
at a rollout end, as in training); then each repetition times one plain ``model.learn(steps)`` (the baseline
fps of this run) followed by one event, triggered directly (``FIRE._fire``, ``ReDo.recycle``,
``PlasticityMonitor.run``). With ``T`` the training time of one period at that fps and ``t`` the time of the
event, the entry reports either the projected fps ratio ``T / (T + t)`` (periods given in env steps, or in
gradient steps converted with the measured gradient steps per env step; the monitor's default ``max_overhead``
cap stretches the period to ``t / max_overhead`` when that is longer, as the monitor itself does), or the
fraction ``t / T`` (FIRE: one call against a 1M-step run). Per-step callback work is not in these numbers
(a dictionary lookup or a comparison per step); the A/B entries ``dqn-mlp-monitor`` / ``dqn-mlp-redo`` measure
the callbacks in place, per-step work included.

The table reports, per metric, the median over the repetitions with their min / max (wall clock; PASS/FAIL
uses this median and the entry's target), the median of the same ratios measured in process CPU time, and
``best/best``, from the best (shortest) time per env step of each arm, or of the baseline and the event (other
load only ever adds time, so these two are the least sensitive to it). The individual ratios follow the
table; absolute numbers are printed only as context, never as the result. The exit status is 1 when an entry
with a target misses it.

Threads: ``--threads`` (default 1) is applied with ``torch.set_num_threads`` before every timed run of both
arms. On a shared 2-core machine 2 threads made the same ops up to 10x slower and far noisier.

Examples::

    python bench/overhead.py --quick                 # every quick entry, <= ~2 minutes
    python bench/overhead.py                         # every entry, full mode
    python bench/overhead.py --only ppo-cnn-relu     # full mode, one entry
    python bench/overhead.py --repeats 7 --threads 1 --json /tmp/overhead.json
    python bench/overhead.py --list

Adding a benchmark: an A/B entry is two factories ``(ctx: Context) -> BaseAlgorithm`` (same env, network and
hyperparameters; ``ctx.mode`` may shorten rollouts for ``--quick``), optionally a ``candidate_callback``
factory, and an :class:`Entry` giving the warm-up / per-repetition env steps of each mode and, optionally, a
target; an event entry is a baseline factory and an :class:`Event`. ``bench/interventions.py`` and
``bench/monitor_overhead.py`` run subsets of these entries.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import gymnasium as gym
import torch as th
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack

from sb3_plastic import FIRE, ContinualBackprop, PlasticDQN, PlasticityMonitor, PlasticPPO, PlasticSAC, ReDo
from sb3_plastic.callbacks import (
    ChurnReduction,
    L2Init,
    LayerReset,
    ParsevalRegularisation,
    PlasticityInjection,
    SpectralRegularisation,
    WeightClipping,
)
from sb3_plastic.callbacks.monitor import DEFAULT_EVERY
from sb3_plastic.common.hooks import OutermostStepHooks
from sb3_plastic.common.surgery import find_networks

MODES = ("quick", "full")
METRICS = ("learn fps", "train() speed", "rollout speed")
KINDS = ("ab", "event")


class Unavailable(RuntimeError):
    """An entry cannot run on this machine (missing optional dependency); reported as SKIP."""


@dataclass(frozen=True)
class Context:
    """What a factory gets: the mode (``quick`` / ``full``), the torch device and the seed."""

    mode: str
    device: str
    seed: int


Factory = Callable[[Context], BaseAlgorithm]


@dataclass(frozen=True)
class Steps:
    """Step counts of one mode: ``warmup`` env steps per arm before timing, ``per_rep`` per timed learn()."""

    warmup: int
    per_rep: int


CallbackFactory = Callable[[Context], BaseCallback]


@dataclass(frozen=True)
class Event:
    """An intervention that runs now and then, measured by the time of one call (kind ``"event"``).

    :param callback: makes the intervention's callback; it is passed to the warm-up ``learn()`` only, where it
        binds the networks and draws its probe batch, and must not act on its own during the warm-up (set its
        period out of reach); the PlasticityMonitor's first pass happens there and is not timed.
    :param trigger: performs one event with that callback.
    :param every: the period: env steps, or gradient steps (optimizer steps, as ReDo counts them) when
        ``unit="gradient"``.
    :param unit: ``"env"`` or ``"gradient"``.
    :param report: ``"ratio"`` (projected fps ratio ``T / (T + t)``, higher is better) or ``"fraction"`` (``t / T``,
        one event against one period, lower is better).
    :param max_share: the PlasticityMonitor's ``max_overhead``: the period is stretched to at least ``t / max_share``
        of training time; a second row gives the ratio without the cap.
    :param label: what one event is, for the table (``"one FIRE call"``).
    """

    callback: CallbackFactory
    trigger: Callable[[BaseCallback], Any]
    every: float
    unit: str = "env"
    report: str = "ratio"
    max_share: Optional[float] = None
    label: str = "one event"

    def metrics(self) -> tuple[str, ...]:
        if self.report == "fraction":
            return (f"time / {self.every:,.0f}-step run",)
        if self.max_share is not None:
            return ("projected fps", "  (no max_overhead)")
        return ("projected fps",)


@dataclass(frozen=True)
class Entry:
    """One benchmark: ``candidate`` (with ``candidate_callback``) against ``baseline``, or an :class:`Event`.

    :param target: the value of the first metric (``learn fps`` ratio; an event's projected ratio or fraction)
        the entry must reach: ``>= target``, or ``< target`` for an event reported as a fraction
        (``None``: informational only).
    :param in_quick: whether ``--quick`` runs this entry (``--only`` runs it in any case).
    """

    name: str
    description: str
    baseline: Factory
    steps: dict[str, Steps]
    candidate: Optional[Factory] = None
    candidate_callback: Optional[CallbackFactory] = None
    event: Optional[Event] = None
    target: Optional[float] = None
    in_quick: bool = True
    notes: str = ""

    @property
    def kind(self) -> str:
        return "event" if self.event is not None else "ab"

    @property
    def metrics(self) -> tuple[str, ...]:
        return METRICS if self.event is None else self.event.metrics()

    @property
    def lower_is_better(self) -> bool:
        return self.event is not None and self.event.report == "fraction"

    def passes(self, value: float) -> bool:
        assert self.target is not None
        return value < self.target if self.lower_is_better else value >= self.target


REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    if entry.name in REGISTRY:
        raise ValueError(f"duplicate benchmark name {entry.name!r}")
    if set(entry.steps) != set(MODES):
        raise ValueError(f"{entry.name}: steps must give {MODES}, got {sorted(entry.steps)}")
    if (entry.candidate is None) == (entry.event is None):
        raise ValueError(f"{entry.name}: give either a candidate (A/B entry) or an event, not both or neither")
    event = entry.event
    if event is not None and (event.unit not in ("env", "gradient") or event.report not in ("ratio", "fraction")):
        raise ValueError(f"{entry.name}: event unit must be 'env' or 'gradient', report 'ratio' or 'fraction'")
    REGISTRY[entry.name] = entry
    return entry


# ---------------------------------------------------------------------------------------------- envs
def make_breakout(n_envs: int, seed: int) -> VecEnv:
    """ALE Breakout, SB3's Atari preprocessing (84x84 grey, frame skip 4, ...) and 4 stacked frames.

    ``frameskip=1`` in the ALE env: SB3's ``AtariWrapper`` does the frame skip (4) itself, as with the
    ``NoFrameskip`` ids; ``ALE/Breakout-v5`` keeps its sticky actions (p = 0.25).
    """
    try:
        import ale_py
        import cv2  # noqa: F401  (SB3's AtariWrapper resizes with OpenCV)
    except ImportError as exc:
        raise Unavailable(f"{exc.name} is not installed (pip install ale-py opencv-python-headless)") from None
    gym.register_envs(ale_py)
    env = make_atari_env("ALE/Breakout-v5", n_envs=n_envs, seed=seed, env_kwargs={"frameskip": 1})
    return VecFrameStack(env, n_stack=4)


def make_gym(env_id: str, n_envs: int, seed: int) -> VecEnv:
    return make_vec_env(env_id, n_envs=n_envs, seed=seed)


# ---------------------------------------------------------------------------------------------- entries
# rl-zoo3's Atari PPO hyperparameters (n_envs 8, n_steps 128, batch 256, 4 epochs). --quick keeps the
# batch size and the number of gradient steps per env step (n_epochs / batch_size) and only shortens the
# rollout, so the rollout / train proportion is the same in both modes.
PPO_ATARI = dict(
    n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01, vf_coef=0.5
)
PPO_ATARI_QUICK = dict(PPO_ATARI, n_steps=32)
PPO_ATARI_ENVS = 8
# Same network in both arms: SB3's CnnPolicy has no MLP after NatureCNN (net_arch=[]). Stated explicitly
# because PlasticActorCriticCnnPolicy / PlasticDQNCnnPolicy would otherwise add [64, 64] MLPs (SB3 only
# drops them when the extractor is NatureCNN itself).
CNN_NET = dict(net_arch=[])


def ppo_atari(cls: type[BaseAlgorithm], **plastic: Any) -> Factory:
    def factory(ctx: Context) -> BaseAlgorithm:
        hp = PPO_ATARI_QUICK if ctx.mode == "quick" else PPO_ATARI
        env = make_breakout(PPO_ATARI_ENVS, ctx.seed)
        return cls("CnnPolicy", env, policy_kwargs=dict(CNN_NET), device=ctx.device, seed=ctx.seed, verbose=0, **hp, **plastic)

    return factory


def _ppo_steps(mode_hp: dict[str, Any], iters: int) -> int:
    return mode_hp["n_steps"] * PPO_ATARI_ENVS * iters


PPO_STEPS = {"quick": Steps(_ppo_steps(PPO_ATARI_QUICK, 1), _ppo_steps(PPO_ATARI_QUICK, 1)),
             "full": Steps(_ppo_steps(PPO_ATARI, 1), _ppo_steps(PPO_ATARI, 1))}

# --- interventions: the settings every entry below uses
#: Continual Backprop at Dohare et al.'s RL replacement rate. Maturity 10 (reference: 10 000 updates) so that the
#: units are eligible during the short timed runs: the steady state of a long run, with at most ~2x as many
#: replacements per update as the reference maturity gives (pessimistic).
CBP_KWARGS = dict(replacement_rate=1e-4, maturity_threshold=10)
#: ReDo's period in gradient steps (optimizer steps; PPO: minibatch updates): the callback's default and the paper's
#: recycling period (1000 gradient steps).
REDO_PERIOD = 1000
#: Out of reach: the callback never acts on its own while the event entries warm up.
NEVER = 10**12


def with_callback(cls: type[BaseCallback], **kwargs: Any) -> CallbackFactory:
    return lambda ctx: cls(**kwargs)


def fire_event(ctx: Context) -> BaseCallback:
    return FIRE(at=NEVER)


def redo_event(ctx: Context) -> BaseCallback:
    return ReDo(period=NEVER)


def monitor_event(ctx: Context) -> BaseCallback:
    return PlasticityMonitor(every=NEVER, max_overhead=None)


def layer_reset_event(ctx: Context) -> BaseCallback:
    return LayerReset("heads", every=NEVER)


def trigger_layer_reset(cb: BaseCallback) -> None:
    cb._act(["bench"])  # type: ignore[attr-defined]  # the reset, its optimizer-state drop and target copy


def injection_event(ctx: Context) -> BaseCallback:
    return PlasticityInjection(at=NEVER)


def trigger_injection(cb: BaseCallback) -> None:
    cb._act(["bench"])  # type: ignore[attr-defined]  # one injection (new head, frozen twin, optimizer group, target)


def trigger_fire(cb: BaseCallback) -> None:
    cb._fire(["bench"])  # type: ignore[attr-defined]  # the surgery the callback performs when a trigger is due


def trigger_redo(cb: BaseCallback) -> None:
    # on-policy: the probe ReDo drew at the last rollout end; off-policy: a fresh replay sample, as in _on_step
    probe = cb._stash if cb._on_policy else cb._replay_probe()  # type: ignore[attr-defined]
    cb.recycle(*probe)  # type: ignore[attr-defined]


def trigger_monitor(cb: BaseCallback) -> None:
    cb.run()  # type: ignore[attr-defined]  # one diagnostics pass on the probe drawn at the first pass


#: PlasticityMonitor at its defaults: period DEFAULT_EVERY env steps, max_overhead 0.02.
MONITOR_EVENT = Event(monitor_event, trigger_monitor, every=DEFAULT_EVERY, max_share=0.02, label="one monitor pass")
REDO_EVENT = Event(redo_event, trigger_redo, every=REDO_PERIOD, unit="gradient", label="one ReDo check")

register(Entry(
    name="ppo-cnn-relu",
    description="PlasticPPO CnnPolicy relu, AdamO+isometry 1e-3 (decoupled) with the exact per-update isometry step "
    "(isometry_interval=1) vs PPO CnnPolicy, Breakout 84x84x4",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_coef=2e-3, isometry_mode="decoupled", isometry_interval=1),
    steps=PPO_STEPS,
    target=0.95,
))
register(Entry(
    name="ppo-cnn-relu-k4",
    description="as ppo-cnn-relu with isometry_interval=4 (the isometry step every 4th update, 4x as large; what the "
    "default isometry_interval='auto' resolves to for batch 256)",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_coef=2e-3, isometry_interval=4),
    steps=PPO_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-aa",
    description="A/A control: PlasticPPO relu with isometry_mode='off', optimizer='adam' (the same computation as "
    "PPO) vs PPO, Breakout; its spread is the noise floor of the run",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_mode="off", optimizer="adam"),
    steps=PPO_STEPS,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-maxmin",
    description="PlasticPPO CnnPolicy maxmin (orthogonal init), AdamO+isometry 1e-3 (isometry_interval='auto': "
    "4 for batch 256) vs PPO CnnPolicy, Breakout; no target: the MaxMin activation's own cost comes on top of AdamO's",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="maxmin", isometry_coef=2e-3, isometry_interval="auto"),
    steps=PPO_STEPS,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-cbp",
    description="PPO CnnPolicy + ContinualBackprop(replacement_rate=1e-4, maturity_threshold=10) vs PPO CnnPolicy, "
    "Breakout",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PPO),
    candidate_callback=with_callback(ContinualBackprop, **CBP_KWARGS),
    steps=PPO_STEPS,
    target=0.90,
))
register(Entry(
    name="ppo-cnn-redo",
    description=f"one ReDo check (probe 256, tau 0.025, recycling) on PPO CnnPolicy every {REDO_PERIOD} gradient steps "
    "(optimizer steps, PPO: 16 minibatch updates per rollout of 1024 steps, a check every 64 rollouts), projected "
    "from PPO's fps in this run, Breakout",
    baseline=ppo_atari(PPO),
    event=REDO_EVENT,
    steps=PPO_STEPS,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-monitor",
    description=f"one PlasticityMonitor pass on PPO CnnPolicy at the defaults (every={DEFAULT_EVERY:,} env steps, "
    "max_overhead=0.02), projected from PPO's fps in this run, Breakout",
    baseline=ppo_atari(PPO),
    event=MONITOR_EVENT,
    steps=PPO_STEPS,
    target=0.95,
))
register(Entry(
    name="ppo-cnn-fire",
    description="one FIRE call (Newton-Schulz on every Conv2d/Linear incl. heads, optimizer-state reset) on PPO "
    "CnnPolicy / the time of a 1M-step PPO run at PPO's fps in this run, Breakout",
    baseline=ppo_atari(PPO),
    event=Event(fire_event, trigger_fire, every=1_000_000, report="fraction", label="one FIRE call"),
    steps=PPO_STEPS,
    target=0.01,
))
register(Entry(
    name="ppo-cnn-layer-reset",
    description="one LayerReset of both heads (fresh SB3 init, Adam state dropped) on PPO CnnPolicy / the time of a "
    "1M-step PPO run at PPO's fps in this run, Breakout (a head reset at every task switch of a 1M-step task)",
    baseline=ppo_atari(PPO),
    event=Event(layer_reset_event, trigger_layer_reset, every=1_000_000, report="fraction", label="one head reset"),
    steps=PPO_STEPS,
    target=0.01,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-injection",
    description="one PlasticityInjection (a new 2-layer head per output: Nature CNN's 512-unit layer + the head) on PPO "
    "CnnPolicy / the time of a 1M-step PPO run at PPO's fps in this run, Breakout (not counted: every later forward "
    "runs the new head and its frozen twin as well)",
    baseline=ppo_atari(PPO),
    event=Event(injection_event, trigger_injection, every=1_000_000, report="fraction", label="one injection"),
    steps=PPO_STEPS,
    target=0.01,
    in_quick=False,
))
for _act in ("crelu", "fourier"):
    register(Entry(
        name=f"ppo-cnn-{_act}",
        description=f"PlasticPPO CnnPolicy activation={_act!r} (half the units per layer, twice the features after each "
        "activation), isometry off, Adam vs PPO CnnPolicy (ReLU), Breakout",
        baseline=ppo_atari(PPO),
        candidate=ppo_atari(PlasticPPO, activation=_act, isometry_mode="off", optimizer="adam"),
        steps=PPO_STEPS,
        in_quick=False,
    ))
register(Entry(
    name="ppo-cnn-trac",
    description="PlasticPPO CnnPolicy relu, optimizer='trac' (TRAC around Adam), isometry off vs PPO CnnPolicy, Breakout",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_mode="off", optimizer="trac"),
    steps=PPO_STEPS,
    in_quick=False,
))
register(Entry(
    name="ppo-cnn-cchain",
    description="PPO CnnPolicy + ChurnReduction (C-CHAIN's policy churn on a second minibatch, a copy of the policy per "
    "update) vs PPO CnnPolicy, Breakout",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PPO),
    candidate_callback=with_callback(ChurnReduction),
    steps=PPO_STEPS,
    in_quick=False,
))

# rl-zoo3's CartPole DQN hyperparameters (learning_starts lowered: the warm-up passes it).
DQN_CARTPOLE = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=256, gamma=0.99,
    target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
    exploration_final_eps=0.04,
)


def dqn_cartpole(cls: type[BaseAlgorithm], **plastic: Any) -> Factory:
    def factory(ctx: Context) -> BaseAlgorithm:
        env = make_gym("CartPole-v1", 1, ctx.seed)
        policy_kwargs = dict(net_arch=[256, 256])
        return cls("MlpPolicy", env, policy_kwargs=policy_kwargs, device=ctx.device, seed=ctx.seed, verbose=0,
                   **DQN_CARTPOLE, **plastic)

    return factory


DQN_MLP_STEPS = {"quick": Steps(512, 768), "full": Steps(512, 4096)}


def dqn_mlp_monitor(ctx: Context) -> BaseCallback:
    # one pass per repetition (the full mode's 4096 steps: about the default period of 5000), no max_overhead cap
    return PlasticityMonitor(every=DQN_MLP_STEPS[ctx.mode].per_rep, max_overhead=None)


register(Entry(
    name="dqn-mlp-relu",
    description="PlasticDQN MlpPolicy [256,256] relu, AdamO+isometry 1e-3 (isometry_interval='auto': 16 for "
    "batch 64) vs DQN, CartPole-v1 (zoo hyperparameters)",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(PlasticDQN, activation="relu", isometry_coef=2e-3, isometry_interval="auto"),
    steps=DQN_MLP_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-aa",
    description="A/A control: PlasticDQN relu with isometry_mode='off', optimizer='adam' (the same computation as "
    "DQN) vs DQN, CartPole-v1; its spread and offset are the noise floor of dqn-mlp-relu",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(PlasticDQN, activation="relu", isometry_mode="off", optimizer="adam"),
    steps=DQN_MLP_STEPS,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-cbp",
    description="DQN MlpPolicy [256,256] + ContinualBackprop(1e-4, maturity 10) vs DQN, CartPole-v1",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(DQN),
    candidate_callback=with_callback(ContinualBackprop, **CBP_KWARGS),
    steps=DQN_MLP_STEPS,
    target=0.90,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-redo",
    description=f"DQN MlpPolicy [256,256] + ReDo(period={REDO_PERIOD}) in place (128 gradient steps every 256 env "
    "steps: ~2 checks per full repetition) vs DQN, CartPole-v1",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(DQN),
    candidate_callback=with_callback(ReDo, period=REDO_PERIOD),
    steps=DQN_MLP_STEPS,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-monitor",
    description="DQN MlpPolicy [256,256] + PlasticityMonitor in place, one pass per repetition (every=4096 env steps "
    "in full mode, no max_overhead cap) vs DQN, CartPole-v1",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(DQN),
    candidate_callback=dqn_mlp_monitor,
    steps=DQN_MLP_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-layer-reset",
    description="one LayerReset of the Q head on DQN MlpPolicy [256,256] every 20 000 gradient steps (Nikishin et al.'s "
    "SPR period), projected from DQN's fps in this run, CartPole-v1",
    baseline=dqn_cartpole(DQN),
    event=Event(layer_reset_event, trigger_layer_reset, every=20_000, unit="gradient", label="one head reset"),
    steps=DQN_MLP_STEPS,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-trac",
    description="PlasticDQN MlpPolicy [256,256] relu, optimizer='trac' (TRAC around Adam), isometry off vs DQN, "
    "CartPole-v1",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(PlasticDQN, activation="relu", isometry_mode="off", optimizer="trac"),
    steps=DQN_MLP_STEPS,
    in_quick=False,
))
register(Entry(
    name="dqn-mlp-cchain",
    description="DQN MlpPolicy [256,256] + ChurnReduction (C-CHAIN: an extra forward / backward on a second replay "
    "batch and a copy of the network per update) vs DQN, CartPole-v1",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(DQN),
    candidate_callback=with_callback(ChurnReduction),
    steps=DQN_MLP_STEPS,
    in_quick=False,
))

# The isometry paper's baselines (issue #15) and Parseval regularisation (issue #30): the penalties as callbacks on plain
# DQN (their gradient joins the task gradient in backward(): post-accumulate-grad hooks), NaP as PlasticDQN(nap=True)
# with the penalty off and Adam (layer norms in the network + the projection after each step) against plain DQN.
BASELINE_COEF = 1e-3

for _prefix, _make, _algo, _plastic, _steps, _net, _env in (
    ("dqn-mlp", dqn_cartpole, DQN, PlasticDQN, DQN_MLP_STEPS, "MlpPolicy [256,256]", "CartPole-v1"),
    ("ppo-cnn", ppo_atari, PPO, PlasticPPO, PPO_STEPS, "CnnPolicy", "Breakout"),
):
    _vs = f"vs {_algo.__name__} {_net}, {_env}"
    for _short, _callback in (("l2init", L2Init), ("spectral", SpectralRegularisation),
                              ("parseval", ParsevalRegularisation)):
        register(Entry(
            name=f"{_prefix}-{_short}",
            description=f"{_algo.__name__} {_net} + {_callback.__name__}({BASELINE_COEF}) {_vs}",
            baseline=_make(_algo),
            candidate=_make(_algo),
            candidate_callback=with_callback(_callback, coef=BASELINE_COEF),
            steps=_steps,
            in_quick=False,
        ))
    register(Entry(
        name=f"{_prefix}-weight-clipping",
        description=f"{_algo.__name__} {_net} + WeightClipping(3.0) (every weight and bias clamped after each "
        f"optimizer step; Elsayed et al., 2024) {_vs}",
        baseline=_make(_algo),
        candidate=_make(_algo),
        candidate_callback=with_callback(WeightClipping, kappa=3.0),
        steps=_steps,
        in_quick=False,
    ))
    register(Entry(
        name=f"{_prefix}-nap",
        description=f"{_plastic.__name__} {_net} relu nap=True (LayerNorm before each ReLU, projection after each "
        f"update), isometry_mode='off', optimizer='adam' {_vs}",
        baseline=_make(_algo),
        candidate=_make(_plastic, activation="relu", isometry_mode="off", optimizer="adam", nap=True),
        steps=_steps,
        in_quick=False,
    ))

# rl-zoo3's Atari DQN hyperparameters, with a replay buffer small enough for this machine and an early
# learning_starts (the warm-up passes it). One env, one gradient step of 32 every 4 env steps.
DQN_ATARI = dict(
    learning_rate=1e-4, batch_size=32, buffer_size=10_000, learning_starts=500, target_update_interval=1000,
    train_freq=4, gradient_steps=1, exploration_fraction=0.1, exploration_final_eps=0.01,
    optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False),
)


def dqn_atari(cls: type[BaseAlgorithm], **plastic: Any) -> Factory:
    def factory(ctx: Context) -> BaseAlgorithm:
        env = make_breakout(1, ctx.seed)
        return cls("CnnPolicy", env, policy_kwargs=dict(CNN_NET), device=ctx.device, seed=ctx.seed, verbose=0,
                   **DQN_ATARI, **plastic)

    return factory


DQN_CNN_STEPS = {"quick": Steps(600, 200), "full": Steps(600, 600)}

register(Entry(
    name="dqn-cnn-relu",
    description="PlasticDQN CnnPolicy relu, AdamO+isometry 1e-3 with the exact per-update isometry step "
    "(isometry_interval=1) vs DQN CnnPolicy, Breakout (zoo hyperparameters)",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(PlasticDQN, activation="relu", isometry_coef=2e-3, isometry_interval=1),
    steps=DQN_CNN_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="dqn-cnn-relu-k4",
    description="as dqn-cnn-relu with isometry_interval=4 (the isometry step every 4th update, 4x as large; the "
    "fixed default before 'auto')",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(PlasticDQN, activation="relu", isometry_coef=2e-3, isometry_interval=4),
    steps=DQN_CNN_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="dqn-cnn-relu-auto",
    description="as dqn-cnn-relu with isometry_interval='auto' (32 for batch 32: the isometry step every "
    "32nd update, 32x as large)",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(PlasticDQN, activation="relu", isometry_coef=2e-3, isometry_interval="auto"),
    steps=DQN_CNN_STEPS,
    target=0.95,
    in_quick=False,
))
register(Entry(
    name="dqn-cnn-cbp",
    description="DQN CnnPolicy + ContinualBackprop(1e-4, maturity 10) vs DQN CnnPolicy, Breakout (batch 32: CBP's "
    "fixed cost per update weighs most here)",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(DQN),
    candidate_callback=with_callback(ContinualBackprop, **CBP_KWARGS),
    steps=DQN_CNN_STEPS,
    target=0.90,
    in_quick=False,
))

# rl-zoo3's Pendulum SAC: SB3 defaults (net [256, 256], batch 256, 1 gradient step per env step), lr 1e-3.
SAC_PENDULUM = dict(learning_rate=1e-3, learning_starts=100)


def sac_pendulum(cls: type[BaseAlgorithm], **plastic: Any) -> Factory:
    def factory(ctx: Context) -> BaseAlgorithm:
        env = make_gym("Pendulum-v1", 1, ctx.seed)
        return cls("MlpPolicy", env, device=ctx.device, seed=ctx.seed, verbose=0, **SAC_PENDULUM, **plastic)

    return factory


SAC_STEPS = {"quick": Steps(120, 100), "full": Steps(200, 500)}

register(Entry(
    name="sac-mlp-relu",
    description="PlasticSAC MlpPolicy [256,256] relu, AdamO+isometry 1e-3 (isometry_interval='auto': 4 for "
    "batch 256) vs SAC, Pendulum-v1",
    baseline=sac_pendulum(SAC),
    candidate=sac_pendulum(PlasticSAC, activation="relu", isometry_coef=2e-3, isometry_interval="auto"),
    steps=SAC_STEPS,
    target=0.95,
))
register(Entry(
    name="sac-mlp-cbp",
    description="SAC MlpPolicy [256,256] + ContinualBackprop(1e-4, maturity 10) on actor and critic vs SAC, Pendulum-v1",
    baseline=sac_pendulum(SAC),
    candidate=sac_pendulum(SAC),
    candidate_callback=with_callback(ContinualBackprop, **CBP_KWARGS),
    steps=SAC_STEPS,
    target=0.90,
    in_quick=False,
))
register(Entry(
    name="sac-mlp-redo",
    description=f"one ReDo check (actor and critic) on SAC MlpPolicy every {REDO_PERIOD} gradient steps (= env steps), "
    "projected from SAC's fps in this run, Pendulum-v1",
    baseline=sac_pendulum(SAC),
    event=REDO_EVENT,
    steps=SAC_STEPS,
    in_quick=False,
))
register(Entry(
    name="sac-mlp-monitor",
    description=f"one PlasticityMonitor pass on SAC MlpPolicy at the defaults (every={DEFAULT_EVERY:,}, max_overhead=0.02), "
    "projected from SAC's fps in this run, Pendulum-v1",
    baseline=sac_pendulum(SAC),
    event=MONITOR_EVENT,
    steps=SAC_STEPS,
    target=0.95,
    in_quick=False,
))


# ---------------------------------------------------------------------------------------------- measuring
@dataclass
class Arm:
    """One model under test, with ``model.train`` wrapped by a timer."""

    model: BaseAlgorithm
    callback: Optional[BaseCallback] = None
    train_seconds: float = 0.0
    train_cpu_seconds: float = 0.0

    def __post_init__(self) -> None:
        original = self.model.train

        def timed_train(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                _sync(self.model.device)
                self.train_seconds += time.perf_counter() - start
                self.train_cpu_seconds += time.process_time() - start_cpu

        self.model.train = timed_train  # type: ignore[method-assign]  # instance attribute shadows the method

    def run(self, steps: int, threads: int) -> dict[str, float]:
        """One timed ``learn()``: wall and CPU seconds, in total and inside train(), env steps done and optimizer
        steps taken (the most of any network's optimizer, as :class:`~sb3_plastic.callbacks.ReDo` counts its period:
        PPO's minibatch updates, one per gradient step for DQN / SAC)."""
        th.set_num_threads(threads)
        gc.collect()
        before_steps, before_train, before_cpu = self.model.num_timesteps, self.train_seconds, self.train_cpu_seconds
        counts: dict[int, int] = {}

        def count(optimizer: th.optim.Optimizer) -> None:
            counts[id(optimizer)] += 1

        hooks = []
        for spec in find_networks(self.model):
            if spec.optimizer is not None and id(spec.optimizer) not in counts:
                counts[id(spec.optimizer)] = 0
                hooks.append(OutermostStepHooks(spec.optimizer, after=count))
        _sync(self.model.device)
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            self.model.learn(total_timesteps=steps, callback=self.callback, reset_num_timesteps=False)
        finally:
            for hook in hooks:
                for handle in hook.handles:
                    handle.remove()
        _sync(self.model.device)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        train, train_cpu = self.train_seconds - before_train, self.train_cpu_seconds - before_cpu
        return {
            "steps": self.model.num_timesteps - before_steps,
            "optimizer_steps": max(counts.values(), default=0),
            "wall": wall, "train": train, "rollout": wall - train,
            "cpu_wall": cpu, "cpu_train": train_cpu, "cpu_rollout": cpu - train_cpu,
        }


def _sync(device: th.device) -> None:
    if th.device(device).type == "cuda":
        th.cuda.synchronize()


@dataclass
class Result:
    entry: Entry
    ratios: dict[str, list[float]] = field(default_factory=dict)
    cpu_ratios: dict[str, list[float]] = field(default_factory=dict)
    best_ratios: dict[str, float] = field(default_factory=dict)
    context: dict[str, float] = field(default_factory=dict)
    skipped: Optional[str] = None


def measure(entry: Entry, mode: str, repeats: int, device: str, threads: int, seed: int, log: Callable[[str], None]) -> Result:
    if entry.event is not None:
        return measure_event(entry, mode, repeats, device, threads, seed, log)
    ctx = Context(mode=mode, device=device, seed=seed)
    steps = entry.steps[mode]
    th.set_num_threads(threads)
    assert entry.candidate is not None
    try:
        base = Arm(entry.baseline(ctx))
        cand = Arm(entry.candidate(ctx), entry.candidate_callback(ctx) if entry.candidate_callback else None)
    except Unavailable as exc:
        return Result(entry, skipped=str(exc))
    log(f"[{entry.name}] warm-up {steps.warmup} steps per arm")
    base.run(steps.warmup, threads)
    cand.run(steps.warmup, threads)
    ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    cpu_ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    runs: dict[str, list[dict[str, float]]] = {"base": [], "cand": []}
    for rep in range(repeats):
        a = base.run(steps.per_rep, threads)  # A/B/A/B: each ratio compares two neighbouring runs
        b = cand.run(steps.per_rep, threads)
        runs["base"].append(a)
        runs["cand"].append(b)
        for prefix, out in (("", ratios), ("cpu_", cpu_ratios)):
            # speed ratios: time per env step of the baseline over that of the candidate
            for metric, key in zip(METRICS, ("wall", "train", "rollout")):
                ta, tb = a[prefix + key] / a["steps"], b[prefix + key] / b["steps"]
                out[metric].append(ta / tb if ta > 0 and tb > 0 else float("nan"))
        log(
            f"[{entry.name}] rep {rep + 1}/{repeats}: " + ", ".join(
                f"{m} {ratios[m][-1]:.3f} (cpu {cpu_ratios[m][-1]:.3f})" for m in METRICS
            )
        )

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    def best(arm: str, key: str) -> float:
        return min(r[key] / r["steps"] for r in runs[arm])

    # Ratio of the best (shortest) time per env step of each arm: other load only ever adds time, so this
    # estimator is the least sensitive to it (the idea behind timeit's min).
    best_ratios = {
        m: best("base", k) / best("cand", k) if best("cand", k) > 0 and best("base", k) > 0 else float("nan")
        for m, k in zip(METRICS, ("wall", "train", "rollout"))
    }

    context = {
        "baseline_fps": statistics.median(r["steps"] / r["wall"] for r in runs["base"]),
        "candidate_fps": statistics.median(r["steps"] / r["wall"] for r in runs["cand"]),
        "baseline_train_share": med("base", "train") / med("base", "wall"),
        "candidate_train_share": med("cand", "train") / med("cand", "wall"),
        "steps_per_rep": steps.per_rep,
    }
    del base, cand
    gc.collect()
    return Result(entry, ratios=ratios, cpu_ratios=cpu_ratios, best_ratios=best_ratios, context=context)


def measure_event(
    entry: Entry, mode: str, repeats: int, device: str, threads: int, seed: int, log: Callable[[str], None]
) -> Result:
    """An event entry: per repetition one timed plain ``learn()`` (the fps of this run), then one timed event."""
    event = entry.event
    assert event is not None
    ctx = Context(mode=mode, device=device, seed=seed)
    steps = entry.steps[mode]
    th.set_num_threads(threads)
    try:
        arm = Arm(entry.baseline(ctx), event.callback(ctx))
    except Unavailable as exc:
        return Result(entry, skipped=str(exc))
    log(f"[{entry.name}] warm-up {steps.warmup} steps with the callback attached")
    arm.run(steps.warmup, threads)
    callback, arm.callback = arm.callback, None
    assert callback is not None
    metrics = entry.metrics
    ratios: dict[str, list[float]] = {m: [] for m in metrics}
    cpu_ratios: dict[str, list[float]] = {m: [] for m in metrics}
    runs: list[dict[str, float]] = []
    for rep in range(repeats):
        run = arm.run(steps.per_rep, threads)
        th.set_num_threads(threads)
        gc.collect()
        _sync(arm.model.device)
        start, start_cpu = time.perf_counter(), time.process_time()
        event.trigger(callback)
        _sync(arm.model.device)
        run["event"], run["cpu_event"] = time.perf_counter() - start, time.process_time() - start_cpu
        run["period_steps"] = _period_steps(event, run)
        runs.append(run)
        for prefix, out in (("", ratios), ("cpu_", cpu_ratios)):
            values = _event_values(event, run["period_steps"] * run[prefix + "wall"] / run["steps"], run[prefix + "event"])
            for metric, value in zip(metrics, values):
                out[metric].append(value)
        log(f"[{entry.name}] rep {rep + 1}/{repeats}: {event.label} {run['event']:.3f} s, " + ", ".join(
            f"{m.strip()} {_fmt_value(entry, ratios[m][-1])}" for m in metrics))
    # best/best: the shortest baseline time per env step and the shortest event
    best_step = min(r["wall"] / r["steps"] for r in runs)
    best_event = min(r["event"] for r in runs)
    best_period = statistics.median(r["period_steps"] for r in runs)
    best_ratios = dict(zip(metrics, _event_values(event, best_period * best_step, best_event)))
    context = {
        "baseline_fps": statistics.median(r["steps"] / r["wall"] for r in runs),
        "event_seconds": statistics.median(r["event"] for r in runs),
        "event_cpu_seconds": statistics.median(r["cpu_event"] for r in runs),
        "period_steps": statistics.median(r["period_steps"] for r in runs),
        "steps_per_rep": steps.per_rep,
    }
    del arm, callback
    gc.collect()
    return Result(entry, ratios=ratios, cpu_ratios=cpu_ratios, best_ratios=best_ratios, context=context)


def _period_steps(event: Event, run: dict[str, float]) -> float:
    """The event's period in env steps (a period in gradient steps is converted with this run's optimizer steps per
    env step)."""
    if event.unit == "env":
        return float(event.every)
    updates = run["optimizer_steps"]
    return float(event.every) * run["steps"] / updates if updates > 0 else float("nan")


def _event_values(event: Event, period_seconds: float, event_seconds: float) -> list[float]:
    """The metrics of an event from the training time of one period and the time of one event."""
    t, period = event_seconds, period_seconds
    if event.report == "fraction":
        return [t / period]
    values = []
    if event.max_share is not None:
        capped = max(period, t / event.max_share)
        values.append(capped / (capped + t))
    values.append(period / (period + t))
    return values


# ---------------------------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x:.3f}" if x == x else "-"


def _fmt_value(entry: Entry, x: float) -> str:
    """A ratio with 3 decimals; a fraction (lower is better) in percent."""
    if not entry.lower_is_better:
        return _fmt(x)
    return f"{100 * x:.4f}%" if x == x else "-"


def _target_text(entry: Entry) -> str:
    if entry.target is None:
        return "-"
    return f"< {100 * entry.target:g}%" if entry.lower_is_better else f">= {entry.target:.3f}"


def primary_median(res: Result) -> float:
    """The wall-clock median of the entry's first metric (the one its target is about)."""
    values = [v for v in res.ratios[res.entry.metrics[0]] if v == v]
    return statistics.median(values) if values else float("nan")


def status(res: Result) -> str:
    if res.skipped is not None:
        return f"SKIP ({res.skipped})"
    if res.entry.target is None:
        return "-"
    value = primary_median(res)
    return "FAIL" if value != value or not res.entry.passes(value) else "PASS"


def table(results: list[Result]) -> str:
    head = ("benchmark", "metric", "median", "min", "max", "cpu-time median", "best/best", "target", "status")
    rows: list[tuple[str, ...]] = []
    for res in results:
        entry = res.entry
        if res.skipped is not None:
            rows.append((entry.name, "-", "-", "-", "-", "-", "-", "-", status(res)))
            continue
        for i, metric in enumerate(entry.metrics):
            values = [v for v in res.ratios[metric] if v == v]
            cpu_values = [v for v in res.cpu_ratios[metric] if v == v]
            if not values:
                rows.append((entry.name, metric, "-", "-", "-", "-", "-", "-", "n/a"))
                continue
            rows.append((
                entry.name, metric, *(_fmt_value(entry, x) for x in (statistics.median(values), min(values), max(values))),
                _fmt_value(entry, statistics.median(cpu_values)) if cpu_values else "-",
                _fmt_value(entry, res.best_ratios.get(metric, float("nan"))),
                _target_text(entry) if i == 0 else "-", status(res) if i == 0 else "-",
            ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def details(results: list[Result]) -> str:
    out = []
    for res in results:
        if res.skipped is not None:
            continue
        entry = res.entry
        out.append(f"{entry.name}: {entry.description}")
        for metric in entry.metrics:
            out.append(
                f"  {metric.strip():14s} values: " + ", ".join(_fmt_value(entry, v) for v in res.ratios[metric])
                + "   (cpu time: " + ", ".join(_fmt_value(entry, v) for v in res.cpu_ratios[metric]) + ")"
            )
        c = res.context
        if entry.event is not None:
            out.append(
                f"  context (not a result): median baseline fps {c['baseline_fps']:.1f}; {entry.event.label}: median "
                f"{c['event_seconds']:.3f} s wall, {c['event_cpu_seconds']:.3f} s CPU; period {c['period_steps']:,.0f} env "
                f"steps (~{c['period_steps'] / c['baseline_fps']:,.0f} s of training); {int(c['steps_per_rep'])} env steps "
                "per repetition"
            )
        else:
            out.append(
                f"  context (not a result): median fps baseline {c['baseline_fps']:.1f}, candidate {c['candidate_fps']:.1f}; "
                f"share of learn() spent in train(): baseline {c['baseline_train_share']:.0%}, "
                f"candidate {c['candidate_train_share']:.0%}; {int(c['steps_per_rep'])} env steps per repetition"
            )
    return "\n".join(out)


def source_revision() -> str:
    """``git describe``-like revision of the checkout being measured (``+dirty`` with local changes)."""
    root = __file__.rsplit("/bench/", 1)[0] if "/bench/" in __file__ else "."
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sb3_plastic"], cwd=root, capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if rev.returncode != 0:
        return "unknown"
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small step counts, entries marked in_quick (<= ~2 minutes)")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--device", default="cpu", help="torch device of both arms (default: cpu)")
    parser.add_argument("--repeats", type=int, default=None, help="A/B repetitions per entry (default: 3 quick, 5 full)")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch.set_num_threads for both arms (default 1: on a shared 2-core machine, 2 threads were up to 10x "
        "slower and far noisier)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the ratios and the context as JSON")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition progress lines (stderr)")
    args = parser.parse_args(argv)

    if args.list:
        for e in REGISTRY.values():
            tgt = f"target {_target_text(e)}" if e.target is not None else "no target"
            print(f"{e.name:18s} {e.kind:5s} {'quick+full' if e.in_quick else 'full only':10s} {tgt:15s} {e.description}")
        return 0
    mode = "quick" if args.quick else "full"
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if args.only:
        unknown = [n for n in args.only if n not in REGISTRY]
        if unknown:
            parser.error(f"unknown entries {unknown}; known: {sorted(REGISTRY)}")
        entries = [REGISTRY[n] for n in args.only]
    else:
        entries = [e for e in REGISTRY.values() if e.in_quick or mode == "full"]

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    th.set_num_threads(args.threads)
    started = time.perf_counter()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    revision = source_revision()
    results = []
    for entry in entries:
        try:
            results.append(measure(entry, mode, repeats, args.device, args.threads, args.seed, log))
        except Exception as exc:
            traceback.print_exc()
            results.append(Result(entry, skipped=f"error: {type(exc).__name__}: {exc}"))
    elapsed = time.perf_counter() - started

    print(
        f"sb3_plastic overhead, mode={mode}, repeats={repeats} (A/B interleaved), device={args.device}, "
        f"threads={args.threads}, torch {th.__version__}, python {platform.python_version()}, sb3_plastic {revision}, "
        f"{stamp}, {elapsed:.0f} s"
    )
    print(
        "ratio = candidate speed / baseline speed, per env step (learn fps; train() and rollout: baseline time / "
        "candidate time); > 1: the plastic algorithm is faster. Event entries: projected fps = T / (T + t), T the "
        "training time of one period at the baseline fps of this run, t one event; 'time / N-step run' = t / T for a "
        "period of N steps. median/min/max: wall clock (status uses the wall-clock median of the first metric); "
        "cpu-time median: the same from this process's CPU time (less sensitive to other load); best/best: from the "
        "best times of each arm over the repetitions (least sensitive to other load)"
    )
    print(table(results))
    print()
    print(details(results))
    if args.json:
        payload = {
            "mode": mode, "repeats": repeats, "device": args.device, "threads": args.threads, "torch": th.__version__,
            "date": stamp, "elapsed_s": elapsed, "revision": revision,
            "results": {
                r.entry.name: {
                    "kind": r.entry.kind, "skipped": r.skipped, "target": r.entry.target,
                    "target_is_upper_bound": r.entry.lower_is_better, "status": status(r),
                    "ratios": r.ratios, "cpu_ratios": r.cpu_ratios,
                    "best_ratios": r.best_ratios,
                    "context": r.context,
                }
                for r in results
            },
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
    failed = any(status(r) == "FAIL" for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
