"""What the exact AdamO step and MaxMin add to an update, at a resolution that can tell (issue #16).

``bench/overhead.py`` times whole ``learn()`` calls of a few hundred env steps; its own A/A control spans
0.75-1.33 on a shared 2-core machine, so verdicts near 0.95 are not resolved there. This script measures where the
methods add work:

* **train-step entries** (``work="train"``): one ``model.train()`` call of a warmed-up model, the same call SB3's
  ``learn()`` makes (PPO: 4 epochs over a 256-sample rollout, i.e. 4 minibatch updates of batch 256, as in the zoo's
  Atari/MinAtar settings; DQN and SAC: ``gradient_steps`` updates at the zoo's batch size);
* **forward entries** (``work="forward"``): one forward pass of the policy on a rollout-sized batch under
  ``no_grad`` (what action selection costs; MaxMin's part of the rollout).

Each entry builds three models: the baseline ``A`` (plain SB3, same network), an identical second baseline ``A'``
(the A/A control) and the candidate ``B``. ``--rounds`` rounds each time every arm with
``torch.utils.benchmark.Timer.blocked_autorange`` (the order of the arms rotates from round to round), once with
the wall clock and once with process CPU time (``time.process_time``). Per round the speed ratios are
``t_A / t_B`` (higher is better; 1 = no cost) and ``t_A / t_A'`` (the control). The noise band of an entry is the
largest deviation of its A/A ratios from 1 (in log space, over all rounds); a verdict is given only where the band
resolves it: ``PASS`` if ``median(t_A/t_B) / band >= target``, ``FAIL`` if ``median * band < target``, otherwise
``not resolved``.

**The floor.** ``torch.utils.flop_counter.FlopCounterMode`` counts the matrix-product and convolution flops of one
unit of work in each arm. ``flops_A / flops_B`` is the best ratio an implementation can reach if time is
proportional to flops (the isometry step of a weight ``(m, n)`` costs ``4 m n min(m, n)`` flops: two products with
the smaller Gram matrix). ``measured / floor`` says how close the implementation is to it. MaxMin adds no
matrix-product flops (its cost is memory traffic: its floor by this count is 1).

**The op floor** (a GPU's floor). On a GPU these small networks are launch-bound: a PPO MinAtar ``train()`` of
~10^9 flops takes ~18 ms on an H200, which would do those flops in microseconds. There time follows the number of
kernels, not flops: :func:`count_ops` counts the aten operators one unit of work dispatches (views left out), and
``ops_A / ops_B`` (``op_floor``) is the ratio a launch-bound implementation of the same kernels would reach.
torch's Adam takes its foreach implementation on CUDA and a loop over the parameters on the CPU, so a CPU count of a
GPU run's kernels needs ``--adam-foreach``; ``--count-only`` counts both floors without timing anything.

Whole runs: ``--whole-run STEPS`` times ``learn(STEPS)`` of the three arms instead (interleaved; one call per arm
and round, read by both clocks), for whole-run fps ratios over enough steps that start-up does not dominate. Their
floor is counted on one ``learn(STEPS)`` of each arm before the rounds (rollout forward passes included, which
lifts it towards 1); that call is also every arm's warm-up.

**How close the step is to its matrix products** (``--step-efficiency``): after the rounds, for a candidate whose
optimizers carry the isometry step (:class:`~sb3_plastic.optim.IsometryStepMixin`), its optimizers' ``step()`` is
timed as it runs (``t_on``), with every group's ``isometry_coef`` set to 0 (``t_off``: the base optimizer alone)
and the bare products ``W^T W`` / ``W G`` of its regularised weights (``t_mm``, the same ``4 m n min(m, n)``
flops). ``t_mm / (t_on - t_off)`` near 1 means the step costs what its products cost; the rest is the clamp bound
and the elementwise work. The timed steps change the candidate's weights (its gradients stay those of its last
update), so this runs once the rounds are done.

**torch.compile** (``--compile candidate`` / ``--compile all``): after the flops are counted (eager), the candidate
(or every arm) has the tensor work of its ``train()`` compiled with ``torch.compile`` (:func:`compile_train_step`:
the policy's training forward passes, whose backward AOTAutograd compiles with them, and every optimizer's
``step``); SB3's Python loop around them (minibatches, the loss's few elementwise ops, logging) stays eager. Every
compiled arm is warmed up until it stops compiling; the number of graphs compiled during the rounds is recorded
(``compiled_during_rounds``, 0 when the timed code was the compiled code) and a nonzero count is reported.
``candidate`` asks whether compiling the plastic model brings it to the eager SB3 speed; ``all`` compares compiled
with compiled (the A/A control is then compiled too).

Threads: one torch thread (``--threads``) for every arm, set before every measurement.

Examples::

    python bench/step_cost.py --list
    python bench/step_cost.py                                   # every entry, ~15 minutes on one core
    python bench/step_cost.py --only ppo-minatar-relu sac-mlp-relu --rounds 9
    python bench/step_cost.py --only ppo-minatar-relu --whole-run 16384 --rounds 5
    python bench/step_cost.py --only ppo-minatar-relu sac-mlp-relu dqn-mlp-relu --step-efficiency
    python bench/step_cost.py --only ppo-minatar-maxmin sac-mlp-relu --compile candidate
    python bench/step_cost.py --device cuda --json /tmp/step_cost_cuda.json
    python bench/step_cost.py --count-only --adam-foreach --only ppo-minatar-relu     # a GPU run's op floor, here
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch as th
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecFrameStack
from torch.utils import benchmark
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.activations import MaxMin
from sb3_plastic.networks import PlasticCNN
from sb3_plastic.optim import IsometryStepMixin


def synchronized_process_time() -> float:
    """Process CPU time, read once the accelerator (if any) has finished its queued work."""
    if th.accelerator.is_available():
        th.accelerator.synchronize()
    return time.process_time()


#: the two clocks of every timing. ``benchmark.timer`` is torch's default Timer clock: the wall clock read after
#: synchronising the accelerator. (A Timer given ``timeit.default_timer`` explicitly does *not* synchronise, and on a
#: GPU it would time kernel launches only.) On a GPU read the wall clock: CPU time there counts the host's wait.
CLOCKS: dict[str, Callable[[], float]] = {"wall": benchmark.timer, "cpu": synchronized_process_time}
WORKS = ("train", "forward")
#: ``--compile``: which arms run their train step under torch.compile
COMPILE_MODES = ("off", "candidate", "all")


@dataclass(frozen=True)
class Entry:
    """One comparison: ``baseline`` and ``candidate`` build a model (``(device, seed) -> model``) on the same env and
    network; ``target`` is the speed ratio to reach (``None``: measured, no verdict)."""

    name: str
    description: str
    baseline: Callable[[str, int], BaseAlgorithm]
    candidate: Callable[[str, int], BaseAlgorithm]
    work: str = "train"
    target: Optional[float] = None
    #: env steps of the warm-up ``learn()`` (fills the rollout / replay buffer, creates the logger)
    warmup: int = 256
    #: DQN / SAC: gradient steps and batch size of one ``train()`` call
    gradient_steps: int = 0
    batch_size: int = 0
    #: calls of the work whose flops are counted (averaged): a whole ``isometry_interval`` window with "auto"
    flop_calls: int = 1


REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> None:
    if entry.work not in WORKS:
        raise ValueError(f"{entry.name}: work must be one of {WORKS}, got {entry.work!r}")
    REGISTRY[entry.name] = entry


# ------------------------------------------------------------------------------------------------ models
def _minatar(n_envs: int, seed: int) -> Any:
    import minatar.gym

    minatar.gym.register_envs()
    return make_vec_env("MinAtar/Breakout-v1", n_envs=n_envs, seed=seed)


def _breakout(n_envs: int, seed: int) -> Any:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = make_atari_env("ALE/Breakout-v5", n_envs=n_envs, seed=seed, env_kwargs={"frameskip": 1})
    return VecFrameStack(env, n_stack=4)


#: The zoo's Atari / MinAtar PPO settings with a 256-sample rollout (8 envs x 32 steps): one ``train()`` is 4
#: epochs of one minibatch of 256, i.e. 4 updates at the zoo's batch size.
PPO_HP = dict(n_steps=32, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01)
DQN_CARTPOLE = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=256, train_freq=256,
                    gradient_steps=128, target_update_interval=10)
DQN_ATARI = dict(learning_rate=1e-4, batch_size=32, buffer_size=10_000, learning_starts=500, train_freq=4,
                 gradient_steps=1, target_update_interval=1000, optimize_memory_usage=True,
                 replay_buffer_kwargs=dict(handle_timeout_termination=False))
SAC_HP = dict(learning_rate=1e-3, learning_starts=100)


def ppo_minatar(plastic: Optional[dict[str, Any]] = None, activation: str = "relu") -> Callable[[str, int], Any]:
    """PPO on MinAtar Breakout with the library's MinAtar CNN (16 3x3 filters, 128 features, no MLP after it) in
    both arms: SB3's NatureCNN rejects MinAtar's 10x10 boolean frames."""

    def build(device: str, seed: int) -> Any:
        env = _minatar(8, seed)
        if plastic is None:
            act = MaxMin if activation == "maxmin" else th.nn.ReLU
            kwargs = dict(features_extractor_class=PlasticCNN, net_arch=[], activation_fn=act,
                          features_extractor_kwargs=dict(activation=activation, arch="auto"))
            return PPO("CnnPolicy", env, policy_kwargs=kwargs, device=device, seed=seed, **PPO_HP)
        return PlasticPPO("CnnPolicy", env, policy_kwargs=dict(net_arch=[]), device=device, seed=seed, **PPO_HP,
                          **plastic)

    return build


def ppo_nature(plastic: Optional[dict[str, Any]] = None) -> Callable[[str, int], Any]:
    """PPO on ALE Breakout 84x84x4 with SB3's NatureCNN (the plastic policy's Nature CNN: the same layers)."""

    def build(device: str, seed: int) -> Any:
        env = _breakout(8, seed)
        if plastic is None:
            return PPO("CnnPolicy", env, policy_kwargs=dict(net_arch=[]), device=device, seed=seed, **PPO_HP)
        return PlasticPPO("CnnPolicy", env, policy_kwargs=dict(net_arch=[]), device=device, seed=seed, **PPO_HP,
                          **plastic)

    return build


def dqn_mlp(plastic: Optional[dict[str, Any]] = None) -> Callable[[str, int], Any]:
    """DQN on CartPole, [256, 256], the zoo's hyperparameters (batch 64)."""

    def build(device: str, seed: int) -> Any:
        env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
        cls, extra = (DQN, {}) if plastic is None else (PlasticDQN, plastic)
        return cls("MlpPolicy", env, policy_kwargs=dict(net_arch=[256, 256]), device=device, seed=seed,
                   **DQN_CARTPOLE, **extra)

    return build


