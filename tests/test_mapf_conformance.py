"""rlx's MAPF environment against POGEMA 1.4, step by step, on the same instances and actions.

POGEMA runs in its own virtualenv (``make pogema``; its pins clash with
ours) through scripts/pogema_driver.py, which picks each step's actions (a mix
of random and goal-directed moves) and records them; our environment replays
them. Every agent's position, on-goal flag, reward and termination must agree
at every step, and so must the observations of the first steps (the agents
channel except under ``soft`` collisions: see the deliberate-difference test).
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs.mapf import instances, maps
from rlx.envs.mapf.env import COLLISION_SYSTEMS, ON_TARGET_MODES, MapfEnv

ROOT = Path(__file__).resolve().parent.parent
POGEMA_PYTHON = ROOT / ".venv-pogema" / "bin" / "python"
DRIVER = ROOT / "scripts" / "pogema_driver.py"
PER_COMBINATION = 24  # 9 combinations x 24 = 216 instances
MAX_SIDE, MAX_AGENTS, MAX_STEPS = 32, 64, 64

pytestmark = pytest.mark.skipif(not POGEMA_PYTHON.exists(), reason="no .venv-pogema (make pogema builds it)")


def goal_sequence(grid, start, first_goal, rng, length=3):
    """``length`` goals for lifelong mode: the first, then random cells of the same component, each
    different from the one before (the cycle back to the first included)."""
    labels = maps.connected_components(grid)
    cells = np.argwhere(labels == labels[tuple(start)])
    sequence = [np.asarray(first_goal)]
    while len(sequence) < length:
        cell = cells[rng.integers(len(cells))]
        if not np.array_equal(cell, sequence[-1]) and (len(sequence) < length - 1 or
                                                         not np.array_equal(cell, sequence[0])):
            sequence.append(cell)
    return np.stack(sequence)


def make_case(rng, collision_system, on_target, radius):
    """One random instance (size 8-32, density 0-0.3, 2-64 agents) with its settings."""
    while True:
        side = int(rng.integers(8, MAX_SIDE + 1))
        grid = maps.random_map(side, float(rng.uniform(0.0, 0.3)), rng)
        free = int((~grid).sum())
        agents = int(min(rng.integers(2, MAX_AGENTS + 1), free // 3))
        if agents < 2:
            continue
        try:
            starts, goals = maps.sample_instance(grid, agents, rng)
        except Exception:
            continue
        if on_target == "restart":
            if any(len(np.argwhere(maps.connected_components(grid) == maps.connected_components(grid)[tuple(s)])) < 3
                   for s in starts):
                continue
            goals = np.stack([goal_sequence(grid, s, g, rng) for s, g in zip(starts, goals)])
        else:
            goals = goals[:, None]
        settings = {"collision_system": collision_system, "on_target": on_target, "obs_radius": radius,
                    "max_episode_steps": int(rng.integers(16, MAX_STEPS + 1)),
                    "greedy": float(rng.choice([0.0, 0.5, 0.9])), "seed": int(rng.integers(2**31))}
        return grid, starts, goals, settings


def run_pogema(cases, tmp_path):
    packed = {}
    for key, index in (("maps", 0), ("starts", 1), ("goals", 2), ("settings", 3)):
        array = np.empty(len(cases), object)
        array[:] = [case[index] for case in cases]
        packed[key] = array
    np.savez(tmp_path / "in.npz", **packed)
    subprocess.run([str(POGEMA_PYTHON), str(DRIVER), "replay", str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   check=True, timeout=600)
    return np.load(tmp_path / "out.npz", allow_pickle=True)


def run_ours(cases, recorded, collision_system, on_target, radius):
    """Our environment replaying POGEMA's actions: per-step arrays ``[case, step, agent, ...]``."""
    pool = instances.from_instances([(g, s, goal) for g, s, goal, _ in cases], num_agents=MAX_AGENTS,
                                    shape=(MAX_SIDE, MAX_SIDE))
    env = MapfEnv(MAX_AGENTS, radius, collision_system, on_target, pool)
    actions = np.zeros((len(cases), MAX_STEPS, MAX_AGENTS), np.int32)
    for i, case_actions in enumerate(recorded):
        actions[i, :case_actions.shape[0], :case_actions.shape[1]] = case_actions

    def episode(instance, case_actions):
        obs, state = env.reset_to(instance, jax.random.PRNGKey(0), pool)

        def step(state, step_actions):
            obs, state, rewards, terminated, info = env.step_env(jax.random.PRNGKey(1), state, step_actions, pool)
            return state, (state.positions, info["on_goal"], rewards, terminated, obs)

        return jax.lax.scan(step, state, case_actions)[1]

    return jax.device_get(jax.jit(jax.vmap(episode))(jnp.arange(len(cases)), jnp.asarray(actions)))


