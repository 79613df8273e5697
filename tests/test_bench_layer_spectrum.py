"""bench/layer_spectrum.py: the feature layers' singular values, against numpy's SVD, from a saved SB3 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from bench_modules import load_bench
from stable_baselines3 import PPO


@pytest.fixture
def spectrum():
    return load_bench("layer_spectrum")


def test_rows_against_numpy(spectrum):
    gen = th.Generator().manual_seed(0)
    state = {"features_extractor.cnn.0.weight": th.randn(4, 2, 3, 3, generator=gen) * 0.3,
             "features_extractor.cnn.0.bias": th.randn(4, generator=gen),
             "features_extractor.linear.0.weight": th.randn(8, 36, generator=gen),
             "action_net.weight": th.randn(3, 8, generator=gen)}
    rows = spectrum.spectrum_rows(state)
    assert [r["name"] for r in rows] == ["features_extractor.cnn.0.weight", "features_extractor.linear.0.weight"]
    for r in rows:
        w = state[r["name"]].double().numpy()
        s = np.linalg.svd(w.reshape(w.shape[0], -1), compute_uv=False)
        assert r["shape"] == w.shape
        assert r["max"] == pytest.approx(s.max()) and r["min"] == pytest.approx(s.min())
        assert r["median"] == pytest.approx(np.sort(s)[(len(s) - 1) // 2])  # the lower median
        assert r["below_one"] == int((s < 1).sum())
        assert r["dfi_floor"] == pytest.approx(float(np.square(s[s < 1] ** 2 - 1).sum()), rel=1e-9)
        assert r["dfi_ceiling"] == pytest.approx(float(np.square(s[s > 1] ** 2 - 1).sum()), rel=1e-9)
    assert rows[0]["below_one"] > 0 and rows[0]["dfi_floor"] > 0  # the scaled-down kernel has singular values below 1
    assert rows[1]["dfi_ceiling"] > 0
    with pytest.raises(ValueError, match=r"no weight named nope\.\* with >= 2 dims"):
        spectrum.spectrum_rows(state, prefix="nope.")


def test_reads_a_saved_model(spectrum, tmp_path, capsys):
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu", policy_kwargs=dict(net_arch=[8]))
    model.save(tmp_path / "m.zip")
    state = spectrum.read_policy(str(tmp_path / "m.zip"))
    for name, w in model.policy.state_dict().items():
        th.testing.assert_close(state[name], w)
    rows = spectrum.spectrum_rows(state, prefix="mlp_extractor.policy_net")
    assert [r["name"] for r in rows] == ["mlp_extractor.policy_net.0.weight"]
    spectrum.main([str(tmp_path / "m.zip"), "--prefix", "mlp_extractor.policy_net"])
    r = rows[0]
    assert capsys.readouterr().out.splitlines()[1] == (
        f"  mlp_extractor.policy_net.0.weight (8, 4): max {r['max']:.2f}, median {r['median']:.2f}, "
        f"min {r['min']:.3f}, {r['below_one']} below 1, DfI below / above 1: {r['dfi_floor']:.3g} / "
        f"{r['dfi_ceiling']:.3g}")
    with pytest.raises(ValueError, match=r"no weight named features_extractor\.\*"):
        spectrum.main([str(tmp_path / "m.zip")])  # an MLP policy's extractor has no weights
    with pytest.raises(ValueError, match="neither a file nor REV:PATH"):
        spectrum.read_policy(str(tmp_path / "missing.zip"))


def test_train_reads_the_weights_the_prefix_names(spectrum, capsys, monkeypatch):
    """``--train`` with ``--prefix`` prints the spectra of the weights the prefix names (an MLP agent has no
    ``features_extractor.`` weights): a few rollouts of PerturbedCartPole's first task, shortened."""
    import importlib
    from dataclasses import replace

    from bench_modules import BENCH

    monkeypatch.syspath_prepend(str(BENCH))
    continual = importlib.import_module("continual")  # the module train_and_print imports
    monkeypatch.setitem(continual.SETTINGS, "cartpole_obs", replace(continual.SETTINGS["cartpole_obs"], change_every=96))
    spectrum.main(["--train", "ppo", "--setting", "cartpole_obs", "--seed", "0", "--every", "512",
                   "--prefix", "mlp_extractor.policy_net"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines if "policy_net.0.weight" in line] == ["256", "512", "768"]
    assert all("value_net" not in line and "action_net" not in line for line in lines)
    assert "(after the last update) mlp_extractor.policy_net.2.weight (64, 64)" in lines[-1]
