"""Overhead of the plastic algorithms against plain Stable-Baselines3 (issue 2).

Every benchmark is an entry of :data:`REGISTRY`: a named pair of factories, the *baseline* (plain SB3)
and the *candidate* (a plastic algorithm) on the same env, the same network and the same
hyperparameters. For each entry the script builds both models, warms both up (this also fills the
rollout / replay buffers), then runs ``--repeats`` interleaved repetitions A/B/A/B of
``model.learn(steps, reset_num_timesteps=False)``. ``model.train`` is wrapped with a timer, so one
``learn()`` call gives three numbers per arm:

* ``learn fps``: env steps per wall-clock second of the whole ``learn()`` (rollout + train);
* ``train() speed``: the time spent inside ``train()`` (the part AdamO changes);
* ``rollout speed``: the rest (env stepping, action selection, buffer writes): the same work in both arms
  apart from the candidate's forward pass (and the episodes its actions lead to), so with the same network
  this ratio should be ~1 and shows how noisy the machine was.

Each repetition gives a ratio candidate/baseline (speed per env step, higher is better:
``fps_cand / fps_base`` and ``time_base / time_cand``). The table reports, per metric, the median ratio over
the repetitions with their min / max (wall clock; PASS/FAIL uses this median), the median of the same ratios
measured in process CPU time, and ``best/best``, the best baseline time over the best candidate time (other
load only ever adds time, so these two are the least sensitive to it). The individual ratios follow the
table; absolute numbers are printed only as context, never as the result. The exit status is 1 when an entry
with a target misses it.

Threads: ``--threads`` (default 1) is applied with ``torch.set_num_threads`` before every timed run of both
arms. On a shared 2-core machine 2 threads made the same ops up to 10x slower and far noisier.

Examples::

    python bench/overhead.py --quick                 # every quick entry, <= ~2 minutes
    python bench/overhead.py --only ppo-cnn-relu     # full mode, one entry
    python bench/overhead.py --repeats 7 --threads 1 --json /tmp/overhead.json
    python bench/overhead.py --list

Adding a benchmark: write two factories ``(ctx: Context) -> BaseAlgorithm`` (same env, network and
hyperparameters; ``ctx.mode`` may shorten rollouts for ``--quick``) and call :func:`register` with an
:class:`Entry` giving the warm-up / per-repetition env steps of each mode and, optionally, a target.
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
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC

MODES = ("quick", "full")
METRICS = ("learn fps", "train() speed", "rollout speed")


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


@dataclass(frozen=True)
class Entry:
    """One benchmark: ``candidate`` against ``baseline``.

    :param target: the ``learn fps`` ratio the candidate must reach (``None``: informational only).
    :param in_quick: whether ``--quick`` runs this entry (``--only`` runs it in any case).
    """

    name: str
    description: str
    baseline: Factory
    candidate: Factory
    steps: dict[str, Steps]
    target: Optional[float] = None
    in_quick: bool = True
    notes: str = ""


REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    if entry.name in REGISTRY:
        raise ValueError(f"duplicate benchmark name {entry.name!r}")
    if set(entry.steps) != set(MODES):
        raise ValueError(f"{entry.name}: steps must give {MODES}, got {sorted(entry.steps)}")
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

register(Entry(
    name="ppo-cnn-relu",
    description="PlasticPPO CnnPolicy relu, AdamO+isometry 1e-3 (decoupled) with the exact per-update isometry step "
    "(isometry_interval=1) vs PPO CnnPolicy, Breakout 84x84x4",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_coef=1e-3, isometry_mode="decoupled", isometry_interval=1),
    steps=PPO_STEPS,
    target=0.95,
))
register(Entry(
    name="ppo-cnn-relu-k4",
    description="as ppo-cnn-relu with isometry_interval=4 (the isometry step every 4th update, 4x as large; the "
    "plastic algorithms' default)",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="relu", isometry_coef=1e-3, isometry_interval=4),
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
    description="PlasticPPO CnnPolicy maxmin (orthogonal init), AdamO+isometry 1e-3 vs PPO CnnPolicy, Breakout",
    baseline=ppo_atari(PPO),
    candidate=ppo_atari(PlasticPPO, activation="maxmin", isometry_coef=1e-3, isometry_mode="decoupled"),
    steps=PPO_STEPS,
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


register(Entry(
    name="dqn-mlp-relu",
    description="PlasticDQN MlpPolicy [256,256] relu, AdamO+isometry 1e-3 vs DQN, CartPole-v1 (zoo hyperparameters)",
    baseline=dqn_cartpole(DQN),
    candidate=dqn_cartpole(PlasticDQN, activation="relu", isometry_coef=1e-3),
    steps={"quick": Steps(512, 768), "full": Steps(512, 4096)},
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


register(Entry(
    name="dqn-cnn-relu",
    description="PlasticDQN CnnPolicy relu, AdamO+isometry 1e-3 vs DQN CnnPolicy, Breakout (zoo hyperparameters)",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(PlasticDQN, activation="relu", isometry_coef=1e-3),
    steps={"quick": Steps(600, 200), "full": Steps(600, 600)},
    in_quick=False,
))
register(Entry(
    name="dqn-cnn-relu-k4",
    description="as dqn-cnn-relu with isometry_interval=4 (the isometry step every 4th update, 4x as large)",
    baseline=dqn_atari(DQN),
    candidate=dqn_atari(PlasticDQN, activation="relu", isometry_coef=1e-3, isometry_interval=4),
    steps={"quick": Steps(600, 200), "full": Steps(600, 600)},
    in_quick=False,
))

# rl-zoo3's Pendulum SAC: SB3 defaults (net [256, 256], batch 256, 1 gradient step per env step), lr 1e-3.
SAC_PENDULUM = dict(learning_rate=1e-3, learning_starts=100)


def sac_pendulum(cls: type[BaseAlgorithm], **plastic: Any) -> Factory:
    def factory(ctx: Context) -> BaseAlgorithm:
        env = make_gym("Pendulum-v1", 1, ctx.seed)
        return cls("MlpPolicy", env, device=ctx.device, seed=ctx.seed, verbose=0, **SAC_PENDULUM, **plastic)

    return factory


register(Entry(
    name="sac-mlp-relu",
    description="PlasticSAC MlpPolicy [256,256] relu, AdamO+isometry 1e-3 vs SAC, Pendulum-v1",
    baseline=sac_pendulum(SAC),
    candidate=sac_pendulum(PlasticSAC, activation="relu", isometry_coef=1e-3),
    steps={"quick": Steps(120, 100), "full": Steps(200, 500)},
))


# ---------------------------------------------------------------------------------------------- measuring
@dataclass
class Arm:
    """One model under test, with ``model.train`` wrapped by a timer."""

    model: BaseAlgorithm
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
        """One timed ``learn()``: wall and CPU seconds, in total and inside train(), and env steps done."""
        th.set_num_threads(threads)
        gc.collect()
        before_steps, before_train, before_cpu = self.model.num_timesteps, self.train_seconds, self.train_cpu_seconds
        _sync(self.model.device)
        start, start_cpu = time.perf_counter(), time.process_time()
        self.model.learn(total_timesteps=steps, reset_num_timesteps=False)
        _sync(self.model.device)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        train, train_cpu = self.train_seconds - before_train, self.train_cpu_seconds - before_cpu
        return {
            "steps": self.model.num_timesteps - before_steps,
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
    ctx = Context(mode=mode, device=device, seed=seed)
    steps = entry.steps[mode]
    th.set_num_threads(threads)
    try:
        base, cand = Arm(entry.baseline(ctx)), Arm(entry.candidate(ctx))
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


# ---------------------------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x:.3f}" if x == x else "-"


def table(results: list[Result]) -> str:
    head = ("benchmark", "metric", "median", "min", "max", "cpu-time median", "best/best", "target", "status")
    rows: list[tuple[str, ...]] = []
    for res in results:
        if res.skipped is not None:
            rows.append((res.entry.name, "-", "-", "-", "-", "-", "-", "-", f"SKIP ({res.skipped})"))
            continue
        for metric in METRICS:
            values = [v for v in res.ratios[metric] if v == v]
            cpu_values = [v for v in res.cpu_ratios[metric] if v == v]
            if not values:
                rows.append((res.entry.name, metric, "-", "-", "-", "-", "-", "-", "n/a"))
                continue
            target = res.entry.target if metric == "learn fps" else None
            med = statistics.median(values)
            status = "-" if target is None else ("PASS" if med >= target else "FAIL")
            rows.append((
                res.entry.name, metric, _fmt(med), _fmt(min(values)), _fmt(max(values)),
                _fmt(statistics.median(cpu_values)) if cpu_values else "-",
                _fmt(res.best_ratios.get(metric, float("nan"))),
                ">= " + _fmt(target) if target is not None else "-", status,
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
        out.append(f"{res.entry.name}: {res.entry.description}")
        for metric in METRICS:
            out.append(
                f"  {metric:14s} ratios: " + ", ".join(_fmt(v) for v in res.ratios[metric])
                + "   (cpu time: " + ", ".join(_fmt(v) for v in res.cpu_ratios[metric]) + ")"
            )
        c = res.context
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
            tgt = f"target >= {e.target}" if e.target is not None else "no target"
            print(f"{e.name:16s} {'quick+full' if e.in_quick else 'full only':10s} {tgt:14s} {e.description}")
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
        "candidate time); > 1: the plastic algorithm is faster. median/min/max: wall clock (status uses the wall-clock "
        "median); cpu-time median: the same ratio from this process's CPU time (less sensitive to other load); "
        "best/best: best baseline time / best candidate time over the repetitions (least sensitive to other load)"
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
                    "skipped": r.skipped, "target": r.entry.target, "ratios": r.ratios, "cpu_ratios": r.cpu_ratios,
                    "best_ratios": r.best_ratios,
                    "context": r.context,
                }
                for r in results
            },
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
    failed = any(
        r.skipped is None and r.entry.target is not None and statistics.median(r.ratios["learn fps"]) < r.entry.target
        for r in results
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
