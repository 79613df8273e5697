"""The isometry paper's penalty baselines (issue #15): L2-init (Kumar et al., 2023) and spectral regularisation
(Lewandowski et al., 2024), as callbacks and as keywords of every plastic algorithm.

References in every test: autograd of the explicit penalty (``loss + lambda * ||theta - theta_0||^2`` followed by
SB3's gradient clipping), ``torch.linalg.svd`` for the largest singular value, the initial parameters recorded
before training, an uninterrupted run for save -> load -> continue, and SB3 itself for "off".
"""

from __future__ import annotations

import pytest
import torch as th
from plastic_asserts import assert_same_parameters
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.env_util import make_vec_env
from test_sb3_parity import PAIRS, algo_kwargs, make_env, policy_name

from sb3_plastic import PlasticPPO
from sb3_plastic.callbacks import L2Init, SpectralRegularisation
from sb3_plastic.callbacks.regularisers import GradientPenalty

PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)


def _start(callback, model):
    """Install a callback's hooks on ``model`` the way ``learn()`` does."""
    callback.init_callback(model)
    callback.on_training_start({}, {})
    model.policy.set_training_mode(True)


def _hand_loss(policy, obs):
    """A loss reaching every parameter of an SB3 actor-critic policy (log_std included for Box actions)."""
    values, log_prob, _ = policy.evaluate_actions(obs, th.zeros(len(obs), dtype=th.long))
    return (values.pow(2) - log_prob).mean()


def test_l2_init_gradient_is_autograd_of_the_penalty_clipped_with_the_task_gradient():
    th.manual_seed(0)
    model = PPO("MlpPolicy", "CartPole-v1", seed=0)
    policy = model.policy
    theta0 = [p.detach().clone() for p in policy.parameters()]
    with th.no_grad():  # move away from theta_0 so the penalty gradient is not zero
        for p in policy.parameters():
            p.add_(0.3 * th.randn_like(p))
    obs = th.randn(16, 4)
    coef = 0.7
    # reference: autograd of loss + coef * ||theta - theta_0||^2, then SB3's clipping
    policy.zero_grad()
    penalty = sum(((p - p0) ** 2).sum() for p, p0 in zip(policy.parameters(), theta0))
    (_hand_loss(policy, obs) + coef * penalty).backward()
    th.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    expected = [p.grad.clone() for p in policy.parameters()]
    # the callback: theta_0 taken at training start (the perturbed parameters are not theta_0: set it by hand)
    callback = L2Init(coef)
    _start(callback, model)
    names = dict(callback.named_network_parameters())
    assert len(names) == len(list(policy.parameters()))
    by_id = {id(p): i for i, p in enumerate(policy.parameters())}
    callback.state["theta0"] = {key: theta0[by_id[id(p)]].clone() for key, p in names.items()}
    policy.zero_grad()
    _hand_loss(policy, obs).backward()
    th.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    clip_norm = th.linalg.vector_norm(th.stack([th.linalg.vector_norm(g) for g in expected]))
    assert float(clip_norm) == pytest.approx(0.5, rel=1e-5)  # clipping was active: the test sees its effect
    for p, want in zip(policy.parameters(), expected):
        th.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-7)
    # no penalty outside training mode (rollouts, evaluation), none after the hooks are removed
    policy.set_training_mode(False)
    policy.zero_grad()
    _hand_loss(policy, obs).backward()
    plain = [p.grad.clone() for p in policy.parameters()]
    callback.on_training_end()
    policy.set_training_mode(True)
    policy.zero_grad()
    _hand_loss(policy, obs).backward()
    for p, want in zip(policy.parameters(), plain):
        assert th.equal(p.grad, want)


def test_l2_init_theta0_is_the_initial_parameters_and_the_pull_shrinks_the_distance():
    def run(coef):
        model = PlasticPPO("MlpPolicy", "CartPole-v1", l2_init_coef=coef, learning_rate=3e-3, **PPO_FAST)
        start = {k: v.clone() for k, v in model.policy.state_dict().items()}
        model.learn(256)
        return model, start

    model, start = run(1.0)
    (callback,) = model.intervention_callbacks()
    callback.init_callback(model)
    theta0 = model.plastic_state["L2Init:auto"]["theta0"]
    assert set(theta0) == {f"policy.{name}" for name, _ in model.policy.named_parameters()}
    for key, value in theta0.items():
        assert th.equal(value, start[key.removeprefix("policy.")])
    pulled = callback.distance()
    free_model, free_start = run(0.0)
    free = sum(float((p.detach() - free_start[n]).pow(2).sum()) for n, p in free_model.policy.named_parameters()) ** 0.5
    assert 0 < pulled < 0.7 * free  # Adam bounds each step by ~lr: the pull shows as a shorter walk


