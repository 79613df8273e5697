"""Cost of the interventions of issue 3, as ratios against the same run without them.

1. FIRE: one call (Newton–Schulz on every layer of NatureCNN + heads, optimizer-state reset, target
   sync) on PlasticPPO("CnnPolicy"), as a fraction of the time a 1M-step run of the same model takes
   on this machine, estimated from the fps of ``learn()`` measured in the same process. Target < 1 %.
2. Continual Backprop: fps of ``learn()`` with ``ContinualBackprop`` against the same algorithm without
   it (PPO MLP on CartPole, PPO NatureCNN on 84x84x4 images, DQN MLP, SAC MLP), interleaved A/B
   repetitions, median ratio. Target >= 0.90.

The image env is SB3's ``FakeImageEnv`` (random 84x84x4 frames): it costs almost nothing to step, so
the network dominates the run time and FIRE's fraction is an upper bound for a real Atari run.

    python bench/interventions.py --quick        # <= ~2 minutes
    python bench/interventions.py                # longer runs, more repetitions
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch as th
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.envs import FakeImageEnv

from sb3_plastic import FIRE, ContinualBackprop, PlasticPPO


def image_env() -> FakeImageEnv:
    return FakeImageEnv(screen_height=84, screen_width=84, n_channels=4, discrete=True)


def timed_learn(model: BaseAlgorithm, steps: int, callback=None) -> float:
    """Env steps per second of one ``learn`` call (the model is warmed up before)."""
    start = time.perf_counter()
    model.learn(steps, callback=callback, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def fire_fraction(steps: int, calls: int) -> dict[str, float]:
    model = PlasticPPO("CnnPolicy", image_env(), n_steps=256, batch_size=64, n_epochs=4, seed=0)
    model.learn(256)  # warm-up
    fps = timed_learn(model, steps)
    fire = FIRE(at=0.5)
    fire.init_callback(model)
    fire._on_training_start()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        fire._fire(["bench"])  # the surgery the callback performs when a trigger is due
        seconds.append(time.perf_counter() - start)
    one_fire = statistics.median(seconds)
    run_1m = 1_000_000 / fps
    return {"fps": fps, "fire_seconds": one_fire, "run_1m_seconds": run_1m, "fraction": one_fire / run_1m}


Factory = Callable[[], BaseAlgorithm]

CBP_CASES: dict[str, tuple[Factory, int]] = {
    "ppo-mlp-cartpole": (lambda: PPO("MlpPolicy", "CartPole-v1", seed=0), 2048),
    "ppo-cnn-84x84": (lambda: PPO("CnnPolicy", image_env(), n_steps=256, batch_size=64, n_epochs=4, seed=0), 512),
    "dqn-mlp-cartpole": (lambda: DQN("MlpPolicy", "CartPole-v1", learning_starts=100, seed=0), 2000),
    "sac-mlp-pendulum": (lambda: SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, seed=0), 400),
}


def cbp_ratio(factory: Factory, steps: int, repeats: int) -> list[float]:
    base, cand = factory(), factory()
    cbp = ContinualBackprop(replacement_rate=1e-4, maturity_threshold=100)
    base.learn(steps // 4)
    cand.learn(steps // 4, callback=cbp)
    ratios = []
    for _ in range(repeats):
        fps_base = timed_learn(base, steps)
        fps_cand = timed_learn(cand, steps, callback=cbp)
        ratios.append(fps_cand / fps_base)
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (<= ~2 minutes)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both arms")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    scale = 1 if args.quick else 4
    repeats = args.repeats or (3 if args.quick else 5)

    fire = fire_fraction(steps=512 * scale, calls=3)
    print("FIRE: one call on PlasticPPO NatureCNN + heads vs a 1M-step run of the same model")
    print(f"  learn fps {fire['fps']:.0f}; one FIRE {fire['fire_seconds']:.3f} s; 1M steps ~ {fire['run_1m_seconds']:.0f} s")
    verdict = "PASS" if fire["fraction"] < 0.01 else "FAIL"
    print(f"  fraction of the run: {100 * fire['fraction']:.4f} %  (target < 1 %)  {verdict}")
    print()
    print("Continual Backprop (rate 1e-4, maturity 100): fps ratio with / without, interleaved repetitions")
    print("| case | steps/rep | median ratio | min | max | target | verdict |\n|---|---:|---:|---:|---:|---:|---|")
    for name, (factory, steps) in CBP_CASES.items():
        ratios = cbp_ratio(factory, steps * scale // (2 if args.quick else 1), repeats)
        med = statistics.median(ratios)
        print(f"| {name} | {steps * scale // (2 if args.quick else 1)} | {med:.3f} | {min(ratios):.3f} | {max(ratios):.3f} "
              f"| 0.90 | {'PASS' if med >= 0.90 else 'FAIL'} |")


if __name__ == "__main__":
    main()