def dqn_nature(plastic: Optional[dict[str, Any]] = None) -> Callable[[str, int], Any]:
    """DQN on ALE Breakout 84x84x4, NatureCNN, the zoo's hyperparameters (batch 32)."""

    def build(device: str, seed: int) -> Any:
        env = _breakout(1, seed)
        cls, extra = (DQN, {}) if plastic is None else (PlasticDQN, plastic)
        return cls("CnnPolicy", env, policy_kwargs=dict(net_arch=[]), device=device, seed=seed, **DQN_ATARI, **extra)

    return build


def sac_mlp(plastic: Optional[dict[str, Any]] = None, activation: str = "relu") -> Callable[[str, int], Any]:
    """SAC on Pendulum, SB3's [256, 256] actor and two critics, batch 256."""

    def build(device: str, seed: int) -> Any:
        env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
        if plastic is None:
            act = MaxMin if activation == "maxmin" else th.nn.ReLU
            return SAC("MlpPolicy", env, policy_kwargs=dict(activation_fn=act), device=device, seed=seed, **SAC_HP)
        return PlasticSAC("MlpPolicy", env, device=device, seed=seed, **SAC_HP, **plastic)

    return build


EXACT = dict(activation="relu")  # AdamO, the class's default coefficient, isometry_interval=1 (the defaults)
AUTO = dict(activation="relu", isometry_interval="auto")
MAXMIN = dict(activation="maxmin")
MAXMIN_ADAM = dict(activation="maxmin", isometry_mode="off", optimizer="adam")

