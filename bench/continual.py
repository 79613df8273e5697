"""Continual-RL grid: methods x seeds on a non-stationary env, with fresh-agent references, rliable statistics,
per-run JSON results and plots that rebuild from them.

Every run trains one agent through a sequence of tasks (``--tasks``, each ``--change-every`` env steps of
every env copy) with :class:`~sb3_plastic.callbacks.PlasticityMonitor` logging the plasticity diagnostics,
and records per task the **reward per env step** and the **mean episode return** over the last ``tail`` part of the
task (20 % unless the setting says otherwise; the setting's ``score`` picks which one the tables use).

The protocol of issue #14 (DESIGN.md, "Continual semantics"):

* **Fresh-agent reference (warm-start test).** For every task ``k`` of a run's sequence a freshly initialised agent
  of the same method (same seed, network, optimizer and callbacks) trains on task ``k`` alone (the env pinned to
  task ``k`` with ``pin_task``) for the same budget, one task. Plasticity at task ``k`` = continual score on task
  ``k`` / fresh score on task ``k``; reported per task and over the last half of the run, next to the absolute
  scores. Interventions that act at task changes or at the continual run's midpoint (Shrink & Perturb, both FIRE
  methods) never trigger within one task, so their fresh agents run without them: they are the plain agent's fresh
  runs, copied from them where those exist (``reused_from`` in the JSON). ``--fresh none`` skips them.
* **Independent task sequences per seed**: run seed ``s`` trains on the task sequence of ``task_seed = s``.
* **Statistics** (:mod:`rl_stats`): per method the IQM (rliable's ``aggregate_iqm``) over runs x last-half tasks with
  a stratified bootstrap 95 % CI, and the probability of improvement over the plain baseline (rliable's
  ``probability_of_improvement``) with its CI; "not resolved" wherever the two intervals compared overlap, and no
  verdict at all ("too few seeds") for a method with fewer than :data:`MIN_VERDICT_SEEDS` runs.

Methods (``--methods``; default: all but ``ppo_fire_switch``, ``ppo_cbp_dohare``, ``ppo_redo`` and the baselines of
issue #15; on a DQN / SAC setting the ``ppo`` prefix reads ``dqn`` / ``sac``: ``dqn``, ``dqn_l2``, ...):

==================  =======================================================================================
``ppo``             the setting's SB3 algorithm, ReLU, Adam (the plain baseline; the library's CNN on MinAtar)
``ppo_l2``          L2 regularisation (Adam ``weight_decay``, coupled, ``--l2``)
``ppo_snp``         :class:`~sb3_plastic.callbacks.ShrinkPerturb` at every task change (Ash & Adams)
``ppo_cbp``         :class:`~sb3_plastic.callbacks.ContinualBackprop` (Dohare et al., 2024) at this library's defaults
``ppo_cbp_dohare``  Continual Backprop at Dohare's RL settings (his Slippery Ant runs): Adam betas (0.99, 0.99),
                    L2 1e-4 (Adam ``weight_decay``), maturity 10 000, replacement rate 1e-4
``ppo_redo``        :class:`~sb3_plastic.callbacks.ReDo` (Sokar et al., 2023) at the library defaults
``ppo_fire``        :class:`~sb3_plastic.callbacks.FIRE` once at the midpoint of the run (the FIRE paper)
``ppo_fire_switch`` FIRE at every task change
``plastic_relu``    the plastic algorithm (:class:`~sb3_plastic.PlasticPPO` / DQN / SAC), ReLU, AdamO + isometry penalty
``plastic_maxmin``  the plastic algorithm, MaxMin (GroupSort-2) with orthogonal init, AdamO + isometry penalty
``ppo_l2_init``     :class:`~sb3_plastic.callbacks.L2Init` (Kumar et al., 2023; ``--l2-init-coef``)
``ppo_spectral``    :class:`~sb3_plastic.callbacks.SpectralRegularisation` (Lewandowski et al., 2024;
                    ``--spectral-coef``)
``ppo_adam_equal_betas`` the setting's SB3 algorithm with Adam beta1 = beta2 = 0.99 (Dohare et al., 2023's fix of
                    PPO's policy collapse), nothing else changed
``ppo_nap``         the plastic algorithm with ``nap=True`` (Normalize-and-Project, Lyle et al., 2024), ReLU,
                    isometry penalty off, Adam: the plain agent with layer norms and the projection
``plastic_*_rect``  ``plastic_relu`` / ``plastic_maxmin`` with ``isometry_rect_scale=True`` (issue #27)
``plastic_relu_s2`` ``plastic_relu`` with ``isometry_scale=2`` (``plastic_relu_s2_rect``: and rect_scale)
``ppo_head_reset``  :class:`~sb3_plastic.callbacks.LayerReset` of both output heads at every task change (Nikishin
                    et al., 2022; issue #29's control); ``ppo_policy_head_reset`` / ``ppo_value_head_reset`` one head
                    (DQN: the Q head)
``ppo_injection``   :class:`~sb3_plastic.callbacks.PlasticityInjection` of a 2-layer head at every task change
``ppo_head2_reset`` LayerReset of the last 2 layers of every path at every task change: the layers ``ppo_injection``
                    freezes and replaces, re-drawn instead (the injection's control)
``ppo_cchain``      :class:`~sb3_plastic.callbacks.ChurnReduction` (C-CHAIN, Tang et al., 2025) at the reference settings
``ppo_trac``        the plain agent's network, TRAC around Adam (``optimizer="trac"``, Muppidi et al., 2024)
``ppo_parseval``    :class:`~sb3_plastic.callbacks.ParsevalRegularisation` (Chung et al., 2024; ``--parseval-coef``)
``ppo_crelu``       the plain agent with CReLU (Abbas et al., 2023; half the units per layer, the same feature widths)
``ppo_fourier``     the plain agent with deep Fourier features (Lewandowski et al., 2024; as ``ppo_crelu``)
``ppo_layernorm``   the plain agent with a layer norm before every ReLU, no projection (NaP without its projection)
``ppo_vecnorm``     the plain agent on SB3's running observation normalisation (``VecNormalize``, observations only;
                    issue #29's control, :func:`normalise_observations`)
``ppo_fire_switch_hidden`` FIRE at every task change on the hidden layers only, the output heads untouched (issue #29)
``ppo_l2_dohare``   Dohare et al.'s L2 agent of Slippery Ant: Adam betas (0.99, 0.99), L2 1e-3 (Adam ``weight_decay``)
``ppo_snp_continual`` continual Shrink & Perturb (``ShrinkPerturb("continual")``, library defaults) with Adam betas
                    (0.99, 0.99), as Dohare et al.'s regularised agents
``ppo_cchain_vanilla`` the plain agent on C-CHAIN's vanilla PPO targets (advantages normalised per rollout, lambda = 1
                    value targets; bench/cchain_vanilla.py): the Gym-control anchor's check (issue #29)
==================  =======================================================================================

The isometry paper's baselines (issue #15) are not in the default list: add them with ``--methods`` (e.g.
``--methods ppo ppo_l2_init ppo_spectral ppo_nap plastic_relu plastic_maxmin``); ``--methods all`` runs every
method of the setting's algorithm (the grid of issue #14).

Settings (``--setting``): see :data:`SETTINGS` (each entry's ``description``) and bench/README.md.

Layout of ``--out`` (default ``bench/results/continual/<setting>``)::

    runs/<method>/seed<k>.json              one finished continual run: per-task scores, diagnostics, timings
    runs/<method>/fresh/seed<k>_task<j>.json  the fresh agent of that run's task j
    tb/<method>/s<k>_1/, tb/<method>/fresh/  TensorBoard events (SB3's logger + PlasticityMonitor; not committed)
    summary.json, summary.md                the tables (IQM, CIs, probability of improvement, verdicts) of every
                                            method found there, whatever ``--methods`` this call ran
    end_of_task.png, plasticity.png, diagnostics.png   the figures, built from the JSON files alone

Resuming: a run whose JSON exists is skipped, so rerunning the same command after an interruption
finishes the grid (an unfinished run resumes from its checkpoint, ``bench/run_checkpoint.py``, or starts again from
scratch with its partial TensorBoard folder removed). A run is trained by one process at a time: it is claimed first
(``<json>.claim``, :func:`claim_run`), and a second process reaching a run that a live one is training reports it as
skipped by name (two processes on one run would share, and the later one delete, its TensorBoard folder). A call in
which no run finished leaves an existing summary and its figures as they are. ``--plot-only`` rebuilds
every table and figure from the JSON files (a fresh clone has them) and refuses to write anything when it finds no
runs; runs recorded before a diagnostic existed get it from their TensorBoard events where those are on disk
(:func:`add_hidden_dfi`, :func:`add_train_scalars`). To spread a grid over machines: ``bench/grid.py``.

Examples::

    python bench/continual.py --quick                                    # smoke test, ~1-2 min
    python bench/continual.py --seeds 0 1 2 --jobs 2                     # the CPU grid of bench/README.md
    python bench/continual.py --setting minatar_intensive --methods all --seeds 0 1 2 3 4 --jobs 14
    python bench/continual.py --setting minatar_intensive --device cuda --jobs 4   # on a GPU machine
    python bench/continual.py --setting minatar_intensive --plot-only    # rebuild tables and figures
    python bench/continual.py --setting cchain_cartpole --methods ppo --seeds 0 1 2 3 4 --fresh all  # C-CHAIN's Table 1
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import continual_figures
import run_checkpoint
from rl_stats import bootstrap_mean_ci, iqm_ci, ratio_of_means_ci, rliable_metrics, stratified_bootstrap

#: fraction of each task (its last part) over which the end-of-task scores are averaged (a setting may differ)
TAIL = 0.2
#: the algorithms of the settings: (SB3 class, plastic class) names
ALGOS = {"ppo": ("PPO", "PlasticPPO"), "dqn": ("DQN", "PlasticDQN"), "sac": ("SAC", "PlasticSAC")}
#: wall seconds between two checkpoints of a run in progress (None: none; see bench/run_checkpoint.py)
CHECKPOINT_SECONDS: Optional[float] = run_checkpoint.CHECKPOINT_SECONDS
#: bootstrap resamples of the tables (stratified for IQM / probability of improvement, per task for the bands)
REPS = 2000


class LeakyReLU01(nn.LeakyReLU):
    """Leaky ReLU with negative slope 0.1, the hidden activation of TRAC's and C-CHAIN's Gym-control networks
    (``torch.nn.LeakyReLU(0.1)``; a class, as SB3's ``activation_fn`` takes one)."""

    def __init__(self, negative_slope: float = 0.1, inplace: bool = False) -> None:
        super().__init__(negative_slope, inplace)


#: hidden activations of the plain agents (:attr:`Setting.activation`)
PLAIN_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "leaky_relu": LeakyReLU01}
#: end-of-task scores (:attr:`Setting.score`): reward per env step, mean return of the episodes ending in the tail, and
#: TRAC / C-CHAIN's per-iteration return (the mean over the tail's rollouts of each rollout's mean episode return, the
#: episode its end cuts counted with its partial return; needs ``rollout_reset``)
SCORES = ("end_reward", "end_return", "iteration_return")
#: how the tables and figures name each score
SCORE_LABELS = {"end_reward": "reward per env step", "end_return": "episode return",
                "iteration_return": "episode return per PPO iteration (TRAC / C-CHAIN's)"}


