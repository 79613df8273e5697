"""The default isometry coefficient per algorithm family (issue #12: defaults that do no harm on a stationary task).

The SAC family (SAC, TQC, CrossQ) defaults to ``isometry_coef=2e-3``, the PPO family and the DQN family to 0.02
(bench/README.md, "Stationary do no harm"; 1e-3 and 0.01 before issue #27, whose penalty had no 1/2: the same
penalty); an explicit value is always what the user asked for.
"""

from __future__ import annotations

import pytest

from sb3_plastic import (
    PlasticCrossQ,
    PlasticDQN,
    PlasticMaskablePPO,
    PlasticPPO,
    PlasticQRDQN,
    PlasticRecurrentPPO,
    PlasticSAC,
    PlasticTQC,
)
from sb3_plastic.common.docs import param_docs
from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin

DISCRETE = "CartPole-v1"
CONTINUOUS = "Pendulum-v1"

CASES = [
    (PlasticPPO, DISCRETE, 0.02),
    (PlasticRecurrentPPO, DISCRETE, 0.02),
    (PlasticMaskablePPO, DISCRETE, 0.02),
    (PlasticDQN, DISCRETE, 0.02),
    (PlasticQRDQN, DISCRETE, 0.02),
    (PlasticSAC, CONTINUOUS, 2e-3),
    (PlasticTQC, CONTINUOUS, 2e-3),
    (PlasticCrossQ, CONTINUOUS, 2e-3),
]


def _model(cls: type, env_id: str, **kwargs):
    off_policy = (PlasticDQN, PlasticQRDQN, PlasticSAC, PlasticTQC, PlasticCrossQ)
    extra = dict(learning_starts=0, buffer_size=100) if cls in off_policy else {}
    policy = "MlpLstmPolicy" if cls is PlasticRecurrentPPO else "MlpPolicy"
    return cls(policy, env_id, seed=0, device="cpu", **extra, **kwargs)


@pytest.mark.parametrize("cls,env_id,expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_family_default_reaches_the_optimizer(cls: type, env_id: str, expected: float) -> None:
    model = _model(cls, env_id)
    assert cls.default_isometry_coef == expected
    assert model.isometry_config.isometry_coef == expected
    parts = [model.policy, getattr(model.policy, "actor", None), getattr(model.policy, "critic", None)]
    optimizers = [part.optimizer for part in parts if getattr(part, "optimizer", None) is not None]
    assert optimizers
    coefs = {g["isometry_coef"] for opt in optimizers for g in opt.param_groups}
    assert coefs == {expected, 0.0}  # the regularised group and the group without the penalty


@pytest.mark.parametrize("options", [("isometry_rect_scale", "isometry_normalize"),
                                     ("isometry_free_scale", "isometry_normalize")], ids=["rect", "free"])
@pytest.mark.parametrize("cls,env_id,expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_isometry_options_reach_the_optimizer(cls: type, env_id: str, expected: float, options: tuple) -> None:
    """``isometry_rect_scale`` / ``isometry_normalize`` (issue #27) and ``isometry_free_scale`` are keywords of all
    eight algorithms, off by default, and reach every isometry param group (of the actor's and the critic's optimizer
    too)."""
    del expected
    for on in (False, True):
        model = _model(cls, env_id, **(dict.fromkeys(options, True) if on else {}))
        assert all(getattr(model.isometry_config, key) is on for key in options)
        parts = [model.policy, getattr(model.policy, "actor", None), getattr(model.policy, "critic", None)]
        groups = [g for part in parts if getattr(part, "optimizer", None) is not None for g in part.optimizer.param_groups]
        assert groups and all(g[key] is on for g in groups for key in options)


@pytest.mark.parametrize("cls,env_id", [(PlasticSAC, CONTINUOUS), (PlasticPPO, DISCRETE)], ids=["SAC", "PPO"])
def test_explicit_coefficient_wins(cls: type, env_id: str) -> None:
    assert _model(cls, env_id, isometry_coef=0.05).isometry_config.isometry_coef == 0.05
    assert _model(cls, env_id, isometry_coef=0.0).isometry_config.isometry_coef == 0.0


def test_bad_coefficient_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"isometry_coef.*-1"):
        _model(PlasticSAC, CONTINUOUS, isometry_coef=-1.0)


@pytest.mark.parametrize("cls", [PlasticPPO, PlasticSAC], ids=["PPO", "SAC"])
def test_docstring_states_the_family_default(cls: type) -> None:
    assert PlasticAlgorithmMixin.default_isometry_coef == 0.02
    entry = param_docs(cls.__doc__)["isometry_coef"]
    assert entry.endswith(f"Default: ``{cls.default_isometry_coef!r}``.")
