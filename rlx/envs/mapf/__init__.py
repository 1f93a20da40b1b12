"""Multi-agent path finding: maps, instance pools, the POGEMA-compatible environment, experts and metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlx.envs.mapf import instances, maps
from rlx.envs.mapf.env import MAP_OBSERVATIONS, MapfEnv, MapfParams, distance_fields
from rlx.errors import ConfigError

LAYOUTS = ("random", "maze", "warehouse", "file", "endgame")


def make_mapf(layout: str = "random", num_agents: int = 16, obs_radius: int = 5, collision_system: str = "soft",
              on_target: str = "nothing", pool_size: int = 512, size: tuple = (17, 21), density: tuple = (0.1, 0.3),
              max_steps: int = 128, seed: int = 0, map_file: str | None = None, observation: str = "local",
              expert: str | None = None, progress_reward: float = 0.0) -> MapfEnv:
    """A ``MapfEnv`` over a pool of ``pool_size`` instances drawn with ``seed``.

    ``layout``: ``random`` (side uniform in ``size``, obstacle density uniform in
    ``density``, as POGEMA's benchmark draws them), ``maze`` (side ``size[1]``),
    ``warehouse`` (the default layout of ``maps.warehouse_map``) or ``file`` (the
    MovingAI ``map_file``); starts and goals are drawn on each map; ``endgame``: random maps whose
    agents start on their goals but for a few pairs that must pass each other in a corridor
    (``instances.endgame_instances``), kept only where the ``expert`` solves them (so at most
    ``pool_size``), for DAgger's ``endgame_maps``. Under
    ``restart`` the next goals are random cells of the agent's component.
    ``observation``: ``local`` windows (POGEMA's), ``local_path`` (the same plus each cell's
    shortest-path distance to the agent's goal relative to the agent's own), the whole ``map``, or
    ``map_priority`` (the whole map plus PIBT's priorities: ``MapfEnv.priority_planes``), ``map_noise``
    (those plus the step's shared tie-break numbers: ``tie_noise``), ``map_defer`` (the same planes, with the
    moves and waiting of agents that keep off their goals as ``pibt_swap_defer`` sees them: ``MapfEnv.deferred``),
    ``map_route`` (those, with the moves of agents off their goals ranked around agents resting on theirs, as
    ``pibt_swap_route`` ranks them: ``routed_distances``), ``map_rank`` (``map_defer``'s planes plus, per
    move, whether the neighbour that way plans before or after the agent in PIBT's order: ``MapfEnv.rank_planes``),
    or ``map_corridor`` (``map_defer``'s planes plus, per move, whether the corridor leading away from the
    neighbour that way ends in a dead end, where PIBT's swap pulls instead of pushing: ``env.dead_end_planes``).
    ``progress_reward``: added to each agent's reward per step it moves closer to its goal (and
    taken away per step it moves farther), on top of the ``on_target`` rewards. ``expert``
    (``pibt``, ``pibt_by_index``: ties broken by agent index as ``map_priority`` shows them,
    ``pibt_swap`` and ``pibt_swap_by_index``: with PIBT's swap operation, ``pibt_swap_noise``: the latter
    choosing among equally good moves by the ``tie_noise`` numbers that ``map_noise`` shows, ``pibt_swap_defer``:
    the latter keeping agents off goals that would shut others out of a pocket (``map_defer``), ``pibt_swap_detour``:
    the latter routing agents round resting ones (``map_route``), ``pibt_swap_route``: that one with pushed agents
    stepping out of their pusher's way (a rule ``map_route`` does not show),
    ``prioritized`` or ``lacam``) solves every instance and keeps the joint
    actions in the pool, for imitation; solutions are cached on disk.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"env.options.layout={layout!r}: valid: {', '.join(LAYOUTS)}")
    random_goals = on_target == "restart"
    if layout in ("random", "endgame"):
        draw = instances.random_instances if layout == "random" else instances.endgame_instances
        drawn = draw(pool_size, num_agents, seed, tuple(size), tuple(density))
        shape = (size[1], size[1])
    else:
        rng = np.random.default_rng(seed)
        grids = {"maze": lambda: maps.maze_map(int(size[1]), rng), "warehouse": maps.warehouse_map,
                 "file": lambda: maps.parse_movingai(_require(map_file))}[layout]
        drawn = []
        for _ in range(pool_size):
            grid = grids()
            starts, goals = maps.sample_instance(grid, num_agents, rng)
            drawn.append((grid, starts, goals))
        shape = None
    actions = None
    if expert is not None:
        actions, finished = expert_actions(drawn, expert, max_steps, num_agents, seed, with_finished=True)
        if layout == "endgame":  # only the endgames the teacher untangles: its failures would teach loops
            solved = np.nonzero(finished.all(1))[0]
            drawn, actions = [drawn[i] for i in solved], actions[solved]
    pool = instances.from_instances(drawn, max_steps, random_goals, num_agents, shape)
    if actions is not None:
        pool = pool.replace(expert_actions=jnp.asarray(actions))
    env = MapfEnv(num_agents, obs_radius, collision_system, on_target, pool, observation, progress_reward)
    # The rules do not depend on the pool, so one environment computes what the pool then stores.
    if env.needs_distances:  # resets then read the first goals' distance fields instead of searching
        pool = pool.replace(goal_distances=first_goal_distances(pool))
    if stores_initial_observations(env, pool):  # auto-resets read the fresh windows: a step observes one state
        pool = env.with_initial_observations(pool)
    return MapfEnv(num_agents, obs_radius, collision_system, on_target, pool, observation, progress_reward)


def stores_initial_observations(env: MapfEnv, pool: MapfParams, max_bytes: int = 256 * 2**20) -> bool:
    """Whether ``make_mapf`` stores the pool's windows at time 0: local windows only, and only while they
    take at most ``max_bytes`` (a large ``local_path`` pool would hold gigabytes to save one window set)."""
    if env.observation in MAP_OBSERVATIONS:
        return False
    space = env.observation_space(pool)
    return pool.blocked.shape[0] * env.num_agents * np.prod(space.shape) * np.dtype(space.dtype).itemsize <= max_bytes


def first_goal_distances(pool: MapfParams, chunk: int = 64) -> jnp.ndarray:
    """``int16[M, N, H, W]``: every pool instance's distance fields to its agents' first goals (``int32`` on
    maps of more than 32,767 cells, whose "unreachable" value ``H * W`` int16 cannot hold)."""
    fields = jax.jit(jax.vmap(distance_fields))
    cells = pool.blocked.shape[1] * pool.blocked.shape[2]
    dtype = jnp.int16 if cells <= np.iinfo(np.int16).max else jnp.int32
    parts = [fields(pool.blocked[i:i + chunk], pool.goals[i:i + chunk, :, 0], pool.sizes[i:i + chunk]).astype(dtype)
             for i in range(0, pool.blocked.shape[0], chunk)]
    return jnp.concatenate(parts)


def expert_actions(drawn: list[tuple], solver: str, max_steps: int, num_agents: int, seed: int,
                   with_finished: bool = False):
    """The solver's joint actions ``[M, T, N]`` on every instance, cached under the user cache dir by content;
    ``with_finished``: also whether each agent ended on its goal ``[M, N]``."""
    import hashlib
    import os

    from rlx.envs.mapf import experts

    digest = hashlib.sha256()
    for grid, starts, goals in drawn:
        digest.update(np.packbits(grid).tobytes() + np.asarray(starts).tobytes() + np.asarray(goals).tobytes())
    digest.update(f"{solver}-{max_steps}-{num_agents}-{seed}".encode())
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rlx", "mapf")
    path = os.path.join(cache, f"{solver}-{digest.hexdigest()[:16]}.npz")
    if not os.path.exists(path):
        solutions = experts.solve_all(drawn, solver, max_steps, seed)
        os.makedirs(cache, exist_ok=True)
        experts.save_dataset(path + ".tmp.npz", drawn, solutions, solver, max_steps)
        os.replace(path + ".tmp.npz", path)
    saved = np.load(path)
    return (saved["actions"], saved["finished"]) if with_finished else saved["actions"]



def _require(map_file: str | None) -> str:
    if not map_file:
        raise ConfigError("env.options.map_file: a MovingAI .map file is needed with layout file (env=mapf_file)")
    return map_file


__all__ = ["MapfEnv", "MapfParams", "instances", "make_mapf", "maps"]