@dataclass(frozen=True)
class Setting:
    """A non-stationary env and the hyperparameters every method shares on it.

    :param env_id: gymnasium id (``sb3_plastic/...``).
    :param change_every: task length in env steps of one env copy (total steps per task: ``x n_envs``).
    :param tasks: number of tasks of a run.
    :param n_envs: env copies (``make_vec_env``; they switch tasks in lockstep).
    :param policy: SB3 policy alias.
    :param net_arch: hidden layers of the policy and value MLPs (the Q / actor / critic MLPs for DQN / SAC).
    :param ppo: keywords of the setting's algorithm shared by every method (PPO's for the PPO settings).
    :param monitor_every: env steps between two PlasticityMonitor passes.
    :param env_kwargs: extra keywords of the env.
    :param description: one line for the README and the plots.
    :param algo: ``"ppo"``, ``"dqn"`` or ``"sac"``.
    :param score: the end-of-task score of the tables: ``"end_reward"`` (reward per env step) or ``"end_return"``
        (mean return of the episodes that end in the task's tail).
    :param tail: fraction of each task (its last part) the end-of-task scores average over.
    :param exploration_steps: DQN only: env steps over which epsilon decays from ``exploration_initial_eps`` to
        ``exploration_final_eps``, the same absolute schedule in a continual run and in a fresh agent (SB3's
        ``exploration_fraction`` is set to ``exploration_steps / timesteps of the run``; C-CHAIN's schedule); 0: the
        algorithm keywords' own ``exploration_fraction`` (a fraction of each run's length).
    :param eval_every: timesteps between two greedy evaluations (:class:`~sb3_plastic.callbacks.ContinualEvalCallback`
        on a second env of the same task sequence, env seed ``1234 * seed`` as C-CHAIN's; the task just trained),
        recorded as ``evaluations`` ``[[timesteps, task, mean return], ...]``; 0: none.
    :param eval_episodes: episodes per evaluation.
    :param activation: hidden activation of the plain agents (the SB3 algorithm, and the methods built on the plain
        agent's network: ``ppo_trac``, ``ppo_nap``, ``ppo_layernorm``): ``"relu"`` or ``"leaky_relu"``
        (:class:`LeakyReLU01`, TRAC's and C-CHAIN's networks). The plastic methods named after an activation
        (``plastic_relu``, ``plastic_maxmin``, ``ppo_crelu``, ``ppo_fourier``) keep theirs.
    :param policy_kwargs: SB3 policy keywords every method shares, on top of ``net_arch`` and the activation (e.g.
        ``ortho_init=False``; ``optimizer_kwargs`` are merged with a method's own, e.g. ``ppo_l2``'s weight decay).
    :param reward_scale: the agent trains on ``reward / reward_scale`` (a wrapper outside SB3's ``Monitor``: episode
        returns and every score stay in the env's units); 1: the env's rewards.
    :param rollout_reset: start every rollout with new episodes (every env copy reset at the rollout start: TRAC's
        and C-CHAIN's PPO iterations); the episode the rollout's end cuts is bootstrapped by PPO, as theirs is.
    :param floor_below: a score below it is the env's floor, what a collapsed policy gets (CartPole: 20, about twice
        the ~9.4 steps of a policy that always pushes one way; Acrobot: -399, the 400-step cap without a swing-up).
        The summary counts the last-half cells at the floor beside the IQM, which drops the lowest quarter of the
        cells and so can hide them; ``None``: no count.
    """

    env_id: str
    change_every: int
    tasks: int
    n_envs: int
    policy: str
    net_arch: tuple[int, ...]
    ppo: dict[str, Any]
    monitor_every: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    algo: str = "ppo"
    score: str = "end_reward"
    tail: float = TAIL
    exploration_steps: int = 0
    eval_every: int = 0
    eval_episodes: int = 10
    activation: str = "relu"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_scale: float = 1.0
    rollout_reset: bool = False
    floor_below: Optional[float] = None

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(map(repr, SCORES))}, got {self.score!r}")
        if self.activation not in PLAIN_ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(map(repr, PLAIN_ACTIVATIONS))}, got {self.activation!r}")
        if not (isinstance(self.reward_scale, (int, float)) and math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise ValueError(f"reward_scale must be a finite number > 0, got {self.reward_scale!r}")
        if self.score == "iteration_return" and not self.rollout_reset:
            raise ValueError("score='iteration_return' (TRAC / C-CHAIN's per-iteration return) needs rollout_reset=True")

    @property
    def task_timesteps(self) -> int:
        return self.change_every * self.n_envs

    @property
    def total_timesteps(self) -> int:
        return self.tasks * self.task_timesteps


#: PPO's Atari settings on MinAtar (the zoo's MinAtar entries)
_PPO_MINATAR = dict(n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01)
#: update-intensive PPO (issue #14's measurement: lr 1e-3, 10 epochs)
_PPO_MINATAR_INTENSIVE = dict(_PPO_MINATAR, n_epochs=10, learning_rate=1e-3)
#: Dohare et al.'s PPO on Slippery Ant (rollouts of 2048 steps, 10 epochs, lr 1e-4; their ``cfg/sant/std.yml``) with a
#: minibatch of 64 where theirs is 128 (``bs`` 2048 / ``n_slices`` 16): the 200 k and 500 k interval runs were made so;
#: ``slippery_ant_dohare`` has their 128
_PPO_SLIPPERY = dict(n_steps=512, batch_size=64, n_epochs=10, learning_rate=1e-4, gamma=0.99, gae_lambda=0.95,
                     clip_range=0.2, ent_coef=0.0)

SETTINGS: dict[str, Setting] = {
    # random-label memorisation as RL: 256 fixed contexts, 8 actions, labels re-drawn every task
    "bandit": Setting(
        env_id="sb3_plastic/RandomLabelBandit-v0",
        change_every=2_000,
        tasks=12,
        n_envs=16,
        policy="MlpPolicy",
        net_arch=(128, 128),
        ppo=dict(n_steps=64, batch_size=256, n_epochs=10, learning_rate=1e-3, gamma=0.0, gae_lambda=1.0, ent_coef=0.0),
        monitor_every=16_000,
        description="RandomLabelBandit (256 contexts, 8 actions, labels re-drawn every 32k steps), PPO [128, 128]",
    ),
    # channel-permuted MinAtar Breakout, short task cycles, PPO's Atari settings
    "minatar": Setting(
        env_id="sb3_plastic/PermutedMinAtar-Breakout-v0",
        change_every=25_000,
        tasks=8,
        n_envs=8,
        policy="CnnPolicy",
        net_arch=(),
        ppo=_PPO_MINATAR,
        monitor_every=50_000,
        description="PermutedMinAtar-Breakout (channels permuted every 200k steps), PPO MinAtar CNN",
        score="end_return",
    ),
    # channel-permuted MinAtar SpaceInvaders, update-intensive PPO: the first candidate of issue #14
    "minatar_intensive": Setting(
        env_id="sb3_plastic/PermutedMinAtar-SpaceInvaders-v0",
        change_every=31_250,
        tasks=20,
        n_envs=8,
        policy="CnnPolicy",
        net_arch=(),
        ppo=_PPO_MINATAR_INTENSIVE,
        monitor_every=125_000,
        description="PermutedMinAtar-SpaceInvaders (channels permuted every 250k steps), PPO lr 1e-3 x 10 epochs",
        score="end_return",
        tail=0.3,
    ),
    # task-switching MinAtar: the five games in turn, each against a fresh agent on that game
    "minatar_switching": Setting(
        env_id="sb3_plastic/SwitchingMinAtar-v0",
        change_every=31_250,
        tasks=10,
        n_envs=8,
        policy="CnnPolicy",
        net_arch=(),
        ppo=_PPO_MINATAR,
        monitor_every=125_000,
        description="SwitchingMinAtar (5 games, a new one every 250k steps), PPO MinAtar CNN",
        score="end_return",
        tail=0.3,
    ),
    # Dohare et al.'s Slippery Ant / HalfCheetah with PPO, change interval 2M -> 200k steps
    "slippery_halfcheetah_ppo": Setting(
        env_id="sb3_plastic/SlipperyHalfCheetah-v0",
        change_every=50_000,
        tasks=10,
        n_envs=4,
        policy="MlpPolicy",
        net_arch=(256, 256),
        ppo=_PPO_SLIPPERY,
        monitor_every=100_000,
        description="SlipperyHalfCheetah (friction re-drawn every 200k steps), PPO [256, 256] (Dohare's settings)",
        score="end_return",
    ),
    # high replay ratio DQN (8 gradient updates per env step): the primacy-bias setting of resets
    "minatar_dqn_replay": Setting(
        env_id="sb3_plastic/PermutedMinAtar-Breakout-v0",
        change_every=100_000,
        tasks=8,
        n_envs=1,
        policy="CnnPolicy",
        net_arch=(),
        ppo=dict(buffer_size=100_000, learning_starts=5_000, batch_size=32, learning_rate=1e-4, train_freq=1,
                 gradient_steps=8, target_update_interval=1_000, exploration_fraction=0.05,
                 exploration_final_eps=0.01),
        monitor_every=100_000,
        description="PermutedMinAtar-Breakout (channels permuted every 100k steps), DQN, replay ratio 8",
        algo="dqn",
        score="end_return",
    ),
    "slippery_halfcheetah_sac_replay": Setting(
        env_id="sb3_plastic/SlipperyHalfCheetah-v0",
        change_every=50_000,
        tasks=8,
        n_envs=1,
        policy="MlpPolicy",
        net_arch=(256, 256),
        ppo=dict(learning_starts=5_000, batch_size=256, train_freq=1, gradient_steps=4),
        monitor_every=50_000,
        description="SlipperyHalfCheetah (friction re-drawn every 50k steps), SAC [256, 256], replay ratio 4",
        algo="sac",
        score="end_return",
    ),
    # classic control with a new fixed random observation offset every task (TRAC / C-CHAIN's Gym-control setting);
    # rl_zoo3's CartPole-v1 PPO settings except a constant lr and clip range (the zoo's lin_0.001 / lin_0.2 would decay
    # them over the whole continual run, or, restarted per task, tell the agent of the switches)
    "cartpole_obs": Setting(
        env_id="sb3_plastic/PerturbedCartPole-v0",
        change_every=12_500,
        tasks=10,
        n_envs=8,
        policy="MlpPolicy",
        net_arch=(64, 64),
        ppo=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3,
                 clip_range=0.2, ent_coef=0.0),
        monitor_every=50_000,
        description="PerturbedCartPole (a new N(0, 1) observation offset every 100k steps), PPO [64, 64]",
        score="end_return",
        floor_below=20.0,
    ),
}

#: C-CHAIN's continual MinAtar (Tang et al., ICML 2025; bluecontra/C-CHAIN, crl_minatar/): their Double DQN (lr 3e-4,
#: batch 32, one update per env step, buffer 1e5 kept across games, target copied every 1 000 updates, epsilon
#: 1 -> 0.1 over 100 k steps after 10 k random ones, gamma 0.99, Adam, no gradient clipping) on SpaceInvaders ->
#: Asterix -> Seaquest, 2 M steps each, idle Seaquest episodes cut at 1 000 steps, 10 greedy evaluation episodes
#: every 50 k steps. Differences that remain (bench/README): SB3's Huber loss (theirs MSE), the 10 k random,
#: untrained steps only at the start of the run (theirs at the start of every game), no zero-shot evaluation at a
#: game's first step.
_CMINATAR_DQN = dict(buffer_size=100_000, learning_starts=10_000, batch_size=32, learning_rate=3e-4, gamma=0.99,
                     train_freq=1, gradient_steps=1, target_update_interval=1_000, exploration_initial_eps=1.0,
                     exploration_final_eps=0.1, max_grad_norm=float("inf"), double_q=True)
SETTINGS["cminatar"] = Setting(
    env_id="sb3_plastic/SwitchingMinAtar-v0",
    change_every=2_000_000,
    tasks=3,
    n_envs=1,
    policy="CnnPolicy",
    net_arch=(),
    ppo=_CMINATAR_DQN,
    monitor_every=250_000,
    env_kwargs=dict(games=("space_invaders", "asterix", "seaquest"), idle_episode_steps=1_000),
    description="C-MinAtar (Tang et al. 2025): SpaceInvaders -> Asterix -> Seaquest, 2M steps each, Double DQN",
    algo="dqn",
    score="end_return",
    exploration_steps=110_000,
    eval_every=50_000,
    eval_episodes=10,
)

#: TRAC / C-CHAIN's continual Gym control (Muppidi et al., NeurIPS 2024, ComputationalRobotics/TRAC ``main.ipynb``;
#: Tang et al., ICML 2025, bluecontra/C-CHAIN ``crl_gym_classic_control/``, whose code and Table 1 these settings
#: follow): 10 tasks, each a new fixed observation offset drawn per dimension from N(0, 2^2) (numpy's
#: ``normal(0, 2)``; none on task 0), 200 PPO iterations of 800 env steps per task, episodes cut at 400 steps. Their PPO:
#: one env, separate policy and value networks of three hidden layers of 256 with leaky ReLU (slope 0.1) and PyTorch's
#: default init, one Adam (lr 1e-3, the script's default; eps 1e-8) over both, 5 epochs of minibatches of 32, clip 0.2,
#: entropy 0.01, value loss 0.5 x MSE, gamma 0.99, GAE lambda 0.95, rewards / 20 for training, no gradient clipping,
#: every iteration starting new episodes. Score: their per-iteration mean episode return, averaged over all iterations
#: of a run (their "average performance", Table 1). What SB3's PPO cannot mirror (bench/README.md): advantages
#: normalised per minibatch of 32 (theirs over the iteration's 800 steps); value targets GAE(0.95) returns (theirs the
#: discounted Monte-Carlo return, bootstrapped at a cut); the offsets drawn from this library's generator (the same
#: distribution, other draws).
_CCHAIN_CONTROL_PPO = dict(n_steps=800, batch_size=32, n_epochs=5, learning_rate=1e-3, gamma=0.99, gae_lambda=0.95,
                           clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=float("inf"))
for _name, _env, _title in (("cchain_cartpole", "CartPole", "CartPole-v1"), ("cchain_acrobot", "Acrobot", "Acrobot-v1"),
                            ("cchain_lunar", "LunarLander", "LunarLander-v3")):
    SETTINGS[_name] = Setting(
        env_id=f"sb3_plastic/Perturbed{_env}-v0",
        change_every=160_000,
        tasks=10,
        n_envs=1,
        policy="MlpPolicy",
        net_arch=(256, 256, 256),
        ppo=_CCHAIN_CONTROL_PPO,
        monitor_every=80_000,
        env_kwargs=dict(scale=2.0, max_episode_steps=400),
        description=f"C-CHAIN's continual {_title} (a new N(0, 2^2) observation offset every 160k steps, 400-step "
                    "episodes), their PPO [256, 256, 256] leaky ReLU",
        score="iteration_return",
        tail=1.0,
        activation="leaky_relu",
        policy_kwargs=dict(ortho_init=False, optimizer_kwargs=dict(eps=1e-8)),
        reward_scale=20.0,
        rollout_reset=True,
        floor_below={"CartPole": 20.0, "Acrobot": -399.0}.get(_env),
    )

SETTINGS["slippery_ant_ppo"] = replace(
    SETTINGS["slippery_halfcheetah_ppo"],
    env_id="sb3_plastic/SlipperyAnt-v0",
    description="SlipperyAnt (friction re-drawn every 200k steps), PPO [256, 256] (Dohare's settings)",
)
# Dohare et al.'s own Slippery Ant design (issue #28: the 200 k and 500 k intervals showed no loss of plain PPO): a new
# friction every 2 M env steps, 10 frictions = 20 M steps (their ``n_steps: 2e7``, ``change_time: 2000000``), their
# minibatch of 128; read in absolute return (their loss is a decline of the continual return; no fresh reference)
SETTINGS["slippery_ant_dohare"] = replace(
    SETTINGS["slippery_ant_ppo"],
    change_every=500_000,
    ppo=dict(_PPO_SLIPPERY, batch_size=128),
    monitor_every=500_000,
    description="SlipperyAnt (friction re-drawn every 2M steps), PPO [256, 256] (Dohare's settings, minibatch 128)",
)

#: method names for PPO settings; on a DQN / SAC setting the "ppo" prefix is the algorithm's (see method_name)
METHODS = (
    "ppo", "ppo_l2", "ppo_snp", "ppo_cbp", "ppo_cbp_dohare", "ppo_redo", "ppo_fire", "ppo_fire_switch",
    "plastic_relu", "plastic_maxmin", "ppo_adam_equal_betas",
)
#: The isometry paper's baselines (issue #15), on request (``--methods``).
BASELINE_METHODS = ("ppo_l2_init", "ppo_spectral", "ppo_nap")
#: The isometry penalty's options in its authors' convention (issue #27), on request: keywords of the plastic algorithm
ISOMETRY_VARIANTS: dict[str, dict[str, Any]] = {
    "plastic_relu_rect": dict(isometry_rect_scale=True),
    "plastic_relu_s2": dict(isometry_scale=2.0),
    "plastic_relu_s2_rect": dict(isometry_scale=2.0, isometry_rect_scale=True),
    "plastic_maxmin_rect": dict(isometry_rect_scale=True),
}
METHODS = METHODS + BASELINE_METHODS + tuple(ISOMETRY_VARIANTS)
DEFAULT_METHODS = tuple(
    m for m in METHODS
    if m not in ("ppo_fire_switch", "ppo_cbp_dohare", "ppo_redo", "ppo_adam_equal_betas")
    and m not in BASELINE_METHODS + tuple(ISOMETRY_VARIANTS)
)
#: methods whose interventions act only at task changes or at the continual run's midpoint: off in a fresh agent
TASK_CHANGE_METHODS = ("ppo_snp", "ppo_fire", "ppo_fire_switch")

#: Head reset at every task switch (issue #29's control; :class:`~sb3_plastic.callbacks.LayerReset`, Nikishin et al.,
#: 2022), on request: ``ppo_head_reset`` both heads, ``ppo_policy_head_reset`` the action head, ``ppo_value_head_reset``
#: the value head (on a DQN setting each is the Q head). They act only at task changes: their fresh agent is the plain
#: one. Each maps to the ``layers`` of its LayerReset. ``ppo_head2_reset`` re-draws the last 2 layers of every path,
#: the layers ``ppo_injection`` replaces: the control that tells whether injection's frozen old heads (kept in the sum)
#: are what costs it, since both give the same layers fresh trainable weights at every switch.
HEAD_RESET_METHODS: dict[str, Any] = {"ppo_head_reset": "heads", "ppo_policy_head_reset": "policy_head",
                                      "ppo_value_head_reset": "value_head", "ppo_head2_reset": 2}
METHODS = METHODS + tuple(HEAD_RESET_METHODS) + ("ppo_injection",)
#: ``ppo_injection``: :class:`~sb3_plastic.callbacks.PlasticityInjection` (Nikishin et al., 2023) of a 2-layer head at
#: every task change (the paper injects once; every switch is the continual use), on request.
TASK_CHANGE_METHODS = TASK_CHANGE_METHODS + tuple(HEAD_RESET_METHODS) + ("ppo_injection",)

#: The field's methods (issue #30), on request: ``ppo_cchain`` C-CHAIN (:class:`~sb3_plastic.callbacks.ChurnReduction`,
#: Tang et al., 2025) at its reference settings for the agent; ``ppo_trac`` the plain agent's network with TRAC around
#: its Adam (``optimizer="trac"``, Muppidi et al., 2024); ``ppo_parseval``
#: :class:`~sb3_plastic.callbacks.ParsevalRegularisation` (Chung et al., 2024) at ``--parseval-coef``; ``ppo_crelu`` /
#: ``ppo_fourier`` the plain agent's network with CReLU (Abbas et al., 2023) / deep Fourier features (Lewandowski et al.,
#: 2024) in place of ReLU (half the units per layer); ``ppo_layernorm`` the plain agent with a layer norm before every
#: ReLU and no projection (``nap=True, nap_project="none"``: NaP without its projection); Adam beta1 = beta2 = 0.99 is
#: ``ppo_adam_equal_betas`` above. They act within a task: their fresh agents run them.
FIELD_METHODS = ("ppo_cchain", "ppo_trac", "ppo_parseval", "ppo_crelu", "ppo_fourier", "ppo_layernorm")
METHODS = METHODS + FIELD_METHODS