def continued_ppo(model, path):
    """``model`` (or the model saved at ``path``) continued for 128 steps on a fresh env, seeds fixed."""
    if path is not None:
        model = PlasticPPO.load(path, env=make_vec_env("CartPole-v1", n_envs=1, seed=3))
    else:
        model.set_env(make_vec_env("CartPole-v1", n_envs=1, seed=3))
    model.set_random_seed(5)
    return model.learn(128, reset_num_timesteps=False)


def assert_resume_equals_uninterrupted(model, tmp_path):
    """Train ``model`` 128 steps, save it, continue the saved copy and ``model`` itself on equal fresh envs and seeds:
    bit-identical parameters. Returns the continued copy and the path of the save."""
    model.learn(128)
    path = tmp_path / "ppo.zip"
    model.save(path)
    loaded = continued_ppo(None, path)
    continued_ppo(model, None)
    assert_same_parameters(model, loaded)
    return loaded, path


@pytest.mark.parametrize(
    "kwargs, key, field",
    [(dict(l2_init_coef=0.5), "L2Init:auto", "theta0"), (dict(spectral_coef=0.5), "SpectralRegularisation:auto", "u")],
)
def test_save_load_continue_equals_the_uninterrupted_run(tmp_path, kwargs, key, field):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", learning_rate=3e-3, **kwargs, **PPO_FAST)
    loaded, path = assert_resume_equals_uninterrupted(model, tmp_path)
    for name, value in model.plastic_state[key][field].items():
        assert th.equal(loaded.plastic_state[key][field][name], value)
    # the control: a loaded model whose state is lost (re-made at its training start) ends elsewhere
    lost = PlasticPPO.load(path)
    lost.plastic_state.data.pop(key)
    lost.save(path)
    lost = continued_ppo(None, path)
    assert any(not th.equal(a, b) for a, b in zip(model.policy.parameters(), lost.policy.parameters()))


def test_zero_coefficient_is_sb3_bit_for_bit():
    def run(callback):  # built and trained one after the other: the seed sets torch's global generator
        model = DQN("MlpPolicy", "CartPole-v1", learning_starts=16, train_freq=4, seed=0)
        return model.learn(64, callback=callback)

    assert_same_parameters(run(None), run(L2Init(0.0)))
    assert PlasticPPO("MlpPolicy", "CartPole-v1", **PPO_FAST).intervention_callbacks() == []


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "0.1", True])
def test_bad_l2_init_coef(bad):
    with pytest.raises(ValueError, match="l2_init_coef"):
        PlasticPPO("MlpPolicy", "CartPole-v1", l2_init_coef=bad)
    with pytest.raises(ValueError, match="coef"):
        L2Init(bad)


def test_mismatched_saved_theta0_is_a_clear_error():
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, n_epochs=1)
    callback = L2Init(0.1)
    _start(callback, model)
    key = next(iter(callback.state["theta0"]))
    callback.state["theta0"][key] = th.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        callback.on_training_start({}, {})


@pytest.mark.parametrize("plastic_cls", list(PAIRS))
def test_penalty_keywords_on_every_plastic_algorithm(plastic_cls):
    kwargs = algo_kwargs(plastic_cls, "mlp")
    env = make_env(plastic_cls, "mlp")
    model = plastic_cls(policy_name(plastic_cls, "mlp"), env, l2_init_coef=0.1, spectral_coef=0.1, seed=0, **kwargs)
    assert [type(c) for c in model.intervention_callbacks()] == [L2Init, SpectralRegularisation]
    start = {n: p.detach().clone() for n, p in model.policy.named_parameters()}
    model.learn(96)
    state = model.plastic_state["L2Init:auto"]["theta0"]
    optimizers = {id(s.optimizer): s.optimizer for s in _networks(model)}.values()
    trained = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    assert len(state) == len(trained)
    names = {id(p): n for n, p in model.policy.named_parameters()}
    # every theta_0 entry is a trained parameter's value before training
    by_value = [start[names[id(p)]] for p in model.policy.parameters() if id(p) in trained]
    assert sorted(float(v.double().sum()) for v in state.values()) == pytest.approx(
        sorted(float(v.double().sum()) for v in by_value)
    )
    spectral = model.plastic_state["SpectralRegularisation:auto"]
    assert spectral["sigma"] and set(spectral["sigma"]) == set(spectral["u"])
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def _networks(model):
    from sb3_plastic.common.surgery import find_networks

    return find_networks(model)


