"""Assertions shared by the algorithm test files (imported as a plain module: pytest puts tests/ on sys.path)."""

import torch as th


def assert_same_parameters(a, b) -> None:
    """Two models' policies have the same state-dict keys and bit-identical tensors."""
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert th.equal(sa[key], sb[key]), key


def assert_same_adam_moments(opt_a, opt_b) -> None:
    """Two Adam-family optimizers hold non-empty, bit-identical first and second moments."""
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for key in sa:
        assert th.equal(sa[key]["exp_avg"], sb[key]["exp_avg"])
        assert th.equal(sa[key]["exp_avg_sq"], sb[key]["exp_avg_sq"])


def cbp_replaced(state) -> int:
    """Units replaced so far by the keyword-created Continual Backprop (its plastic state)."""
    return sum(int(v["replaced"]) for layers in state["ContinualBackprop:auto"].values() for v in layers.values())


def assert_intervention_ran(model, intervention: dict) -> None:
    """After ``learn`` with one intervention keyword: finite parameters, and the intervention's persistent
    state shows it acted (FIRE fired once, Continual Backprop replaced units, ReDo had events)."""
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    state = model.plastic_state
    if "fire_at" in intervention:
        assert state["FIRE:auto"]["count"] == 1
    if "replacement_rate" in intervention:
        assert cbp_replaced(state) > 0
    if "redo_period" in intervention:
        assert state["ReDo:auto"]["events"] > 0
