"""Run POGEMA on given instances and record what happens; executed by POGEMA's own virtualenv.

POGEMA 1.4 pins gymnasium 0.28, numpy <= 1.26 and pydantic <= 1.9, so it
cannot share rlx's environment; ``make pogema`` builds one for it and the
conformance test (tests/test_mapf_conformance.py) and scripts/bench_mapf.py
call this file with that interpreter. It imports only numpy and pogema.

    python pogema_driver.py replay IN.npz OUT.npz   # step each instance with its recorded policy
    python pogema_driver.py speed SIZE AGENTS STEPS  # agent-steps/s with random actions

``replay`` input (npz of object arrays, one entry per instance): ``maps``
(bool [h, w]), ``starts`` ([n, 2]), ``goals`` ([n, k, 2]; k > 1 only with
``restart``), ``settings`` (collision_system, on_target, obs_radius,
max_episode_steps, greedy, seed). Each step's actions are drawn here: with
probability ``greedy`` an agent moves towards its current goal (Manhattan),
else uniformly. Output per instance: ``actions`` [T, n] (what was sent, before
POGEMA overwrites blocked ones), ``positions`` [T, n, 2], ``on_goal`` [T, n],
``rewards`` [T, n], ``terminated`` [T, n], ``obs`` [min(T, 8), n, 3, 2R+1, 2R+1]
(uint8), where T is the number of steps until every agent terminated or the
horizon.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
from pogema import GridConfig, pogema_v0

OBS_STEPS = 8
warnings.filterwarnings("ignore", message="Agent .* cycling back")  # our goal sequences cycle on purpose


def towards(position, goal, rng):
    """A Manhattan move towards ``goal`` (1 up, 2 down, 3 left, 4 right), 0 when there."""
    dr, dc = goal[0] - position[0], goal[1] - position[1]
    options = ([1] if dr < 0 else [2] if dr > 0 else []) + ([3] if dc < 0 else [4] if dc > 0 else [])
    return int(rng.choice(options)) if options else 0


def replay_one(grid, starts, goals, settings):
    rng = np.random.default_rng(int(settings["seed"]))
    targets = [[[int(r), int(c)] for r, c in seq] for seq in goals] if settings["on_target"] == "restart" \
        else [[int(r), int(c)] for r, c in goals[:, 0]]
    config = GridConfig(map=np.asarray(grid, int).tolist(), agents_xy=[[int(r), int(c)] for r, c in starts],
                        targets_xy=targets, collision_system=settings["collision_system"],
                        on_target=settings["on_target"], obs_radius=int(settings["obs_radius"]),
                        max_episode_steps=int(settings["max_episode_steps"]), seed=0)
    env = pogema_v0(grid_config=config)
    env.reset()
    grid_env = env.unwrapped
    n = len(starts)
    record = {key: [] for key in ("actions", "positions", "on_goal", "rewards", "terminated", "obs")}
    while True:
        positions = grid_env.get_agents_xy(ignore_borders=True)
        current = grid_env.get_targets_xy(ignore_borders=True)
        actions = [towards(positions[i], current[i], rng) if rng.random() < settings["greedy"]
                   else int(rng.integers(5)) for i in range(n)]
        record["actions"].append(list(actions))
        obs, rewards, terminated, truncated, _ = env.step(list(actions))
        record["positions"].append(grid_env.get_agents_xy(ignore_borders=True))
        record["on_goal"].append([grid_env.grid.on_goal(i) for i in range(n)])
        record["rewards"].append(rewards)
        record["terminated"].append(terminated)
        if len(record["obs"]) < OBS_STEPS:
            record["obs"].append(np.asarray(obs, np.uint8))
        if all(terminated) or all(truncated):
            break
    dtypes = {"actions": np.int8, "positions": np.int16, "on_goal": bool, "rewards": np.float32,
              "terminated": bool, "obs": np.uint8}
    return {key: np.asarray(values, dtypes[key]) for key, values in record.items()}


def replay(path_in: str, path_out: str) -> None:
    data = np.load(path_in, allow_pickle=True)
    results = {key: [] for key in ("actions", "positions", "on_goal", "rewards", "terminated", "obs")}
    for grid, starts, goals, settings in zip(data["maps"], data["starts"], data["goals"], data["settings"]):
        out = replay_one(grid, np.asarray(starts), np.asarray(goals), settings)
        for key in results:
            results[key].append(out[key])
    packed = {}
    for key, values in results.items():
        array = np.empty(len(values), object)
        array[:] = values
        packed[key] = array
    np.savez(path_out, **packed)


def speed(size: int, agents: int, steps: int, repeats: int = 3) -> None:
    """Prints agent-steps/s of one POGEMA environment (random map, density 0.3, soft collisions): the median
    of ``repeats`` episodes of ``steps`` random joint actions, each after its own reset (not timed)."""
    config = GridConfig(size=size, num_agents=agents, density=0.3, seed=0, collision_system="soft",
                        on_target="nothing", obs_radius=5, max_episode_steps=steps + 1)
    env = pogema_v0(grid_config=config)
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(repeats):
        env.reset()
        actions = rng.integers(0, 5, (steps, agents)).tolist()
        start = time.perf_counter()
        for step_actions in actions:
            env.step(step_actions)
        runs.append(time.perf_counter() - start)
    print(f"{agents * steps / sorted(runs)[len(runs) // 2]:.1f}")


if __name__ == "__main__":
    if sys.argv[1] == "replay":
        replay(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "speed":
        speed(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}: replay or speed")
