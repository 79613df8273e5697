"""Plasticity interventions as SB3 callbacks (work on PPO, A2C, DQN, SAC, QR-DQN, TQC, plastic or not)."""

from sb3_plastic.callbacks.base import PlasticCallback

__all__ = ["PlasticCallback"]
