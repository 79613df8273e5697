"""How often sb3-contrib's own ``test_save_load[CrossQ]`` fails for plain, unpatched CrossQ (issue #31).

The test (``tests/test_save_load.py`` of sb3-contrib 2.9.2) trains ``CrossQ("MlpPolicy", IdentityEnvBox, net_arch=[8],
buffer_size=256, train_freq=2)`` for 128 steps, overwrites every state-dict entry but the last of each object with
``rand_like`` (``th.randint_like(t, high=10)`` for integer tensors) and asserts that each entry changed. CrossQ's
BatchRenorm layers hold integer ``steps`` counters; a counter whose value is below 10 equals its random draw with
probability 1/10, and the test then fails with "Parameters did not change as expected." whatever the algorithm
class. This script replays the test's steps with the global generators seeded ``0 .. n-1`` and counts the seeds at
which the assertion would fail, naming the entries that did not change. Run: ``python bench/crossq_save_load_flake.py
--seeds 50`` (about a minute on one CPU core).
"""

from __future__ import annotations

import argparse
import json
from copy import deepcopy

import numpy as np
import torch as th
from sb3_contrib import CrossQ
from stable_baselines3.common.envs import IdentityEnvBox
from stable_baselines3.common.vec_env import DummyVecEnv


def rand_like(tensor: th.Tensor) -> th.Tensor:
    """The test's draw: uniform floats, or integers in [0, 10)."""
    return th.rand_like(tensor) if th.is_floating_point(tensor) else th.randint_like(tensor, high=10)


def unchanged_entries(seed: int) -> tuple[list[str], dict[str, int]]:
    """The test's steps at global seed ``seed``: the state-dict entries the random overwrite left unchanged (the
    test fails when there is one), and the integer entries' values before the overwrite."""
    th.manual_seed(seed)
    np.random.seed(seed)
    env = DummyVecEnv([lambda: IdentityEnvBox(-1, 1)])
    model = CrossQ("MlpPolicy", env, verbose=0, policy_kwargs=dict(net_arch=[8]), buffer_size=256, train_freq=2)
    model.learn(total_timesteps=128)
    original = deepcopy(model.get_parameters())
    counters = {f"{obj}.{k}": int(v) for obj, params in original.items() if "optim" not in obj
                for k, v in params.items() if not th.is_floating_point(v) and v.numel() == 1}
    random_params = {
        obj: params if "optim" in obj else {k: rand_like(v) for k, v in list(params.items())[:-1]}
        for obj, params in original.items()
    }
    model.set_parameters(random_params, exact_match=False)
    new = model.get_parameters()
    same = [
        f"{obj}.{k}"
        for obj, params in original.items()
        if "optim" not in obj
        for k in list(params)[:-1]
        if th.allclose(params[k], new[obj][k])
    ]
    return same, counters


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    failing: dict[int, list[str]] = {}
    counters: dict[str, int] = {}
    for seed in range(args.seeds):
        same, counters = unchanged_entries(seed)
        if same:
            failing[seed] = same
    out = {"seeds": args.seeds, "failing_seeds": len(failing), "unchanged": failing, "counters_last_seed": counters}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
