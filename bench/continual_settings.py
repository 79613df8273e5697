"""The settings of bench/continual.py: :class:`Setting` (a non-stationary env and the hyperparameters every
method shares on it), the registry :data:`SETTINGS` and their hyperparameter dicts, the scores, the plain
agents' activations and the algorithms, and how a setting is recorded (:func:`setting_config`) and compared
(:func:`same_setting`)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from torch import nn

#: fraction of each task (its last part) over which the end-of-task scores are averaged (a setting may differ)
TAIL = 0.2
#: the algorithms of the settings: (SB3 class, plastic class) names
ALGOS = {"ppo": ("PPO", "PlasticPPO"), "dqn": ("DQN", "PlasticDQN"), "sac": ("SAC", "PlasticSAC")}


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
#: the weight initialisations of :attr:`Setting.init`
INITS = ("default", "lecun")
#: where PPO's advantages are normalised (:attr:`Setting.advantage_norm`)
ADVANTAGE_NORMS = ("minibatch", "rollout")
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
        on a second env of the same task sequence, env seed ``1234 * seed + 1``: C-CHAIN's ``1234 * seed`` kept apart
        from the training env's seed 0; the task just trained),
        recorded as ``evaluations`` ``[[timesteps, task, mean return], ...]``; 0: none.
    :param eval_episodes: episodes per evaluation.
    :param eval_at_task_start: also evaluate at the run's first step and at the first step of every new task, before
        any update on it (C-CHAIN's zero-shot evaluation at every game's start; ``ContinualEvalCallback``'s
        ``eval_at_task_start``).
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
    :param random_steps_per_task: DQN only: after each task switch of a continual run, this many env steps of uniformly
        random actions without an update (SB3's ``learning_starts`` moved to the switch plus this), as C-CHAIN's runs
        start every game (their ``INIT_RANDOM_STEPS``); a fresh agent has the algorithm's ``learning_starts``; 0: none.
    :param init: weight initialisation of the agents built on SB3's algorithm class (the plain agent and the methods
        that add an optimizer setting or a callback to it: Adam beta1 = beta2, L2, CBP, S&P, ...; the methods built on
        a plastic class, ``plastic_*``, ``ppo_trac``, ``ppo_nap``, ``ppo_layernorm``, ``ppo_crelu``, ``ppo_fourier``,
        keep theirs): ``"default"`` (SB3's orthogonal init) or ``"lecun"`` (Dohare et al.'s ``lecun_init``, PPO with
        an MLP policy only: every Linear layer of the actor and critic, heads included,
        ``U(-sqrt(3 / fan_in), sqrt(3 / fan_in))``, biases 0; :func:`continual_methods.lecun_init_`).
    :param advantage_norm: PPO only, every method: ``"minibatch"`` (SB3's ``normalize_advantage``: each minibatch
        by its own mean and std) or ``"rollout"`` (once over each rollout's advantages, as Dohare et al.'s PPO does:
        :func:`dohare_ppo.rollout_advantage_norm`).
    :param time_limit_terminal: an episode cut by the env's time limit ends as a terminal state, not bootstrapped
        (:class:`~sb3_plastic.envs.TruncationAsTermination` around every env copy: gym 0.23's single ``done``, which
        Dohare et al.'s PPO stored as terminal at Ant's 1000-step limit); ``False``: SB3 bootstraps a truncation.
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
    random_steps_per_task: int = 0
    eval_at_task_start: bool = False
    init: str = "default"
    advantage_norm: str = "minibatch"
    time_limit_terminal: bool = False

    def __post_init__(self) -> None:
        if self.advantage_norm not in ADVANTAGE_NORMS:
            raise ValueError(f"advantage_norm must be one of {', '.join(map(repr, ADVANTAGE_NORMS))}, "
                             f"got {self.advantage_norm!r}")
        if self.advantage_norm != "minibatch" and self.algo != "ppo":
            raise ValueError(f"advantage_norm={self.advantage_norm!r} normalises PPO's advantages; the setting's "
                             f"algo is {self.algo!r} (allowed: 'minibatch', which leaves it alone)")
        if not isinstance(self.time_limit_terminal, bool):
            raise ValueError(f"time_limit_terminal must be a bool, got {self.time_limit_terminal!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(map(repr, INITS))}, got {self.init!r}")
        if self.init == "lecun" and (self.algo, self.policy) != ("ppo", "MlpPolicy"):
            raise ValueError(f"init='lecun' is for a PPO setting with an MLP policy, got algo={self.algo!r}, "
                             f"policy={self.policy!r}")
        if self.random_steps_per_task and self.algo != "dqn":
            raise ValueError(f"random_steps_per_task is for a DQN setting (learning_starts), got algo={self.algo!r} "
                             f"with random_steps_per_task={self.random_steps_per_task!r}")
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
#: batch 32, one update per env step, the squared TD error, buffer 1e5 kept across games, target copied every 1 000
#: updates, epsilon 1 -> 0.1 over 100 k steps after 10 k random ones, gamma 0.99, Adam, no gradient clipping) on
#: SpaceInvaders -> Asterix -> Seaquest, 2 M steps each, every game starting with 10 k random, untrained steps, idle
#: Seaquest episodes cut at 1 000 steps, 10 greedy evaluation episodes every 50 k steps and one at every game's first
#: step. Differences that remain (bench/README): SB3 copies the target every 1 000 env steps (theirs every 1 000
#: updates: the same outside the random steps); our epsilon falls linearly from step 0 (theirs from step 10 k), both
#: reaching 0.1 at 110 k; our idle cut is for every game (theirs Seaquest's).
_CMINATAR_DQN = dict(buffer_size=100_000, learning_starts=10_000, batch_size=32, learning_rate=3e-4, gamma=0.99,
                     train_freq=1, gradient_steps=1, target_update_interval=1_000, exploration_initial_eps=1.0,
                     exploration_final_eps=0.1, max_grad_norm=float("inf"), double_q=True, td_loss="mse")
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
    random_steps_per_task=10_000,
    eval_at_task_start=True,
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
# minibatch of 128; read in absolute return (their loss is a decline of the continual return; no fresh reference).
# Their Ant is gym 0.23's Ant-v3 on mujoco-py 2.1, whose 84 contact-force observations and contact cost are always 0
# (MuJoCo 2 leaves cfrc_ext unset; openai/gym#1541): Ant-v5 without its contact forces in the observation and without
# the contact cost is the env their agents saw (twenty-seventh session, the env audit; their 111 inputs, the 84
# contact forces as zeros, since the twenty-ninth: ``observation_zeros`` below)
# Their PPO (lop/algos/rl/ppo.py, run_ppo.py's defaults; the twenty-seventh session's audit): no gradient clipping
# (max_grad_norm 1e9), the value loss unweighted (vf_coef 1), Adam's eps 1e-8, LeCun-uniform init of every layer. With
# SB3's defaults instead (max_grad_norm 0.5, vf_coef 0.5, eps 1e-5) every update was clipped (gradient norms 57-340,
# mostly the value loss's), the clipped policy gradients fell below eps, and the weight decay of the L2 / CBP arms,
# which torch's Adam adds after the clip, erased their policy networks within ~40-80 k steps.
# Their agent sent its raw Gaussian sample to the env (gym 0.23 did not clip): the control cost charged every sample,
# MuJoCo clamped it for the dynamics; raw_actions=True does that for SB3, which clips to the action space.
SETTINGS["slippery_ant_dohare"] = replace(
    SETTINGS["slippery_ant_ppo"],
    change_every=500_000,
    ppo=dict(_PPO_SLIPPERY, batch_size=128, max_grad_norm=float("inf"), vf_coef=1.0),
    policy_kwargs=dict(optimizer_kwargs=dict(eps=1e-8)),
    init="lecun",
    monitor_every=500_000,
    env_kwargs=dict(include_cfrc_ext_in_observation=False, contact_cost_weight=0.0, raw_actions=True,
                    observation_zeros=84),
    advantage_norm="rollout",
    time_limit_terminal=True,
    description="SlipperyAnt (friction re-drawn every 2M steps, no contact forces: Dohare's Ant-v3), PPO [256, 256] "
                "(Dohare's settings, minibatch 128)",
)

#: the ablation of ``slippery_ant_dohare``'s terminal time limit (twenty-eighth session): his design with SB3's bootstrap
#: at the 1000-step cut (``time_limit_terminal=False``), his advantage normalisation kept; run on task 0 only
#: (``--tasks 1``) beside the full setting's task 0, to tell which of his two targets costs return there
SETTINGS["slippery_ant_dohare_bootstrap"] = replace(
    SETTINGS["slippery_ant_dohare"],
    time_limit_terminal=False,
    description="SlipperyAnt at Dohare's design (friction re-drawn every 2M steps), PPO [256, 256] (Dohare's settings, "
                "minibatch 128), the time-limit cut bootstrapped (SB3's), his advantage normalisation",
)

#: The width probe of the thirty-eighth session: ``minatar_intensive`` with the CNN's linear layer at 32 or 512 features
#: (the setting's 128), for single-task runs (``--tasks 1``) of plain PPO and ReLU + AdamO with the penalty on that
#: layer alone. The thirty-seventh session found the penalty's cost in learning speed on the 128 x 1024 layer and
#: guessed "the layer furthest from square"; 32 x 1024 is further from square and has fewer rows to hold orthogonal,
#: 512 x 1024 is nearer square and has more: the two guesses predict opposite orderings (bench/README.md).
for _width in (32, 512):
    SETTINGS[f"minatar_intensive_width{_width}"] = replace(
        SETTINGS["minatar_intensive"],
        policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=_width)),
        description=f"PermutedMinAtar-SpaceInvaders (channels permuted every 250k steps), PPO lr 1e-3 x 10 epochs, the "
                    f"CNN's linear layer {_width} wide (the setting's: 128)",
    )

#: Setting fields added by issue #29 (the cchain settings) and after; summary.json leaves them out where they are at
#: their defaults, so the tables of the settings before them rebuild byte for byte
LATE_FIELDS = ("activation", "policy_kwargs", "reward_scale", "rollout_reset", "floor_below", "random_steps_per_task",
               "eval_at_task_start", "init", "advantage_norm", "time_limit_terminal")
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
