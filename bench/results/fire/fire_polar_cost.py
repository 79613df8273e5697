"""CPU seconds of one FIRE call (all layers) on PPO CnnPolicy (NatureCNN 84x84x4) and SAC MlpPolicy:
the exact polar factor (SVD, default) vs the reference's 10 Newton-Schulz steps; median of 5, one thread."""

import statistics
import time

import torch as th
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.envs import FakeImageEnv

from sb3_plastic.callbacks.fire import fire_
from sb3_plastic.common.surgery import find_networks

th.set_num_threads(1)
models = {
    "ppo-cnn": PPO("CnnPolicy", FakeImageEnv(screen_height=84, screen_width=84, n_channels=4, discrete=True), seed=0),
    "sac-mlp": SAC("MlpPolicy", "Pendulum-v1", seed=0, buffer_size=100),
}
for name, model in models.items():
    layers = [m for spec in find_networks(model) for m in spec.weight_layers()]
    state = {k: v.clone() for k, v in model.policy.state_dict().items()}
    for label, iterations in (("svd (default)", None), ("newton-schulz 10", 10)):
        times = []
        for _ in range(5):
            model.policy.load_state_dict(state)
            start = time.process_time()
            fire_(layers, iterations)
            times.append(time.process_time() - start)
        print(f"{name}: {label}: {statistics.median(times):.3f} CPU s per call ({len(layers)} layers)")
