"""The training targets of C-CHAIN's vanilla PPO on SB3's PPO (issue #29 part 2: does our plain agent differ from
their vanilla agent because of them?).

C-CHAIN's continual Gym-control code (Tang et al., ICML 2025; bluecontra/C-CHAIN, ``crl_gym_classic_control/``,
``basic_utils.py``: ``Episode.end_episode`` and ``History.build_dataset``; modified from TRAC's notebook) trains its
PPO on targets that differ from SB3's in two ways; everything else of the ``cchain_*`` settings is already theirs
(bench/README's protocol table):

1. **Advantages** are GAE(gamma, lambda) as SB3's, normalised once over the iteration's whole dataset,
   ``(a - mean) / (std + 1e-5)`` with numpy's population std, where SB3 normalises every minibatch
   (``normalize_advantage``: torch's unbiased std + 1e-8 over 32 samples here).
2. **Value targets** are each episode's discounted return-to-go, bootstrapped with the value of the last observation
   where the episode is cut (the 400-step limit, the iteration's end) and 0 at a termination: the lambda = 1 return,
   where SB3's target is the GAE(lambda) return (advantage + value).

:func:`their_targets` rewrites SB3's rollout buffer after SB3 fills it (``on_rollout_end`` runs after
``compute_returns_and_advantage``) and turns SB3's per-minibatch normalisation off. SB3 folds a truncated episode's
bootstrap into the reward of its last step, so a second GAE pass with lambda = 1 over the same buffer gives their
return-to-go at every kind of cut.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the constant C-CHAIN's code adds to the advantages' standard deviation (``normalize_list``)
STD_EPS = 1e-5


def their_targets() -> Any:
    """A callback that trains SB3's PPO on C-CHAIN's vanilla targets (the module docstring): per-rollout advantage
    normalisation and lambda = 1 value targets. Use it with a PPO model; it sets ``normalize_advantage = False``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class TheirTargets(BaseCallback):
        def _on_training_start(self) -> None:
            if not hasattr(self.model, "rollout_buffer") or not hasattr(self.model, "normalize_advantage"):
                raise TypeError(f"their_targets() trains a PPO model, got {type(self.model).__name__}")
            self.model.normalize_advantage = False  # normalised once per rollout below

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            advantages = buffer.advantages.copy()  # SB3's GAE(lambda)
            gae_lambda = buffer.gae_lambda
            buffer.gae_lambda = 1.0
            try:
                buffer.compute_returns_and_advantage(last_values=self.locals["values"], dones=self.locals["dones"])
            finally:
                buffer.gae_lambda = gae_lambda
            # buffer.returns is now the lambda = 1 return (their return-to-go); the advantages go back to GAE(lambda)
            buffer.advantages = ((advantages - advantages.mean()) / (advantages.std() + STD_EPS)).astype(np.float32)

        def _on_step(self) -> bool:
            return True

    return TheirTargets()