#: Issue #29's mechanism controls besides the head resets, on request. ``ppo_vecnorm``: the plain agent on SB3's
#: running observation normalisation (:func:`normalise_observations`); it acts on every step, so its fresh agent runs
#: it too, with statistics of its own from the fresh agent's first observation. ``ppo_fire_switch_hidden``: FIRE at every
#: task change on the hidden layers only (``FIRE(layers="hidden")``, the output heads untouched: does the polar factor
#: of the representation alone restore learning, where FIRE on every layer also rewrites the saturated head?); a
#: task-change method, its fresh agent is the plain one.
MECHANISM_CONTROLS = ("ppo_vecnorm", "ppo_fire_switch_hidden")
METHODS = METHODS + MECHANISM_CONTROLS
TASK_CHANGE_METHODS = (*TASK_CHANGE_METHODS, "ppo_fire_switch_hidden")

#: Dohare et al.'s regularised PPO agents of Slippery Ant (issue #28, ``slippery_ant_dohare``; their
#: ``lop/rl/cfg/sant/*.yml``), on request. Like ``ppo_cbp_dohare`` each trains with Adam beta1 = beta2 = 0.99, the
#: change their ``ns.yml`` isolates (``ppo_adam_equal_betas`` here): ``ppo_l2_dohare`` L2 :data:`DOHARE_L2` (Adam
#: ``weight_decay``, their ``l2.yml``); ``ppo_snp_continual`` continual Shrink & Perturb
#: (:class:`~sb3_plastic.callbacks.ShrinkPerturb` ``mode="continual"`` at the library defaults: L2 1e-4 in the
#: gradient, N(0, 1e-5^2) noise after every step; they publish no Slippery Ant S&P configuration). Both act on every
#: step: their fresh agents run them.
DOHARE_METHODS = ("ppo_l2_dohare", "ppo_snp_continual")
METHODS = METHODS + DOHARE_METHODS

#: Issue #29 part 2's check of the Gym-control anchor, on request: ``ppo_cchain_vanilla`` the plain agent trained on
#: the targets of C-CHAIN's vanilla PPO (:func:`cchain_vanilla.their_targets`: advantages normalised once per rollout,
#: lambda = 1 value targets), the two differences between our plain agent and theirs that SB3's PPO can be given. It
#: acts on every update: its fresh agents run it.
ANCHOR_CHECKS = ("ppo_cchain_vanilla",)
METHODS = METHODS + ANCHOR_CHECKS
#: methods that exist for PPO settings only (not offered on a DQN / SAC setting)
PPO_ONLY_METHODS = ANCHOR_CHECKS


def method_name(method: str, algo: str) -> str:
    """The name of ``method`` (a :data:`METHODS` entry) on a setting of ``algo``: ``ppo_l2`` -> ``dqn_l2``."""
    return algo + method[3:] if method.startswith("ppo") else method


def methods_of(algo: str) -> list[str]:
    """The method names of a setting of ``algo`` (:data:`METHODS` on its algorithm, :data:`PPO_ONLY_METHODS` for PPO
    only)."""
    return [method_name(m, algo) for m in METHODS if algo == "ppo" or m not in PPO_ONLY_METHODS]


def canonical_method(name: str) -> str:
    """The :data:`METHODS` entry of a method name of any algorithm (``dqn_l2`` -> ``ppo_l2``)."""
    for algo in ALGOS:
        if name == algo or name.startswith(algo + "_"):
            return "ppo" + name[len(algo):]
    return name


ALL_METHOD_NAMES = tuple(dict.fromkeys(method_name(m, a) for a in ALGOS for m in METHODS))


@dataclass(frozen=True)
class MethodParams:
    """Hyperparameters of the methods (flags of the script), fixed before the grid.

    :param l2: Adam ``weight_decay`` of ``ppo_l2``.
    :param shrink: ``lambda`` of Shrink & Perturb (event form).
    :param perturb: ``p`` of Shrink & Perturb.
    :param cbp_rate: Continual Backprop replacement rate per optimizer step of ``ppo_cbp`` (library default).
    :param cbp_maturity: Continual Backprop maturity threshold (optimizer steps) of ``ppo_cbp`` (library default,
        Dohare's RL value).
    :param isometry_coef: ``lambda`` of the isometry penalty (AdamO) of the plastic methods, in the authors' convention
        ``1/2 ||Gram - s I||_F^2`` (issue #27): 0.2, the same penalty as the 0.1 of the runs made before it.
    :param l2_init_coef: ``lambda`` of ``ppo_l2_init``.
    :param spectral_coef: ``lambda`` of ``ppo_spectral``.
    :param fire_head_scale: ``head_scale`` of the FIRE methods (``"init"``, the library default, or ``"reference"``).
    :param fire_iterations: ``iterations`` of the FIRE methods: 0 for the library default (the exact polar factor),
        ``k`` for ``k`` Newton–Schulz steps (10: the reference implementation).
    :param isometry_interval: ``isometry_interval`` of the plastic methods: an int ``k`` or ``"auto"``
        (``"1"``: the exact per-update AdamO step, the library default).
    :param parseval_coef: ``lambda`` of ``ppo_parseval`` (Plasticine's 1e-3).
    """

    l2: float = 1e-3
    shrink: float = 0.4
    perturb: float = 0.1
    cbp_rate: float = 1e-4
    cbp_maturity: int = 10_000
    isometry_coef: float = 0.2
    l2_init_coef: float = 1e-3
    spectral_coef: float = 1e-3
    fire_head_scale: str = "init"
    fire_iterations: int = 0
    isometry_interval: str = "1"
    parseval_coef: float = 1e-3


#: Adam's betas of ``ppo_adam_equal_betas`` (Dohare et al., 2023, *Overcoming policy collapse in deep RL*: beta1 = beta2
#: keeps Adam's update bounded after a change of the gradient's scale; the library's ``optimizer="adam_equal_betas"``)
EQUAL_BETAS = (0.99, 0.99)
#: Continual Backprop at Dohare's RL settings (``ppo_cbp_dohare``; his Slippery Ant PPO runs)
DOHARE_CBP = dict(replacement_rate=1e-4, maturity_threshold=10_000, betas=(0.99, 0.99), weight_decay=1e-4)
#: Adam ``weight_decay`` of ``ppo_l2_dohare`` (Dohare et al.'s ``cfg/sant/l2.yml``, with betas :data:`EQUAL_BETAS`)
DOHARE_L2 = 1e-3


# ------------------------------------------------------------------------------------------- one run
def _task_recorder(setting: Setting, results: dict[str, list[float]], progress_path: Optional[str] = None) -> Any:
    """A callback accumulating, per task of env copy 0's ``info["task_id"]``, the mean reward per env step
    over the task and over its last ``tail`` part, and the mean return of the episodes ending in that tail;
    writes ``continual/...`` keys to SB3's logger at each task end.

    A task's reading covers its first ``change_every`` env steps (``info["task_step"]`` 1 to ``change_every``) and
    nothing after: SB3 stops ``learn`` at the first rollout boundary at or after ``total_timesteps``, so a fresh
    agent (its env pinned to one task) runs a few steps past the task's length when ``change_every`` is not a
    multiple of ``n_steps``. The continual run's steps there belong to the next task; read by the fresh agent, an
    episode ending in them would make the fresh reading of the same training differ from the continual one.

    With ``setting.rollout_reset`` it also records ``iteration_return`` per task: TRAC / C-CHAIN's per-iteration score
    (their ``itr_mean_return``), the mean over the rollouts that end in the task's tail of each rollout's mean episode
    return, where the episodes are those ending in the rollout plus the one its end cuts (with the partial return it
    reached; the next rollout starts new episodes).

    The head's statistics (:func:`head_statistics`) are read twice per task: over the last :data:`HEAD_PROBE_STEPS`
    steps of its tail (``head_*``) and as the task finds the network, ``switch_head_*``: the mean over the task's
    first :data:`HEAD_PROBE_STEPS` steps, each step's observations read with the network of that step (a PPO task
    that starts at a rollout's start is read before any update on it). Task 0's reading is the initial network's; a
    later task's tells a head saturated by the switch (the old head on the new observations) from one that
    saturates while it trains."""
    from stable_baselines3.common.callbacks import BaseCallback

    tail_start = round((1.0 - setting.tail) * setting.change_every)

    class TaskRecorder(BaseCallback):
        def _on_training_start(self) -> None:
            self._task: Optional[int] = None
            self._sums = np.zeros(2)
            self._counts = np.zeros(2)
            self._returns: list[float] = []
            self._recent: list[np.ndarray] = []  # the last HEAD_PROBE_STEPS steps' observations of the task's tail
            self._switch: dict[str, list[float]] = {}  # head statistics of the task's first HEAD_PROBE_STEPS steps
            self._rollout_returns: list[float] = []  # returns of the episodes ended in the rollout in progress
            self._iteration_means: list[float] = []  # the task's rollouts' mean returns (rollout_reset)
            self._task_step = 0

        def _on_rollout_start(self) -> None:
            self._rollout_returns = []

        def _on_rollout_end(self) -> None:
            if not setting.rollout_reset or self._task_step <= tail_start or self._task_step > setting.change_every:
                return
            # the episode in progress is cut here (the next rollout resets the envs): its partial return counts
            partial = [float(np.sum(r)) for r in self.training_env.get_attr("rewards") if len(r)]
            returns = self._rollout_returns + partial
            if returns:
                self._iteration_means.append(float(np.mean(returns)))

        def _close_task(self) -> None:
            if self._task is None or self._counts[0] == 0 or self._task >= setting.tasks:
                return  # (the last rollout may run a few steps into a task past the schedule)
            mean = float(self._sums[0] / self._counts[0])
            end = float(self._sums[1] / self._counts[1]) if self._counts[1] else float("nan")
            end_return = float(np.mean(self._returns)) if self._returns else float("nan")
            results["task"].append(self._task)
            results["mean_reward"].append(mean)
            results["end_reward"].append(end)
            results["end_return"].append(end_return)
            results["end_episodes"].append(len(self._returns))
            if setting.rollout_reset:
                means = self._iteration_means
                results.setdefault("iteration_return", []).append(float(np.mean(means)) if means else float("nan"))
            for key, value in head_statistics(self.model, self._recent).items():
                results.setdefault(key, []).append(value)
            for key, values in self._switch.items():
                _append_per_task(results, "switch_" + key, float(np.mean(values)))
            self.logger.record("continual/end_of_task_reward", end)
            self.logger.record("continual/end_of_task_return", end_return)
            self.logger.record("continual/task_mean_reward", mean)
            self.logger.record("continual/task", self._task)
            if progress_path:  # what an interrupted run had reached (never read as a finished run)
                with open(progress_path, "w") as f:
                    json.dump(results, f)

        def _on_step(self) -> bool:
            infos = self.locals["infos"]
            task = int(infos[0].get("task_id", 0))
            if task != self._task:
                self._close_task()
                self._task, self._sums[:], self._counts[:], self._returns = task, 0.0, 0.0, []
                self._recent, self._iteration_means, self._switch = [], [], {}
            task_step = self._task_step = int(infos[0].get("task_step", 0))
            if task_step > setting.change_every:
                return True  # past the task's length: a fresh agent's last rollout (see above)
            obs = self.locals.get("new_obs")
            if HEAD_PROBE_STEPS and task_step <= HEAD_PROBE_STEPS and isinstance(obs, np.ndarray):
                # the head as the task finds it: each of its first steps read with the network of that step
                for key, value in head_statistics(self.model, [obs]).items():
                    self._switch.setdefault(key, []).append(value)
            self._rollout_returns.extend(float(i["episode"]["r"]) for i in infos if "episode" in i)
            rewards = np.asarray(self.locals["rewards"], dtype=np.float64)
            self._sums[0] += rewards.sum()
            self._counts[0] += rewards.size
            if task_step > tail_start:
                self._sums[1] += rewards.sum()
                self._counts[1] += rewards.size
                self._returns.extend(float(i["episode"]["r"]) for i in infos if "episode" in i)
                if HEAD_PROBE_STEPS and isinstance(obs, np.ndarray):
                    self._recent.append(obs.copy())
                    del self._recent[:-HEAD_PROBE_STEPS]
            return True

        def _on_training_end(self) -> None:
            self._close_task()

    return TaskRecorder()


#: env steps (of every copy) whose observations probe the output head at a task's end and at its start
#: (:func:`head_statistics`; 0: no probe)
HEAD_PROBE_STEPS = 32


def _append_per_task(results: dict[str, list[float]], key: str, value: float) -> None:
    """Append the reading of the task just closed (the last entry of ``results["task"]``) to ``results[key]``,
    first padding with NaN the tasks that have none (a run resumed from a checkpoint written before the key
    existed, or a task resumed past its start), so that the list stays aligned with ``results["task"]``."""
    values = results.setdefault(key, [])
    values.extend([float("nan")] * (len(results["task"]) - 1 - len(values)))
    values.append(value)


def head_statistics(model: Any, observations: list[np.ndarray]) -> dict[str, float]:
    """What the output head does on ``observations`` (the last observations of a task's tail, or its first ones),
    so a collapse can be read per task: for a policy with a categorical distribution (PPO), ``head_entropy`` (mean entropy of
    pi(.|s)), ``head_max_prob`` (mean probability of the most likely action) and ``head_logit_std`` (mean over
    states of the standard deviation of the logits across actions: the logit scale); for a Q-network (DQN),
    ``head_q_std`` (the same spread of Q(s, .)) and ``head_q_max`` (mean max_a Q(s, a)); for a diagonal Gaussian
    policy (PPO on MuJoCo), ``head_action_std`` (mean over states and action dimensions of the policy's standard
    deviation) and ``head_mean_abs`` (the same of |mean action|: a mean driven far outside the action bounds is the
    Gaussian head's saturation, the clipped action no longer moving with it). Forward passes only, in the policy's
    current mode, no random numbers drawn (training is unchanged). ``{}`` without observations or for other heads
    (SAC's squashed actor)."""
    import torch as th

    if not observations:
        return {}
    policy = model.policy
    obs = np.concatenate(observations)
    with th.no_grad():
        tensor = policy.obs_to_tensor(obs)[0]
        if hasattr(policy, "q_net"):
            q = policy.q_net(tensor).double()
            return {"head_q_std": float(q.std(dim=1).mean()), "head_q_max": float(q.max(dim=1).values.mean())}
        if not hasattr(policy, "get_distribution"):
            return {}
        dist = policy.get_distribution(tensor).distribution
        if isinstance(dist, th.distributions.Normal):
            return {"head_action_std": float(dist.stddev.double().mean()),
                    "head_mean_abs": float(dist.mean.double().abs().mean())}
        logits = getattr(dist, "logits", None)
        if logits is None:
            return {}
        logits = logits.double()
        probs = th.softmax(logits, dim=1)
        entropy = -(probs * th.log_softmax(logits, dim=1)).sum(dim=1)
        return {"head_entropy": float(entropy.mean()), "head_max_prob": float(probs.max(dim=1).values.mean()),
                "head_logit_std": float(logits.std(dim=1).mean())}


