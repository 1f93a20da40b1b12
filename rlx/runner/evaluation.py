"""Separate evaluation rollouts: fresh environments, their own keys, greedy or sampled actions."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def stateful_act(agent):
    """``(policy, memory, obs, reset, key, greedy) -> (memory, action)`` for any agent.

    Recurrent agents (those with ``init_carry``) act like this already; a
    feed-forward agent gets an empty memory it ignores.
    """
    if hasattr(agent, "init_carry"):
        return agent.act, agent.init_carry

    def act(policy, memory, obs, reset, key, greedy):
        return memory, agent.act(policy, obs, key, greedy)

    return act, lambda batch_size: ()


def evaluate(agent, env, env_params, policy, key, num_episodes: int, greedy: bool, num_steps: int | None = None):
    """Undiscounted returns of ``num_episodes`` parallel episodes, shape ``[num_episodes]``.

    Runs ``max_steps_in_episode`` steps (or ``num_steps``); each episode's return
    stops accumulating at its first termination or truncation, so auto-reset
    episodes are never counted. A recurrent agent's memory starts empty.
    """
    act, init_memory = stateful_act(agent)
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_episodes), env_params)

    def step(carry, _):
        obs, state, memory, reset, returns, running, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        memory, action = act(policy, memory, obs, reset, act_key, greedy)
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, num_episodes), state, action, env_params
        )
        done = jnp.logical_or(terminated, truncated)
        returns = returns + reward * running
        running = running * (1.0 - done)
        return (obs, state, memory, done, returns, running, key), None

    starts = jnp.ones(num_episodes, bool)  # every first observation starts an episode
    carry = (obs, state, init_memory(num_episodes), starts, jnp.zeros(num_episodes), jnp.ones(num_episodes), key)
    (*_, returns, _, _), _ = jax.lax.scan(step, carry, None, num_steps or int(env_params.max_steps_in_episode))
    return returns
