"""A2C (rlx/agents/a2c.py): loss by hand, GAE / n-step targets against NumPy, validation, learning."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.agents import a2c
from test_returns import reference_gae  # the NumPy GAE reference PPO's targets are checked against


# --------------------------------------------------------------------------- loss


@pytest.mark.parametrize("jit", [False, True])
def test_loss_terms_by_hand(jit):
    config = a2c.Config(vf_coef=0.25, ent_coef=0.1, normalize_advantages=False)
    log_prob = np.array([math.log(0.5), math.log(0.25), math.log(0.8)], np.float32)
    entropy = np.array([0.6, 0.9, 0.3], np.float32)
    value = np.array([1.0, -1.0, 0.5], np.float32)
    advantages = np.array([2.0, -1.0, 0.5], np.float32)
    targets = np.array([3.0, 0.0, 0.5], np.float32)

    fn = jax.jit(a2c.a2c_loss_terms, static_argnums=0) if jit else a2c.a2c_loss_terms
    total, terms = fn(config, log_prob, entropy, value, advantages, targets)

    policy_loss = -(2.0 * math.log(0.5) - 1.0 * math.log(0.25) + 0.5 * math.log(0.8)) / 3
    value_loss = 0.5 * (4.0 + 1.0 + 0.0) / 3
    entropy_mean = 0.6
    assert terms["policy_loss"] == pytest.approx(policy_loss, abs=1e-6)
    assert terms["value_loss"] == pytest.approx(value_loss, abs=1e-6)
    assert terms["entropy"] == pytest.approx(entropy_mean, abs=1e-6)
    assert total == pytest.approx(policy_loss + 0.25 * value_loss - 0.1 * entropy_mean, abs=1e-6)


def test_loss_gradient_treats_advantages_and_targets_as_constants():
    """d loss / d log_prob = -A/n and d loss / d value = vf_coef * (V - target)/n; none flows into A or targets."""
    config = a2c.Config(vf_coef=0.5, ent_coef=0.0)
    log_prob, value = jnp.array([-0.7, -1.2]), jnp.array([1.0, 2.0])
    advantages, targets = jnp.array([1.5, -0.5]), jnp.array([0.0, 4.0])

    def total(log_prob, value, advantages, targets):
        return a2c.a2c_loss_terms(config, log_prob, jnp.zeros(2), value, advantages, targets)[0]

    grads = jax.grad(total, argnums=(0, 1, 2, 3))(log_prob, value, advantages, targets)
    np.testing.assert_allclose(grads[0], [-0.75, 0.25], atol=1e-6)
    np.testing.assert_allclose(grads[1], [0.25, -0.5], atol=1e-6)
    np.testing.assert_allclose(grads[2], 0.0)
    np.testing.assert_allclose(grads[3], 0.0)


def test_advantage_normalisation():
    config = a2c.Config(normalize_advantages=True, ent_coef=0.0, vf_coef=0.0)
    log_prob = np.array([-1.0, -2.0], np.float32)
    advantages = np.array([3.0, 5.0], np.float32)  # normalised to -1, +1
    zeros = np.zeros(2, np.float32)
    total, terms = a2c.a2c_loss_terms(config, log_prob, zeros, zeros, advantages, zeros)
    assert terms["policy_loss"] == pytest.approx(-(-1.0 * -1.0 + 1.0 * -2.0) / 2, abs=1e-5)
    assert total == pytest.approx(terms["policy_loss"])


# --------------------------------------------------------------------------- n-step / GAE targets


def reference_n_step_returns(rewards, next_values, terminated, truncated, gamma):
    """G_t = r_t + gamma r_{t+1} + ... up to the episode's end (bootstrap V(final obs) if truncated)
    or the rollout's end (bootstrap V(next obs)); nothing after a termination."""
    steps, envs = rewards.shape
    returns = np.zeros_like(rewards)
    for n in range(envs):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                total += weight * rewards[k, n]
                weight *= gamma
                if terminated[k, n]:
                    break
                if truncated[k, n] or k == steps - 1:
                    total += weight * next_values[k, n]
                    break
            returns[t, n] = total
    return returns


def random_rollout(seed=0, steps=12, envs=3):
    rng = np.random.default_rng(seed)
    rewards, values, next_values = (rng.normal(size=(steps, envs)).astype(np.float32) for _ in range(3))
    terminated = np.zeros((steps, envs), np.float32)
    truncated = np.zeros((steps, envs), np.float32)
    terminated[3, 0] = terminated[7, 1] = 1  # natural ends: no bootstrap
    truncated[5, 0] = truncated[2, 1] = truncated[9, 2] = 1  # time limits: bootstrap from the final obs
    return rewards, values, next_values, terminated, truncated


@pytest.mark.parametrize("jit", [False, True])
def test_gae_matches_reference_with_termination_and_truncation(jit):
    rewards, values, next_values, terminated, truncated = random_rollout()
    done = np.maximum(terminated, truncated)
    gae = jax.jit(a2c.gae) if jit else a2c.gae
    adv, targets = gae(rewards, values, next_values, terminated, done, 0.97, 0.9)
    ref_adv, ref_targets = reference_gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-5, atol=1e-5)