register(Entry("ppo-minatar-relu", "PlasticPPO relu + exact AdamO vs PPO, MinAtar CNN", ppo_minatar(),
               ppo_minatar(EXACT), target=0.95))
register(Entry("ppo-minatar-auto", "as ppo-minatar-relu with isometry_interval='auto' (4 at batch 256)",
               ppo_minatar(), ppo_minatar(AUTO), target=0.98))
register(Entry("ppo-minatar-maxmin", "PlasticPPO maxmin + exact AdamO vs PPO relu, MinAtar CNN", ppo_minatar(),
               ppo_minatar(MAXMIN), target=0.95))
register(Entry("ppo-minatar-maxmin-adam", "MaxMin's own cost: PlasticPPO maxmin + plain Adam (no penalty) vs PPO "
               "relu", ppo_minatar(), ppo_minatar(MAXMIN_ADAM)))
register(Entry("ppo-minatar-maxmin-forward", "rollout forward pass (8 observations, no_grad): PlasticPPO maxmin vs "
               "PPO relu", ppo_minatar(), ppo_minatar(MAXMIN), work="forward"))
register(Entry("ppo-nature-relu", "PlasticPPO relu + exact AdamO vs PPO, Atari NatureCNN", ppo_nature(),
               ppo_nature(EXACT), target=0.95))
register(Entry("ppo-nature-auto", "as ppo-nature-relu with isometry_interval='auto'", ppo_nature(),
               ppo_nature(AUTO), target=0.98))
register(Entry("dqn-mlp-relu", "PlasticDQN relu + exact AdamO vs DQN, CartPole [256, 256], 16 updates of batch 64",
               dqn_mlp(), dqn_mlp(EXACT), target=0.95, warmup=300, gradient_steps=16, batch_size=64))
