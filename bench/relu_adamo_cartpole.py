"""Why ReLU + AdamO learns CartPole from scratch more slowly than plain PPO (issue #27's quick check).

CartPole-v1 with the PPO settings of bench/continual.py's ``cartpole_obs`` (8 envs, n_steps 32, batch 256, 20 epochs,
lr 1e-3, gamma 0.98, GAE 0.8, [64, 64]), 100k steps, score = mean return of the last 100 episodes, seeds 0 1 2. Arms:
SB3's PPO (ReLU, Adam) and PlasticPPO with ReLU + AdamO at ``isometry_coef`` 0.2 (the authors' convention; 0.1 before
issue #27) on every hidden layer, without the two 64 x 4 input layers, with ``isometry_rect_scale``, with
``isometry_scale=2`` and with both. Per run it also records the singular values of the policy's input layer
``mlp_extractor.policy_net.0.weight`` (64 x 4) at the end.

    python bench/relu_adamo_cartpole.py                    # ~20 s per run on one core
    python bench/relu_adamo_cartpole.py --arms ppo rect --seeds 0

Output: ``bench/results/isometry_convention/relu_adamo_cartpole.json`` (one entry per arm and seed; a finished entry
is not rerun) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

SECOND_LAYERS = ["mlp_extractor.policy_net.2.*", "mlp_extractor.value_net.2.*"]
#: arm -> PlasticPPO keywords (``None``: SB3's PPO with ReLU)
ARMS: dict[str, Any] = {
    "ppo": None,
    "adamo": {},
    "adamo_no_input": dict(isometry_layers=SECOND_LAYERS),
    "rect": dict(isometry_rect_scale=True),
    "s2": dict(isometry_scale=2.0),
    "s2_rect": dict(isometry_scale=2.0, isometry_rect_scale=True),
}
PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3, clip_range=0.2,
           ent_coef=0.0)
OUT = os.path.join("bench", "results", "isometry_convention", "relu_adamo_cartpole.json")


def run(arm: str, seed: int, steps: int, coef: float) -> dict[str, Any]:
    """Train one arm from seed ``seed``; its score and the input layer's singular values."""
    import torch as th
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_plastic import PlasticPPO

    th.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    policy_kwargs = dict(net_arch=[64, 64])
    start = time.process_time()
    if ARMS[arm] is None:
        model = SB3PPO("MlpPolicy", env, seed=seed, policy_kwargs=dict(policy_kwargs, activation_fn=th.nn.ReLU), **PPO)
    else:
        model = PlasticPPO("MlpPolicy", env, seed=seed, activation="relu", isometry_coef=coef,
                           policy_kwargs=policy_kwargs, **ARMS[arm], **PPO)
    model.learn(steps)
    weight = model.policy.mlp_extractor.policy_net[0].weight.detach()
    return {
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "isometry_coef": None if ARMS[arm] is None else coef,
        "score": float(np.mean([e["r"] for e in model.ep_info_buffer])),
        "input_singular_values": [round(float(v), 4) for v in th.linalg.svdvals(weight)],
        "cpu_seconds": time.process_time() - start,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--isometry-coef", type=float, default=0.2)
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    results = json.load(open(args.out)) if os.path.exists(args.out) else []
    done = {(r["arm"], r["seed"], r["steps"], r["isometry_coef"]) for r in results}
    for arm in args.arms:
        for seed in args.seeds:
            key = (arm, seed, args.steps, None if ARMS[arm] is None else args.isometry_coef)
            if key in done:
                continue
            results.append(run(arm, seed, args.steps, args.isometry_coef))
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
            print(json.dumps(results[-1]), flush=True)
    print("| arm | scores (seeds) | mean | input-layer singular values (seed 0) |\n|---|---|---|---|")
    for arm in args.arms:
        rows = [r for r in results if r["arm"] == arm and r["steps"] == args.steps]
        if rows:
            sv = next((r["input_singular_values"] for r in rows if r["seed"] == 0), [])
            scores = " / ".join(f"{r['score']:.0f}" for r in sorted(rows, key=lambda r: r["seed"]))
            print(f"| {arm} | {scores} | {np.mean([r['score'] for r in rows]):.0f} | {sv} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
