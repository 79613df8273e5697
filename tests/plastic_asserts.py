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