register(Entry("dqn-mlp-auto", "as dqn-mlp-relu with isometry_interval='auto' (16 at batch 64)", dqn_mlp(),
               dqn_mlp(AUTO), target=0.98, warmup=300, gradient_steps=16, batch_size=64))
register(Entry("dqn-nature-relu", "PlasticDQN relu + exact AdamO vs DQN, Atari NatureCNN, 4 updates of batch 32",
               dqn_nature(), dqn_nature(EXACT), target=0.95, warmup=600, gradient_steps=4, batch_size=32))
register(Entry("dqn-nature-auto", "as dqn-nature-relu with isometry_interval='auto' (32 at batch 32)", dqn_nature(),
               dqn_nature(AUTO), target=0.98, warmup=600, gradient_steps=4, batch_size=32, flop_calls=8))
register(Entry("sac-mlp-relu", "PlasticSAC relu + exact AdamO vs SAC, Pendulum [256, 256], 4 updates of batch 256",
               sac_mlp(), sac_mlp(EXACT), target=0.95, warmup=300, gradient_steps=4, batch_size=256))
register(Entry("sac-mlp-auto", "as sac-mlp-relu with isometry_interval='auto' (4 at batch 256)", sac_mlp(),
               sac_mlp(AUTO), target=0.98, warmup=300, gradient_steps=4, batch_size=256))
register(Entry("sac-mlp-maxmin", "PlasticSAC maxmin + exact AdamO vs SAC relu, Pendulum [256, 256]", sac_mlp(),
               sac_mlp(MAXMIN), target=0.95, warmup=300, gradient_steps=4, batch_size=256))
register(Entry("sac-mlp-maxmin-adam", "MaxMin's own cost: SAC with MaxMin (SB3, plain Adam) vs SAC relu",
               sac_mlp(), sac_mlp(activation="maxmin"), warmup=300, gradient_steps=4, batch_size=256))

# The isometry paper's baselines (issue #15) through the plastic algorithms' keywords, isometry penalty off and plain
# Adam (the same network as the baseline): what each one alone adds to an update. No target (the issue asks for the
# measured cost). Their flop floors read ~1: L2-init and NaP (layer norms, the projection) add elementwise work only,
# and the spectral penalty's power iteration adds matrix-vector products (a floor of 0.996-0.999 on these networks).
BASELINES = dict(activation="relu", isometry_mode="off", optimizer="adam")
for _short, _kwargs in (("l2init", dict(l2_init_coef=1e-3)), ("spectral", dict(spectral_coef=1e-3)),
                        ("nap", dict(nap=True))):
    _what = ", ".join(f"{k}={v}" for k, v in _kwargs.items())
    register(Entry(f"ppo-minatar-{_short}", f"PlasticPPO relu + Adam, {_what} vs PPO, MinAtar CNN", ppo_minatar(),
                   ppo_minatar(dict(BASELINES, **_kwargs))))
    register(Entry(f"dqn-mlp-{_short}", f"PlasticDQN relu + Adam, {_what} vs DQN, CartPole [256, 256]", dqn_mlp(),
                   dqn_mlp(dict(BASELINES, **_kwargs)), warmup=300, gradient_steps=16, batch_size=64))
    register(Entry(f"sac-mlp-{_short}", f"PlasticSAC relu + Adam, {_what} vs SAC, Pendulum [256, 256]", sac_mlp(),
                   sac_mlp(dict(BASELINES, **_kwargs)), warmup=300, gradient_steps=4, batch_size=256))

# ------------------------------------------------------------------------------------------------ measuring
def start_interventions(model: BaseAlgorithm) -> Optional[CallbackList]:
    """Start the keyword-enabled interventions of a plastic ``model`` (its ``intervention_callbacks()``) as
    ``learn()`` would, and leave them running: L2-init's and spectral regularisation's gradient hooks and NaP's
    projection are installed at training start and removed at training end, so without this a ``train()`` called
    after ``learn()`` returns would run without them. ``None`` for a model without such interventions."""
    callbacks = model.intervention_callbacks() if hasattr(model, "intervention_callbacks") else []
    if not callbacks:
        return None
    started = CallbackList(callbacks)
    started.init_callback(model)
    started.on_training_start({}, {})
    return started


def prepare(entry: Entry, build: Callable[[str, int], Any], device: str, seed: int) -> tuple[Any, Callable[[], Any]]:
    """Build and warm up one arm, its interventions started (:func:`start_interventions`, kept as
    ``model.step_cost_interventions``); returns the model and its unit of work (a zero-argument callable)."""
    model = build(device, seed)
    model.learn(entry.warmup)
    model.step_cost_interventions = start_interventions(model)
    if entry.work == "forward":
        obs, _ = model.policy.obs_to_tensor(model.env.reset())

        def forward() -> Any:
            with th.no_grad():
                return model.policy(obs)

        return model, forward
    if entry.gradient_steps:
        return model, lambda: model.train(gradient_steps=entry.gradient_steps, batch_size=entry.batch_size)
    return model, model.train