def _rollout_reset() -> Any:
    """The callback of a setting with ``rollout_reset``: every env copy is reset at each rollout start, so a rollout
    starts new episodes as TRAC's and C-CHAIN's PPO iterations do (their ``env.reset()`` at every iteration; the
    episode an iteration's end cuts is bootstrapped with the value of its last observation, as SB3's PPO does at a
    rollout's end). Put it first after the checkpointer."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutReset(BaseCallback):
        def _on_rollout_start(self) -> None:
            self.model._last_obs = self.training_env.reset()
            self.model._last_episode_starts = np.ones((self.training_env.num_envs,), dtype=bool)

        def _on_step(self) -> bool:
            return True

    return RolloutReset()


def _recording_monitor(every: int) -> Any:
    """A :class:`~sb3_plastic.callbacks.PlasticityMonitor` that also keeps every pass's network-level diagnostics
    (``plasticity/<network>/<metric>``, no per-layer keys) in ``history``: ``{key: [[num_timesteps, value], ...]}``,
    so that the per-run JSON carries them and the diagnostics figure rebuilds without the TensorBoard files."""
    from sb3_plastic import PlasticityMonitor

    class RecordingMonitor(PlasticityMonitor):
        def run(self) -> dict[str, float]:
            values = super().run()
            for key, value in values.items():
                parts = key.split("/")
                if len(parts) == 3 and parts[2] in DIAGNOSTICS and np.isfinite(value):
                    self.history.setdefault(key, []).append([int(self.num_timesteps), float(value)])
            return values

    monitor = RecordingMonitor(every=every, max_overhead=None)
    monitor.history = {}
    return monitor


#: the network-level diagnostics kept in the per-run JSON and plotted (the isometry paper's claim is about the NTK)
DIAGNOSTICS = ("dormant_fraction", "ntk_cond", "ntk_erank", "dfi", "dfi_hidden", "weight_norm")
#: SB3's own training scalars copied from a run's TensorBoard events into its JSON (:func:`add_train_scalars`), per
#: task over the task's tail: PPO's policy entropy (``-train/entropy_loss``) tells a policy that collapsed to one
#: action (entropy 0) from one that still explores
TRAIN_SCALARS = ("train/entropy_loss",)


def write_record(path: str, record: dict) -> None:
    """Write a run's JSON atomically (a temporary file, then a rename): a JSON that exists is a finished run."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def train_scalars_per_task(events_dir: str, setting: Setting, tasks: int) -> dict[str, list[Optional[float]]]:
    """Per tag of :data:`TRAIN_SCALARS` found in the TensorBoard events of ``events_dir`` (tensorboard's
    ``EventAccumulator``): the mean of the values logged in the tail of each of the first ``tasks`` tasks (the last
    ``setting.tail`` part of ``[k, k + 1) * task_timesteps`` in timesteps); ``None`` for a task without a value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    events.Reload()
    length = setting.task_timesteps
    out: dict[str, list[Optional[float]]] = {}
    for tag in TRAIN_SCALARS:
        if tag not in events.Tags()["scalars"]:
            continue
        steps = np.array([e.step for e in events.Scalars(tag)], dtype=float)
        values = np.array([e.value for e in events.Scalars(tag)], dtype=float)
        per_task: list[Optional[float]] = []
        for k in range(tasks):
            start, end = (k + 1.0 - setting.tail) * length, (k + 1.0) * length
            chosen = values[(steps > start) & (steps <= end)]
            per_task.append(float(chosen.mean()) if chosen.size else None)
        out[tag] = per_task
    return out


def _events_dir(out: str, record: dict) -> Path:
    """The TensorBoard events folder of a run JSON under ``out/tb`` (a copied fresh agent's: its source's)."""
    method, seed, fresh_task = record.get("reused_from", record["method"]), record["seed"], record.get("fresh_task")
    if fresh_task is None:
        return Path(out, "tb", method, f"s{seed}_1")
    return Path(out, "tb", method, "fresh", f"s{seed}_task{fresh_task}_1")


def _run_jsons(out: str) -> list[Path]:
    return sorted(Path(out, "runs").glob("*/seed*.json")) + sorted(Path(out, "runs").glob("*/fresh/*.json"))


def hidden_dfi_from_events(events_dir: str, network: str = "policy") -> tuple[dict[int, float], dict[int, float]]:
    """``({step: dfi_hidden}, {step: dfi})`` from a run's TensorBoard events: ``dfi_hidden`` rebuilt from the
    per-layer keys, the sum of ``plasticity/<network>/<layer>/dfi`` over every layer but the heads, at each step
    where every such layer has a value; ``dfi`` the network-level key as logged, which identifies the run. A head is
    a weight layer (it has ``<layer>/sigma_max``, which LSTM matrices do not) without a ``<layer>/dormant_fraction``
    (the monitor scores the units of every non-head layer). The diagnostics' own ``dfi_hidden`` key is the same sum
    (:func:`sb3_plastic.diagnostics.network_diagnostics`); this rebuilds it for runs made before that key existed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    prefix = f"plasticity/{network}/"

    def layers_with(metric: str) -> set[str]:
        return {t[len(prefix):-len(metric) - 1] for t in tags
                if t.startswith(prefix) and t.endswith("/" + metric) and t.count("/") == 3}

    heads = layers_with("sigma_max") - layers_with("dormant_fraction")
    per_layer = [{e.step: e.value for e in events.Scalars(f"{prefix}{layer}/dfi")}
                 for layer in sorted(layers_with("dfi") - heads)]
    total_tag = f"{prefix}dfi"
    totals = {int(e.step): float(e.value) for e in events.Scalars(total_tag)} if total_tag in tags else {}
    if not per_layer:
        return {}, totals
    steps = set.intersection(*(set(d) for d in per_layer))
    return {int(step): float(sum(d[step] for d in per_layer)) for step in sorted(steps)}, totals


def add_hidden_dfi(out: str) -> int:
    """Add ``plasticity/<network>/dfi_hidden`` to the diagnostics of the run JSONs made before the key existed,
    from their TensorBoard events (:func:`hidden_dfi_from_events`), at the steps of the JSON's own history. The
    events must be the JSON's own run: their network-level ``dfi`` must equal, step for step, the one the JSON
    recorded (to float32 precision, as TensorBoard stores it); a JSON whose events are missing or belong to another
    run (an interrupted attempt's folder) is left as it is and named in a warning. Returns the JSONs updated."""
    updated, missing = 0, []
    for record_path in _run_jsons(out):
        with open(record_path) as f:
            record = json.load(f)
        diagnostics = record.get("diagnostics") or {}
        networks = {k.split("/")[1] for k in diagnostics if k.endswith("/dfi")}
        todo = [n for n in sorted(networks) if f"plasticity/{n}/dfi_hidden" not in diagnostics]
        if not todo:
            continue
        folder = _events_dir(out, record)
        if not folder.is_dir():
            missing.append(str(record_path))
            continue
        for network in todo:
            rebuilt, logged = hidden_dfi_from_events(str(folder), network)
            total = diagnostics[f"plasticity/{network}/dfi"]
            series = [[step, rebuilt[int(step)]] for step, _ in total if int(step) in rebuilt]
            same_run = all(int(step) in logged and math.isclose(logged[int(step)], value, rel_tol=1e-5, abs_tol=1e-6)
                           for step, value in total)
            if len(series) != len(total) or not same_run:
                missing.append(str(record_path))
                break
            diagnostics[f"plasticity/{network}/dfi_hidden"] = series
        else:
            write_record(str(record_path), record)
            updated += 1
    if missing:
        print(f"warning: {len(missing)} run JSONs carry no dfi_hidden and have no matching TensorBoard events under "
              f"{os.path.join(out, 'tb')} to rebuild it from (e.g. {missing[0]}): their hidden-layer DfI is left out",
              flush=True)
    return updated


def add_train_scalars(out: str, setting: Setting) -> int:
    """Copy :data:`TRAIN_SCALARS` from the TensorBoard events under ``out/tb`` (not committed) into the run JSONs
    (committed) that lack them: ``record["train_scalars"] = {tag: [per task]}`` (a fresh agent's list has its one
    task). Returns the number of JSONs updated; a run without its events folder is left as it is, and a warning
    names how many those are."""
    updated, missing = 0, []
    for record_path in _run_jsons(out):
        with open(record_path) as f:
            record = json.load(f)
        if "train_scalars" in record:
            continue
        folder = _events_dir(out, record)
        if not folder.is_dir():
            missing.append(str(record_path))
            continue
        tasks = setting.tasks if record.get("fresh_task") is None else 1
        record["train_scalars"] = train_scalars_per_task(str(folder), setting, tasks)
        write_record(str(record_path), record)
        updated += 1
    if missing:
        print(f"warning: {len(missing)} run JSONs carry no {', '.join(TRAIN_SCALARS)} and have no TensorBoard events "
              f"under {os.path.join(out, 'tb')} to copy them from (e.g. {missing[0]}): their policy entropy is left out "
              "of the tables", flush=True)
    return updated


def _plain_cnn_kwargs(setting: Setting) -> dict[str, Any]:
    """``policy_kwargs`` that give SB3's plain algorithm the library's CNN (:class:`~sb3_plastic.networks.PlasticCNN`
    with ReLU, ``arch="auto"``: the MinAtar CNN on 10x10 frames), the network the plastic methods build; SB3's
    NatureCNN rejects MinAtar's boolean frames and is too large for them."""
    if setting.policy != "CnnPolicy":
        return {}
    from sb3_plastic.networks import PlasticCNN

    return dict(features_extractor_class=PlasticCNN, features_extractor_kwargs=dict(activation="relu", arch="auto"))


def scaled_reward(reward: float, scale: float) -> float:
    """``reward / scale``: what the agent of a setting with ``reward_scale`` trains on (TRAC / C-CHAIN's
    ``reward / reward_scale``)."""
    return reward / scale


def make_env(setting: Setting, seed: int, fresh_task: Optional[int] = None, env_seed: Optional[int] = None) -> Any:
    """The vector env of run seed ``seed``: ``task_seed = seed`` (independent task sequences per seed); with
    ``fresh_task`` every copy is pinned to that task of the sequence (``pin_task``) for a fresh-agent reference;
    ``env_seed`` seeds the env copies (default ``seed``; an evaluation env's differs, its task sequence does not)."""
    from stable_baselines3.common.env_util import make_vec_env

    import sb3_plastic.envs  # noqa: F401  (registers the ids)

    scaled = {}
    if setting.reward_scale != 1:  # outside the Monitor: episode returns stay in the env's units
        from gymnasium.wrappers import TransformReward

        scaled = dict(wrapper_class=TransformReward,
                      wrapper_kwargs=dict(func=functools.partial(scaled_reward, scale=setting.reward_scale)))
    env = make_vec_env(
        setting.env_id,
        n_envs=setting.n_envs,
        seed=seed if env_seed is None else env_seed,
        env_kwargs=dict(change_every=setting.change_every, task_seed=seed, **setting.env_kwargs),
        **scaled,
    )
    if fresh_task is not None:
        env.env_method("pin_task", int(fresh_task))
    return env


def normalise_observations(env: Any, training: bool = True) -> Any:
    """``env`` wrapped in SB3's :class:`~stable_baselines3.common.vec_env.VecNormalize` with ``norm_obs=True`` and
    ``norm_reward=False`` (SB3's defaults otherwise: ``clip_obs=10``, ``epsilon=1e-8``): the observation method
    ``ppo_vecnorm`` of issue #29.

    Every observation is standardised by the running mean and variance of all observations seen so far (updated
    first, then applied), per dimension. On a setting whose tasks add a fixed offset to the observation an offset is
    exactly what a normaliser removes, so the arm tells an input-shift problem from a loss of plasticity of the
    network. Rewards are left alone (``norm_reward=False``): the control changes one thing, the observation, and the
    score (episode returns from SB3's ``Monitor``, under VecNormalize) and the value targets stay on the plain agent's
    scale; a reward normaliser would also rescale PPO's value loss and advantages, a second change that the
    comparison with plain PPO could not separate from the first.

    SB3's statistics are cumulative (:class:`~stable_baselines3.common.running_mean_std.RunningMeanStd`: a running
    mean over every step since the start, no forgetting), kept across task switches: one wrapper serves the whole
    continual run, so after task ``k`` its mean is the step-weighted mean of the offsets of tasks ``0..k`` and its
    variance includes their spread. It removes the average offset, not the current one: a new offset is removed
    only as far as the task's own steps move the running mean (less each task). A fresh agent gets a wrapper of its
    own (statistics from its first observation). A checkpoint (:mod:`run_checkpoint`) keeps the statistics with
    the env (:func:`run_checkpoint.dumps_env`).

    :param env: the vector env of :func:`make_env`.
    :param training: update the statistics (``False`` for an evaluation env, whose statistics SB3's ``EvalCallback``
        copies from the training env before every evaluation).
    """
    from stable_baselines3.common.vec_env import VecNormalize

    return VecNormalize(env, training=training, norm_obs=True, norm_reward=False)