def test_gradient_penalty_is_the_one_mechanism():
    assert issubclass(L2Init, GradientPenalty) and issubclass(SpectralRegularisation, GradientPenalty)


# ---------------------------------------------------------------------------------------------------
# Spectral regularisation
# ---------------------------------------------------------------------------------------------------
def _augmented(layer, include_bias=True):
    weight = layer.weight.reshape(layer.weight.shape[0], -1)
    return th.cat([weight, layer.bias.unsqueeze(1)], 1) if include_bias else weight


def _paper_penalty(layers, exponent=2.0, include_bias=True, bias_as_column=False):
    """Lewandowski et al.'s penalty written out with the SVD: ``sum_l (sigma_1(W_l)^k - 1)^2 + ||b_l||^(2k)`` (and the
    ``[W | b]`` / weight-only variants), differentiable by autograd."""
    column = include_bias and bias_as_column
    total = sum((th.linalg.svdvals(_augmented(m, column))[0] ** exponent - 1) ** 2 for m in layers)
    if include_bias and not bias_as_column:
        total = total + sum(m.bias.norm() ** (2 * exponent) for m in layers)
    return total


@pytest.mark.parametrize(
    "exponent, include_bias, bias_as_column",
    [(2.0, True, False), (3.0, True, False), (1.0, True, True), (2.0, True, True), (1.0, False, False)],
)
def test_spectral_gradient_is_autograd_of_the_svd_penalty(exponent, include_bias, bias_as_column):
    th.manual_seed(1)
    model = PPO("MlpPolicy", "CartPole-v1", seed=0)
    policy = model.policy
    with th.no_grad():  # SB3's orthogonal init has equal singular values (no unique top pair) and zero biases
        for p in policy.parameters():
            p.add_(0.1 * th.randn_like(p))
    obs = th.randn(16, 4)
    coef = 0.3
    layers = [m for m in policy.modules() if isinstance(m, th.nn.Linear)]
    # reference: autograd of loss + coef * the SVD penalty, then SB3's clipping
    policy.zero_grad()
    penalty = _paper_penalty(layers, exponent, include_bias, bias_as_column)
    (_hand_loss(policy, obs) + coef * penalty).backward()
    th.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    expected = [p.grad.clone() for p in policy.parameters()]
    # the callback with enough power iterations to converge on the first update
    callback = SpectralRegularisation(
        coef, exponent=exponent, include_bias=include_bias, bias_as_column=bias_as_column, power_iterations=500
    )
    _start(callback, model)
    assert len(callback.blocks()) == len(layers)
    assert len(callback.biases()) == (len(layers) if include_bias and not bias_as_column else 0)
    policy.zero_grad()
    _hand_loss(policy, obs).backward()
    th.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    for (name, p), want in zip(policy.named_parameters(), expected):
        th.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-6, msg=name)
    for m in layers:  # the estimates are the SVD's largest singular values
        key = f"policy.{callback.networks[0].layer_names[id(m)]}"
        svd = float(th.linalg.svdvals(_augmented(m, include_bias and bias_as_column).detach())[0])
        assert float(callback.state["sigma"][key]) == pytest.approx(svd, rel=1e-5)


