"""Policy classes that are not one of the plastic policy aliases: a user's own SB3 policy class (issue #31).

SB3's contract is that ``PPO(MyPolicy, env)`` trains any subclass of the algorithm's policy class. The plastic
algorithms keep it:

* **Plasticity off** (``isometry_mode="off", optimizer="adam"``, ``activation=None``, no orthogonal
  initialisation, no NaP): the class is passed to SB3 untouched, without plastic keywords in its
  ``policy_kwargs``, so training is SB3's bit for bit. Interventions (FIRE, Continual Backprop, ReDo, ...) are
  callbacks and act on it as on any SB3 model.
* **Plasticity on**: the class gets the plastic machinery of the algorithm's own policy family by a subclass built
  on the fly, ``Plastic<MyPolicy>(<family>, MyPolicy)`` (e.g. ``PlasticActorCriticPolicy`` for PPO): SB3 builds the
  user's networks as the user's class says, then the isometry penalty (AdamO's param groups) covers every
  Linear / Conv weight the policy owns except the family's output heads (``plastic_heads``: PPO's ``action_net``
  and ``value_net``, DQN's last Q layer, ...). ``activation=None`` leaves the user's activations alone; an explicit
  ``activation`` is passed as ``activation_fn``. The class must derive from the family's SB3 base class
  (``ActorCriticPolicy`` for PPO, ``DQNPolicy`` for DQN, ...): otherwise ``ValueError`` saying so and how to train
  it with plasticity off.
* SB3's own classes of the policy aliases (``PPO.policy_aliases["MlpPolicy"]`` is ``ActorCriticPolicy``) mean the
  same as the alias's name and resolve to the plastic alias class.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.config import IsometryConfig
from sb3_plastic.policies import PlasticPolicyMixin


def sb3_algorithm_class(algorithm_cls: type) -> type:
    """The SB3 / sb3-contrib algorithm class behind a plastic algorithm class (``PlasticPPO`` -> ``PPO``)."""
    from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin

    return next(
        c for c in algorithm_cls.__mro__ if issubclass(c, BaseAlgorithm) and not issubclass(c, PlasticAlgorithmMixin)
    )


def plastic_alias_class(algorithm_cls: type, policy: type) -> Optional[str]:
    """The name of the alias whose SB3 policy class is exactly ``policy`` (``ActorCriticPolicy`` -> ``"MlpPolicy"``
    for PPO) and that the plastic algorithm also has; ``None`` for any other class."""
    base = sb3_algorithm_class(algorithm_cls)
    alias = next((name for name, known in base.policy_aliases.items() if known is policy), None)
    return alias if alias in algorithm_cls.policy_aliases else None


def _sb3_policy_base(plastic_policy: type) -> type:
    """The first SB3 policy class in the MRO of a plastic policy class (``PlasticActorCriticPolicy`` ->
    ``ActorCriticPolicy``, ``PlasticRecurrentActorCriticPolicy`` -> ``RecurrentActorCriticPolicy``)."""
    return next(
        c for c in plastic_policy.__mro__ if issubclass(c, BasePolicy) and not issubclass(c, PlasticPolicyMixin)
    )


def policy_family(algorithm_cls: type) -> type:
    """The plastic policy class whose machinery a user's policy class gets: the one of the algorithm's aliases
    without a plastic default features extractor (``PlasticActorCriticPolicy`` for PPO, ``PlasticDQNPolicy`` for
    DQN, ``PlasticRecurrentActorCriticPolicy`` for RecurrentPPO, ...)."""
    return next(p for p in algorithm_cls.policy_aliases.values() if p._plastic_default_extractor is None)


def plasticity_off(config: IsometryConfig, nap: bool = False) -> bool:
    """Whether the plastic keywords leave the networks and optimizer SB3's: ``isometry_mode="off",
    optimizer="adam"``, ``activation=None``, no orthogonal initialisation and no NaP layer norms."""
    return (
        config.isometry_mode == "off"
        and config.optimizer == "adam"
        and config.activation is None
        and not config.use_orthogonal_init
        and not nap
    )


class PlasticUserPolicyMixin:
    """First base of the plastic class built on a user's policy class (:func:`plastic_user_policy`): turns a
    signature clash of the user's ``__init__`` with the keywords the plastic machinery passes into a clear error."""

    _plastic_user_policy = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)
        except TypeError as exc:
            text = str(exc)
            if "multiple values for keyword argument" not in text and "unexpected keyword argument" not in text:
                raise
            user = type(self).__mro__[-1]
            for cls in type(self).__mro__:
                if not issubclass(cls, (PlasticPolicyMixin, PlasticUserPolicyMixin)):
                    user = cls
                    break
            raise TypeError(
                f"{user.__name__} cannot take the plastic keywords: {text}. With plasticity on, sb3_plastic passes "
                "optimizer_class and optimizer_kwargs (and activation_fn when activation= is given) through the "
                f"policy's __init__; let {user.__name__}.__init__ accept them and forward them to its base class, "
                "or train it as SB3 does with isometry_mode='off', optimizer='adam'"
            ) from exc


@functools.cache
def plastic_user_policy(family: type, policy: type) -> type:
    """The plastic class built on the user's policy class ``policy`` with the machinery of the plastic policy
    class ``family`` (cached: the same pair gives the same class)."""
    return type(
        f"Plastic{policy.__name__}",
        (PlasticUserPolicyMixin, family, policy),
        {"__module__": policy.__module__, "__doc__": f"{policy.__name__} with the plastic machinery of {family.__name__}."},
    )


def resolve_policy_class(algorithm_cls: type, policy: type, config: IsometryConfig, nap: bool = False) -> type:
    """The policy class a plastic algorithm hands to SB3 for the class ``policy`` (see the module docstring).

    :param algorithm_cls: the plastic algorithm class.
    :param policy: a policy class (not an alias name).
    :param config: the model's isometry settings.
    :param nap: whether Normalize-and-Project's layer norms are asked for.
    :return: a plastic alias class (SB3's own alias class given), ``policy`` itself (a plastic class, or plasticity
        off), or the plastic class built on it.
    :raises ValueError: for a non-class, or, with plasticity on, a class that does not derive from the policy
        family's SB3 base class.
    """
    if not isinstance(policy, type) or not issubclass(policy, BasePolicy):
        raise ValueError(
            f"{algorithm_cls.__name__} needs a policy alias {sorted(algorithm_cls.policy_aliases)} or a policy class "
            f"(a subclass of stable_baselines3's BasePolicy), got {policy!r}"
        )
    if issubclass(policy, PlasticPolicyMixin):
        return policy
    alias = plastic_alias_class(algorithm_cls, policy)
    if alias is not None:
        return algorithm_cls.policy_aliases[alias]
    if plasticity_off(config, nap):
        return policy
    family = policy_family(algorithm_cls)
    base = _sb3_policy_base(family)
    if not issubclass(policy, base):
        raise ValueError(
            f"{algorithm_cls.__name__} with plasticity on puts the isometry penalty and the interventions on the "
            f"Linear / Conv layers of a {base.__name__} (its policy family), and {policy.__name__} does not derive "
            f"from {base.__name__}; derive it from {base.__name__}, or train it as SB3 does with "
            "isometry_mode='off', optimizer='adam' (interventions still act through their callbacks)"
        )
    return plastic_user_policy(family, policy)