def build_model(method: str, setting: Setting, params: MethodParams, seed: int, device: str, tb_dir: Optional[str],
                fresh_task: Optional[int] = None) -> Any:
    """The agent of ``method`` and the callbacks it trains with (besides the monitor and the recorder).

    :param method: a :data:`METHODS` name, or its name on the setting's algorithm (``dqn_l2``).
    :param fresh_task: build the fresh-agent reference of that task (pinned env; no task-change / midpoint
        interventions, which cannot trigger within one task).
    """
    import sb3_plastic
    from sb3_plastic import FIRE, ContinualBackprop, L2Init, ReDo, ShrinkPerturb, SpectralRegularisation

    if setting.algo not in ALGOS:
        raise ValueError(f"unknown algo {setting.algo!r} of the setting; allowed: {', '.join(ALGOS)}")
    allowed = methods_of(setting.algo)
    if method not in allowed and (method not in METHODS or method in PPO_ONLY_METHODS):
        raise ValueError(f"unknown method {method!r} for a {setting.algo} setting; allowed: {', '.join(allowed)}")
    canonical = canonical_method(method)
    sb3_name, plastic_name = ALGOS[setting.algo]
    import stable_baselines3

    sb3_cls = getattr(stable_baselines3, sb3_name)
    plastic_cls = getattr(sb3_plastic, plastic_name)
    env = make_env(setting, seed, fresh_task)
    if canonical == "ppo_vecnorm":
        env = normalise_observations(env)
    common = dict(setting.ppo, seed=seed, device=device, tensorboard_log=tb_dir, verbose=0)
    if setting.exploration_steps:
        steps = setting.task_timesteps if fresh_task is not None else setting.total_timesteps
        common["exploration_fraction"] = setting.exploration_steps / steps
    if "double_q" in common and not canonical.startswith("plastic_") and canonical != "ppo_nap":
        # SB3's DQN has no Double DQN target: the plain methods run PlasticDQN with plasticity off, which is SB3's
        # DQN exactly (tests/test_sb3_parity.py) plus the double_q target
        sb3_cls = functools.partial(plastic_cls, isometry_mode="off", optimizer="adam")
    net_arch = list(setting.net_arch)
    callbacks: list[Any] = []
    shared = {k: v for k, v in setting.policy_kwargs.items() if k != "optimizer_kwargs"}
    shared_optimizer = dict(setting.policy_kwargs.get("optimizer_kwargs") or {})
    # the plastic algorithms on the plain agent's network: its activation (a class through policy_kwargs where it has
    # no name of the library's), the setting's shared policy keywords
    net_kwargs = dict(net_arch=net_arch, **shared, **(dict(optimizer_kwargs=shared_optimizer) if shared_optimizer else {}))
    plain_net: dict[str, Any] = dict(activation="relu", policy_kwargs=net_kwargs)
    if setting.activation != "relu":
        plain_net = dict(activation=None, policy_kwargs=dict(net_kwargs, activation_fn=PLAIN_ACTIVATIONS[setting.activation]))
    if canonical.startswith("plastic_"):
        activation = canonical.removeprefix("plastic_").split("_")[0]
        model = plastic_cls(
            setting.policy,
            env,
            activation=activation,
            **ISOMETRY_VARIANTS.get(canonical, {}),
            isometry_coef=params.isometry_coef,
            isometry_interval="auto" if params.isometry_interval == "auto" else int(params.isometry_interval),
            policy_kwargs=net_kwargs,
            **common,
        )
        return model, callbacks
    if canonical in ("ppo_trac", "ppo_layernorm", "ppo_nap"):
        field: dict[str, Any] = dict(isometry_mode="off", optimizer="trac" if canonical == "ppo_trac" else "adam")
        if canonical == "ppo_layernorm":
            field.update(nap=True, nap_project="none")
        elif canonical == "ppo_nap":
            field.update(nap=True)
        return plastic_cls(setting.policy, env, **plain_net, **field, **common), callbacks
    if canonical in ("ppo_crelu", "ppo_fourier"):
        activation = {"ppo_crelu": "crelu", "ppo_fourier": "fourier"}[canonical]
        field = dict(activation=activation, isometry_mode="off", optimizer="adam")
        return plastic_cls(setting.policy, env, policy_kwargs=net_kwargs, **field, **common), callbacks
    policy_kwargs: dict[str, Any] = dict(net_arch=net_arch, activation_fn=PLAIN_ACTIVATIONS[setting.activation],
                                         **_plain_cnn_kwargs(setting), **shared)
    optimizer_kwargs = {**(dict(eps=1e-5) if setting.algo == "ppo" else {}), **shared_optimizer}  # SB3's defaults
    if shared_optimizer:
        policy_kwargs["optimizer_kwargs"] = optimizer_kwargs
    if canonical == "ppo_l2":
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, weight_decay=params.l2)
    elif canonical == "ppo_cbp_dohare":
        adam = {k: DOHARE_CBP[k] for k in ("betas", "weight_decay")}
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, **adam)
    elif canonical in ("ppo_adam_equal_betas", "ppo_snp_continual"):
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, betas=EQUAL_BETAS)
    elif canonical == "ppo_l2_dohare":
        policy_kwargs["optimizer_kwargs"] = dict(optimizer_kwargs, betas=EQUAL_BETAS, weight_decay=DOHARE_L2)
    model = sb3_cls(setting.policy, env, policy_kwargs=policy_kwargs, **common)
    if fresh_task is not None and canonical in TASK_CHANGE_METHODS:
        return model, callbacks
    if canonical == "ppo_snp":
        callbacks.append(ShrinkPerturb("event", shrink=params.shrink, perturb=params.perturb, on_task_change=True))
    elif canonical == "ppo_l2_init":
        callbacks.append(L2Init(params.l2_init_coef))
    elif canonical == "ppo_spectral":
        callbacks.append(SpectralRegularisation(params.spectral_coef))
    elif canonical == "ppo_cbp":
        callbacks.append(ContinualBackprop(replacement_rate=params.cbp_rate, maturity_threshold=params.cbp_maturity))
    elif canonical == "ppo_cbp_dohare":
        cbp = {k: DOHARE_CBP[k] for k in ("replacement_rate", "maturity_threshold")}
        callbacks.append(ContinualBackprop(**cbp))
    elif canonical == "ppo_snp_continual":
        callbacks.append(ShrinkPerturb("continual"))
    elif canonical == "ppo_redo":
        callbacks.append(ReDo())
    elif canonical in ("ppo_fire", "ppo_fire_switch", "ppo_fire_switch_hidden"):
        fire: dict[str, Any] = dict(head_scale=params.fire_head_scale, iterations=params.fire_iterations or None)
        if canonical == "ppo_fire_switch_hidden":  # FIRE's own layer selection; a head scale has nothing to act on
            fire = dict(layers="hidden", iterations=fire["iterations"])
        trigger = dict(at=0.5) if canonical == "ppo_fire" else dict(at=None, on_task_change=True)
        callbacks.append(FIRE(**trigger, **fire))
    elif canonical == "ppo_parseval":
        from sb3_plastic import ParsevalRegularisation

        callbacks.append(ParsevalRegularisation(params.parseval_coef))
    elif canonical == "ppo_cchain":
        from sb3_plastic import ChurnReduction

        callbacks.append(ChurnReduction())
    elif canonical == "ppo_injection":
        from sb3_plastic import PlasticityInjection

        callbacks.append(PlasticityInjection(layers=2, at=None, on_task_change=True))
    elif canonical in HEAD_RESET_METHODS:
        from sb3_plastic import LayerReset

        callbacks.append(LayerReset(HEAD_RESET_METHODS[canonical], on_task_change=True))
    elif canonical == "ppo_cchain_vanilla":
        import cchain_vanilla

        callbacks.append(cchain_vanilla.their_targets())
    return model, callbacks


def run_path(out: str, method: str, seed: int, fresh_task: Optional[int] = None) -> str:
    """Where the JSON of a run is: ``runs/<method>/seed<k>.json``, fresh agents under ``runs/<method>/fresh/``."""
    if fresh_task is None:
        return os.path.join(out, "runs", method, f"seed{seed}.json")
    return os.path.join(out, "runs", method, "fresh", f"seed{seed}_task{fresh_task}.json")


#: fresh agents per seed with ``--fresh sample`` (tasks of the run's last half, :func:`fresh_sample`)
FRESH_SAMPLE = 4
#: the ``--fresh`` choices: every task, a sample of the last half, none
FRESH_CHOICES = ("all", "sample", "none")


