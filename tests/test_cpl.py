"""Offline CPL and the BC baselines (rlx/agents/cpl.py): the loss against a NumPy reference, which
actions each objective reads, the continuous log-densities, validation, and a CartPole run that
beats a random policy (the vendored demo: test_vendoring.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole
from gymnax.environments.classic_control.pendulum import Pendulum

from rlx.agents import cpl

KEY = jax.random.PRNGKey(0)


def softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def reference_cpl_loss(log_probs, labels, mask, alpha, gamma, lam, bc_weight):
    """The CPL objective written out with loops, in float64."""
    total, weight, bc_sum, bc_count = 0.0, 0.0, 0.0, 0.0
    for (lp0, lp1), y, m in zip(log_probs, labels, mask):
        s0 = alpha * sum(gamma**t * v for t, v in enumerate(lp0))
        s1 = alpha * sum(gamma**t * v for t, v in enumerate(lp1))
        total += m * (y * softplus(lam * s0 - s1) + (1 - y) * softplus(lam * s1 - s0))
        weight += m
        for segment, preferred in ((lp0, y <= 0.5), (lp1, y >= 0.5)):
            if m and preferred:
                bc_sum += -np.mean(segment)
                bc_count += 1
    return total / max(weight, 1.0) + bc_weight * bc_sum / bc_count


def test_cpl_loss_of_one_pair_by_hand():
    # scores: s0 = 1 * (-1 - 1) = -2, s1 = -1; second preferred, lambda 0.5: softplus(0.5 * -2 - -1) = log 2
    log_probs = jnp.asarray([[[-1.0, -1.0], [-0.5, -0.5]]])
    config = cpl.Config(alpha=1.0, gamma=1.0, conservative_bias=0.5, bc_weight=0.0)
    loss, metrics = cpl.loss_terms(config, log_probs, jnp.asarray([1.0]), jnp.asarray([1.0]))
    np.testing.assert_allclose(float(loss), np.log(2.0), rtol=1e-6)
    assert float(metrics["accuracy"]) == 1.0
    # first preferred instead: softplus(0.5 * -1 - -2) = softplus(1.5)
    loss, _ = cpl.loss_terms(config, log_probs, jnp.asarray([0.0]), jnp.asarray([1.0]))
    np.testing.assert_allclose(float(loss), np.log1p(np.exp(1.5)), rtol=1e-6)


def test_cpl_loss_matches_numpy_reference_with_discount_bias_ties_and_masks():
    rng = np.random.default_rng(0)
    log_probs = -rng.exponential(1.0, (6, 2, 5))
    labels = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.5])
    mask = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])  # the 4th pair is skipped
    settings = dict(alpha=0.3, gamma=0.9, conservative_bias=0.6, bc_weight=0.25)
    loss, metrics = cpl.loss_terms(cpl.Config(**settings), jnp.asarray(log_probs, jnp.float32),
                                   jnp.asarray(labels), jnp.asarray(mask))
    expected = reference_cpl_loss(log_probs, labels, mask, settings["alpha"], settings["gamma"],
                                  settings["conservative_bias"], settings["bc_weight"])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    # the skipped pair counts for nothing, whatever its log-likelihoods
    changed = log_probs.copy()
    changed[3] -= 7.0
    loss2, _ = cpl.loss_terms(cpl.Config(**settings), jnp.asarray(changed, jnp.float32), jnp.asarray(labels),
                              jnp.asarray(mask))
    np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
    assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_bias_one_makes_a_tie_indifferent_and_bias_below_one_raises_both_likelihoods():
    log_probs = jnp.full((1, 2, 4), -0.7)
    tie, mask = jnp.asarray([0.5]), jnp.asarray([1.0])

    def grad(bias):
        config = cpl.Config(conservative_bias=bias, bc_weight=0.0)
        return jax.grad(lambda lp: cpl.loss_terms(config, lp, tie, mask)[0])(log_probs)

    np.testing.assert_allclose(np.asarray(grad(1.0)), 0.0, atol=1e-7)  # equal scores: nothing to learn
    assert (np.asarray(grad(0.5)) < 0).all()  # descending the loss raises every log-likelihood


def test_bc_objectives_weight_the_right_segments():
    rng = np.random.default_rng(1)
    log_probs = -rng.exponential(1.0, (4, 2, 3))
    labels, mask = np.array([1.0, 0.0, 0.5, 1.0]), np.array([1.0, 1.0, 1.0, 0.0])
    per_segment = -log_probs.mean(-1)
    preferred = per_segment[0, 1] + per_segment[1, 0] + per_segment[2, 0] + per_segment[2, 1]

    def loss(objective, lp=log_probs):
        return float(cpl.loss_terms(cpl.Config(objective=objective), jnp.asarray(lp, jnp.float32),
                                    jnp.asarray(labels), jnp.asarray(mask))[0])

    np.testing.assert_allclose(loss("bc_preferred"), preferred / 4, rtol=1e-5)
    np.testing.assert_allclose(loss("bc_all"), per_segment.mean(), rtol=1e-5)
    dispreferred = log_probs.copy()
    dispreferred[0, 0] -= 5.0  # loser of pair 0
    dispreferred[1, 1] -= 5.0  # loser of pair 1
    dispreferred[3] -= 5.0  # both segments of the skipped pair
    np.testing.assert_allclose(loss("bc_preferred", dispreferred), loss("bc_preferred"), rtol=1e-6)
    assert loss("bc_all", dispreferred) > loss("bc_all") + 1.0
    assert loss("cpl", dispreferred) != pytest.approx(loss("cpl"))


def tiny_cartpole_data(num_segments=6, length=4, num_pairs=5, seed=0):
    rng = np.random.default_rng(seed)
    return cpl.Data(
        obs=rng.normal(size=(num_segments, length, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (num_segments, length)).astype(np.int32),
        pairs=np.stack([np.arange(num_pairs), np.arange(num_pairs) + 1], -1).astype(np.int32),
        labels=np.array([1.0, 0.0, 0.5, 1.0, 0.0], np.float32)[:num_pairs],
        mask=np.array([1.0, 1.0, 1.0, 0.0, 1.0], np.float32)[:num_pairs],
    )


@pytest.mark.parametrize("objective, changes", [("bc_preferred", False), ("bc_all", True), ("cpl", True)])
def test_agent_loss_reads_dispreferred_actions_only_when_it_should(objective, changes):
    env = CartPole()
    data = tiny_cartpole_data()
    config = cpl.Config(objective=objective)
    segments = jnp.asarray(data.pairs)
    labels, mask = jnp.asarray(data.labels), jnp.asarray(data.mask)

    def loss_of(data):
        agent = cpl.make(config, env, env.default_params, data)
        state = agent.init(KEY)
        return float(agent.loss(state.params, state.policy, segments, labels, mask)[0])

    # pairs (0,1) second wins, (1,2) first wins, (2,3) tie, (3,4) skipped, (4,5) first wins: segments
    # 0 and 5 are never preferred in a used pair (2 loses to 1 but is preferred in its tie), so
    # flipping their actions must not move BC-preferred's loss and must move the others'.
    flipped = data.actions.copy()
    flipped[[0, 5]] = 1 - flipped[[0, 5]]
    before, after = loss_of(data), loss_of(data._replace(actions=flipped))
    assert (abs(after - before) > 1e-6) == changes, (before, after)


@pytest.mark.parametrize("policy", ["tanh_gaussian", "gaussian"])
def test_continuous_log_density_integrates_to_one_over_the_action_range(policy):
    env = Pendulum()
    params = env.default_params
    config = cpl.Config(policy=policy, normalize_observations=False)
    spec = cpl.action_spec(env, params)
    network, log_prob, act = cpl.policy_functions(config, spec, (3,))
    net_params = network.init(KEY, jnp.zeros(3))
    # a non-trivial mean and std, small enough that little mass sits in the last 0.1% of the range
    net_params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(KEY, x.shape), net_params)
    policy_ = cpl.Policy(net_params, jnp.zeros(3), jnp.ones(3))
    obs = jnp.asarray([0.3, -0.2, 0.5])
    grid = jnp.linspace(-2.0, 2.0, 20001)
    density = jnp.exp(jax.vmap(lambda a: log_prob(policy_, obs, a[None]))(grid))
    mass = float(jnp.trapezoid(density, grid))
    if policy == "tanh_gaussian":
        assert mass == pytest.approx(1.0, abs=0.02)
    else:
        assert 0.0 < mass <= 1.0 + 1e-3  # clipped when acting: part of the mass lies outside the bounds
    action = act(policy_, obs, KEY, False)
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


@pytest.mark.parametrize("field, value, words", [
    ("objective", "dpo", ["objective='dpo'", "cpl", "bc_all", "bc_preferred"]),
    ("conservative_bias", 0.0, ["conservative_bias=0.0", "(0, 1]"]),
    ("conservative_bias", 1.5, ["conservative_bias=1.5", "(0, 1]"]),
    ("alpha", -1.0, ["alpha=-1.0", "> 0"]),
    ("gamma", 0.0, ["gamma=0.0", "(0, 1]"]),
    ("policy", "beta", ["policy='beta'", "tanh_gaussian"]),
    ("batch_size", 0, ["batch_size=0", ">= 1"]),
    ("bc_weight", -0.1, ["bc_weight=-0.1", ">= 0"]),
])
def test_validate_names_field_value_and_valid_choices(field, value, words):
    with pytest.raises(ValueError) as error:
        cpl.validate(cpl.Config(**{field: value}))
    for word in words:
        assert word in str(error.value)


def test_bad_data_shapes_name_the_field():
    env = CartPole()
    data = tiny_cartpole_data()
    with pytest.raises(ValueError, match="labels"):
        cpl.make(cpl.Config(), env, env.default_params, data._replace(labels=data.labels[:3]))
    with pytest.raises(ValueError, match="actions"):
        cpl.make(cpl.Config(), env, env.default_params, data._replace(actions=data.actions[:, :2]))
    with pytest.raises(ValueError, match="pairs"):
        cpl.make(cpl.Config(), env, env.default_params, data._replace(pairs=data.pairs + 10))


@pytest.mark.slow  # about 20 s cold; the vendoring test trains cpl.py to a threshold in the fast suite
def test_cpl_learns_cartpole_from_preferences_and_beats_random():
    env = CartPole()
    params = env.default_params
    data_key, train_key, eval_key = jax.random.split(jax.random.PRNGKey(3), 3)
    data, _ = cpl.cartpole_dataset(env, params, data_key, num_envs=4, num_steps=160, num_pairs=1000)
    config = cpl.Config(num_updates=600)
    state, metrics = cpl.train(config, env, params, data, jax.random.split(train_key, 2))
    returns = jax.vmap(lambda policy, key: cpl.evaluate(config, env, params, policy, key, 8))(
        state.policy, jax.random.split(eval_key, 2))
    assert np.asarray(metrics["accuracy"])[:, -50:].mean() > 0.8
    # a random policy averages about 22; the data's actions are wrong half of the time overall
    assert float(returns.min()) > 150.0, returns
