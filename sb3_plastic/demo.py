"""A short plastic training run with a visible result: ``python -m sb3_plastic.demo``.

Trains PlasticPPO (MaxMin activation, orthogonal layers, AdamO with the isometry step) on CartPole and
prints the evaluation return before and after training, and the deviation from isometry of the hidden
layers, which AdamO keeps small.
"""

from __future__ import annotations

import argparse

from stable_baselines3.common.evaluation import evaluate_policy

from sb3_plastic import PlasticPPO
from sb3_plastic.isometry import dfi_per_layer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--timesteps", type=int, default=20_000)
    parser.add_argument("--activation", default="maxmin", choices=["maxmin", "relu", "tanh"])
    parser.add_argument("--isometry-coef", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    model = PlasticPPO(
        "MlpPolicy", args.env, activation=args.activation, isometry_coef=args.isometry_coef, seed=args.seed, verbose=0
    )
    before, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=10)
    print(f"PlasticPPO ({args.activation} + AdamO, isometry_coef={args.isometry_coef}) on {args.env}")
    print(f"mean return before training: {before:8.1f}")
    model.learn(args.timesteps)
    after, std = evaluate_policy(model, model.get_env(), n_eval_episodes=10)
    print(f"mean return after {args.timesteps} steps: {after:8.1f} +/- {std:.1f}")
    dfi = dfi_per_layer(model.policy.mlp_extractor)
    print("deviation from isometry ||W^T W - I||_F^2 of the hidden layers:")
    for name, value in dfi.items():
        print(f"  mlp_extractor.{name:<14} {value:.4f}")


if __name__ == "__main__":
    main()