def fresh_sample(setting: Setting, seed: int, size: int = FRESH_SAMPLE) -> list[int]:
    """The tasks whose fresh agents ``--fresh sample`` trains for run seed ``seed``: ``size`` distinct tasks of the
    last half (``tasks // 2`` to ``tasks - 1``), drawn without replacement by a generator seeded with ``seed`` alone
    (so every method of a seed is compared on the same tasks), sorted; the whole last half when it is smaller.

    For a setting whose tasks are alike in distribution (channel permutations of one game) the fresh agents on a
    sample of the late tasks estimate the same fresh level as agents on every task, for a fraction of the CPU
    (issue #28); the summary's plasticity is then the ratio of aggregates over the sampled cells
    (:func:`ratio_of_means_ci`)."""
    late = list(range(setting.tasks // 2, setting.tasks))
    if size >= len(late):
        return late
    rng = np.random.default_rng([seed, 28])
    return sorted(int(k) for k in rng.choice(late, size=size, replace=False))


def run_parts(setting: Setting, fresh: str, seed: Optional[int] = None) -> list[Optional[int]]:
    """The runs of one (method, seed) cell: ``None`` (the continual run) and the fresh agents: of every task
    (``fresh="all"``), of :func:`fresh_sample`'s tasks of ``seed`` (``"sample"``) or none (``"none"``)."""
    if fresh not in FRESH_CHOICES:
        raise ValueError(f"fresh must be one of {', '.join(map(repr, FRESH_CHOICES))}, got {fresh!r}")
    if fresh == "sample":
        if seed is None:
            raise ValueError("fresh='sample' needs the run's seed (the sample depends on it)")
        return [None, *fresh_sample(setting, seed)]
    return [None] + (list(range(setting.tasks)) if fresh == "all" else [])


#: Setting fields added by issue #29 (the cchain settings) and after; summary.json leaves them out where they are at
#: their defaults, so the tables of the settings before them rebuild byte for byte
LATE_FIELDS = ("activation", "policy_kwargs", "reward_scale", "rollout_reset", "floor_below")
#: Setting fields that change how runs are summarised, not how they run: :func:`same_setting` ignores them
REPORT_FIELDS = ("floor_below",)


def setting_config(setting: Setting) -> dict[str, Any]:
    """``asdict(setting)`` without the :data:`LATE_FIELDS` that are at their defaults (summary.json's record)."""
    config = asdict(setting)
    default = Setting(env_id="", change_every=1, tasks=1, n_envs=1, policy="", net_arch=(), ppo={}, monitor_every=1)
    for name in LATE_FIELDS:
        if config[name] == getattr(default, name):
            del config[name]
    return config


def same_setting(recorded: dict[str, Any], setting: Setting) -> bool:
    """Whether a run JSON's ``setting`` is ``setting``; a field the JSON lacks (written before the field existed)
    counts as that field's default, and the :data:`REPORT_FIELDS` (how runs are summarised) are not compared."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(Setting)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    current = json.loads(json.dumps(asdict(setting)))
    run = {**json.loads(json.dumps(defaults)), **recorded}
    return {k: v for k, v in run.items() if k not in REPORT_FIELDS} == {
        k: v for k, v in current.items() if k not in REPORT_FIELDS}


def _reuse_plain_fresh(method: str, seed: int, setting: Setting, out: str, fresh_task: Optional[int]) -> Optional[dict]:
    """The fresh agent of a :data:`TASK_CHANGE_METHODS` method is the plain agent (its intervention cannot trigger
    within one task; :func:`build_model` builds the same model with the same seed), so an existing plain fresh run of
    the same seed, task and setting is copied instead of trained again (``reused_from`` names it); else ``None``."""
    if fresh_task is None or canonical_method(method) not in TASK_CHANGE_METHODS:
        return None
    plain = method_name("ppo", setting.algo)
    source = run_path(out, plain, seed, fresh_task)
    if not os.path.exists(source):
        return None
    with open(source) as f:
        record = json.load(f)
    if not same_setting(record["setting"], setting):
        return None
    record.update(method=method, reused_from=plain)
    path = run_path(out, method, seed, fresh_task)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_record(path, record)
    return record


class RunClaimedError(RuntimeError):
    """Another live process on this machine is training the same run (its claim file names it)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def claim_run(path: str, take_over: bool = False) -> str:
    """Claim the run whose JSON is ``path`` for this process: ``<path>.claim`` made with ``O_EXCL`` holds
    ``host pid``. Two processes training one run would share (and the later one delete) its TensorBoard folder and
    race on its JSON, so a claim held by a live process on this host raises :class:`RunClaimedError`; a claim left
    by a dead process (an interrupted attempt) is taken over; one from another host is respected (remove it by hand
    when that host is gone) unless ``take_over`` (bench/grid.py's retry of a trial whose worker optuna's heartbeat
    declared dead). Returns the claim's path (remove it when the run is written)."""
    import socket

    claim = path + ".claim"
    me = f"{socket.gethostname()} {os.getpid()}"
    os.makedirs(os.path.dirname(claim) or ".", exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(claim) as f:
                    host, pid = f.read().split()
            except (OSError, ValueError):  # being written this instant, or unreadable: treat as held
                raise RunClaimedError(f"{path} is claimed ({claim} exists)") from None
            if not take_over and (host != socket.gethostname() or _pid_alive(int(pid))):
                raise RunClaimedError(f"{path} is being trained by pid {pid} on {host} ({claim})") from None
            os.remove(claim)  # a dead process's claim (or one handed over)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        return claim
    raise RunClaimedError(f"{path}: could not claim {claim}")


def run_one(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str, threads: int,
            fresh_task: Optional[int] = None, take_over: bool = False) -> dict:
    """Train one run (the continual run, or with ``fresh_task`` the fresh agent of that task) and write its JSON
    (:func:`run_path`); returns its record. The run is claimed first (:func:`claim_run`): a run that another live
    process is training raises :class:`RunClaimedError` and nothing of it is touched."""
    reused = _reuse_plain_fresh(method, seed, setting, out, fresh_task)
    if reused is not None:
        return reused
    path = run_path(out, method, seed, fresh_task)
    claim = claim_run(path, take_over)
    try:
        if os.path.exists(path):  # finished by the previous claimant between our check and our claim
            with open(path) as f:
                return json.load(f)
        return _train_run(method, seed, setting, params, out, device, threads, fresh_task)
    finally:
        os.remove(claim)


#: the task recorder's internals a checkpoint keeps (the rest of its state is the ``results`` dict)
_RECORDER_FIELDS = ("_task", "_sums", "_counts", "_returns", "_recent", "_iteration_means", "_task_step",
                    "_switch")


#: what a checkpoint keeps of the evaluation callback besides its env (SB3's EvalCallback counts calls for its
#: schedule; ContinualEvalCallback's per-evaluation lists)
_EVALUATOR_FIELDS = ("n_calls", "evaluation_num_timesteps", "evaluation_task_ids", "evaluation_mean_rewards",
                     "evaluations_timesteps", "evaluations_results", "evaluations_length", "best_mean_reward",
                     "last_mean_reward")


def _evaluator(setting: Setting, seed: int, fresh_task: Optional[int], method: str = "ppo") -> Any:
    """The greedy evaluations of a setting with ``eval_every`` (else ``None``): a
    :class:`~sb3_plastic.callbacks.ContinualEvalCallback` on a second env of the run's task sequence (env seed
    ``1234 * seed``, C-CHAIN's), ``eval_episodes`` deterministic episodes every ``eval_every`` timesteps. For
    ``ppo_vecnorm`` the evaluation env is normalised too, with the training env's statistics (SB3's ``EvalCallback``
    copies them before each evaluation; they are not updated by the evaluation)."""
    if not setting.eval_every:
        return None
    from sb3_plastic.callbacks import ContinualEvalCallback

    env = make_env(setting, seed, fresh_task, env_seed=1234 * seed + 1)
    if canonical_method(method) == "ppo_vecnorm":
        env = normalise_observations(env, training=False)
    return ContinualEvalCallback(env, eval_freq=max(setting.eval_every // setting.n_envs, 1),
                                 n_eval_episodes=setting.eval_episodes, deterministic=True, verbose=0)


def _with_evaluator_state(extra: Any, evaluator: Any) -> Any:
    def with_state() -> dict[str, Any]:
        state = {k: getattr(evaluator, k) for k in _EVALUATOR_FIELDS}
        return dict(extra(), evaluator=state, evaluator_env=run_checkpoint.dumps_env(evaluator.eval_env))

    return with_state


def _with_evaluator_restore(restore: Any, evaluator: Any, saved: dict[str, Any]) -> Any:
    def with_restore() -> None:
        restore()
        for key, value in saved["evaluator"].items():
            setattr(evaluator, key, value)
        evaluator.eval_env.close()
        evaluator.eval_env = run_checkpoint.loads_env(saved["evaluator_env"])

    return with_restore


def checkpoint_root(out: str, method: str, seed: int, fresh_task: Optional[int] = None) -> str:
    """Where the checkpoints of a run in progress are (``ckpt/<method>/s<k>[_task<j>]``; not committed, removed
    when the run is written)."""
    return os.path.join(out, "ckpt", method, f"s{seed}" if fresh_task is None else f"s{seed}_task{fresh_task}")


def _train_run(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str, threads: int,
               fresh_task: Optional[int]) -> dict:
    """Train one run; resume it from its latest checkpoint (:mod:`run_checkpoint`) when an interrupted attempt
    left one, else start it afresh (an interrupted attempt's TensorBoard folder removed first)."""
    import torch as th

    th.set_num_threads(threads)
    tb_root = os.path.join(out, "tb", method) if fresh_task is None else os.path.join(out, "tb", method, "fresh")
    name = f"s{seed}" if fresh_task is None else f"s{seed}_task{fresh_task}"
    ckpt_root = checkpoint_root(out, method, seed, fresh_task)
    resume = run_checkpoint.latest(ckpt_root)
    if resume is None:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        for stale in (d for d in (os.listdir(tb_root) if os.path.isdir(tb_root) else []) if d.startswith(f"{name}_")):
            shutil.rmtree(os.path.join(tb_root, stale))  # an interrupted attempt
    start = time.time()
    cpu_start = time.process_time()
    model, callbacks = build_model(method, setting, params, seed, device, tb_root, fresh_task=fresh_task)
    saved: dict[str, Any] = {}
    if resume is not None:
        built = model
        model, saved = run_checkpoint.load(resume, type(built), device, tb_root)
        built.get_env().close()
    results: dict[str, list[float]] = saved.get("results") or {
        "task": [], "mean_reward": [], "end_reward": [], "end_return": [], "end_episodes": []}
    monitor = _recording_monitor(setting.monitor_every)
    monitor.history = saved.get("monitor_history", monitor.history)
    path = run_path(out, method, seed, fresh_task)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    recorder = _task_recorder(setting, results, path.replace(".json", ".progress"))
    resumes = [*saved.get("resumes", []), int(model.num_timesteps)] if resume else []
    before_cpu, before_wall = saved.get("cpu_seconds", 0.0), saved.get("wall_seconds", 0.0)

    def extra() -> dict[str, Any]:
        return {"results": results, "recorder": {k: getattr(recorder, k) for k in _RECORDER_FIELDS},
                "monitor_history": monitor.history, "monitor_probe": monitor._probe, "resumes": resumes,
                "cpu_seconds": before_cpu + time.process_time() - cpu_start,
                "wall_seconds": before_wall + time.time() - start}

    def restore() -> None:
        run_checkpoint.restore_rng(saved, model)
        for key, value in saved["recorder"].items():
            setattr(recorder, key, value)
        monitor._probe = saved["monitor_probe"]

    evaluator = _evaluator(setting, seed, fresh_task, method)
    if evaluator is not None:
        extra = _with_evaluator_state(extra, evaluator)
        restore = _with_evaluator_restore(restore, evaluator, saved)
    checkpointer = run_checkpoint.checkpointer(ckpt_root, CHECKPOINT_SECONDS, extra, restore if resume else None)
    steps = setting.total_timesteps if fresh_task is None else setting.task_timesteps
    evaluating = [] if evaluator is None else [evaluator]
    resetting = [_rollout_reset()] if setting.rollout_reset else []
    model.learn(steps - model.num_timesteps if resume else steps,
                callback=[checkpointer, *resetting, *callbacks, monitor, recorder, *evaluating],
                tb_log_name=name, reset_num_timesteps=resume is None)
    record = {
        "method": method,
        "seed": seed,
        "task_seed": seed,
        "fresh_task": fresh_task,
        "setting": asdict(setting),
        "params": asdict(params),
        "device": str(model.device),
        "timesteps": int(model.num_timesteps),
        "wall_seconds": before_wall + time.time() - start,
        "cpu_seconds": before_cpu + time.process_time() - cpu_start,
        **results,
        "diagnostics": monitor.history,
    }
    if evaluator is not None:
        record["evaluations"] = [[int(t), int(k), float(r)] for t, k, r in zip(
            evaluator.evaluation_num_timesteps, evaluator.evaluation_task_ids, evaluator.evaluation_mean_rewards)]
    if resumes:
        record["resumed_at"] = resumes  # num_timesteps of each resume from a checkpoint (an interrupted session)
    write_record(path, record)
    progress = path.replace(".json", ".progress")
    if os.path.exists(progress):
        os.remove(progress)
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return record


def run_cell(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str = "cpu",
             threads: int = 1, fresh: str = "all", take_over: bool = False) -> dict:
    """Every run of one (method, seed) cell that has no JSON yet (the continual run, then the fresh agents), one
    after the other; returns the continual record (bench/grid.py's unit of work). ``take_over``: see
    :func:`claim_run`."""
    for part in run_parts(setting, fresh, seed):
        if not os.path.exists(run_path(out, method, seed, part)):
            run_one(method, seed, setting, params, out, device, threads, part, take_over)
    with open(run_path(out, method, seed)) as f:
        return json.load(f)


def _run_job(job: tuple) -> tuple[str, int, Optional[int], float, Optional[str]]:
    method, seed, fresh_task, setting, params, out, device, threads = job
    start = time.time()
    try:
        run_one(method, seed, setting, params, out, device, threads, fresh_task)
        return method, seed, fresh_task, time.time() - start, None
    except Exception as exc:  # reported, the grid goes on
        return method, seed, fresh_task, time.time() - start, f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------- the grid
class NoRunsError(RuntimeError):
    """No finished run under ``--out``: nothing to build a table from (and nothing is written)."""


class SettingMismatchError(ValueError):
    """Runs under ``--out`` made with another setting than the command's (:func:`check_records_setting`)."""


def load_records(out: str) -> list[dict]:
    """Every finished run under ``out/runs`` (continual and fresh; a fresh record has ``fresh_task`` set)."""
    records = []
    root = os.path.join(out, "runs")
    for method in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for folder in (os.path.join(root, method), os.path.join(root, method, "fresh")):
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                if name.endswith(".json"):
                    with open(os.path.join(folder, name)) as f:
                        records.append(json.load(f))
    return records


def _score(record: dict, setting: Setting) -> list[float]:
    # records written before the end_return field (the bandit's runs) score by reward per env step
    return record.get(setting.score, record["end_reward"])


def _entropy_last_half(runs: list[dict], records: list[dict], method: str, n: int) -> dict[str, float]:
    """PPO's policy entropy (``-train/entropy_loss``, :data:`TRAIN_SCALARS`) averaged over runs x last-half tasks of
    the continual runs and over the matching fresh agents, where the run JSONs carry it; else ``{}``."""
    tag = "train/entropy_loss"

    def mean(lists: list[list[Optional[float]]]) -> Optional[float]:
        values = [-v for values in lists for v in values if v is not None]
        return float(np.mean(values)) if values else None

    cont = [r["train_scalars"][tag][n // 2: n] for r in runs if tag in r.get("train_scalars", {})]
    seeds = {r["seed"] for r in runs}
    fresh = [r["train_scalars"][tag] for r in records if r["method"] == method and r.get("fresh_task") is not None
             and n // 2 <= r["fresh_task"] < n and r["seed"] in seeds and tag in r.get("train_scalars", {})]
    out = {}
    if cont and mean(cont) is not None:
        out["entropy_last_half"] = mean(cont)
    if fresh and mean(fresh) is not None:
        out["fresh_entropy_last_half"] = mean(fresh)
    return out


#: the diagnostics of the summary table (:func:`diagnostics_last_half`); the condition number as its log10
TABLE_DIAGNOSTICS = ("dormant_fraction", "ntk_erank", "ntk_cond", "dfi", "dfi_hidden")


def _network(records: list[dict]) -> str:
    """The network whose diagnostics are summarised and plotted: ``policy`` where the runs have it, else the first."""
    keys = [k for r in records for k in (r.get("diagnostics") or {})]
    if not keys:
        return "policy"
    return "policy" if any(k.startswith("plasticity/policy/") for k in keys) else keys[0].split("/")[1]


def diagnostics_last_half(runs: list[dict], records: list[dict], method: str, n: int,
                          setting: Setting) -> dict[str, dict[str, float]]:
    """Per metric of :data:`TABLE_DIAGNOSTICS` (``ntk_cond`` as ``log10``): the continual runs' mean over the
    passes in the last half of the tasks (steps after ``n // 2`` tasks), then the mean, min and max over seeds; and
    ``fresh``: the fresh agents' last pass on their task, averaged over the last-half tasks and seeds. Metrics no
    run recorded are left out."""
    network = _network(runs)
    start = (n // 2) * setting.task_timesteps
    fresh_runs = [r for r in records if r["method"] == method and r.get("fresh_task") is not None
                  and n // 2 <= r["fresh_task"] < n and r["seed"] in {x["seed"] for x in runs}]
    out: dict[str, dict[str, float]] = {}
    for metric in TABLE_DIAGNOSTICS:
        key = f"plasticity/{network}/{metric}"
        transform = np.log10 if metric == "ntk_cond" else (lambda x: x)
        per_seed = []
        for r in runs:
            values = [v for step, v in (r.get("diagnostics") or {}).get(key, []) if step > start]
            if values:
                per_seed.append(float(np.mean(transform(np.asarray(values, dtype=float)))))
        if not per_seed:
            continue
        entry = {"mean": float(np.mean(per_seed)), "min": float(np.min(per_seed)), "max": float(np.max(per_seed)),
                 "seeds": len(per_seed)}
        ends = [float(transform(float(r["diagnostics"][key][-1][1]))) for r in fresh_runs
                if (r.get("diagnostics") or {}).get(key)]
        if ends:
            entry["fresh"] = float(np.mean(ends))
        out["log10_ntk_cond" if metric == "ntk_cond" else metric] = entry
    return out


def _ci_text(v: Optional[dict], digits: int = 3) -> str:
    if not v:
        return "-"
    part = f" ({v['runs']} of {v['of']} runs)" if "runs" in v else ""
    return f"{v['iqm']:.{digits}g} [{v['low']:.{digits}g}, {v['high']:.{digits}g}]{part}"


def _ratio_text(v: Optional[dict]) -> str:
    if not v:
        return "-"
    return f"{v['ratio']:.3g} [{v['low']:.3g}, {v['high']:.3g}]" + ("" if v.get("complete", True) else " (sample)")


def _iqm_entry(matrix: np.ndarray) -> Optional[dict]:
    if matrix.size == 0 or not np.all(np.isfinite(matrix)):
        return None
    point, low, high = iqm_ci({"x": matrix}, reps=REPS)["x"]
    return {"iqm": point, "low": low, "high": high}


def _iqm_of_complete_runs(matrix: np.ndarray) -> Optional[dict]:
    """The IQM entry over the runs (rows) with every cell finite, with ``runs`` and ``of`` (how many runs of how
    many): the fresh level of a ``--fresh all`` grid in progress. ``None`` when no run is complete."""
    rows = np.isfinite(matrix).all(axis=1)
    entry = _iqm_entry(matrix[rows]) if rows.any() else None
    return entry and {**entry, "runs": int(rows.sum()), "of": len(matrix)}


#: fewest runs per method for a verdict: a bootstrap over one or two runs gives an interval that says nothing
MIN_VERDICT_SEEDS = 3


def _too_few(seeds: int) -> str:
    """The verdict text when ``seeds`` runs are too few for one (else ``""``)."""
    return f"too few seeds ({seeds} < {MIN_VERDICT_SEEDS})" if seeds < MIN_VERDICT_SEEDS else ""


def compare(a: Optional[dict], b: Optional[dict], lower: str, higher: str) -> str:
    """``lower`` when the CI of ``a`` lies wholly below that of ``b``, ``higher`` when above, else "not resolved"."""
    if not a or not b:
        return "-"
    if a["high"] < b["low"]:
        return lower
    if a["low"] > b["high"]:
        return higher
    return "not resolved"


def evaluation_summary(runs: list[dict], tasks: int) -> dict[str, Any]:
    """The greedy evaluations of the continual runs (settings with ``eval_every``): per run the mean return over all
    its evaluations (C-CHAIN's Table 4 statistic as read from their code: the evaluation curve averaged over the
    whole run), then its mean and standard error over runs (``mean``, ``se``, ``per_seed``); and per task the mean
    over runs of each run's mean over the evaluations of that task (``per_task``). Empty without evaluations."""
    with_evals = [r for r in runs if r.get("evaluations")]
    if not with_evals:
        return {}
    per_seed = [float(np.mean([e[2] for e in r["evaluations"]])) for r in with_evals]
    per_task = []
    for k in range(tasks):
        means = [float(np.mean(v)) for r in with_evals if (v := [e[2] for e in r["evaluations"] if e[1] == k])]
        per_task.append(float(np.mean(means)) if means else None)
    se = float(np.std(per_seed, ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else float("nan")
    return {"mean": float(np.mean(per_seed)), "se": se, "per_seed": per_seed, "per_task": per_task,
            "seeds": len(per_seed)}


def _mean_se(values: np.ndarray) -> dict[str, Any]:
    se = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"mean": float(np.mean(values)), "se": se, "per_seed": [float(v) for v in values], "seeds": len(values)}


def run_average_summary(ends: np.ndarray, fresh: np.ndarray, floor_below: Optional[float] = None) -> dict[str, Any]:
    """TRAC / C-CHAIN's Table 1 statistic for a setting scored by ``iteration_return`` (runs x tasks in ``ends``,
    the fresh agents' scores or NaN in ``fresh``): ``run_average``, per run the mean over all its tasks (every task has
    the same number of iterations: the mean over all the run's iterations, their "average performance"), then the
    mean and standard error over runs; ``fresh_run_average``, the same over each run's fresh agents (a new network and
    optimizer at every task: their "Oracle"), over the tasks that have one (``fresh_tasks`` of them, all tasks with
    ``--fresh all``; a sample of the late tasks with ``--fresh sample``). With a ``floor_below``, ``later_at_floor``
    counts the cells of every task after the first (the tasks the statistic averages over besides task 0) that sit
    at the floor: a run's average moves by whole cells that leave it (C-CHAIN's vanilla CartPole: ~3 of 54)."""
    out: dict[str, Any] = {"run_average": _mean_se(ends.mean(axis=1))}
    if floor_below is not None:
        out["later_at_floor"] = _at_floor(ends[:, 1:], floor_below)
    seen = np.isfinite(fresh)
    rows = seen.any(axis=1)
    if rows.any():
        per_run = np.array([fresh[i, seen[i]].mean() for i in np.flatnonzero(rows)])
        out["fresh_run_average"] = dict(_mean_se(per_run), fresh_tasks=int(seen[rows].sum(axis=1).min()),
                                        complete=bool(seen.all()))
    return out


def _paired_fresh_last_half(cont: np.ndarray, fresh: np.ndarray) -> dict[str, Any]:
    """The paired statistics over the last-half cells (runs x tasks) that have a fresh agent (all of them, or
    :func:`fresh_sample`'s): ``plasticity_ratio_last_half``, the ratio of aggregates sum(continual) / sum(fresh) with a
    paired bootstrap over runs (:func:`rl_stats.ratio_of_means_ci`; ``low`` / ``high`` are its 95 % CI), and
    ``minus_fresh_last_half``, the mean of continual - fresh over those cells with the same bootstrap; with a sample
    of equal size per run also the IQMs of both over the sampled cells (``iqm_fresh_last_half``,
    ``iqm_sampled_last_half``). Empty when no last-half cell has a fresh agent."""
    cells = np.isfinite(fresh) & np.isfinite(cont)
    if not cells.any():
        return {}
    out: dict[str, Any] = {}
    count = int(cells.sum())
    if np.nansum(np.where(cells, fresh, np.nan)) > 0:
        point, low, high = ratio_of_means_ci(np.where(cells, cont, np.nan), np.where(cells, fresh, np.nan),
                                             n_boot=REPS)
        out["plasticity_ratio_last_half"] = {"ratio": point, "low": low, "high": high, "cells": count,
                                             "complete": bool(cells.all())}
    diff = np.where(cells, cont - fresh, 0.0)
    per_run, counts = diff.sum(axis=1), cells.sum(axis=1)
    rows = np.random.default_rng(0).integers(0, len(diff), size=(REPS, len(diff)))
    boot = per_run[rows].sum(axis=1) / np.maximum(counts[rows].sum(axis=1), 1)
    out["minus_fresh_last_half"] = {"mean": float(per_run.sum() / count), "low": float(np.quantile(boot, 0.025)),
                                    "high": float(np.quantile(boot, 0.975)), "cells": count}
    per = cells.sum(axis=1)
    if not cells.all() and per.min() == per.max() > 0:
        out["iqm_fresh_last_half"] = _iqm_entry(fresh[cells].reshape(len(fresh), -1))
        out["iqm_sampled_last_half"] = _iqm_entry(cont[cells].reshape(len(cont), -1))
    return out


def fresh_sample_cells(cont: np.ndarray, fresh: np.ndarray, seeds: list[int],
                       setting: Setting) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The fresh scores (runs x tasks) the paired estimator reads when a grid mixes ``--fresh sample`` and ``--fresh
    all`` (issue #28: every seed on its sample of the late tasks, one seed also on every task to check the sample):
    when some run has fresh agents on exactly its :func:`fresh_sample` (a part of the last half), a run with more
    enters with its own sample only (every seed weighs alike), and when it has every late task its other fresh agents
    go into the check: the fresh level over its sample against the level over every late task (mean, standard
    deviation over the tasks) and the ratio of means over both. Otherwise (every run on every task, or a ``--fresh
    all`` grid still in progress) the scores come back unchanged and there is no check."""
    n = fresh.shape[1]
    late = list(range(n // 2, n))
    if n != setting.tasks:
        return fresh, []
    samples = [fresh_sample(setting, seed) for seed in seeds]
    present = [[k for k in late if np.isfinite(fresh[i, k])] for i in range(len(fresh))]
    # the sample design is in use when some run holds exactly its sample, a part of the last half (a --fresh all grid
    # still in progress does not: its runs enter with every fresh agent they have)
    if not any(p == sample and len(sample) < len(late) for p, sample in zip(present, samples)):
        return fresh, []
    out, checks = fresh.copy(), []
    for i, sample in enumerate(samples):
        counts = len(present[i])
        if counts <= len(sample) or not set(sample) <= set(present[i]):
            continue  # a run on its sample (or short of it) enters as it is
        out[i, [k for k in late if k not in sample]] = np.nan
        if counts < len(late):  # the check waits for every late fresh agent of the run
            continue
        checks.append({"seed": seeds[i], "sample": sample, "late_tasks": late,
                       "fresh_sample_mean": float(fresh[i, sample].mean()),
                       "fresh_late_mean": float(fresh[i, late].mean()),
                       "fresh_late_sd": float(fresh[i, late].std(ddof=1)),
                       "fresh_late": fresh[i, late].tolist(),
                       "ratio_sample": float(cont[i, sample].sum() / fresh[i, sample].sum()),
                       "ratio_late": float(cont[i, late].sum() / fresh[i, late].sum())})
    return out, checks


def _ratio_per_task(cont: np.ndarray, fresh: np.ndarray) -> Optional[dict[str, list[Optional[float]]]]:
    """Plasticity per task as the ratio of means over the seeds with a fresh agent on that task, sum(continual) /
    sum(fresh), with its paired bootstrap 95 % CI over seeds (:func:`ratio_of_means_ci`; NaN with one seed):
    ``{"ratio": [...], "low": [...], "high": [...]}`` over tasks, ``None`` for a task without fresh agents or whose
    fresh scores do not sum to a positive number; ``None`` when no task has one."""
    out: dict[str, list[Optional[float]]] = {"ratio": [], "low": [], "high": []}
    for k in range(cont.shape[1]):
        cells = np.isfinite(cont[:, k]) & np.isfinite(fresh[:, k])
        if cells.any() and fresh[cells, k].sum() > 0:
            values = ratio_of_means_ci(cont[cells][:, [k]], fresh[cells][:, [k]], n_boot=REPS)
        else:
            values = (None, None, None)
        for key, value in zip(("ratio", "low", "high"), values):
            out[key].append(value)
    return out if any(v is not None for v in out["ratio"]) else None


def summarise(records: list[dict], methods: list[str], setting: Setting) -> dict[str, Any]:
    """Per method: per-task continual and fresh scores (mean and 95 % bootstrap CI over seeds), plasticity per task
    (continual / fresh of the same method), and over the last half of the tasks the IQM with a stratified bootstrap
    95 % CI of the continual score, the fresh score and plasticity, the probability of improvement over the plain
    baseline, and verdicts ("not resolved" where the intervals overlap)."""
    iqm, poi, metrics_source = rliable_metrics()
    plain = method_name("ppo", setting.algo)
    summary: dict[str, Any] = {}
    for method in methods:
        runs = sorted((r for r in records if r["method"] == method and r.get("fresh_task") is None),
                      key=lambda r: r["seed"])
        if not runs:
            continue
        n = min(len(r["end_reward"]) for r in runs)
        ends = np.array([_score(r, setting)[:n] for r in runs], dtype=float)  # seeds x tasks
        fresh_by = {(r["seed"], r["fresh_task"]): _score(r, setting)[0]
                    for r in records if r["method"] == method and r.get("fresh_task") is not None and r["task"]}
        fresh = np.array([[fresh_by.get((r["seed"], k), np.nan) for k in range(n)] for r in runs], dtype=float)
        half = slice(n // 2, n)
        first, last_half = ends[:, 0], ends[:, half].mean(axis=1)
        bands = [bootstrap_mean_ci(ends[:, k], n_boot=REPS) for k in range(n)]
        iqm_bands = [iqm_ci({"x": ends[:, [k]]}, reps=REPS)["x"] for k in range(n)]  # per task, over seeds
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in runs],
            "tasks": n,
            "score": setting.score,
            "end_reward_mean": ends.mean(axis=0).tolist(),
            "end_reward_min": ends.min(axis=0).tolist(),
            "end_reward_max": ends.max(axis=0).tolist(),
            "score_ci_low": [b[0] for b in bands],
            "score_ci_high": [b[1] for b in bands],
            "score_iqm": [b[0] for b in iqm_bands],
            "score_iqm_ci_low": [b[1] for b in iqm_bands],
            "score_iqm_ci_high": [b[2] for b in iqm_bands],
            "task0": float(first.mean()),
            "last_half": float(last_half.mean()),
            "last_half_per_seed": last_half.tolist(),
            "retained": float(last_half.mean() / first.mean()) if first.mean() > 0 else float("nan"),
            "iqm_last_half": _iqm_entry(ends[:, half]),
            "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in runs])),
            "cpu_seconds_mean": float(np.mean([r["cpu_seconds"] for r in runs])),
            "device": runs[0]["device"],
        }
        if setting.floor_below is not None:
            entry["at_floor_last_half"] = _at_floor(ends[:, half], setting.floor_below)
        evaluations = evaluation_summary(runs, n)
        if evaluations:
            entry["evaluations"] = evaluations
        if setting.score == "iteration_return":
            entry.update(run_average_summary(ends, fresh, setting.floor_below))
        entropy = _entropy_last_half(runs, records, method, n)
        if entropy:
            entry.update(entropy)
        diagnostics = diagnostics_last_half(runs, records, method, n, setting)
        if diagnostics:
            entry["diagnostics_last_half"] = diagnostics
            entry["diagnostics_network"] = _network(runs)
        seen = np.isfinite(fresh)
        if seen.any():
            entry["fresh_mean"] = [float(np.nanmean(fresh[:, k])) if seen[:, k].any() else None for k in range(n)]
            entry["fresh_iqm"] = [float(iqm(fresh[seen[:, k], k][:, None])) if seen[:, k].any() else None
                                  for k in range(n)]
            per_task = _ratio_per_task(ends, fresh)
            if per_task:
                entry["plasticity_ratio_per_task"] = per_task
            entry["fresh_complete"] = bool(seen.all())
            entry["iqm_fresh_last_half"] = _iqm_entry(fresh[:, half]) or _iqm_of_complete_runs(fresh[:, half])
            if seen.all() and np.all(fresh > 0):
                ratio = ends / fresh
                entry["plasticity_mean"] = ratio.mean(axis=0).tolist()
                ratio_bands = [bootstrap_mean_ci(ratio[:, k], n_boot=REPS) for k in range(n)]
                entry["plasticity_ci_low"] = [b[0] for b in ratio_bands]
                entry["plasticity_ci_high"] = [b[1] for b in ratio_bands]
                entry["iqm_plasticity_last_half"] = _iqm_entry(ratio[:, half])
            else:  # a ratio needs positive fresh scores (rewards can be negative): the difference is reported
                entry["plasticity_mean"] = None
            entry["iqm_minus_fresh_last_half"] = _iqm_entry(ends[:, half] - fresh[:, half]) if seen.all() else None
            paired, checks = fresh_sample_cells(ends, fresh, entry["seeds"], setting)
            if checks:
                entry["fresh_sample_check"] = checks
            entry.update(_paired_fresh_last_half(ends[:, half], paired[:, half]))
            if setting.floor_below is not None:
                entry["fresh_at_floor_last_half"] = _at_floor(fresh[:, half], setting.floor_below)
            if seen.all():
                entry["vs_fresh"] = _too_few(len(runs)) or compare(
                    entry["iqm_last_half"], entry["iqm_fresh_last_half"], "below fresh (plasticity lost)", "above fresh")
            else:  # a sample of fresh agents (--fresh sample): the paired ratio of means decides
                ratio = entry.get("plasticity_ratio_last_half")
                one = {"low": 1.0, "high": 1.0}
                entry["vs_fresh"] = _too_few(len(runs)) or (compare(
                    ratio, one, "below fresh (plasticity lost)", "above fresh") if ratio else "-")
        summary[method] = entry
    if plain in summary:
        base = summary[plain]
        base_ends = np.array([_score(r, setting)[: base["tasks"]] for r in records
                              if r["method"] == plain and r.get("fresh_task") is None], dtype=float)
        for method, entry in summary.items():
            entry["vs_plain"] = "-" if method == plain else _too_few(min(len(entry["seeds"]), len(base["seeds"]))) or compare(
                entry["iqm_last_half"], base["iqm_last_half"], f"below {plain}", f"above {plain}")
            if method == plain:
                continue
            ends = np.array([_score(r, setting)[: entry["tasks"]] for r in records
                             if r["method"] == method and r.get("fresh_task") is None], dtype=float)
            n = min(ends.shape[1], base_ends.shape[1])
            half = slice(n // 2, n)
            point, low, high = stratified_bootstrap(poi, ends[:, half], base_ends[:, half], reps=REPS)
            entry["poi_vs_plain"] = {"iqm": point, "low": low, "high": high}  # (the point is P, not an IQM)
    return {"metrics": metrics_source, "plain": plain, "methods": summary}


def _at_floor(cells: np.ndarray, floor_below: float) -> dict[str, int]:
    """How many of the scored ``cells`` (NaN: no run) are below the setting's ``floor_below``."""
    scored = cells[np.isfinite(cells)]
    return {"cells": int((scored < floor_below).sum()), "of": int(scored.size)}


def markdown_table(result: dict[str, Any], setting_name: str, setting: Setting) -> str:
    summary = result["methods"]
    score = SCORE_LABELS[setting.score]
    lines = [
        f"setting={setting_name}: {setting.description}. Score: {score} over the last {setting.tail:.0%} of each task. "
        f"Last half of the tasks: IQM over runs x tasks [stratified bootstrap 95 % CI] ({result['metrics']}); "
        "plasticity = IQM of continual / fresh agent of the same method on the same task, per cell; ratio of means = "
        "sum(continual) / sum(fresh) over the last-half cells with a fresh agent [paired bootstrap over runs] "
        f"('sample': fresh agents on a sample of the late tasks); P(> {result['plain']}): "
        "probability of improvement over the plain baseline [95 % CI]; 'not resolved': the intervals overlap.",
        "",
        "| method | seeds | fresh agent | continual | plasticity | plasticity, ratio of means | continual vs fresh "
        "| P(> plain) | vs plain | CPU min / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with_entropy = any("entropy_last_half" in s for s in summary.values())
    if with_entropy:
        lines[2] = lines[2].replace(" CPU min / run |", " policy entropy: continual / fresh | CPU min / run |")
        lines[3] += "---|"
    with_floor = setting.floor_below is not None and any("at_floor_last_half" in s for s in summary.values())
    if with_floor:
        lines[0] += (f" At the floor: the last-half cells scoring below {setting.floor_below:g} (a collapsed policy's "
                     "score; the IQM drops the lowest quarter of the cells), continual / fresh agents.")
        lines[2] = lines[2].replace(" | continual | ", " | continual | at the floor: continual / fresh | ")
        lines[3] += "---|"
    for method, s in summary.items():
        poi = s.get("poi_vs_plain")
        entropy = ""
        if with_entropy:
            cells = [s.get("entropy_last_half"), s.get("fresh_entropy_last_half")]
            entropy = " / ".join("-" if c is None else f"{c:.3f}" for c in cells) + " | "
        floor = ""
        if with_floor:
            counts = [s.get("at_floor_last_half"), s.get("fresh_at_floor_last_half")]
            floor = " / ".join("-" if c is None else f"{c['cells']} of {c['of']}" for c in counts) + " | "
        lines.append(
            f"| {method} | {len(s['seeds'])} | {_ci_text(s.get('iqm_fresh_last_half'))} | {_ci_text(s['iqm_last_half'])} "
            f"| {floor}{_ci_text(s.get('iqm_plasticity_last_half'))} | {_ratio_text(s.get('plasticity_ratio_last_half'))} "
            f"| {s.get('vs_fresh', '-')} "
            f"| {_ci_text(poi, 2)} | {s.get('vs_plain', '-')} | {entropy}{s['cpu_seconds_mean'] / 60:.1f} |"
        )
    n_tasks = max(s["tasks"] for s in summary.values())
    shown = sorted({0, 1, n_tasks // 2, n_tasks - 1} & set(range(n_tasks)))
    lines += ["", "Per task (mean over seeds): continual score / plasticity (continual / fresh)", "",
              "| method | " + " | ".join(f"task {k}" for k in shown) + " |", "|---|" + "---|" * len(shown)]
    for method, s in summary.items():
        ratio = s.get("plasticity_mean")
        cells = [f"{s['end_reward_mean'][k]:.3g}" + (f" / {ratio[k]:.2f}" if ratio else "") if k < s["tasks"] else "-"
                 for k in shown]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    checked = {m: s["fresh_sample_check"] for m, s in summary.items() if s.get("fresh_sample_check")}
    if checked:
        lines += ["", "Fresh-sample check (runs with a fresh agent on every late task; the ratio of means above uses "
                  "their sample only): the fresh level over the run's sample against every late task (mean, SD over "
                  "the tasks), and the ratio of means over both", "",
                  "| method | seed | sample | fresh, sample | fresh, every late task | ratio of means, sample / every "
                  "late task |", "|---|---|---|---|---|---|"]
        for method, runs in checked.items():
            for c in runs:
                lines.append(f"| {method} | {c['seed']} | {' '.join(map(str, c['sample']))} | "
                             f"{c['fresh_sample_mean']:.3g} | {c['fresh_late_mean']:.3g} ± {c['fresh_late_sd']:.2g} | "
                             f"{c['ratio_sample']:.3g} / {c['ratio_late']:.3g} |")
    evaluated = {m: s["evaluations"] for m, s in summary.items() if s.get("evaluations")}
    if evaluated:
        lines += ["", f"Greedy evaluations ({setting.eval_episodes} episodes every {setting.eval_every} timesteps, the "
                  "task just trained): mean over all evaluations of a run, mean ± standard error over runs; per task: "
                  "mean over runs", "", "| method | runs | whole run | " + " | ".join(
                      f"task {k}" for k in range(n_tasks)) + " |", "|---|---|---|" + "---|" * n_tasks]
        for method, e in evaluated.items():
            cells = ["-" if v is None else f"{v:.3g}" for v in e["per_task"]]
            lines.append(f"| {method} | {e['seeds']} | {e['mean']:.3g} ± {e['se']:.2g} | " + " | ".join(cells) + " |")
    averaged = {m: s for m, s in summary.items() if s.get("run_average")}
    if averaged:
        lines += ["", "TRAC / C-CHAIN's statistic (their Table 1): per run the mean over all its PPO iterations of the "
                  "iteration's mean episode return, mean ± standard error over runs; fresh agents (their 'Oracle': a new "
                  "network and optimizer at every task): the same over the tasks with a fresh agent", "",
                  "| method | runs | continual, whole run | fresh agents (tasks) |", "|---|---|---|---|"]
        floors = any("later_at_floor" in s for s in averaged.values())
        if floors:
            lines[-4] += (f"; later tasks at the floor: the cells of tasks 1-{n_tasks - 1} scoring below "
                          f"{setting.floor_below:g}")
            lines[-2] = lines[-2].replace(" fresh agents (tasks) |", " fresh agents (tasks) | later tasks at the floor |")
            lines[-1] += "---|"
        for method, s in averaged.items():
            a, f = s["run_average"], s.get("fresh_run_average")
            fresh_text = "-" if not f else (f"{f['mean']:.4g} ± {f['se']:.2g} ({'all' if f['complete'] else f['fresh_tasks']}"
                                            f"{'' if f['complete'] else ' per run'})")
            floor = ""
            if floors:
                c = s.get("later_at_floor")
                floor = " " + ("-" if c is None else f"{c['cells']} of {c['of']}") + " |"
            lines.append(f"| {method} | {a['seeds']} | {a['mean']:.4g} ± {a['se']:.2g} | {fresh_text} |{floor}")
    diagnosed = {m: s["diagnostics_last_half"] for m, s in summary.items() if s.get("diagnostics_last_half")}
    if diagnosed:
        names = {"dormant_fraction": "dormant fraction", "ntk_erank": "NTK effective rank",
                 "log10_ntk_cond": "log10 NTK cond", "dfi": "DfI, all layers", "dfi_hidden": "DfI, hidden layers"}
        shown_metrics = [m for m in names if any(m in d for d in diagnosed.values())]
        network = next(s.get("diagnostics_network", "policy") for s in summary.values() if s.get("diagnostics_last_half"))
        lines += ["", f"{network} network diagnostics (PlasticityMonitor) over the last half of the tasks: continual runs, "
                  "mean over seeds [min, max over seeds]; fresh: the fresh agents' last pass on the same tasks", "",
                  "| method | " + " | ".join(names[m] for m in shown_metrics) + " |", "|---|" + "---|" * len(shown_metrics)]
        for method, d in diagnosed.items():
            cells = []
            for m in shown_metrics:
                e = d.get(m)
                fewer = e is not None and e.get("seeds", len(summary[method]["seeds"])) < len(summary[method]["seeds"])
                cells.append("-" if e is None else f"{e['mean']:.3g} [{e['min']:.3g}, {e['max']:.3g}]"
                             + (f" ({e['seeds']} seeds)" if fewer else "")
                             + (f"; fresh {e['fresh']:.3g}" if "fresh" in e else ""))
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: significant digits of the floats of summary.json (and of the tables and figures built from them): a rebuild on
#: another machine differs in a float's last bits (numpy's sums follow the CPU's SIMD width), and a committed summary
#: must rebuild byte for byte in a fresh clone (issue #29, part 5); 10 digits are far below every CI's resolution
SUMMARY_DIGITS = 10


def rounded(value: Any, digits: int = SUMMARY_DIGITS) -> Any:
    """``value`` with every finite float (in dicts, lists and tuples, recursively; tuples become lists, as in JSON)
    rounded to ``digits`` significant digits; NaN, infinities and everything else unchanged."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


#: The fields of a run's recorded setting that its summary depends on (the task index, the score and its window), with
#: the command-line flag that sets each where one does.
SUMMARY_FIELDS = {"env_id": "--setting", "tasks": "--tasks", "change_every": "--change-every", "n_envs": "--setting",
                  "score": "--setting", "tail": "--setting"}


def check_records_setting(records: list[dict], setting: Setting, setting_name: str) -> None:
    """Refuse to summarise runs with a setting other than the command's: a folder of runs made with
    ``--change-every 125000`` summarised at the setting's default would cut its tasks elsewhere, silently.

    :raises SettingMismatchError: naming the field, the command's value, the runs' value and the flag that sets
        it.
    """
    for record in records:
        recorded = record.get("setting")
        if not isinstance(recorded, dict):
            continue  # runs written before settings were recorded
        for name, flag in SUMMARY_FIELDS.items():
            if name in recorded and recorded[name] != getattr(setting, name):
                what = "fresh agent" if record.get("fresh_task") is not None else "run"
                raise SettingMismatchError(
                    f"the {what} {record['method']} seed {record['seed']} was made with {name}={recorded[name]!r}, "
                    f"the command's setting {setting_name!r} has {name}={getattr(setting, name)!r}: pass the runs' "
                    f"value ({flag}) to summarise them, or another --out for runs of this setting"
                )


def report(out: str, setting_name: str, setting: Setting, methods: Optional[list[str]], diagnostics: bool = True,
           tb_plots: bool = False) -> dict[str, Any]:
    """Tables on stdout, ``summary.json``, ``summary.md`` and the figures, from the run JSONs under ``out`` alone
    (``methods=None``: every method found). ``tb_plots`` adds :func:`sb3_plastic.plot.plot_runs`'s figures of the
    TensorBoard events under ``plots/`` (the events are not committed).

    :raises NoRunsError: when ``out`` holds no finished run of ``methods``; nothing is written then.
    :raises SettingMismatchError: when the runs were made with another setting (:func:`check_records_setting`).
    """
    check_records_setting(load_records(out), setting, setting_name)
    rebuilt = add_hidden_dfi(out)
    if rebuilt:
        print(f"rebuilt the hidden-layer DfI (dfi_hidden) from the TensorBoard events of {rebuilt} run JSONs", flush=True)
    copied = add_train_scalars(out, setting)
    if copied:
        print(f"copied SB3's training scalars ({', '.join(TRAIN_SCALARS)}) from the TensorBoard events into {copied} "
              "run JSONs", flush=True)
    records = load_records(out)
    found = list(dict.fromkeys(r["method"] for r in records))
    if methods is None:
        order = {m: i for i, m in enumerate(ALL_METHOD_NAMES)}
        methods = sorted(found, key=lambda m: order.get(m, len(order)))
    result = rounded(summarise(records, methods, setting))
    if not result["methods"]:
        raise NoRunsError(
            f"no finished runs of {', '.join(methods) or 'any method'} under {os.path.join(out, 'runs')} "
            f"(found: {', '.join(found) or 'none'}): nothing written"
        )
    table = markdown_table(result, setting_name, setting)
    print(table)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(rounded({"setting": setting_name, "tail": setting.tail, "description": setting.description,
                           "setting_config": setting_config(setting), **result}), f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    summary = result["methods"]
    figures = {"end_of_task.png": continual_figures.end_of_task_figure(summary, setting, result["plain"],
                                                                         SCORE_LABELS[setting.score]),
               "plasticity.png": continual_figures.plasticity_figure(summary, result["plain"], setting.description)}
    if diagnostics:
        runs = [r for r in records if r["method"] in summary]
        figures["diagnostics.png"] = continual_figures.diagnostics_figure(runs, list(summary), setting, _network(runs),
                                                                          result["plain"])
    for name, fig in figures.items():
        if fig is not None:
            print("wrote", continual_figures.save(fig, os.path.join(out, name)))
    if tb_plots:
        from sb3_plastic.plot import plot_runs

        metrics = [f"plasticity/policy/{m}" for m in DIAGNOSTICS] + ["continual/end_of_task_reward"]
        tb = os.path.join(out, "tb")
        paths = [os.path.join(tb, m, d) for m in summary if os.path.isdir(os.path.join(tb, m))
                 for d in sorted(os.listdir(os.path.join(tb, m))) if d != "fresh"]  # the continual runs only
        # one curve per method folder tb/<method>/ (the plain methods differ only in their callbacks)
        for path in plot_runs(paths, os.path.join(out, "plots"), metrics=metrics, switch_every=setting.task_timesteps,
                              group_by=r"/tb/([^/]+)/[^/]+$"):
            print("wrote", path)
    return summary


def parse_ppo_kwargs(items: list[str], algo: str = "ppo") -> dict[str, Any]:
    """``["ent_coef=0.01", ...]`` -> ``{"ent_coef": 0.01}``; a key the algorithm does not take is a ``ValueError``."""
    import inspect

    import stable_baselines3
    import yaml

    ignored = {"self", "policy", "env", "policy_kwargs", "seed", "device"}
    cls = getattr(stable_baselines3, ALGOS[algo][0])
    allowed = {k for k in inspect.signature(cls.__init__).parameters if k not in ignored and not k.startswith("_")}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ValueError(
                f"--ppo-kwarg expects KEY=VALUE with KEY a {cls.__name__} keyword ({', '.join(sorted(allowed))}), "
                f"got {item!r}"
            )
        out[key] = yaml.safe_load(value)
    return out


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="bandit")
    p.add_argument("--methods", nargs="+", choices=[*ALL_METHOD_NAMES, "all"],
                   help="methods (default: the default list; with --plot-only: every method found; 'all': all)")
    p.add_argument("--seeds", nargs="+", type=int,
                   help="run seeds (default 0 1 2; --quick: 0); --plot-only summarises every seed it finds")
    p.add_argument("--tasks", type=int, help="number of tasks (default: the setting's)")
    p.add_argument("--change-every", type=int, help="task length in env steps per env copy (default: the setting's)")
    p.add_argument("--fresh", choices=FRESH_CHOICES, default="all",
                   help=f"fresh-agent references: one per task of every run (all), {FRESH_SAMPLE} tasks of each run's "
                        "last half (sample: for tasks alike in distribution) or none")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes; a GPU is shared by them)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--device", default="cpu", help="torch device of the agents: cpu, cuda, cuda:1, auto")
    p.add_argument("--out", help="output folder (default bench/results/continual/<setting>[_quick])")
    p.add_argument("--quick", action="store_true", help="2 short tasks, one seed: a smoke test (~1 min)")
    p.add_argument(
        "--ppo-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a keyword of the setting's algorithm for every method, e.g. ent_coef=0.01 (repeatable; "
        "VALUE read as yaml)",
    )
    p.add_argument("--plot-only", action="store_true", help="only rebuild the tables and figures from the run JSONs")
    p.add_argument("--no-diagnostics-plots", action="store_true", help="skip the diagnostics figure")
    p.add_argument("--tb-plots", action="store_true", help="also plot the TensorBoard events (plots/)")
    for f in MethodParams.__dataclass_fields__.values():
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    try:
        args.ppo_overrides = parse_ppo_kwargs(args.ppo_kwarg, SETTINGS[args.setting].algo)
    except ValueError as exc:
        p.error(str(exc))
    for name in ("tasks", "change_every", "jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    algo = SETTINGS[args.setting].algo
    if args.methods is not None:
        if "all" in args.methods:
            args.methods = methods_of(algo)
        wrong = [m for m in args.methods if m not in methods_of(algo)]
        if wrong:
            p.error(f"--methods {' '.join(wrong)}: not a method of the {algo} setting {args.setting!r}; allowed: "
                    + ", ".join(methods_of(algo)))
    return args


def resolve_setting(name: str, quick: bool = False, tasks: Optional[int] = None, change_every: Optional[int] = None,
                    overrides: Optional[dict[str, Any]] = None) -> Setting:
    """The setting ``name`` with the command line's changes (``--quick``, ``--tasks``, ``--change-every``,
    ``--ppo-kwarg``); bench/grid.py builds its cells with the same function."""
    setting = SETTINGS[name]
    if quick:
        setting = replace(
            setting, tasks=2, change_every=max(setting.change_every // 16, 64), monitor_every=setting.change_every
        )
    if tasks is not None:
        setting = replace(setting, tasks=tasks)
    if change_every is not None:
        setting = replace(setting, change_every=change_every)
    if setting.task_timesteps != SETTINGS[name].task_timesteps:  # the description says the new interval
        steps = setting.task_timesteps
        text = f"{steps / 1e6:g}M" if steps % 1_000_000 == 0 else f"{steps / 1000:g}k"
        description = re.sub(r"every [\d.]+[kM] steps", f"every {text} steps", setting.description)
        setting = replace(setting, description=re.sub(r"[\d.]+M steps each", f"{text} steps each", description))
    if overrides:
        setting = replace(setting, ppo={**setting.ppo, **overrides})
    return setting


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    setting = resolve_setting(args.setting, args.quick, args.tasks, args.change_every, args.ppo_overrides)
    if args.plot_only and args.seeds is not None:
        print(f"warning: --seeds {' '.join(map(str, args.seeds))} has no effect with --plot-only: every run found is "
              "summarised", file=sys.stderr, flush=True)
    if args.plot_only and args.methods is not None:
        print(f"warning: --methods {' '.join(args.methods)} has no effect with --plot-only: every method found is "
              "summarised", file=sys.stderr, flush=True)
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    params = MethodParams(**{f: getattr(args, f) for f in MethodParams.__dataclass_fields__})
    out = args.out or os.path.join("bench", "results", "continual", args.setting + ("_quick" if args.quick else ""))
    methods = args.methods
    if methods is None and not args.plot_only:
        methods = [method_name(m, setting.algo) for m in DEFAULT_METHODS]
    if args.plot_only:  # what the tables will summarise: every continual run found
        methods = None
        found = sorted({r["seed"] for r in load_records(out) if r.get("fresh_task") is None})
        seeds = " ".join(map(str, found)) + " (every seed found)" if found else "none found"
    else:
        seeds = " ".join(map(str, args.seeds))
    print(
        f"setting={args.setting}: {setting.description}; {setting.tasks} tasks x {setting.task_timesteps} env steps "
        f"({setting.change_every} per copy x {setting.n_envs} copies), methods={' '.join(methods or ['(found)'])}, "
        f"seeds={seeds}, fresh={args.fresh}, device={args.device}, jobs={args.jobs}, out={out}",
        flush=True,
    )
    if not args.plot_only:
        os.makedirs(out, exist_ok=True)
        cells = [(m, s, k) for s in args.seeds for m in methods for k in run_parts(setting, args.fresh, s)]
        jobs = [(m, s, k, setting, params, out, args.device, args.threads) for m, s, k in cells
                if not os.path.exists(run_path(out, m, s, k))]
        skipped = len(cells) - len(jobs)
        if skipped:
            print(f"resuming: {skipped} finished runs skipped", flush=True)
        failures, claimed, finished = [], [], 0
        start = time.time()
        if args.jobs == 1:
            outcomes = map(_run_job, jobs)
        else:
            pool = futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
            outcomes = (f.result() for f in futures.as_completed([pool.submit(_run_job, j) for j in jobs]))
        for method, seed, fresh_task, seconds, error in outcomes:
            # a run another live worker holds is not a failure: that worker writes it
            held = bool(error) and error.startswith(f"{RunClaimedError.__name__}:")
            status = f"skipped, another worker holds it ({error})" if held else "FAILED " + error if error else "done"
            what = "" if fresh_task is None else f" fresh task {fresh_task}"
            print(f"[{time.time() - start:7.0f}s] {method} seed {seed}{what}: {status} ({seconds / 60:.1f} min)",
                  file=sys.stderr, flush=True)
            if held:
                claimed.append((method, seed, fresh_task))
            elif error:
                failures.append((method, seed, fresh_task, error))
            else:
                finished += 1
        if args.jobs != 1:
            pool.shutdown()
        if claimed:
            print(f"{len(claimed)} runs skipped: another worker holds them ({claimed}); the same command, run again "
                  "once that worker is done, finds them finished or resumes what it left", flush=True)
        if failures:
            print(f"{len(failures)} runs failed: {failures}", flush=True)
        if not finished and os.path.exists(os.path.join(out, "summary.json")):
            # a grid worker's call on cells that are done or held: rebuilding a folder of many methods costs minutes
            print("no run finished in this call: the folder's tables and figures are left as they are (rebuild them "
                  "with --plot-only)", flush=True)
            return 0
    try:  # the folder's tables and figures summarise every method found there, not only the ones this call ran
        report(out, args.setting, setting, None, diagnostics=not args.no_diagnostics_plots, tb_plots=args.tb_plots)
    except (NoRunsError, SettingMismatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
