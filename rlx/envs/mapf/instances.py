"""Instance pools for ``MapfEnv``: maps, starts and goal sequences stacked at a common size.

A pool is the environment's parameters (``MapfParams``). It is made once on
the host from explicit instances, or drawn the way POGEMA's benchmark draws
random maps, and then lives on the device; ``reset`` picks an entry.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from rlx.envs.mapf import maps
from rlx.envs.mapf.env import MapfParams
from rlx.errors import ConfigError


def from_instances(instances: list[tuple], max_steps_in_episode: int = 64, random_goals: bool = False,
                   num_agents: int | None = None, shape: tuple[int, int] | None = None) -> MapfParams:
    """A pool from ``(blocked [h, w], starts [n, 2], goals [n, 2] or [n, k, 2])`` instances.

    Maps are padded with obstacles to the largest (or the given ``shape``),
    agent slots to the most agents (or ``num_agents``; unused slots are masked
    out), goal sequences to the longest by repeating each one cyclically (so each length must divide the
    longest: a sequence cut mid-cycle would hand out goals in another order than the instance's own cycle).
    """
    if not instances:
        raise ConfigError("an instance pool needs at least one instance")
    goal_lists = [np.asarray(g, np.int32).reshape(len(s), -1, 2) for _, s, g in instances]
    height = max(np.shape(b)[0] for b, _, _ in instances)
    width = max(np.shape(b)[1] for b, _, _ in instances)
    if shape is not None:
        if shape[0] < height or shape[1] < width:
            raise ConfigError(f"pool shape {shape} is smaller than a map ({height} x {width})")
        height, width = shape
    slots = num_agents or max(len(s) for _, s, _ in instances)
    length = max(g.shape[1] for g in goal_lists)
    uneven = [i for i, g in enumerate(goal_lists) if length % g.shape[1]]
    if uneven:
        raise ConfigError(f"instance {uneven[0]}: {goal_lists[uneven[0]].shape[1]} goals per agent do not divide the "
                          f"pool's longest sequence ({length}); give every instance as many goals, or a divisor")
    count = len(instances)
    blocked = np.ones((count, height, width), bool)
    sizes = np.zeros((count, 2), np.int32)
    starts = np.zeros((count, slots, 2), np.int32)
    goals = np.zeros((count, slots, length, 2), np.int32)
    mask = np.zeros((count, slots), bool)
    components = np.full((count, height, width), -1, np.int32)
    for i, ((grid, agent_starts, _), agent_goals) in enumerate(zip(instances, goal_lists)):
        grid = np.asarray(grid, bool)
        n = len(agent_starts)
        if n > slots:
            raise ConfigError(f"instance {i} has {n} agents, more than the pool's {slots} slots")
        check_instance(grid, np.asarray(agent_starts), agent_goals, i)
        h, w = grid.shape
        blocked[i, :h, :w] = grid
        sizes[i] = (h, w)
        starts[i, :n] = agent_starts
        goals[i, :n] = agent_goals[:, np.arange(length) % agent_goals.shape[1]]
        starts[i, n:] = goals[i, n:, :] = 0
        mask[i, :n] = True
        components[i, :h, :w] = maps.connected_components(grid)
    return MapfParams(blocked=jnp.asarray(blocked), sizes=jnp.asarray(sizes), starts=jnp.asarray(starts),
                      goals=jnp.asarray(goals), agent_mask=jnp.asarray(mask), components=jnp.asarray(components),
                      random_goals=random_goals, max_steps_in_episode=max_steps_in_episode)


def check_instance(blocked: np.ndarray, starts: np.ndarray, goals: np.ndarray, index: int = 0) -> None:
    """Starts and goals (``[n, K, 2]`` sequences) inside the map, on free cells, starts distinct, first goals
    distinct, every goal reachable from its agent's start."""
    h, w = blocked.shape
    labels = maps.connected_components(blocked)
    for what, cells in (("start", starts[:, None]), ("goal", goals)):
        for agent, (r, c) in ((agent, cell) for agent, sequence in enumerate(cells) for cell in sequence):
            if not (0 <= r < h and 0 <= c < w) or blocked[r, c]:
                raise ConfigError(f"instance {index}: agent {agent}'s {what} ({r}, {c}) is not a free cell of the map")
        if len({tuple(cell) for cell in cells[:, 0].tolist()}) < len(cells):
            raise ConfigError(f"instance {index}: two agents share a {what}")
    for agent, (start, sequence) in enumerate(zip(starts, goals)):
        if any(labels[tuple(start)] != labels[tuple(goal)] for goal in sequence):
            raise ConfigError(f"instance {index}: agent {agent}'s goal is not reachable from its start")


def random_instances(count: int, num_agents: int, seed: int = 0, size: tuple[int, int] = (17, 21),
                     density: tuple[float, float] = (0.1, 0.3)) -> list[tuple]:
    """Random maps as POGEMA's benchmark draws them: side and obstacle density uniform in the ranges,
    with starts and goals from ``maps.sample_instance`` (maps too crowded for the agents are redrawn).
    Agents are placed by our rule, not POGEMA's (``placed_as_pogema`` re-places them)."""
    if num_agents > size[1] ** 2:
        raise ConfigError(f"num_agents: {num_agents} agents do not fit on maps of at most {size[1]} x {size[1]} cells")
    rng = np.random.default_rng(seed)
    instances, draws = [], 0
    while len(instances) < count:
        draws += 1
        if draws > 100 * count + 1000:
            raise ConfigError(f"num_agents: {len(instances)} of {count} maps with side in {tuple(size)} and density in "
                              f"{tuple(density)} held {num_agents} agents with reachable distinct goals after "
                              f"{draws - 1} draws; use fewer agents, larger maps or a lower density")
        side = int(rng.integers(size[0], size[1] + 1))
        grid = maps.random_map(side, float(rng.uniform(*density)), rng)
        try:
            starts, goals = maps.sample_instance(grid, num_agents, rng)
        except ConfigError:
            continue
        instances.append((grid, starts, goals))
    return instances


def placed_as_pogema(drawn: list[tuple], seed: int = 0) -> list[tuple]:
    """The maps of ``drawn`` with their agents placed again by POGEMA's rule (``maps.pogema_placement``): as
    many agents, no goal on any start. For measuring what our placement rule changes."""
    rng = np.random.default_rng(seed)
    out = []
    for index, (grid, starts, _) in enumerate(drawn):
        placed = maps.pogema_placement(grid, len(starts), rng)
        if placed is None:
            raise ConfigError(f"instance {index}: POGEMA's rule cannot place {len(starts)} agents on this map")
        out.append((grid, *placed))
    return out


def endgame_starts(blocked: np.ndarray, goals: np.ndarray, rng: np.random.Generator, pairs: tuple[int, int] = (1, 3),
                   reach: int = 4) -> np.ndarray:
    """Starts ``int[n, 2]`` for an endgame of ``goals``: every agent on its goal except 1–3 (``pairs``) pairs of
    agents that start on each other's goals (half the time one of the two next to it instead), at most ``reach`` steps apart, with
    at least one of the two goals in a corridor or a dead end (at most two free neighbours).

    This is how the map policy's N=64 episodes end when they fail: two agents that must pass each other
    where there is no room, while everyone else rests on their goals. Pairs that no teacher can untangle
    come out too; ``make_mapf(layout="endgame")`` keeps only the instances its teacher solves."""
    from rlx.envs.mapf import experts

    starts, n = goals.copy(), len(goals)
    narrow = [i for i in rng.permutation(n) if len(experts.neighbours(blocked, tuple(goals[i]))) <= 3]  # itself + 2
    taken, wanted = set(), int(rng.integers(pairs[0], pairs[1] + 1))
    for i in narrow:
        if wanted == 0:
            break
        if i in taken:
            continue
        field = experts.distances_to(blocked, goals[i])
        partners = [j for j in range(n) if j != i and j not in taken and 1 <= field[tuple(goals[j])] <= reach]
        if not partners:
            continue
        j = int(rng.choice(partners))
        starts[i], starts[j] = goals[j], goals[i]
        taken |= {i, j}
        wanted -= 1
        occupied = {tuple(cell) for cell in starts.tolist()}
        aside = [cell for cell in experts.neighbours(blocked, tuple(starts[i])) if cell not in occupied]
        if aside and rng.random() < 0.5:
            starts[i] = aside[int(rng.integers(len(aside)))]
    return starts


def endgame_instances(count: int, num_agents: int, seed: int = 0, size: tuple[int, int] = (17, 21),
                      density: tuple[float, float] = (0.1, 0.3)) -> list[tuple]:
    """``random_instances`` whose starts are rearranged by ``endgame_starts``; maps with no pair to place
    are skipped, so ``count`` is an upper bound."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for grid, starts, goals in random_instances(count, num_agents, seed, size, density):
        endgame = endgame_starts(grid, goals, rng)
        if np.any(endgame != goals):
            out.append((grid, endgame.astype(np.int32), goals))
    return out


def lifelong_instances(count: int, num_agents: int, goals_per_agent: int, seed: int = 0,
                       size: tuple[int, int] = (17, 21), density: tuple[float, float] = (0.1, 0.3)) -> list[tuple]:
    """``random_instances`` with goal sequences ``[n, goals_per_agent, 2]`` for lifelong (``restart``) runs.

    After the first goal, each next goal is a uniformly drawn free cell of the
    agent's component other than its previous goal (as POGEMA draws lifelong
    targets: other agents' goals may coincide). Fixed in advance, so a host
    solver and the environment follow the same sequences. A sequence runs
    cyclically, and its last goal may equal its first: an agent that gets that
    goal under foot earns it only by leaving and coming back (``MapfEnv``'s
    ``restart`` rule, which ``experts.pibt`` follows too).
    """
    rng = np.random.default_rng(seed + 1)
    out, batch = [], 0
    while len(out) < count:
        for grid, starts, first in random_instances(count, num_agents, seed + 7919 * batch, size, density):
            labels = maps.connected_components(grid)
            components = [np.argwhere(labels == labels[tuple(start)]) for start in starts]
            if len(out) == count or min(map(len, components)) < 2:
                continue  # an agent walled into one cell would "arrive" on every step
            sequences = np.zeros((num_agents, goals_per_agent, 2), np.int32)
            sequences[:, 0] = first
            for agent, cells in enumerate(components):
                for k in range(1, goals_per_agent):
                    options = cells[np.any(cells != sequences[agent, k - 1], axis=1)]
                    sequences[agent, k] = options[rng.integers(len(options))]
            out.append((grid, starts, sequences))
        batch += 1
    return out


def random_pool(count: int, num_agents: int, seed: int = 0, size: tuple[int, int] = (17, 21),
                density: tuple[float, float] = (0.1, 0.3), max_steps_in_episode: int = 128,
                random_goals: bool = False) -> MapfParams:
    """``from_instances(random_instances(...))`` at the largest side of ``size``."""
    instances = random_instances(count, num_agents, seed, size, density)
    return from_instances(instances, max_steps_in_episode, random_goals, num_agents, (size[1], size[1]))


def merge_pools(pools: list[MapfParams], num_agents: int | None = None) -> MapfParams:
    """One pool holding every entry of ``pools`` (same map shape, horizon and goal-sequence length), with
    ``num_agents`` agent slots (default: the most of any pool); entries with fewer agents get unused slots.

    Lets one fixed-size environment train on several crowd sizes at once (e.g. 32 and 64 agents). Per-entry
    arrays the pools carry (expert actions, distance fields) are merged too: all pools need them or none.
    """
    slots = num_agents or max(p.agent_mask.shape[1] for p in pools)
    first = pools[0]
    shared = {"max_steps_in_episode": lambda p: p.max_steps_in_episode, "random_goals": lambda p: p.random_goals,
              "map shape": lambda p: p.blocked.shape[1:], "goal-sequence length": lambda p: p.goals.shape[2]}
    for field, of in shared.items():
        values = sorted({of(p) for p in pools})
        if len(values) > 1:
            raise ConfigError(f"merge_pools: the pools differ in {field} ({', '.join(map(str, values))}); "
                              f"one pool has one")

    def pad(array, axis, value=0):
        if array is None:
            return None
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, slots - array.shape[axis])
        return jnp.pad(array, widths, constant_values=value)

    def merged(name, axis=None, value=0):
        arrays = [getattr(p, name) for p in pools]
        if all(a is None for a in arrays):
            return None
        if any(a is None for a in arrays):
            raise ConfigError(f"merge_pools: {name} is in some pools only")
        return jnp.concatenate([a if axis is None else pad(a, axis, value) for a in arrays])

    far = first.blocked.shape[1] * first.blocked.shape[2]
    return first.replace(
        blocked=merged("blocked"), sizes=merged("sizes"), components=merged("components"),
        starts=merged("starts", 1), goals=merged("goals", 1), agent_mask=merged("agent_mask", 1, False),
        expert_actions=merged("expert_actions", 2), behaviour_actions=merged("behaviour_actions", 2),
        goal_distances=merged("goal_distances", 1, far), committed_actions=merged("committed_actions", 2, -1),
        initial_observations=None)