def model_optimizers(model: BaseAlgorithm) -> list[th.optim.Optimizer]:
    """Every optimizer ``model.train()`` steps: those of the policy and its modules (PPO's and DQN's policy, SAC's
    actor and critic) and SAC's entropy-coefficient optimizer."""
    found: list[th.optim.Optimizer] = []
    for opt in [getattr(module, "optimizer", None) for module in model.policy.modules()] + [
            getattr(model, "ent_coef_optimizer", None)]:
        if isinstance(opt, th.optim.Optimizer) and all(opt is not o for o in found):
            found.append(opt)
    return found


def compile_train_step(model: BaseAlgorithm) -> None:
    """Put the tensor work of ``model.train()`` under ``torch.compile``, in place: the training forward passes
    (PPO's ``policy.evaluate_actions``; DQN's ``q_net`` and ``q_net_target``; SAC's ``actor.action_log_prob``,
    ``critic`` and ``critic_target``), whose backward AOTAutograd compiles with them, and the ``step`` of every
    optimizer (:func:`model_optimizers`). A rollout's action selection (``policy.forward``) is not compiled: the
    train-step entries do not time it."""
    policy = model.policy
    if isinstance(model, PPO):
        policy.evaluate_actions = th.compile(policy.evaluate_actions)
    elif isinstance(model, DQN):
        policy.q_net.compile()
        policy.q_net_target.compile()
    elif isinstance(model, SAC):
        policy.actor.action_log_prob = th.compile(policy.actor.action_log_prob)
        policy.critic.compile()
        policy.critic_target.compile()
    else:
        raise ValueError(f"compile_train_step: no compile plan for {type(model).__name__} (PPO, DQN and SAC have one)")
    for opt in model_optimizers(model):
        opt.step = th.compile(opt.step)  # type: ignore[method-assign]


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up_compiled(work: Callable[[], Any], max_calls: int = 10) -> int:
    """Call ``work`` until a call compiles nothing new (recompilations for a changing step count included); the
    number of calls. Raises if it still compiles after ``max_calls``."""
    for calls in range(1, max_calls + 1):
        before = compiled_graphs()
        work()
        if compiled_graphs() == before and calls > 1:
            return calls
    raise RuntimeError(f"torch.compile still compiles after {max_calls} calls of the work")


def count_flops(work: Callable[[], Any], calls: int = 1) -> float:
    """Matrix-product and convolution flops of one call of ``work`` (``torch.utils.flop_counter``), averaged
    over ``calls`` calls."""
    with FlopCounterMode(display=False) as counter:
        for _ in range(calls):
            work()
    return counter.get_total_flops() / calls


#: Operators that launch no kernel: reading a scalar out (``.item()``; on CUDA, Adam's step counters stay on the CPU)
#: and wrapping a constant.
NO_KERNEL_OPS = frozenset({"aten::_local_scalar_dense", "aten::lift_fresh"})


class _OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched that launch a kernel: views, the profiler's record-function markers and
    :data:`NO_KERNEL_OPS` left out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if not func.is_view and func.namespace == "aten" and func._schema.name not in NO_KERNEL_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(work: Callable[[], Any], calls: int = 1) -> float:
    """Aten operators that one call of ``work`` dispatches (views and :data:`NO_KERNEL_OPS` left out), averaged over
    ``calls`` calls: on a GPU each is about one kernel launch, and a launch-bound step's time is about proportional
    to them (the op floor)."""
    with _OpCounter() as counter:
        for _ in range(calls):
            work()
    return counter.count / calls


@contextlib.contextmanager
def adam_foreach(on: bool = True) -> Iterator[None]:
    """While inside, every ``torch.optim.Adam`` (AdamO included) built without an explicit ``foreach`` takes its
    foreach implementation, which torch takes by default on CUDA only: an op count on the CPU then counts the
    kernels a GPU run launches."""
    adam_module = sys.modules[th.optim.Adam.__module__]
    saved = adam_module._default_to_fused_or_foreach  # type: ignore[attr-defined]
    if on:
        adam_module._default_to_fused_or_foreach = lambda *args, **kwargs: (False, True)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        adam_module._default_to_fused_or_foreach = saved  # type: ignore[attr-defined]


