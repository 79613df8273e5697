"""A weight with no task gradient under ShrinkPerturb('continual'), wd 1e-4, lr 1e-3, noise off, 10k Adam steps."""

import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.logger import configure

from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturb

th.set_num_threads(1)
for mode in ("coupled", "decoupled"):
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[4]), learning_rate=1e-3, seed=0)
    model.set_logger(configure(None, [""]))
    with th.no_grad():
        for p in model.q_net.parameters():
            p.fill_(0.05)
    cb = ShrinkPerturb("continual", weight_decay=1e-4, noise_std=0.0, weight_decay_mode=mode)
    cb.init_callback(model)
    cb.on_training_start({}, {})
    model.policy.set_training_mode(True)
    for _ in range(10_000):
        for p in model.q_net.parameters():
            p.grad = th.zeros_like(p)
        model.policy.optimizer.step()
    w = th.cat([p.detach().abs().flatten() for p in model.q_net.parameters()])
    print(f"weight_decay_mode={mode}: |w| after 10k steps: max {w.max().item():.3g}, min {w.min().item():.3g} (start 0.05)")
