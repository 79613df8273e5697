"""Steps per second of each sb3_plastic non-stationary env against its base env (random actions).

Each pair is measured in interleaved A/B repetitions (within a repetition the two envs alternate in
10 chunks, the order flipping from chunk to chunk; both envs stay alive and warm), timed in CPU seconds of
the stepping thread (robust on a shared machine), and the median of the per-repetition ratios
wrapped/base is printed (target >= 0.9). Both envs are made with ``gym.make`` (the same env-checker /
order-enforcing wrappers) and step the same pre-drawn random actions, resetting at episode ends. Tasks
change during the measurement (``change_every`` below), so the measured path includes the permuted /
switched / re-frictioned case:

* Slippery<Robot>-v0 vs <Robot>-v5 (friction redrawn at the next episode end after 1000 steps);
* PermutedMinAtar-<Game>-v0 vs MinAtar/<Game>-v0 (a new permutation every 1000 steps);
* SwitchingMinAtar-v0 vs the five MinAtar/<Game>-v0 envs stepped in the same cycle by hand;
* SwitchingAtari-v0 vs the same per-game ALE + AtariPreprocessing + FrameStackObservation(4) stacks
  stepped in the same cycle by hand (the overhead of switching alone).

    python bench/env_speed.py --quick        # <= 2 minutes
    python bench/env_speed.py                # longer runs, more repetitions
    python bench/env_speed.py --only MinAtar # a subset (substring of the env name)
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import minatar.gym
import numpy as np

import sb3_plastic.envs  # noqa: F401  (registers the sb3_plastic/ ids)

minatar.gym.register_envs()

MINATAR = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]
ATARI = ["Breakout", "Pong", "SpaceInvaders"]
CHANGE_EVERY = 1000  # permutations / frictions: several changes inside every measurement
SWITCH_EVERY = {"minatar": 2000, "atari": 200}  # env steps per game while switching


class CyclingBase:
    """The base of a switching env: the same games stepped by hand, switching game every ``change_every`` steps."""

    def __init__(self, envs: list[gym.Env], change_every: int) -> None:
        self.envs, self.change_every = envs, change_every
        self.index, self.steps = 0, 0
        self.action_space = envs[0].action_space

    def reset(self, seed: Any = None) -> Any:
        return self.envs[self.index].reset(seed=seed)

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.envs[self.index].step(action)
        self.steps += 1
        if self.steps % self.change_every == 0:  # the game is over: the runner resets into the next one
            self.index = (self.index + 1) % len(self.envs)
            truncated = True
        return obs, reward, terminated, truncated, info


def base_atari_game(game: str) -> gym.Env:
    env = gym.make(f"ALE/{game}-v5", frameskip=1, full_action_space=True, obs_type="grayscale")
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, 4)


def pairs() -> list[tuple[str, str, str, Callable[[], Any], Callable[[], Any]]]:
    """(name, base name, family, make wrapped, make base)."""
    out: list[tuple[str, str, str, Callable[[], Any], Callable[[], Any]]] = []
    for robot in ("HalfCheetah", "Ant"):
        out.append((f"Slippery{robot}-v0", f"{robot}-v5", "mujoco",
                    lambda r=robot: gym.make(f"sb3_plastic/Slippery{r}-v0", change_every=CHANGE_EVERY),
                    lambda r=robot: gym.make(f"{r}-v5")))
    for game in MINATAR:
        out.append((f"PermutedMinAtar-{game}-v0", f"MinAtar/{game}-v0", "minatar",
                    lambda g=game: gym.make(f"sb3_plastic/PermutedMinAtar-{g}-v0", change_every=CHANGE_EVERY),
                    lambda g=game: gym.make(f"MinAtar/{g}-v0")))
    every = SWITCH_EVERY["minatar"]
    out.append(("SwitchingMinAtar-v0", "5 x MinAtar/<Game>-v0 cycled", "minatar",
                lambda: gym.make("sb3_plastic/SwitchingMinAtar-v0", change_every=every),
                lambda: CyclingBase([gym.make(f"MinAtar/{g}-v0") for g in MINATAR], every)))
    every = SWITCH_EVERY["atari"]
    out.append(("SwitchingAtari-v0", "3 x ALE/<Game>-v5 stack cycled", "atari",
                lambda: gym.make("sb3_plastic/SwitchingAtari-v0", change_every=every, games=ATARI),
                lambda: CyclingBase([base_atari_game(g) for g in ATARI], every)))
    return out


def draw_actions(space: gym.Space, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return [int(a) for a in rng.integers(space.start, space.start + space.n, size=n)]
    return list(rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype))


def run_steps(env: Any, actions: list) -> float:
    """Step through ``actions`` (resetting at episode ends); return the CPU time of this thread it took.

    CPU time rather than wall time: the benchmark machine may be shared, and a thread's CPU time does not
    count the time it waits for a core."""
    step, reset = env.step, env.reset
    start = time.thread_time()
    for action in actions:
        _, _, terminated, truncated, _ = step(action)
        if terminated or truncated:
            reset()
    return time.thread_time() - start


def measure(make_wrapped: Callable[[], Any], make_base: Callable[[], Any], n_steps: int, reps: int,
            chunks: int = 10) -> dict[str, float]:
    """Median over ``reps`` repetitions of the ratio wrapped/base steps per CPU-second; within a repetition the
    two envs alternate in ``chunks`` chunks (ABAB... or BABA...), so slow drifts of the machine hit both."""
    wrapped, base = make_wrapped(), make_base()
    actions = draw_actions(wrapped.action_space, n_steps)
    size = max(1, n_steps // chunks)
    parts = [actions[i:i + size] for i in range(0, n_steps, size)]
    for env in (wrapped, base):
        env.reset(seed=0)
        run_steps(env, parts[0])  # warm-up
    ratios, wrapped_sps, base_sps = [], [], []
    for rep in range(reps):
        seconds = {"w": 0.0, "b": 0.0}
        for i, part in enumerate(parts):
            order = [("w", wrapped), ("b", base)] if (rep + i) % 2 == 0 else [("b", base), ("w", wrapped)]
            for key, env in order:
                seconds[key] += run_steps(env, part)
        wrapped_sps.append(n_steps / seconds["w"])
        base_sps.append(n_steps / seconds["b"])
        ratios.append(wrapped_sps[-1] / base_sps[-1])
    for env in (wrapped, base):
        for inner in getattr(env, "envs", [env]):
            inner.close()
    return {"base": statistics.median(base_sps), "wrapped": statistics.median(wrapped_sps),
            "ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (the whole table in <= 2 minutes)")
    parser.add_argument("--reps", type=int, default=None, help="A/B repetitions per env (default 5 quick, 9 full)")
    parser.add_argument("--only", default="", help="measure only envs whose name contains this substring")
    args = parser.parse_args()
    steps = {"mujoco": 1_500, "minatar": 8_000, "atari": 300} if args.quick else \
        {"mujoco": 10_000, "minatar": 50_000, "atari": 2_000}
    reps = args.reps or (5 if args.quick else 9)
    warnings.simplefilter("ignore")
    print(f"reps={reps}, steps per repetition and env: {steps}, random actions, steps per CPU-second of 1 thread\n")
    print("| env | base env | base steps/s | wrapped steps/s | median ratio | min-max ratio |")
    print("|---|---|---:|---:|---:|---:|")
    start = time.perf_counter()
    for name, base_name, family, make_wrapped, make_base in pairs():
        if args.only and args.only.lower() not in name.lower():
            continue
        r = measure(make_wrapped, make_base, steps[family], reps)
        print(f"| {name} | {base_name} | {r['base']:,.0f} | {r['wrapped']:,.0f} | {r['ratio']:.3f} | "
              f"{r['min']:.2f}-{r['max']:.2f} |", flush=True)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
