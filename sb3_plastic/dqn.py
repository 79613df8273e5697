"""PlasticDQN: SB3's DQN with plastic policies and AdamO, and an optional Double DQN target."""

from __future__ import annotations

from typing import Any, ClassVar, Union

import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.policies import BasePolicy
from torch import nn

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.policies import PlasticDQNCnnPolicy, PlasticDQNMultiInputPolicy, PlasticDQNPolicy


class DoubleQTarget(nn.Module):
    """Stands in for the target network inside SB3's ``DQN.train``: for next observations ``s'`` it returns a tensor
    whose maximum over actions is ``Q_target(s', argmax_a Q_online(s', a))`` (every other entry is ``-inf``), so
    SB3's own target ``r + gamma * max_a(...)`` becomes the Double DQN target (van Hasselt et al., 2016) and nothing
    of SB3's update is copied. Called under SB3's ``no_grad``; the online forward therefore feeds no gradient-gated
    hook (Continual Backprop records only forwards with gradients).

    :param online: the online Q-network (chooses the action).
    :param target: the target Q-network (evaluates it).
    """

    def __init__(self, online: nn.Module, target: nn.Module) -> None:
        super().__init__()
        self.online = online
        self.target = target

    def forward(self, obs: Any) -> th.Tensor:
        q_target = self.target(obs)
        action = self.online(obs).argmax(dim=1, keepdim=True)
        return th.full_like(q_target, -th.inf).scatter_(1, action, q_target.gather(1, action))


class PlasticDQN(PlasticAlgorithmMixin, DQN):
    """Deep Q-Network (Mnih et al., 2015) with isometry-preserving networks.

    Same constructor as ``stable_baselines3.DQN`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig` and ``double_q``. The target network is a copy of the online network
    (also after orthogonal initialisation). ``isometry_mode="off", optimizer="adam"`` is exactly SB3's DQN.

    :param double_q: the Double DQN target (van Hasselt, Guez & Silver, 2016, *Deep Reinforcement Learning with
        Double Q-learning*): the next action is chosen by the online network and evaluated by the target network,
        ``r + gamma * Q_target(s', argmax_a Q_online(s', a))``, instead of SB3's ``r + gamma * max_a Q_target(s',
        a)``. Default ``False`` (SB3's DQN). The agent of C-CHAIN's continual MinAtar (Tang et al., 2025) is a Double
        DQN. Saved with the model.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticDQNPolicy,
        "CnnPolicy": PlasticDQNCnnPolicy,
        "MultiInputPolicy": PlasticDQNMultiInputPolicy,
    }

    def __init__(self, policy: Union[str, type[BasePolicy]], env: Any, *args: Any, double_q: bool = False,
                 **kwargs: Any) -> None:
        if not isinstance(double_q, bool):
            raise ValueError(f"double_q must be True or False, got {double_q!r}")
        self.double_q = double_q
        super().__init__(policy, env, *args, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        if not getattr(self, "double_q", False):
            return super().train(gradient_steps, batch_size)
        target = self.q_net_target
        self.q_net_target = DoubleQTarget(self.q_net, target)
        try:
            super().train(gradient_steps, batch_size)
        finally:
            self.q_net_target = target