def test_lambda_one_gives_n_step_returns():
    """A2C's default lambda = 1: targets are n-step discounted returns, whatever the values are."""
    rewards, values, next_values, terminated, truncated = random_rollout(seed=1)
    done = np.maximum(terminated, truncated)
    # Within an episode the next state's value is the next step's value, as in a real rollout.
    next_values[:-1] = np.where(done[:-1] > 0, next_values[:-1], values[1:])
    _, targets = a2c.gae(rewards, values, next_values, terminated, done, 0.9, 1.0)
    expected = reference_n_step_returns(rewards, next_values, terminated, truncated, 0.9)
    np.testing.assert_allclose(targets, expected, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    """One step, two envs, same reward: only the truncated one adds gamma * V(final obs)."""
    adv, _ = a2c.gae(
        np.array([[1.0, 1.0]]), np.zeros((1, 2)), np.array([[10.0, 10.0]]),
        np.array([[1.0, 0.0]]), np.array([[1.0, 1.0]]), 0.5, 1.0,
    )
    np.testing.assert_allclose(adv, [[1.0, 1.0 + 0.5 * 10.0]])


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lr", 0.0, "lr=0.0: must be > 0"),
        ("gamma", 1.5, "gamma=1.5: must be in [0, 1]"),
        ("gae_lambda", -0.1, "gae_lambda=-0.1: must be in [0, 1]"),
        ("ent_coef", -0.01, "ent_coef=-0.01: must be >= 0"),
        ("max_grad_norm", 0.0, "max_grad_norm=0.0: must be > 0"),
        ("rms_decay", 1.0, "rms_decay=1.0: must be in [0, 1)"),
        ("num_envs", 0, "num_envs=0: must be >= 1"),
        ("total_timesteps", 100, "total_timesteps=100: must be >= one batch (num_envs*num_steps=128)"),
        ("hidden_sizes", (64, 0), "hidden_sizes=(64, 0): every width must be an integer >= 1"),
        ("activation", "sigmoid", "activation='sigmoid': must be one of"),
        ("optimizer", "sgd", "optimizer='sgd': must be one of ['rmsprop', 'adam']"),
    ],
)
def test_validate_names_the_field_value_and_rule(field, value, message):
    with pytest.raises(ValueError) as error:
        a2c.validate(dataclasses.replace(a2c.Config(), **{field: value}))
    assert str(error.value).startswith(message)


def test_defaults_are_valid_and_static_fields_are_not_leaves():
    config = a2c.Config()
    a2c.validate(config)
    assert len(jax.tree.leaves(config)) == 10  # the numeric hyper-parameters only
    assert config.batch_size == config.num_envs * config.num_steps
    assert config.num_updates == config.total_timesteps // config.batch_size


# --------------------------------------------------------------------------- running


def test_continuous_actions_adam_and_normalisation_run():
    """``train`` with a Gaussian policy on Pendulum and the non-default branches: finite metrics,
    linearly annealed learning rate, step counters, and act/value shapes."""
    from gymnax.environments.classic_control.pendulum import Pendulum

    env = Pendulum()
    config = a2c.Config(total_timesteps=4 * 64, num_envs=4, num_steps=16, hidden_sizes=(16,), optimizer="adam",
                        normalize_observations=True, normalize_advantages=True, gae_lambda=0.95, lr=1e-3)
    a2c.validate(config)
    state, metrics = a2c.train(config, env, env.default_params, jax.random.PRNGKey(0))
    for name, values in metrics.items():
        assert np.isfinite(values).all(), name
    np.testing.assert_allclose(metrics["learning_rate"], [1e-3, 7.5e-4, 5e-4, 2.5e-4], rtol=1e-5)
    assert int(state.env_steps) == 4 * config.batch_size and int(state.update_step) == 4
    agent = a2c.make(config, env, env.default_params)
    obs = jnp.zeros((5, 3))
    action = agent.act(state.policy, obs, jax.random.PRNGKey(1), False)
    assert action.shape == (5, 1) and bool((jnp.abs(action) <= 2.0).all())
    assert agent.act(state.policy, obs[0], jax.random.PRNGKey(1), True).shape == (1,)
    assert agent.value(state.policy, obs).shape == (5,)


def test_learns_cartpole_on_two_seeds(optimised):
    """Default hyper-parameters, 60k steps: the train return of each seed is far above random (~22)."""
    from gymnax.environments.classic_control.cartpole import CartPole

    config = a2c.Config(total_timesteps=60_000)
    a2c.validate(config)
    env = CartPole()
    agent = a2c.make(config, env, env.default_params)

    def run(key):  # both seeds in one compiled program, as the runner does
        state = agent.init(key)
        return jax.lax.scan(lambda s, _: agent.update(s), state, None, config.num_updates)[1]

    metrics = jax.jit(jax.vmap(run))(jnp.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)]))
    final = np.asarray(metrics["train_return"])[:, -1]
    assert (final > 150).all(), final
