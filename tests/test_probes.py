"""PPO on probe environments must converge to their known values and policies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.agents import ppo
from rlx.envs import registry

PROBE_CONFIG = dict(
    total_timesteps=16 * 8 * 60, num_envs=16, num_steps=8, num_epochs=4, num_minibatches=2,
    lr=3e-3, ent_coef=0.0, anneal_lr=False, hidden_sizes=(16,), gamma=0.9,
)


def train_probe(name, **overrides):
    env, params = registry.make(name)
    config = ppo.Config(**{**PROBE_CONFIG, **overrides})
    ppo.validate(config)
    state, _ = ppo.train(config, env, params, jax.random.PRNGKey(0))
    return ppo.make(config, env, params), state


def test_constant_reward_value_is_one():
    agent, state = train_probe("Probe-ConstantReward")
    assert float(agent.value(state.policy, jnp.array([1.0, 0.0]))) == pytest.approx(1.0, abs=0.05)


def test_observation_reward_value_follows_observation():
    agent, state = train_probe("Probe-ObservationReward")
    values = agent.value(state.policy, jnp.array([[1.0, 0.0], [-1.0, 0.0]]))
    np.testing.assert_allclose(values, [1.0, -1.0], atol=0.1)


def test_action_reward_policy_picks_rewarded_action():
    agent, state = train_probe("Probe-ActionReward")
    obs = jnp.tile(jnp.array([1.0, 0.0]), (256, 1))
    actions = agent.act(state.policy, obs, jax.random.PRNGKey(1), False)
    assert float(actions.mean()) > 0.95
    assert int(agent.act(state.policy, obs[0], jax.random.PRNGKey(2), True)) == 1


def test_two_step_credit_values_are_gamma_and_one():
    agent, state = train_probe("Probe-TwoStepCredit")
    values = agent.value(state.policy, jnp.array([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(values, [0.9, 1.0], atol=0.07)


def test_continuous_gaussian_mean_moves_to_target():
    agent, state = train_probe("Probe-ContinuousTarget", lr=1e-2, total_timesteps=16 * 8 * 100)
    action = agent.act(state.policy, jnp.array([1.0, 0.0]), jax.random.PRNGKey(0), True)
    assert float(action[0]) == pytest.approx(0.5, abs=0.1)
