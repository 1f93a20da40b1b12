"""Multi-agent path finding: maps, instance pools, the POGEMA-compatible environment, experts and metrics."""

from __future__ import annotations

import numpy as np

from rlx.envs.mapf import instances, maps
from rlx.envs.mapf.env import MapfEnv, MapfParams
from rlx.errors import ConfigError

LAYOUTS = ("random", "maze", "warehouse", "file")


def make_mapf(layout: str = "random", num_agents: int = 16, obs_radius: int = 5, collision_system: str = "soft",
              on_target: str = "nothing", pool_size: int = 512, size: tuple = (17, 21), density: tuple = (0.1, 0.3),
              max_steps: int = 128, seed: int = 0, map_file: str | None = None) -> MapfEnv:
    """A ``MapfEnv`` over a pool of ``pool_size`` instances drawn with ``seed``.

    ``layout``: ``random`` (side uniform in ``size``, obstacle density uniform in
    ``density``, as POGEMA's benchmark draws them), ``maze`` (side ``size[1]``),
    ``warehouse`` (the default layout of ``maps.warehouse_map``) or ``file`` (the
    MovingAI ``map_file``); starts and goals are drawn on each map. Under
    ``restart`` the next goals are random cells of the agent's component.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"env.options.layout={layout!r}: valid: {', '.join(LAYOUTS)}")
    random_goals = on_target == "restart"
    if layout == "random":
        pool = instances.random_pool(pool_size, num_agents, seed, tuple(size), tuple(density), max_steps, random_goals)
    else:
        rng = np.random.default_rng(seed)
        grids = {"maze": lambda: maps.maze_map(int(size[1]), rng), "warehouse": maps.warehouse_map,
                 "file": lambda: maps.parse_movingai(_require(map_file))}[layout]
        drawn = []
        for _ in range(pool_size):
            grid = grids()
            starts, goals = maps.sample_instance(grid, num_agents, rng)
            drawn.append((grid, starts, goals))
        pool = instances.from_instances(drawn, max_steps, random_goals, num_agents)
    return MapfEnv(num_agents, obs_radius, collision_system, on_target, pool)



def _require(map_file: str | None) -> str:
    if not map_file:
        raise ConfigError("env.options.map_file: a MovingAI .map file is needed with maps=file")
    return map_file


__all__ = ["MapfEnv", "MapfParams", "instances", "make_mapf", "maps"]
