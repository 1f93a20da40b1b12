"""Reference policies for multi-agent environments: uniform random, a scripted MPE spread team, SMAX's heuristic.

All follow the multi-agent agent interface that ``rlx.runner.evaluation.evaluate_multi_agent``
calls, ``act(policy, obs, key, greedy, mask) -> actions`` on ``[batch, n_agents, obs_dim]``
observations (the SMAX heuristic, which keeps memory, the recurrent form with ``init_carry``),
so their returns are measured by the same code as a trained MAPPO policy's.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# MPE's discrete actions (jaxmarl.environments.mpe.simple: _decode_discrete_action):
# 0 no-op, 1 -x, 2 +x, 3 -y, 4 +y; each pushes with force accel along one axis.
MPE_ACTION_FORCES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)


class ReferencePolicy(NamedTuple):
    """A policy without parameters, shaped like an rlx agent for ``evaluate_multi_agent``."""

    act: callable


def random_policy(num_actions: int) -> ReferencePolicy:
    """Uniformly random available actions (all actions when the environment has no mask)."""

    def act(policy, obs, key, greedy=False, mask=None):
        logits = jnp.zeros(obs.shape[:-1] + (num_actions,))
        if mask is not None:
            logits = jnp.where(mask, logits, -jnp.inf)
        return jax.random.categorical(key, logits)

    return ReferencePolicy(act)


def best_assignment(cost: jax.Array) -> jax.Array:
    """For an ``[n, n]`` cost matrix, the permutation ``p`` minimising ``sum_i cost[i, p[i]]``.

    The optimal linear assignment (what the Hungarian method computes), found by scoring all
    ``n!`` permutations at once: exact, jittable and fast for the handful of agents of MPE
    tasks (n <= 6). ``tests/test_baselines.py`` checks it against scipy's Hungarian solver.
    """
    n = cost.shape[-1]
    if n > 6:
        raise ValueError(f"best_assignment enumerates n! permutations; n={n} is too many (at most 6)")
    permutations = jnp.asarray(list(itertools.permutations(range(n))), jnp.int32)  # [n!, n]
    totals = jnp.take_along_axis(cost[None, :, :], permutations[:, :, None], axis=2)[..., 0].sum(-1)
    return permutations[jnp.argmin(totals)]


def spread_scripted_policy(num_agents: int, num_landmarks: int, dt: float = 0.1, damping: float = 0.25,
                           accel: float = 5.0) -> ReferencePolicy:
    """MPE simple_spread: assign agents to distinct landmarks (optimal assignment), then steer straight there.

    Reads each agent's observation ``[vel(2), pos(2), landmark offsets(2L), ...]``. The
    assignment minimises the summed agent-to-landmark distances at every step (it settles on one
    matching as agents approach). Steering is a one-step lookahead on MPE's point-mass dynamics
    (``pos += vel*dt``, then ``vel = (1-damping)*vel + accel*dt*u``): each agent picks the
    action whose *stopping point* -- where it would come to rest if it pushed no more -- lies
    closest to its landmark, so it accelerates when far away and brakes before arriving.
    """
    if num_agents != num_landmarks:
        raise ValueError(f"spread_scripted_policy needs as many agents as landmarks, got {num_agents} and {num_landmarks}")
    forces = jnp.asarray(MPE_ACTION_FORCES) * accel * dt  # velocity change per action

    def team_actions(obs):  # [n, obs_dim] -> [n]
        vel, pos = obs[:, 0:2], obs[:, 2:4]
        landmarks = pos[0] + obs[0, 4:4 + 2 * num_landmarks].reshape(num_landmarks, 2)
        distance = jnp.linalg.norm(pos[:, None, :] - landmarks[None, :, :], axis=-1)  # [n, L]
        targets = landmarks[best_assignment(distance)]
        next_vel = (1.0 - damping) * vel[:, None, :] + forces[None, :, :]  # [n, 5, 2]
        stopping_point = pos[:, None, :] + vel[:, None, :] * dt + next_vel * dt / damping
        miss = jnp.linalg.norm(stopping_point - targets[:, None, :], axis=-1)
        return jnp.argmin(miss, axis=-1)

    def act(policy, obs, key, greedy=False, mask=None):
        flat = obs.reshape((-1,) + obs.shape[-2:])
        return jax.vmap(team_actions)(flat).reshape(obs.shape[:-1])

    return ReferencePolicy(act)


class StatefulReferencePolicy(NamedTuple):
    """A parameter-free policy with memory, called like a recurrent rlx agent by ``evaluate_multi_agent``."""

    act: callable  # (policy, memory, obs, reset, key, greedy, mask) -> (memory, actions)
    init_carry: callable  # batch size -> memory [batch, n_agents, ...]


def smax_heuristic_policy(env) -> StatefulReferencePolicy:
    """JaxMARL's scripted SMAX micro-management, playing the allies of an rlx SMAX adapter.

    The same heuristic that drives the enemy team (``HeuristicEnemySMAX``): shoot the closest
    enemy in range, else advance towards the enemy's half or a visible enemy. Against its mirror
    image it is the natural scripted reference for a learned team's win rate. Each ally keeps
    the heuristic's small state (its current target), reset at episode starts.
    """
    from jaxmarl.environments.smax.heuristic_enemy import (
        create_heuristic_policy,
        get_heuristic_policy_initial_state,
    )

    heuristic = jax.vmap(jax.vmap(create_heuristic_policy(env.env._env, team=0)))  # over episodes, then allies
    num_agents = env.num_agents

    def init_carry(batch: int):
        start = get_heuristic_policy_initial_state()
        return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (batch, num_agents) + jnp.shape(x)), start)

    def act(policy, memory, obs, reset, key, greedy=False, mask=None):
        fresh = init_carry(obs.shape[0])
        memory = jax.tree.map(lambda f, m: jnp.where(reset.reshape(reset.shape + (1,) * (m.ndim - 1)), f, m),
                              fresh, memory)
        keys = jax.random.split(key, obs.shape[0] * num_agents).reshape(obs.shape[0], num_agents, -1)
        actions, memory = heuristic(keys, memory, obs)
        return memory, actions

    return StatefulReferencePolicy(act, init_carry)
