"""Singular values of the penalised layers at initialisation and after a stationary run, SB3 arm vs plastic arm.

Usage (one torch thread; prints JSON)::

    python bench/stationary_spectra.py breakout_ppo 0 [KEY=VALUE ...] > out.json

``KEY=VALUE`` are plastic keywords (Python literals), e.g. ``isometry_coef=0.01``. The runs are those of
``bench/stationary.py`` (same settings, seeds, networks); used in bench/README.md ("Stationary do no harm",
Reading) to see what the isometry penalty does to each layer's spectrum.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stationary as S
from stable_baselines3.common.env_util import make_vec_env

from sb3_plastic.isometry import as_matrix


def _stats(s: th.Tensor) -> dict[str, float]:
    return dict(min=float(s.min()), max=float(s.max()), rms=float(s.pow(2).mean().sqrt()))


def main(argv: list[str]) -> dict:
    name, seed = argv[0], int(argv[1])
    S.PLASTIC_OVERRIDES.update({k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in argv[2:])})
    th.set_num_threads(1)
    setting = S.SETTINGS[name]
    if name == "pendulum_sac":
        setting = dataclasses.replace(setting, timesteps=10_000)  # the budget of the stationary table
    layers: dict[str, dict] = {}
    regularised: list[str] = []
    for arm in ("plastic", "sb3"):
        env = make_vec_env(lambda: S.make_env(setting), n_envs=setting.n_envs, seed=seed)
        model, _ = S.build_model(setting, arm, seed, env)
        if arm == "plastic":
            names = {id(p): n for n, p in model.policy.named_parameters()}
            regularised = [names[id(p)] for p in model.policy.regularised_parameters()]
        params = dict(model.policy.named_parameters())
        init = {n: th.linalg.svdvals(as_matrix(params[n].detach()).double()) for n in regularised}
        model.learn(setting.timesteps)
        for n in regularised:
            final = th.linalg.svdvals(as_matrix(params[n].detach()).double())
            layers.setdefault(n, {})[arm] = {"init": _stats(init[n]), "final": _stats(final)}
    return dict(setting=name, seed=seed, plastic_overrides=dict(S.PLASTIC_OVERRIDES), layers=layers)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