def test_spectral_default_is_the_papers_weight_and_bias_penalty():
    """The default callback (and ``spectral_coef`` alone) adds ``coef * [(sigma_1(W)^2 - 1)^2 + ||b||^4]`` per layer:
    checked against a hand-written gradient (``2 (sigma^2 - 1) 2 sigma u v^T`` from the SVD's top pair, ``4 ||b||^2 b``),
    with no task loss and no clipping. The earlier default (``sigma_1([W | b])`` pulled to 1, no bias term) fails."""
    th.manual_seed(3)
    model = PlasticPPO("MlpPolicy", "CartPole-v1", spectral_coef=0.25, isometry_mode="off", optimizer="adam", seed=0)
    policy = model.policy
    with th.no_grad():  # Gaussian weights (sigma_1 far from 1, a unique top pair), biases away from 0
        for m in policy.modules():
            if isinstance(m, th.nn.Linear):
                m.weight.copy_(0.3 * th.randn_like(m.weight))
                m.bias.copy_(0.4 * th.randn_like(m.bias))
    callback = model.intervention_callbacks()[0]
    assert isinstance(callback, SpectralRegularisation) and callback.power_iterations == 1
    callback.power_iterations = 500  # converge on the first update (the default persists one step per update)
    _start(callback, model)
    policy.zero_grad()
    # a loss that reaches every parameter with zero gradient: the gradients are the penalty's alone
    (0.0 * sum(p.sum() for p in policy.parameters())).backward()
    layers = [m for m in policy.modules() if isinstance(m, th.nn.Linear)]
    for m in layers:
        matrix = m.weight.detach().double()
        u, s, vh = th.linalg.svd(matrix)
        sigma = s[0]
        want_w = 0.25 * 2 * (sigma**2 - 1) * 2 * sigma * th.outer(u[:, 0], vh[0])
        bias = m.bias.detach().double()
        want_b = 0.25 * 4 * bias.norm() ** 2 * bias
        th.testing.assert_close(m.weight.grad.double(), want_w, rtol=1e-4, atol=1e-5)
        th.testing.assert_close(m.bias.grad.double(), want_b, rtol=1e-5, atol=1e-6)
    assert callback.exponent == 2.0 and callback.layers == "all" and callback.include_bias and not callback.bias_as_column


def test_spectral_bias_penalty_functions():
    from sb3_plastic.callbacks.regularisers import spectral_bias_penalty, spectral_bias_penalty_grad

    gen = th.Generator().manual_seed(4)
    bias = th.randn(7, generator=gen, dtype=th.float64)
    for k in (0.5, 1.0, 2.0, 3.0):
        b = bias.clone().requires_grad_(True)
        (0.3 * b.norm() ** (2 * k)).backward()
        th.testing.assert_close(spectral_bias_penalty_grad(bias, 0.3, k), b.grad)
        assert float(spectral_bias_penalty(bias, k)) == pytest.approx(float(bias.norm()) ** (2 * k))
        zero = spectral_bias_penalty_grad(th.zeros(3, dtype=th.float64), 0.3, k)
        assert th.equal(zero, th.zeros(3, dtype=th.float64))  # 0 at b = 0, also for k < 1


def test_spectral_bias_keywords():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", spectral_coef=0.1, spectral_bias_as_column=True)
    callback = model.intervention_callbacks()[0]
    assert callback.bias_as_column and callback.biases() == []
    assert all(b.bias is not None for b in callback.blocks())
    hidden = SpectralRegularisation(0.1, layers="hidden")
    hidden.init_callback(PPO("MlpPolicy", "CartPole-v1", seed=0))
    assert len(hidden.biases()) == 4  # the heads' biases stay free with their weights
    with pytest.warns(UserWarning, match=r"bias_as_column=True.*include_bias is False"):
        SpectralRegularisation(0.1, include_bias=False, bias_as_column=True)
    with pytest.warns(UserWarning, match=r"spectral_bias_as_column=True.*spectral_include_bias is False"):
        PlasticPPO("MlpPolicy", "CartPole-v1", spectral_coef=0.1, spectral_include_bias=False, spectral_bias_as_column=True)