@pytest.mark.parametrize("collision_system,on_target", list(itertools.product(COLLISION_SYSTEMS, ON_TARGET_MODES)))
def test_positions_and_goal_flags_match_pogema_at_every_step(collision_system, on_target, tmp_path):
    combination = COLLISION_SYSTEMS.index(collision_system) * 3 + ON_TARGET_MODES.index(on_target)
    rng = np.random.default_rng(1000 + combination)
    radius = 1 + combination % 5
    cases = [make_case(rng, collision_system, on_target, radius) for _ in range(PER_COMBINATION)]
    theirs = run_pogema(cases, tmp_path)
    positions, on_goal, rewards, terminated, obs = run_ours(cases, theirs["actions"], collision_system, on_target,
                                                            radius)
    moves = 0
    for i, (grid, starts, _, _) in enumerate(cases):
        steps, n = theirs["actions"][i].shape
        where = f"case {i} ({grid.shape[0]}x{grid.shape[1]}, {n} agents, {collision_system}, {on_target})"
        np.testing.assert_array_equal(positions[i, :steps, :n], theirs["positions"][i], err_msg=f"positions, {where}")
        np.testing.assert_array_equal(on_goal[i, :steps, :n], theirs["on_goal"][i], err_msg=f"on goal, {where}")
        np.testing.assert_array_equal(rewards[i, :steps, :n], theirs["rewards"][i], err_msg=f"rewards, {where}")
        np.testing.assert_array_equal(terminated[i, :steps, :n], theirs["terminated"][i], err_msg=f"terminated, {where}")
        their_obs = np.moveaxis(theirs["obs"][i], 2, -1)  # [T, n, 3, w, w] -> [T, n, w, w, 3]
        ours = obs[i, :their_obs.shape[0], :n]
        channels = [0, 2] if collision_system == "soft" else [0, 1, 2]
        np.testing.assert_array_equal(ours[..., channels], their_obs[..., channels], err_msg=f"observations, {where}")
        moves += int(np.abs(np.diff(theirs["positions"][i], axis=0)).sum())
    assert moves > 50 * PER_COMBINATION  # the agents did move: the comparison is not vacuous


def test_soft_agents_channel_shows_a_follower_that_pogema_hides(tmp_path):
    """Deliberate difference: agent 0 follows agent 1 (higher index) into the cell it leaves. POGEMA
    writes its occupancy map in index order, so agent 0 vanishes from its agents channel; ours shows it."""
    grid = maps.from_strings(["....", "...."])
    starts, goals = np.array([[0, 0], [0, 1]]), np.array([[[0, 2]], [[0, 3]]])
    settings = {"collision_system": "soft", "on_target": "nothing", "obs_radius": 1, "max_episode_steps": 1,
                "greedy": 1.0, "seed": 0}  # both move right: agent 0 onto agent 1's old cell
    theirs = run_pogema([(grid, starts, goals, settings)], tmp_path)
    np.testing.assert_array_equal(theirs["actions"][0], [[4, 4]])
    np.testing.assert_array_equal(theirs["positions"][0][0], [[0, 1], [0, 2]])
    assert theirs["obs"][0][0, 0, 1, 1, 1] == 0  # POGEMA: agent 0 does not see itself
    _, _, _, _, obs = run_ours([(grid, starts, goals, settings)], theirs["actions"], "soft", "nothing", 1)
    assert obs[0, 0, 0, 1, 1, 1] == 1  # ours: it does
    assert obs[0, 0, 0, 1, 2, 1] == 1  # and sees agent 1 to its right
