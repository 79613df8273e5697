"""Overhead of the PlasticityMonitor at its default settings (issue 5).

For each entry, two identical models (same algorithm, env, hyperparameters and seed) are built: arm A
trains with ``PlasticityMonitor()`` (default period and probe sizes), arm B without. Both are warmed up,
then ``--repeats`` interleaved repetitions A/B/A/B... of ``model.learn(steps, reset_num_timesteps=False)``
are timed. Each repetition gives a speed ratio ``fps_A / fps_B`` (1 = no overhead); the table reports its
median, min and max over repetitions. Because the machine may be shared and noisy, the table also reports
the monitor's *own* share of arm A's wall-clock time (the time spent inside its passes, measured by the
monitor itself, over arm A's total learn time): this share does not depend on noise in arm B.

``steps`` per repetition covers ``--periods`` monitor periods (rounded up to whole rollouts for PPO, whose
passes happen at rollout ends), so every repetition contains the same number of passes.

Modes:

* full (default): the monitor's default period (:data:`DEFAULT_EVERY`), 2 periods per repetition, 5 repetitions;
* ``--quick`` (<= ~2 minutes on a loaded 2-core machine): period 1000 steps, one pass per repetition, 3
  repetitions. Passes are then 5x more frequent than at the default period, so the fps ratio is a
  pessimistic bound; the last column projects the share at the default period from the measured cost
  of a pass and the speed of arm B: ``t_pass / (t_pass + DEFAULT_EVERY / fps_B)``.

Examples::

    python bench/monitor_overhead.py --quick
    python bench/monitor_overhead.py                 # full, at the default period
    python bench/monitor_overhead.py --every 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch as th
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_plastic.callbacks.monitor import DEFAULT_EVERY, PlasticityMonitor


@dataclass(frozen=True)
class Entry:
    name: str
    make: Callable[[int], BaseAlgorithm]
    warmup: int


ENTRIES = [
    Entry("ppo-cartpole-mlp64", lambda seed: PPO("MlpPolicy", "CartPole-v1", seed=seed), 2048),
    Entry("dqn-cartpole-mlp64", lambda seed: DQN("MlpPolicy", "CartPole-v1", learning_starts=1000, seed=seed), 2000),
]


@dataclass
class Result:
    name: str
    every: int
    steps: int
    ratios: list[float]
    fps_with: list[float]
    fps_without: list[float]
    passes: int
    monitor_seconds: float
    learn_seconds_with: float

    @property
    def share(self) -> float:
        return self.monitor_seconds / self.learn_seconds_with if self.learn_seconds_with else float("nan")

    @property
    def per_pass(self) -> float:
        return self.monitor_seconds / self.passes if self.passes else float("nan")

    @property
    def projected_share(self) -> float:
        """Share of time at the default period, from the cost of a pass and the speed without the monitor."""
        return self.per_pass / (self.per_pass + DEFAULT_EVERY / statistics.median(self.fps_without))


def _learn(model: BaseAlgorithm, steps: int, callback: Optional[PlasticityMonitor]) -> float:
    gc.collect()
    start = time.perf_counter()
    model.learn(steps, callback=callback, reset_num_timesteps=False)
    return time.perf_counter() - start


def run_entry(entry: Entry, every: int, periods: int, repeats: int, seed: int) -> Result:
    with_monitor, without = entry.make(seed), entry.make(seed)
    rollout = getattr(with_monitor, "n_steps", 1) * with_monitor.n_envs if isinstance(with_monitor, PPO) else 1
    steps = math.ceil(every * periods / rollout) * rollout
    # default settings (max_overhead included); only the period changes when asked
    monitor = PlasticityMonitor() if every == DEFAULT_EVERY else PlasticityMonitor(every=every)
    # warm-up: fills buffers, makes the first (probe-drawing) pass happen outside the timed part
    _learn(with_monitor, entry.warmup, monitor)
    _learn(without, entry.warmup, None)
    passes0, seconds0 = int(monitor.state.get("events", 0)), float(monitor.state.get("seconds", 0.0))
    ratios, fps_a, fps_b, learn_a = [], [], [], 0.0
    for _ in range(repeats):
        t_a = _learn(with_monitor, steps, monitor)
        t_b = _learn(without, steps, None)
        learn_a += t_a
        fps_a.append(steps / t_a)
        fps_b.append(steps / t_b)
        ratios.append(fps_a[-1] / fps_b[-1])
    return Result(
        entry.name,
        every,
        steps,
        ratios,
        fps_a,
        fps_b,
        int(monitor.state["events"]) - passes0,
        float(monitor.state["seconds"]) - seconds0,
        learn_a,
    )


def table(results: list[Result]) -> str:
    head = (
        "| entry | period (steps) | steps/rep | reps | fps without (median) | fps ratio with/without: median [min, max] | "
        f"passes | s/pass | monitor share of time | projected share at period {DEFAULT_EVERY:,} |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(
            f"| {r.name} | {r.every:,} | {r.steps:,} | {len(r.ratios)} | {statistics.median(r.fps_without):.0f} | "
            f"{statistics.median(r.ratios):.3f} [{min(r.ratios):.3f}, {max(r.ratios):.3f}] | {r.passes} | "
            f"{r.per_pass:.3f} | {100 * r.share:.2f} % | {100 * r.projected_share:.2f} % |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="period 1000, one pass per repetition, 3 repetitions")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repetitions (default: 3 quick, 5 full)")
    parser.add_argument("--every", type=int, default=None, help=f"monitor period (default: 1000 quick, {DEFAULT_EVERY} full)")
    parser.add_argument("--periods", type=int, default=None, help="monitor periods per repetition (default: 1 quick, 2 full)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--only", default=None, help="run only the entry with this name")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 5)
    periods = args.periods or (1 if args.quick else 2)
    every = args.every or (1000 if args.quick else DEFAULT_EVERY)
    entries = [e for e in ENTRIES if args.only in (None, e.name)]
    if not entries:
        parser.error(f"unknown entry {args.only!r}; known: {[e.name for e in ENTRIES]}")
    print(
        f"# PlasticityMonitor overhead: torch {th.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} thread(s), {'quick' if args.quick else 'full'} mode",
        flush=True,
    )
    results = []
    for entry in entries:
        start = time.perf_counter()
        results.append(run_entry(entry, every, periods, repeats, args.seed))
        print(f"# {entry.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
