"""Separate evaluation rollouts: fresh environments, their own keys, greedy or sampled actions."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def evaluate(act, env, env_params, policy, key, num_episodes: int, greedy: bool):
    """Undiscounted returns of ``num_episodes`` parallel episodes, shape ``[num_episodes]``.

    Runs ``max_steps_in_episode`` steps; each episode's return stops
    accumulating at its first termination or truncation, so auto-reset
    episodes are never counted.
    """
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_episodes), env_params)

    def step(carry, _):
        obs, state, returns, running, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        action = act(policy, obs, act_key, greedy)
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, num_episodes), state, action, env_params
        )
        returns = returns + reward * running
        running = running * (1.0 - jnp.logical_or(terminated, truncated))
        return (obs, state, returns, running, key), None

    zeros = jnp.zeros(num_episodes)
    carry = (obs, state, zeros, jnp.ones(num_episodes), key)
    (_, _, returns, _, _), _ = jax.lax.scan(step, carry, None, int(env_params.max_steps_in_episode))
    return returns