def count_only(entry: Entry, device: str, seed: int) -> dict[str, Any]:
    """The flop and op floors of an entry without timing it: the arms ``A`` and ``B`` built and warmed up as
    :func:`measure` builds them, one unit of work counted."""
    counts: dict[str, dict[str, float]] = {"flops": {}, "ops": {}}
    for arm, build in (("A", entry.baseline), ("B", entry.candidate)):
        _, work = prepare(entry, build, device, seed)
        counts["flops"][arm] = count_flops(work, entry.flop_calls)
        counts["ops"][arm] = count_ops(work, entry.flop_calls)
    return dict(entry=entry.name, description=entry.description, work=entry.work, **counts,
                floor=counts["flops"]["A"] / counts["flops"]["B"] if counts["flops"]["B"] else None,
                op_floor=counts["ops"]["A"] / counts["ops"]["B"])


def _time(work: Callable[[], Any], clock: str, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="work()", globals={"work": work}, timer=CLOCKS[clock])
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def _time_learn(model: Any, steps: int) -> dict[str, float]:
    """Seconds of one ``learn(steps)`` (continuing the model's run) by every clock of :data:`CLOCKS` at once."""
    start = {clock: read() for clock, read in CLOCKS.items()}
    model.learn(steps, reset_num_timesteps=False)
    return {clock: read() - start[clock] for clock, read in CLOCKS.items()}


def isometry_optimizers(model: BaseAlgorithm) -> list[IsometryStepMixin]:
    """The optimizers of ``model`` (:func:`model_optimizers`) that carry the isometry step."""
    return [opt for opt in model_optimizers(model) if isinstance(opt, IsometryStepMixin)]


def step_efficiency_work(model: BaseAlgorithm) -> dict[str, Callable[[], Any]]:
    """Three zero-argument callables on ``model``'s isometry optimizers (see the module docstring): ``"on"`` (their
    ``step()``), ``"off"`` (the same with ``isometry_coef = 0`` in every group) and ``"matmul"`` (the two products
    with the smaller Gram matrix of every regularised weight). Empty when the model has no isometry optimizer, or
    when a regularised group has ``isometry_interval > 1`` (its ``step()`` does the products once every ``k``
    calls, so there is no per-call reference to compare it with)."""
    optimizers = isometry_optimizers(model)
    if any(g["isometry_coef"] > 0 and g["isometry_interval"] != 1 for opt in optimizers for g in opt.param_groups):
        return {}
    weights = []
    generator = th.Generator().manual_seed(0)
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is None:  # a parameter the last update did not reach: a small fixed gradient
                    p.grad = (th.randn(p.shape, generator=generator) * 1e-3).to(p.device, p.dtype)
                if opt.is_regularised(p, group):
                    weights.append(p)
    if not weights:
        return {}
    coefs = [[group["isometry_coef"] for group in opt.param_groups] for opt in optimizers]

    def on() -> None:
        for opt in optimizers:
            opt.step()

    def off() -> None:
        for opt, values in zip(optimizers, coefs):
            for group in opt.param_groups:
                group["isometry_coef"] = 0.0
            try:
                opt.step()
            finally:
                for group, value in zip(opt.param_groups, values):
                    group["isometry_coef"] = value

    def matmul() -> None:
        with th.no_grad():
            for p in weights:
                w = p.reshape(p.shape[0], -1)
                if w.shape[0] >= w.shape[1]:
                    w @ (w.T @ w)
                else:
                    (w @ w.T) @ w

    return {"on": on, "off": off, "matmul": matmul}


def measure_step_efficiency(model: BaseAlgorithm, rounds: int, min_run_time: float, threads: int,
                            clock: str = "cpu") -> Optional[dict[str, Any]]:
    """Rounds of interleaved timings of :func:`step_efficiency_work` (rotating order); per round the isometry part
    ``t_on - t_off`` and the efficiency ``t_mm / (t_on - t_off)``. ``None`` for a model without the step."""
    work = step_efficiency_work(model)
    if not work:
        return None
    times: dict[str, list[float]] = {name: [] for name in work}
    order = list(work)
    for r in range(rounds):
        for name in order[r % 3:] + order[: r % 3]:
            th.set_num_threads(threads)
            times[name].append(_time(work[name], clock, min_run_time))
    parts = [on - off for on, off in zip(times["on"], times["off"])]
    efficiency = [mm / part if part > 0 else float("nan") for mm, part in zip(times["matmul"], parts)]
    return dict(clock=clock, times=times, isometry_part=parts, efficiency=efficiency,
                median_efficiency=statistics.median(efficiency),
                median_step_over_matmul=statistics.median(part / mm for part, mm in zip(parts, times["matmul"])))


