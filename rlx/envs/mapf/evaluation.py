"""Measuring MAPF methods the same way: every method's joint actions run in ``MapfEnv``.

Solvers on the host (PIBT, prioritized planning) hand over their joint
actions; learned and random policies act inside ``jit``. Either way the
episode runs in the environment (its collision rules have the last word) until
it ends, and POGEMA's metrics are read from the step it ends on.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlx.envs.mapf import experts
from rlx.envs.mapf.env import MapfEnv, MapfParams

METRICS = ("csr", "isr", "soc", "makespan", "throughput")


def run_episodes(env: MapfEnv, pool: MapfParams, choose: Callable, key, inputs=(), instances=None,
                 record: Callable | None = None):
    """Play each pool entry in ``instances`` (default: all) once, in one compiled program.

    ``choose(inputs, obs, state, t, key)`` returns the joint action ``[n]``, or
    ``(actions [n], extra)``. Once an episode ends (every agent terminated, or
    the horizon) its state stays as it ended and its actions are waits.
    ``record(state, actions, extra)``, where given, says what to keep of each
    step (``state``: the one the actions were chosen in).

    Returns ``(metrics, records, solved)``: POGEMA's metrics read at the step
    each episode ended (``{name: [M]}``), the records stacked ``[M, T, ...]``
    (``None`` without ``record``) and ``solved [M]``, every agent terminated
    within the horizon.

    The pool and ``inputs`` (a policy's parameters, fixed joint actions) are
    arguments of the compiled program, not constants in it: XLA would
    otherwise fold their values into the program at every compile, and each
    trained run or pool would compile a program of its own, where now runs of
    one architecture on pools of one shape share one (from the persistent
    compilation cache too).
    """
    horizon = int(pool.max_steps_in_episode)
    instances = jnp.arange(pool.blocked.shape[0]) if instances is None else jnp.asarray(instances)

    def episode(pool, inputs, instance, key):
        reset_key, key = jax.random.split(key)
        obs, state = env.reset_to(instance, reset_key, pool)
        first = {name: jnp.zeros(()) for name in METRICS}

        def step(carry, t):
            obs, state, over, solved, final, key = carry
            key, act_key, step_key = jax.random.split(key, 3)
            chosen = choose(inputs, obs, state, t, act_key)
            chosen, extra = chosen if isinstance(chosen, tuple) else (chosen, None)
            actions = jnp.where(over, 0, chosen)
            kept = None if record is None else record(state, actions, extra)
            obs, new_state, _, terminated, info = env.step_env(step_key, state, actions, pool)
            solved = solved | jnp.all(terminated)
            ends = ~over & (jnp.all(terminated) | (t + 1 >= horizon))
            final = {name: jnp.where(ends, info[name], final[name]) for name in METRICS}
            state = jax.tree.map(lambda new, old: jnp.where(over, old, new), new_state, state)
            return (obs, state, over | ends, solved, final, key), kept

        no = jnp.asarray(False)
        (_, _, _, solved, final, _), records = jax.lax.scan(step, (obs, state, no, no, first, key),
                                                             jnp.arange(horizon))
        return final, records, solved

    run_all = jax.jit(jax.vmap(episode, in_axes=(None, None, 0, 0)))
    final, records, solved = run_all(pool, inputs, instances, jax.random.split(key, instances.shape[0]))
    metrics = {name: np.asarray(values) for name, values in final.items()}
    return metrics, jax.tree.map(np.asarray, records), np.asarray(solved)


def evaluate_actions(env: MapfEnv, pool: MapfParams, actions: np.ndarray) -> dict[str, np.ndarray]:
    """Per-instance metrics of fixed joint actions ``[M, T, n]`` (e.g. a solver's)."""
    actions = jnp.asarray(actions, jnp.int32)
    horizon = int(pool.max_steps_in_episode)
    if actions.shape[1] < horizon:
        actions = jnp.pad(actions, ((0, 0), (0, horizon - actions.shape[1]), (0, 0)))
    return run_episodes(env, pool, lambda actions, obs, state, t, key: actions[state.instance, t],
                        jax.random.PRNGKey(0), actions)[0]


def evaluate_policy(env: MapfEnv, pool: MapfParams, act: Callable, key, params=()) -> dict[str, np.ndarray]:
    """Per-instance metrics of ``act(params, obs [n, ...], key) -> actions [n]``; ``params`` (e.g. a trained
    policy's) enter the compiled program as an argument."""
    return run_episodes(env, pool, lambda params, obs, state, t, k: act(params, obs, k), key, params)[0]


def random_actions(num_agents: int) -> Callable:
    """``act(params, obs, key)``: uniform random moves (``params`` unused)."""
    return lambda params, obs, key: jax.random.randint(key, (num_agents,), 0, 5)


def greedy_shortest_path(num_agents: int) -> Callable:
    """Each agent takes a move that shortens its own distance to goal (ignoring everyone else), else waits.

    Acts on ``observation="map"`` observations (the per-agent move signs of ``MapfEnv.map_features``);
    ``params`` unused."""
    def act(params, obs, key):
        signs = jnp.einsum("nhw,hwc->nc", obs[..., -1], obs[0, ..., 3:7])  # [n, 4]: up, down, left, right
        best = jnp.argmin(signs, axis=-1)
        return jnp.where(jnp.min(signs, axis=-1) < 0, best + 1, 0).astype(jnp.int32)

    return act


def solver_actions(instances: list[tuple], solver: str, horizon: int, num_agents: int,
                   lifelong: bool = False) -> np.ndarray:
    """``[M, horizon, num_agents]`` joint actions of a host solver on each instance (parallel processes);
    ``lifelong``: following the instances' goal sequences as ``restart`` mode hands them out."""
    solutions = experts.solve_all(instances, solver, horizon, lifelong=lifelong)
    return experts.joint_actions(solutions, horizon, num_agents)


def shielded_actions(env: MapfEnv, pool: MapfParams, drawn: list[tuple], logits: Callable, seed: int = 0,
                     swap: bool = True) -> np.ndarray:
    """``[M, horizon, n]`` joint actions of a learned policy made conflict-free by PIBT (``experts.pibt_shield``).

    A host loop over the horizon (PIBT runs in NumPy): at each step the policy
    sees the environment's observations of all instances at once (``logits(obs
    [M, n, ...]) -> [M, n, 5]``), Gumbel noise on its logits samples each
    agent's ranking of moves, and PIBT (with its swap operation unless
    ``swap`` is False) turns the rankings into a joint step. Every pool slot
    must hold an agent.
    """
    horizon, count, n = int(pool.max_steps_in_episode), len(drawn), env.num_agents
    rng = np.random.default_rng(seed)
    reset = jax.jit(jax.vmap(lambda pool, i: env.reset_to(i, jax.random.PRNGKey(0), pool), in_axes=(None, 0)))
    step = jax.jit(jax.vmap(lambda pool, state, actions: env.step_env(jax.random.PRNGKey(0), state, actions, pool)[:2],
                            in_axes=(None, 0, 0)))
    obs, state = reset(pool, jnp.arange(count))
    tables = [experts.neighbour_table(grid) for grid, _, _ in drawn]
    priorities = rng.random((count, n)) / n
    actions = np.zeros((count, horizon, n), np.int32)
    for t in range(horizon):
        scores = np.asarray(logits(obs)) + rng.gumbel(size=(count, n, len(experts.MOVES)))
        positions, goals = np.asarray(state.positions), np.asarray(state.goals)
        for m in range(count):
            position = [tuple(map(int, cell)) for cell in positions[m]]
            actions[m, t] = experts.pibt_shield(tables[m], position, goals[m], scores[m], priorities[m], rng,
                                                  swap=swap)
        obs, state = step(pool, state, jnp.asarray(actions[:, t]))
    return actions


def summarize(metrics: dict[str, np.ndarray]) -> dict[str, float]:
    """Means over instances; SoC and makespan over the solved ones only (as MAPF papers report them)."""
    solved = metrics["csr"] > 0.5
    out = {name: float(np.mean(metrics[name])) for name in ("csr", "isr", "throughput")}
    for name in ("soc", "makespan"):
        out[name] = float(np.mean(metrics[name][solved])) if solved.any() else float("nan")
    out["instances"] = int(len(solved))
    return out
