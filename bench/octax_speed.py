"""Steps per second of the Octax adapter (``sb3_plastic.envs.octax``) on this machine, against MinAtar for scale.

For each game the script builds the env, times the first ``reset`` + ``step`` (emulator start-up and JIT
compilation), warms up, then times ``--steps`` single-env steps with pre-drawn uniform random actions
(resetting at episode ends, which is part of the cost), best of ``--repeats``. Rows:

* ``octax raw``: Octax's own functional API in a Python loop (``env.step`` jitted, observation fetched to
  NumPy every step): the floor for any single-env adapter;
* ``OctaxEnv``: ``sb3_plastic/Octax-<Game>-v0``, with its ratio to ``octax raw``;
* ``PermutedOctax`` / ``SwitchingOctax``: the non-stationary wrappers, with their ratio to ``OctaxEnv``
  (``change_every=1000`` so that changes happen during the run);
* ``octax vmap xB`` (``--vmap B``, 0 to skip): ``B`` copies stepped as one ``jax.vmap``-ed call, env steps
  (copies x calls) per second: what a JAX-vectorised env would reach on this device;
* ``MinAtar``: ``MinAtar/Breakout-v1`` (gymnasium API, same loop), the scale of a cheap CPU env.

Examples::

    python bench/octax_speed.py --quick             # brix + pong, ~1 minute
    python bench/octax_speed.py                     # brix, pong, tetris, 5000 steps, 3 repeats
    python bench/octax_speed.py --games brix worm --steps 20000 --vmap 256

JAX runs on its default device (CPU unless a CUDA jax is installed; ``JAX_PLATFORMS=cpu`` forces CPU).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np


def time_loop(
    reset: Callable[[], None], step: Callable[[int], bool], actions: np.ndarray, repeats: int
) -> tuple[float, float]:
    """Best steps/s in wall-clock and in process CPU time over ``repeats`` runs of ``len(actions)`` steps.

    ``step`` returns True at episode ends (then ``reset`` runs, inside the timing). CPU time (all threads
    of this process) is the less load-sensitive number on a shared machine.
    """
    best_wall = best_cpu = 0.0
    for _ in range(repeats):
        reset()
        wall, cpu = time.perf_counter(), time.process_time()
        for action in actions:
            if step(int(action)):
                reset()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best_wall, best_cpu = max(best_wall, len(actions) / wall), max(best_cpu, len(actions) / max(cpu, 1e-9))
    return best_wall, best_cpu


def gym_loop(env: gym.Env, actions: np.ndarray, repeats: int) -> tuple[float, float]:
    def step(action: int) -> bool:
        _, _, terminated, truncated, _ = env.step(action)
        return terminated or truncated

    return time_loop(lambda: env.reset(seed=0), step, actions, repeats)


def bench_game(game: str, args: argparse.Namespace, rows: list[tuple[str, str, tuple[float, float], str]]) -> None:
    import jax

    from sb3_plastic.envs.octax import OctaxEnv, make_permuted_octax, make_switching_octax

    start = time.perf_counter()
    env = OctaxEnv(game)
    built = time.perf_counter() - start
    start = time.perf_counter()
    env.reset(seed=0)
    env.step(0)
    compiled = time.perf_counter() - start
    rng = np.random.default_rng(0)
    actions = rng.integers(env.action_space.n, size=args.steps)
    gym_loop(env, actions[: args.steps // 10], 1)  # warm-up
    print(f"{game}: emulator start-up {built:.1f} s, first reset+step (JIT compile) {compiled:.1f} s", flush=True)

    # octax's own API, same loop
    raw = env._game.env
    state_box: list = [None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # jax dtype warnings while octax's step is traced

        def raw_reset() -> None:
            state_box[0], _, _ = raw.reset(jax.random.PRNGKey(0))

        def raw_step(action: int) -> bool:
            state, obs, _, terminated, truncated, _ = raw.step(state_box[0], action)
            state_box[0] = state
            np.asarray(obs)
            return bool(terminated) or bool(truncated)

        raw_reset()
        raw_step(0)
        raw_sps = time_loop(raw_reset, raw_step, actions, args.repeats)
    rows.append((game, "octax raw", raw_sps, ""))
    env_sps = gym_loop(env, actions, args.repeats)
    rows.append((game, "OctaxEnv", env_sps, ratio(env_sps, raw_sps, "raw")))

    permuted = make_permuted_octax(game, change_every=1000)
    sps = gym_loop(permuted, actions, args.repeats)
    rows.append((game, "PermutedOctax", sps, ratio(sps, env_sps, "OctaxEnv")))
    switching = make_switching_octax([game, game], change_every=1000)  # same game twice: same per-step work
    sps = gym_loop(switching, np.minimum(actions, switching.action_space.n - 1), args.repeats)
    rows.append((game, "SwitchingOctax", sps, ratio(sps, env_sps, "OctaxEnv")))

    if args.vmap > 0:
        batch = args.vmap
        keys = jax.random.split(jax.random.PRNGKey(0), batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            v_reset = jax.jit(jax.vmap(raw.reset))
            v_step = jax.jit(jax.vmap(raw.step))
            states, _, _ = v_reset(keys)
            batch_actions = jax.numpy.asarray(rng.integers(env.action_space.n, size=(batch,)), dtype=jax.numpy.int32)
            states, obs, *_ = v_step(states, batch_actions)
            jax.block_until_ready(obs)
        n_calls = max(10, args.steps // batch)
        best_wall = best_cpu = 0.0
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n_calls):
                states, obs, *_ = v_step(states, batch_actions)  # no auto-reset: a throughput measurement
            jax.block_until_ready(obs)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best_wall, best_cpu = max(best_wall, n_calls * batch / wall), max(best_cpu, n_calls * batch / cpu)
        rows.append((game, f"octax vmap x{batch}", (best_wall, best_cpu), ratio((best_wall, best_cpu), raw_sps, "raw")))


def ratio(a: tuple[float, float], b: tuple[float, float], name: str) -> str:
    """``a / b`` in wall-clock and CPU time."""
    return f"{a[0] / b[0]:.2f} / {a[1] / b[1]:.2f} x {name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="brix and pong, 1000 steps, 2 repeats, vmap 64")
    parser.add_argument("--games", nargs="+", default=None, help="Octax games (default: brix pong tetris)")
    parser.add_argument("--steps", type=int, default=5000, help="timed env steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (best is kept)")
    parser.add_argument("--vmap", type=int, default=64, help="batch size of the vmap row (0: skip)")
    args = parser.parse_args()
    if args.quick:
        args.games = args.games or ["brix", "pong"]
        args.steps, args.repeats = min(args.steps, 1000), 2
    args.games = args.games or ["brix", "pong", "tetris"]

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.steps} steps x {args.repeats} repeats", flush=True)
    rows: list[tuple[str, str, tuple[float, float], str]] = []
    for game in args.games:
        bench_game(game, args, rows)

    import minatar.gym

    minatar.gym.register_envs()
    minatar_env = gym.make("MinAtar/Breakout-v1")
    actions = np.random.default_rng(0).integers(minatar_env.action_space.n, size=max(args.steps, 20_000))
    gym_loop(minatar_env, actions[:1000], 1)
    minatar_sps = gym_loop(minatar_env, actions, args.repeats)
    rows.append(("breakout", "MinAtar", minatar_sps, ""))

    print(f"\n{'game':<10} {'env':<18} {'steps/s wall':>12} {'steps/s CPU':>12}  ratio (wall / CPU)")
    for game, name, (wall, cpu), text in rows:
        print(f"{game:<10} {name:<18} {wall:>12.0f} {cpu:>12.0f}  {text}")
    octax_cpu = [cpu for _, name, (_, cpu), _ in rows if name == "OctaxEnv"]
    slow, fast = minatar_sps[1] / max(octax_cpu), minatar_sps[1] / min(octax_cpu)
    print(f"\nOctaxEnv (single env) is {slow:.0f}-{fast:.0f}x slower than MinAtar here (CPU time).")


if __name__ == "__main__":
    main()