def measure(entry: Entry, rounds: int, min_run_time: float, threads: int, device: str, seed: int,
            whole_run: int = 0, log: Callable[[str], None] = print, step_efficiency: bool = False,
            compile: str = "off") -> dict[str, Any]:
    """Rounds of interleaved timings of the arms ``A``, ``A'`` and ``B`` (see the module docstring)."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    if compile != "off" and (whole_run or entry.work != "train" or step_efficiency):
        raise ValueError(f"{entry.name}: --compile times train-step entries only (work 'train', no --whole-run, "
                         "no --step-efficiency)")
    arms = {}
    for arm, build in (("A", entry.baseline), ("A'", entry.baseline), ("B", entry.candidate)):
        th.set_num_threads(threads)
        arms[arm] = prepare(entry, build, device, seed)
    if whole_run:  # the floor of a whole run: the flops of one learn(whole_run), rollouts included (also a warm-up)
        flops = {arm: count_flops(lambda m=model: m.learn(whole_run, reset_num_timesteps=False))
                 for arm, (model, _) in arms.items() if arm != "A'"}
        arms["A'"][0].learn(whole_run, reset_num_timesteps=False)  # the control arm gets the same warm-up
    else:
        flops = {arm: count_flops(work, entry.flop_calls) for arm, (_, work) in arms.items() if arm != "A'"}
        ops = {arm: count_ops(work, entry.flop_calls) for arm, (_, work) in arms.items() if arm != "A'"}
    compiled_arms = {"off": (), "candidate": ("B",), "all": ("A", "A'", "B")}[compile]
    if compiled_arms:
        import torch._dynamo

        # the arms' models share code objects (Adam.step, the policy's methods): one cache entry per model and
        # step-count specialisation, more than torch's default limit of 8 with SAC's three optimizers per model
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
        for arm in compiled_arms:
            th.set_num_threads(threads)
            compile_train_step(arms[arm][0])
            calls = warm_up_compiled(arms[arm][1])
            log(f"  {arm}: compiled, warm after {calls} calls")
    graphs_before = compiled_graphs()
    times: dict[str, dict[str, list[float]]] = {arm: {clock: [] for clock in CLOCKS} for arm in arms}
    order = list(arms)
    for r in range(rounds):
        for arm in order[r % 3:] + order[: r % 3]:
            model, work = arms[arm]
            if whole_run:  # one learn() per arm and round, read by both clocks
                th.set_num_threads(threads)
                for clock, seconds in _time_learn(model, whole_run).items():
                    times[arm][clock].append(seconds / whole_run)
                continue
            for clock in CLOCKS:
                th.set_num_threads(threads)
                times[arm][clock].append(_time(work, clock, min_run_time))
        log(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{arm} {times[arm]['cpu'][-1] * 1e3:.2f} ms" for arm in arms) + " (cpu)")
    result: dict[str, Any] = dict(entry=entry.name, description=entry.description, target=entry.target,
                                  work="learn" if whole_run else entry.work, whole_run_steps=whole_run,
                                  flops=flops, times=times, compile=compile, compiled_arms=list(compiled_arms))
    if compiled_arms:
        result["compiled_during_rounds"] = compiled_graphs() - graphs_before
        if result["compiled_during_rounds"]:
            log(f"  WARNING: {result['compiled_during_rounds']} graphs were compiled during the timed rounds")
    result["floor"] = flops["A"] / flops["B"] if flops["B"] else None
    if not whole_run:
        result["ops"] = ops
        result["op_floor"] = ops["A"] / ops["B"]
    for clock in CLOCKS:
        a, a2, b = (times[arm][clock] for arm in ("A", "A'", "B"))
        ratios = [x / y for x, y in zip(a, b)]
        controls = [x / y for x, y in zip(a, a2)]
        band = math.exp(max(abs(math.log(c)) for c in controls))
        median = statistics.median(ratios)
        result[clock] = dict(ratios=ratios, controls=controls, median=median, band=band,
                             verdict=verdict(median, band, entry.target))
    if step_efficiency:
        result["step_efficiency"] = measure_step_efficiency(arms["B"][0], rounds, min_run_time, threads)
        if result["step_efficiency"] is None:
            log("  step efficiency: not measured (no isometry optimizer, or isometry_interval > 1)")
    return result


def verdict(median: float, band: float, target: Optional[float]) -> str:
    """``PASS`` / ``FAIL`` where the A/A band resolves the median against the target, else ``not resolved``."""
    if target is None:
        return "-"
    if median / band >= target:
        return "PASS"
    if median * band < target:
        return "FAIL"
    return "not resolved"


def table(results: list[dict[str, Any]]) -> str:
    head = ("entry", "work", "target", "cpu ratio [min, max]", "A/A cpu [min, max]", "verdict (cpu)",
            "wall ratio", "A/A wall [min, max]", "verdict (wall)", "flop floor", "cpu / floor", "op floor")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cpu, wall = res["cpu"], res["wall"]
        floor = res["floor"]
        cells = (
            res["entry"], res["work"], "-" if res["target"] is None else f"{res['target']:.2f}",
            f"{cpu['median']:.3f} [{min(cpu['ratios']):.3f}, {max(cpu['ratios']):.3f}]",
            f"[{min(cpu['controls']):.3f}, {max(cpu['controls']):.3f}]", cpu["verdict"],
            f"{wall['median']:.3f}", f"[{min(wall['controls']):.3f}, {max(wall['controls']):.3f}]", wall["verdict"],
            "-" if floor is None else f"{floor:.3f}", "-" if floor is None else f"{cpu['median'] / floor:.3f}",
            f"{res['op_floor']:.3f}" if res.get("op_floor") else "-",
        )
        lines.append("| " + " | ".join(cells) + " |")
    efficiency = [res for res in results if res.get("step_efficiency")]
    if efficiency:
        lines += ["", "| entry | step() on, ms | step() off, ms | isometry part, ms | its products, ms | "
                  "part / products (median) |", "|---|---|---|---|---|---|"]
        for res in efficiency:
            eff = res["step_efficiency"]
            med = {k: statistics.median(v) * 1e3 for k, v in eff["times"].items()}
            lines.append(f"| {res['entry']} | {med['on']:.3f} | {med['off']:.3f} | "
                         f"{statistics.median(eff['isometry_part']) * 1e3:.3f} | {med['matmul']:.3f} | "
                         f"{eff['median_step_over_matmul']:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(REGISTRY), help="entries to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per entry (default 7)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per blocked_autorange (default 1)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--whole-run", type=int, default=0, metavar="STEPS",
                        help="time learn(STEPS) per arm and round instead of one unit of work")
    parser.add_argument("--step-efficiency", action="store_true",
                        help="also time the candidate's isometry step against its bare matrix products")
    parser.add_argument("--compile", choices=COMPILE_MODES, default="off",
                        help="torch.compile the train step of the candidate or of every arm (default off)")
    parser.add_argument("--count-only", action="store_true",
                        help="count the flop and op floors of the entries, time nothing")
    parser.add_argument("--adam-foreach", action="store_true",
                        help="every Adam takes its foreach implementation (torch's default on CUDA): with "
                             "--count-only on the CPU, the op count of a GPU run")
    parser.add_argument("--json", help="write every timing and ratio to this file")
    args = parser.parse_args(argv)
    if args.list:
        for name, entry in REGISTRY.items():
            print(f"{name:28s} {entry.work:8s} target {entry.target}  {entry.description}")
        return 0
    if args.adam_foreach and not args.count_only:
        parser.error("--adam-foreach counts a GPU run's kernels on the CPU: it goes with --count-only")
    if args.count_only:
        counted = []
        print("| entry | work | flops A | flops B | flop floor | ops A | ops B | op floor |")
        print("|---|---|---|---|---|---|---|---|")
        for name in args.only or list(REGISTRY):
            with adam_foreach(args.adam_foreach):
                res = count_only(REGISTRY[name], args.device, args.seed)
            counted.append(res)
            floor = "-" if res["floor"] is None else f"{res['floor']:.3f}"
            print(f"| {name} | {res['work']} | {res['flops']['A']:.4g} | {res['flops']['B']:.4g} | {floor} | "
                  f"{res['ops']['A']:g} | {res['ops']['B']:g} | {res['op_floor']:.3f} |", flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(argv=sys.argv[1:], torch=th.__version__, device=args.device,
                               adam_foreach=args.adam_foreach, results=counted), fh, indent=1)
        return 0
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2 (the A/A band needs rounds), got {args.rounds}")
    if args.device.startswith("cuda") and not th.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available")
    names = args.only or list(REGISTRY)
    where = th.cuda.get_device_name(args.device) if args.device.startswith("cuda") else ""
    results: list[dict[str, Any]] = []

    def dump(complete: bool) -> None:  # after every entry, so that a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(argv=sys.argv[1:], torch=th.__version__, device=args.device, device_name=where,
                               complete=complete, results=results), fh, indent=1)

    for name in names:
        print(f"{name}: {REGISTRY[name].description}", flush=True)
        results.append(measure(REGISTRY[name], args.rounds, args.min_run_time, args.threads, args.device, args.seed,
                               args.whole_run, log=lambda msg: print(msg, flush=True),
                               step_efficiency=args.step_efficiency, compile=args.compile))
        dump(complete=False)
    print()
    print(f"torch {th.__version__}, {where or platform.processor() or platform.machine()}, threads {args.threads}, "
          f"device {args.device}, rounds {args.rounds}" + (f", learn({args.whole_run})" if args.whole_run else "")
          + (f", compiled arms: {args.compile}" if args.compile != "off" else ""))
    print(table(results))
    dump(complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
