"""Dohare et al.'s PPO advantage normalisation on SB3's PPO (issue #28: Slippery Ant at their design).

Their PPO (Dohare et al., Nature 2024; shibhansh/loss-of-plasticity, ``lop/algos/rl/ppo.py``, ``get_rets_advs``
with ``u_adv_scl: 1`` in ``cfg/sant/*.yml``) computes GAE(lambda) advantages over its 2048-step batch and normalises
them once over the whole batch, before its epochs: ``a - mean(a)``, then divided by torch's ``std()`` (the
unbiased, n - 1 estimate) unless that is 0 or NaN, with no constant added. SB3 normalises every minibatch instead
(``normalize_advantage``: 128 samples there, std + 1e-8). Their value targets are the GAE returns, as SB3's, so
nothing else of the targets differs.

:func:`rollout_advantage_norm` is the callback a setting with ``advantage_norm="rollout"`` adds to every method
(bench/continual_runs.py): it rewrites the rollout buffer's advantages after SB3 computes them (``on_rollout_end``
runs after ``compute_returns_and_advantage``) and turns SB3's per-minibatch normalisation off.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def normalise_over_rollout(advantages: np.ndarray) -> np.ndarray:
    """Their batch normalisation of ``advantages`` (every entry of the rollout, all env copies): centred, then divided
    by the unbiased standard deviation where that is a positive number (float32, as SB3's buffer)."""
    values = np.asarray(advantages, dtype=np.float64)
    centred = values - values.mean()
    std = centred.std(ddof=1) if centred.size > 1 else float("nan")
    if std != 0 and not np.isnan(std):
        centred = centred / std
    return centred.astype(np.float32)


def rollout_advantage_norm() -> Any:
    """A callback that normalises PPO's advantages once per rollout (:func:`normalise_over_rollout`) and sets the
    model's ``normalize_advantage = False``. Use it with a PPO model (any subclass of SB3's, the library's
    ``PlasticPPO`` included)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutAdvantageNorm(BaseCallback):
        def _on_training_start(self) -> None:
            if not hasattr(self.model, "rollout_buffer") or not hasattr(self.model, "normalize_advantage"):
                raise TypeError(f"rollout_advantage_norm() normalises a PPO model's advantages, got "
                                f"{type(self.model).__name__}")
            self.model.normalize_advantage = False  # normalised once per rollout below

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            buffer.advantages = normalise_over_rollout(buffer.advantages)

        def _on_step(self) -> bool:
            return True

    return RolloutAdvantageNorm()
