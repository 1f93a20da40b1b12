"""Recurrent PPO (rlx/agents/ppo_rnn.py): memory resets, GAE, config checks, and a task only memory solves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.agents import ppo, ppo_rnn
from rlx.envs.registry import import_env_module
from rlx.runner.evaluation import evaluate

MemoryChain = import_env_module("gymnax.environments.bsuite.memory_chain").MemoryChain

# MemoryChain (bsuite, memory_length=5): the cue (+1/-1) is in the first two
# observations, then only a countdown; on the 6th step the action must match the
# cue for +1, else -1. Feed-forward policies see the same last observation
# whatever the cue, so they average 0.
MEMORY_BUDGET = dict(total_timesteps=16 * 32 * 32, num_envs=16, num_steps=32, num_minibatches=4, lr=3e-3)
RNN_CONFIG = ppo_rnn.Config(**MEMORY_BUDGET, hidden_sizes=(32,), gru_size=32, head_sizes=(32,))
FF_CONFIG = ppo.Config(**MEMORY_BUDGET, hidden_sizes=(32, 32))
EVAL_EPISODES = 512


def memory_env():
    env = MemoryChain()
    return env, env.default_params


@jax.jit
def rnn_update(config, state):
    """One update; ``config`` is traced, so ``config.replace(lr=...)`` reuses the compiled program."""
    env, env_params = memory_env()
    return ppo_rnn.make(config, env, env_params).update(state)


@pytest.fixture(scope="module")
def trained_rnn():
    env, env_params = memory_env()
    ppo_rnn.validate(RNN_CONFIG)
    agent = ppo_rnn.make(RNN_CONFIG, env, env_params)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    for _ in range(RNN_CONFIG.num_updates):
        state, metrics = rnn_update(RNN_CONFIG, state)
    return agent, state, metrics


# --------------------------------------------------------------------------- memory resets


def test_reset_gives_fresh_carry_output_whatever_the_previous_carry():
    env, env_params = memory_env()
    config = ppo_rnn.Config(gru_size=8, hidden_sizes=(8,), head_sizes=(8,))
    agent = ppo_rnn.make(config, env, env_params)
    value, act = jax.jit(agent.value), jax.jit(agent.act, static_argnums=5)
    policy = jax.jit(agent.init)(jax.random.PRNGKey(0)).policy
    batch = 4
    obs = jax.random.normal(jax.random.PRNGKey(1), (batch, 3))
    old_carry = jax.random.normal(jax.random.PRNGKey(2), (batch, 8))
    fresh = value(policy, agent.init_carry(batch), obs, jnp.zeros(batch, bool))

    after_reset = value(policy, old_carry, obs, jnp.ones(batch, bool))
    np.testing.assert_allclose(after_reset[0], fresh[0], atol=1e-6)
    np.testing.assert_allclose(after_reset[1], fresh[1], atol=1e-6)

    # Only rows flagged reset forget; the others read their previous carry.
    mixed = value(policy, old_carry, obs, jnp.array([True, False, True, False]))
    np.testing.assert_allclose(mixed[0][::2], fresh[0][::2], atol=1e-6)
    assert np.abs(np.asarray(mixed[0][1::2] - fresh[0][1::2])).min() > 1e-3

    # act returns the same carry, and works on one unbatched observation.
    carry, action = act(policy, old_carry[0], obs[0], True, jax.random.PRNGKey(3), True)
    np.testing.assert_allclose(carry, fresh[0][0], atol=1e-6)
    assert action.shape == ()


def test_unroll_over_a_sequence_matches_step_by_step_and_restarts_at_resets():
    network = ppo_rnn.RecurrentActorCritic(2, False, (8,), 8, (8,), "tanh")
    params = network.init(jax.random.PRNGKey(0), jnp.zeros(8), jnp.zeros(3), jnp.zeros((), bool))
    unroll = jax.jit(lambda carry, obs, reset: ppo_rnn.unroll(network, params, carry, obs, reset))
    one_step = jax.jit(lambda carry, obs, reset: network.apply(params, carry, obs, reset))
    steps, batch, k = 7, 3, 4
    obs = jax.random.normal(jax.random.PRNGKey(1), (steps, batch, 3))
    reset = jnp.zeros((steps, batch), bool).at[k, 1].set(True)
    carry0 = jax.random.normal(jax.random.PRNGKey(2), (batch, 8))

    last, dist, value = unroll(carry0, obs, reset)
    carry, logits, values = carry0, [], []
    for t in range(steps):
        carry, step_dist, step_value = one_step(carry, obs[t], reset[t])
        logits.append(step_dist.logits)
        values.append(step_value)
    np.testing.assert_allclose(last, carry, atol=1e-5)
    np.testing.assert_allclose(dist.logits, jnp.stack(logits), atol=1e-5)
    np.testing.assert_allclose(value, jnp.stack(values), atol=1e-5)

    # From its reset on, env 1 gives what a fresh sequence started at step k gives;
    # before it, its random initial carry matters.
    fresh_start = unroll(jnp.zeros((batch, 8)), jnp.roll(obs, -k, axis=0), jnp.zeros((steps, batch), bool))[2]
    np.testing.assert_allclose(value[k:, 1], fresh_start[: steps - k, 1], atol=1e-5)
    fresh = unroll(jnp.zeros((batch, 8)), obs, jnp.zeros((steps, batch), bool))[2]
    assert np.abs(np.asarray(value[:k, 1] - fresh[:k, 1])).min() > 1e-4


def test_learning_replay_reproduces_rollout_log_probs(trained_rnn):
    # With a zero learning rate the replayed sequences (stored start carry, reset
    # flags) must give exactly the rollout's log-probabilities: ratio 1 throughout.
    # A trained policy depends on its memory, so a misaligned carry would show.
    _, state, _ = trained_rnn
    _, metrics = rnn_update(RNN_CONFIG.replace(lr=0.0), state)
    assert float(metrics["approx_kl"]) < 1e-6, metrics
    assert float(metrics["clip_fraction"]) == 0.0


# --------------------------------------------------------------------------- returns


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Advantages as explicit sums of discounted TD errors up to each episode's end."""
    steps, batch = rewards.shape
    advantages = np.zeros((steps, batch))
    for b in range(batch):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for u in range(t, steps):
                bootstrap = 0.0 if terminated[u, b] else gamma * next_values[u, b]
                total += weight * (rewards[u, b] + bootstrap - values[u, b])
                if terminated[u, b] or truncated[u, b]:
                    break
                weight *= gamma * lam
            advantages[t, b] = total
    return advantages, advantages + values