def test_spectral_power_iteration_persists_one_step_per_update():
    th.manual_seed(2)
    model = PPO("MlpPolicy", "CartPole-v1", seed=0)
    layer = model.policy.mlp_extractor.policy_net[0]  # Linear(4, 64)
    with th.no_grad():  # known spectrum: singular values 3, 2.4, 1, 0.5 of W (the bias has its own norm penalty)
        u, _ = th.linalg.qr(th.randn(64, 4))
        v, _ = th.linalg.qr(th.randn(4, 4))
        target = u @ th.diag(th.tensor([3.0, 2.4, 1.0, 0.5])) @ v.T
        layer.weight.copy_(target)
    callback = SpectralRegularisation(1e-3)
    _start(callback, model)
    key = "policy.mlp_extractor.policy_net.0"
    obs = th.randn(8, 4)
    # hand-written reference loop: one power iteration per update from the persisted vector
    ref_u = callback.state["u"][key].clone()
    matrix = target.clone()
    first = None
    for _ in range(30):
        ref_v = matrix.T @ ref_u
        ref_v = ref_v / ref_v.norm()
        ref_u = matrix @ ref_v
        ref_u = ref_u / ref_u.norm()
        for _twice in range(2):  # a second backward before the step does not advance the iteration
            model.policy.zero_grad()
            _hand_loss(model.policy, obs).backward()
        th.testing.assert_close(callback.state["u"][key], ref_u, rtol=1e-5, atol=1e-6)
        first = float(callback.state["sigma"][key]) if first is None else first
        with th.no_grad():  # an "optimizer step" that leaves the values: the version counter moves
            layer.weight.add_(0.0)
    ratio = 2.4 / 3.0
    assert float(callback.state["sigma"][key]) == pytest.approx(3.0, rel=4 * ratio ** (2 * 30))
    assert first == pytest.approx(3.0, rel=1e-2)  # the vector was warmed up when drawn (issue #27)


def test_spectral_layers_hidden_leaves_heads_and_lstm_gate_blocks():
    model = PPO("MlpPolicy", "CartPole-v1", seed=0)
    callback = SpectralRegularisation(0.1, layers="hidden")
    callback.init_callback(model)
    keys = [b.key for b in callback.blocks()]
    assert "policy.action_net" not in keys and "policy.value_net" not in keys and len(keys) == 4
    from sb3_contrib import RecurrentPPO

    lstm = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16, policy_kwargs=dict(lstm_hidden_size=8))
    callback = SpectralRegularisation(0.1)
    callback.init_callback(lstm)
    blocks = [b for b in callback.blocks() if "lstm_actor.weight_hh_l0" in b.key]
    assert [tuple(b.matrix().shape) for b in blocks] == [(8, 8)] * 4
    assert th.equal(blocks[2].matrix(), lstm.policy.lstm_actor.weight_hh_l0.detach()[16:24])


def test_spectral_pulls_sigma_max_towards_one():
    def sigmas(coef):
        fast = dict(PPO_FAST, batch_size=16, n_epochs=10)  # 160 updates
        model = PlasticPPO("MlpPolicy", "CartPole-v1", spectral_coef=coef, learning_rate=3e-3, **fast)
        model.learn(256)
        layer = model.policy.mlp_extractor.policy_net[0]
        return th.linalg.svdvals(layer.weight.detach())[0], layer.bias.detach().norm()

    (sigma_on, bias_on), (sigma_off, bias_off) = sigmas(1.0), sigmas(0.0)
    assert abs(float(sigma_on) - 1) < 0.5 * abs(float(sigma_off) - 1)
    assert float(bias_on) < float(bias_off)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(spectral_coef=-1.0), "spectral_coef"),
        (dict(spectral_exponent=0), "spectral_exponent"),
        (dict(spectral_include_bias="yes"), "spectral_include_bias"),
        (dict(spectral_bias_as_column=1), "spectral_bias_as_column"),
        (dict(spectral_layers="heads"), "heads"),
        (dict(spectral_power_iterations=0), "spectral_power_iterations"),
    ],
)
def test_bad_spectral_keywords(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_spectral_zero_coefficient_is_sb3_bit_for_bit():
    def run(callback):
        model = PPO("MlpPolicy", "CartPole-v1", seed=0, **{k: v for k, v in PPO_FAST.items() if k != "seed"})
        return model.learn(128, callback=callback)

    assert_same_parameters(run(None), run(SpectralRegularisation(0.0)))


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")
def test_the_three_baselines_train_on_cuda():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", device="cuda", l2_init_coef=0.1, spectral_coef=0.1, nap=True, **PPO_FAST)
    model.learn(128)
    state = model.plastic_state
    assert all(v.device.type == "cuda" for v in state["L2Init:auto"]["theta0"].values())
    assert all(u.device.type == "cuda" for u in state["SpectralRegularisation:auto"]["u"].values())
    assert state["NormalizeAndProject:auto"]["projections"] > 0
    for p in model.policy.parameters():
        assert p.device.type == "cuda" and th.isfinite(p).all()
