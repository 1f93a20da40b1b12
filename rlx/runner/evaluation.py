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


def is_multi_agent(env) -> bool:
    """Whether ``env`` follows the array-per-agent contract (``rlx.envs.multi_agent``): a subclass or ``num_agents``."""
    from rlx.envs.multi_agent import MultiAgentEnv

    return isinstance(env, MultiAgentEnv) or hasattr(env, "num_agents")


def episode_outcomes(env) -> tuple[str, ...]:
    """Names of the boolean ``info`` entries that say how an episode ended (SMAX: ``("won",)``).

    An environment lists them in ``episode_outcomes``; evaluation reports, per
    episode, each entry's value on the episode's last step (a win rate for ``won``).
    """
    return tuple(getattr(env, "episode_outcomes", ()))


def evaluate(agent, env, env_params, policy, key, num_episodes: int, greedy: bool, num_steps: int | None = None):
    """Undiscounted returns of ``num_episodes`` parallel episodes, shape ``[num_episodes]``.

    Runs ``max_steps_in_episode`` steps (or ``num_steps``); each episode's return
    stops accumulating at its first termination or truncation, so auto-reset
    episodes are never counted. A recurrent agent's memory starts empty.
    Multi-agent environments get ``evaluate_multi_agent`` (team returns).
    """
    return evaluate_episodes(agent, env, env_params, policy, key, num_episodes, greedy, num_steps)[0]


def evaluate_episodes(agent, env, env_params, policy, key, num_episodes: int, greedy: bool,
                      num_steps: int | None = None):
    """``(returns [num_episodes], {outcome: float [num_episodes]})``: ``evaluate`` plus ``episode_outcomes``.

    An outcome is 1.0 for an episode whose last counted step set it, else 0.0
    (also for an episode still running when the evaluation stops).
    """
    if is_multi_agent(env):
        return _evaluate_multi_agent(agent, env, env_params, policy, key, num_episodes, greedy, num_steps)
    act, init_memory = stateful_act(agent)
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_episodes), env_params)
    names = episode_outcomes(env)

    def step(carry, _):
        obs, state, memory, reset, returns, outcomes, running, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        memory, action = act(policy, memory, obs, reset, act_key, greedy)
        obs, state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, num_episodes), state, action, env_params
        )
        done = jnp.logical_or(terminated, truncated)
        returns = returns + reward * running
        outcomes = _record_outcomes(outcomes, info, running * done)
        running = running * (1.0 - done)
        return (obs, state, memory, done, returns, outcomes, running, key), None

    starts = jnp.ones(num_episodes, bool)  # every first observation starts an episode
    zeros = jnp.zeros(num_episodes)
    carry = (obs, state, init_memory(num_episodes), starts, zeros, {n: zeros for n in names}, jnp.ones(num_episodes),
             key)
    (*_, returns, outcomes, _, _), _ = jax.lax.scan(step, carry, None,
                                                     num_steps or int(env_params.max_steps_in_episode))
    return returns, outcomes


def _record_outcomes(outcomes: dict, info: dict, ended: jax.Array) -> dict:
    """Adds each outcome's ``info`` flag where a counted episode ends on this step (``ended`` is 0 or 1)."""
    return {name: total + info[name].astype(jnp.float32) * ended for name, total in outcomes.items()}


def evaluate_multi_agent(agent, env, env_params, policy, key, num_episodes: int, greedy: bool,
                         num_steps: int | None = None):
    """Team returns of ``num_episodes`` parallel episodes, shape ``[num_episodes]``; see ``_evaluate_multi_agent``."""
    return _evaluate_multi_agent(agent, env, env_params, policy, key, num_episodes, greedy, num_steps)[0]


def _evaluate_multi_agent(agent, env, env_params, policy, key, num_episodes: int, greedy: bool,
                          num_steps: int | None = None):
    """Team returns of ``num_episodes`` parallel episodes of a multi-agent environment, shape ``[num_episodes]``.

    The team return is the mean over agents of each agent's summed rewards,
    counted until ``info["episode_over"]`` (every agent terminated, or the time
    limit); auto-reset episodes are never counted. Actions respect
    ``env.action_mask``: the agent is called as ``act(policy, obs, key, greedy,
    mask)``, or ``act(policy, carry, obs, reset, key, greedy, mask) -> (carry,
    action)`` when it has ``init_carry`` (a recurrent agent; memory starts empty).
    Returns ``(returns, outcomes)`` as ``evaluate_episodes`` does.
    """
    recurrent = hasattr(agent, "init_carry")
    has_mask = hasattr(env, "action_mask")
    batched = lambda fn: jax.vmap(fn, in_axes=(0, None))  # noqa: E731
    reset_key, key = jax.random.split(key)
    obs, state = batched(env.reset)(jax.random.split(reset_key, num_episodes), env_params)
    names = episode_outcomes(env)

    def step(carry, _):
        obs, state, memory, reset, returns, outcomes, running, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        mask = batched(env.action_mask)(state, env_params) if has_mask else None
        if recurrent:
            memory, action = agent.act(policy, memory, obs, reset, act_key, greedy, mask)
        else:
            action = agent.act(policy, obs, act_key, greedy, mask)
        obs, state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, num_episodes), state, action, env_params
        )
        if "episode_over" in info:
            over = info["episode_over"]
        else:
            over = jnp.logical_or(jnp.all(terminated, -1), truncated[..., 0])
        returns = returns + reward.mean(-1) * running
        outcomes = _record_outcomes(outcomes, info, running * over)
        running = running * (1.0 - over)
        return (obs, state, memory, over, returns, outcomes, running, key), None

    memory = agent.init_carry(num_episodes) if recurrent else ()
    starts = jnp.ones(num_episodes, bool)
    zeros = jnp.zeros(num_episodes)
    carry = (obs, state, memory, starts, zeros, {n: zeros for n in names}, jnp.ones(num_episodes), key)
    (*_, returns, outcomes, _, _), _ = jax.lax.scan(step, carry, None,
                                                     num_steps or int(env_params.max_steps_in_episode))
    return returns, outcomes