def test_gae_matches_numpy_reference_with_termination_and_truncation():
    rng = np.random.default_rng(0)
    steps, batch, gamma, lam = 12, 3, 0.97, 0.9
    rewards, values, next_values = (rng.normal(size=(steps, batch)) for _ in range(3))
    terminated = np.zeros((steps, batch), bool)
    truncated = np.zeros((steps, batch), bool)
    terminated[[3, 8], 0] = True
    truncated[5, 1] = True
    terminated[2, 2], truncated[6, 2], truncated[11, 2] = True, True, True
    done = terminated | truncated
    got = jax.jit(ppo_rnn.gae)(
        *(jnp.asarray(x, jnp.float32) for x in (rewards, values, next_values, terminated, done)), gamma, lam
    )
    want = gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    # Truncation bootstraps from the next value, termination does not.
    assert got[0][5, 1] == pytest.approx(rewards[5, 1] + gamma * next_values[5, 1] - values[5, 1], abs=1e-5)
    assert got[0][8, 0] == pytest.approx(rewards[8, 0] - values[8, 0], abs=1e-5)


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_envs=8, num_minibatches=3), "num_minibatches=3: must divide num_envs=8"),
        (dict(lr=0.0), "lr=0.0: must be > 0"),
        (dict(gru_size=0), "gru_size=0: must be >= 1"),
        (dict(head_sizes=(16, 0)), r"head_sizes=\(16, 0\): every width must be an integer >= 1"),
        (dict(activation="sigmoid"), "activation='sigmoid': must be one of"),
        (dict(total_timesteps=100, num_envs=4, num_steps=64), "total_timesteps=100: must be >= one batch"),
    ],
)
def test_validate_names_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        ppo_rnn.validate(ppo_rnn.Config(**overrides))


def test_default_config_is_valid():
    ppo_rnn.validate(ppo_rnn.Config())


# --------------------------------------------------------------------------- the memory gap


def test_memory_task_needs_memory(trained_rnn):
    env, env_params = memory_env()
    agent, state, metrics = trained_rnn
    rnn_returns = jax.jit(
        lambda policy, key: evaluate(agent, env, env_params, policy, key, EVAL_EPISODES, True, 12)
    )(state.policy, jax.random.PRNGKey(1))

    ppo.validate(FF_CONFIG)
    ff_agent = ppo.make(FF_CONFIG, env, env_params)
    ff_state, ff_update = jax.jit(ff_agent.init)(jax.random.PRNGKey(0)), jax.jit(ff_agent.update)
    for _ in range(FF_CONFIG.num_updates):
        ff_state, _ = ff_update(ff_state)
    # The runner's evaluation with a horizon of two episodes (only the first counts).
    short = env_params.replace(max_steps_in_episode=12)
    ff_returns = jax.jit(lambda policy, key: evaluate(ff_agent, env, short, policy, key, EVAL_EPISODES, True))(
        ff_state.policy, jax.random.PRNGKey(1)
    )

    rnn_mean, ff_mean = float(rnn_returns.mean()), float(ff_returns.mean())
    print(f"memory chain greedy return: GRU {rnn_mean:.3f}, feed-forward {ff_mean:.3f}")
    assert rnn_mean > 0.9, (rnn_mean, float(metrics["train_return"]))  # max 1
    assert abs(ff_mean) < 0.25, ff_mean  # chance is 0 (+-0.045 standard error with 512 episodes)
