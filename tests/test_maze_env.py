"""ProceduralMaze (rlx/envs/maze.py): levels are deterministic, distinct and solvable; the dynamics,
reward, truncation and level sampling follow the documented contract; BFS matches a NumPy reference."""

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs import maze, registry

SIZE = 9
NUM_KEYS = 256  # one batch shape, so each jitted function compiles once
UP, RIGHT, DOWN, LEFT = range(4)


@pytest.fixture(scope="module")
def env():
    return maze.ProceduralMaze(SIZE)


@pytest.fixture(scope="module")
def keys():
    return jax.random.split(jax.random.PRNGKey(1), NUM_KEYS)


@pytest.fixture(scope="module")
def small():
    """A 5x5 maze for hand-built layouts (auto-reset levels must have the same shape)."""
    return maze.ProceduralMaze(5)


@pytest.fixture(scope="module")
def generate():
    """generate_level jitted and vmapped over 200 level ids (one compile shared by the tests)."""
    return jax.jit(jax.vmap(lambda i: maze.generate_level(i, SIZE, 0.3)))


@pytest.fixture(scope="module")
def levels(generate):
    """Levels 0..199 at the default wall density: (walls, agent_pos, goal_pos) as NumPy arrays."""
    return jax.tree.map(np.asarray, generate(jnp.arange(200)))


def numpy_bfs(walls, start, goal):
    """Reference shortest path length by queue-based BFS; -1 when the goal is unreachable."""
    dist = np.full(walls.shape, -1)
    dist[tuple(start)] = 0
    queue = deque([tuple(start)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < walls.shape[0] and 0 <= nc < walls.shape[1] and not walls[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist[tuple(goal)]


_BATCH_RESETS = {}


def batch_reset(env, keys, params):
    """jit(vmap(env.reset)) over keys and parameters (broadcast when shared), compiled once per environment."""
    if env not in _BATCH_RESETS:
        _BATCH_RESETS[env] = jax.jit(jax.vmap(env.reset))
    params = jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (len(keys),)), params)
    return _BATCH_RESETS[env](keys, params)


def hand_state(walls, agent, goal, time=0):
    """A MazeState on a hand-built layout (strings of '#' and '.')."""
    grid = jnp.array([[ch == "#" for ch in row] for row in walls])
    return maze.MazeState(walls=grid, agent_pos=jnp.array(agent, jnp.int32), goal_pos=jnp.array(goal, jnp.int32),
                          level_id=jnp.int32(0), time=jnp.int32(time))


CORRIDOR = ["#####", "#...#", "#.#.#", "#...#", "#####"]


def test_same_id_same_layout_and_different_ids_differ(generate, levels):
    reversed_ids = jax.tree.map(np.asarray, generate(jnp.arange(200)[::-1]))  # same ids, other batch slots
    for a, b in zip(reversed_ids, levels):
        np.testing.assert_array_equal(a[::-1], b)
    walls, agent, goal = levels
    differ = [not (np.array_equal(walls[i], walls[i + 50]) and np.array_equal(agent[i], agent[i + 50])
                   and np.array_equal(goal[i], goal[i + 50])) for i in range(50)]
    assert sum(differ) >= 48


def test_every_level_is_solvable_with_walls_only_where_allowed(levels):
    walls, agent, goal = levels
    n = len(walls)
    reach = np.asarray(jax.vmap(maze.reachable)(walls, agent))
    assert reach[np.arange(n), goal[:, 0], goal[:, 1]].all()
    assert (agent != goal).any(-1).all()
    assert not walls[np.arange(n), agent[:, 0], agent[:, 1]].any()
    assert not walls[np.arange(n), goal[:, 0], goal[:, 1]].any()
    assert walls[:, 0].all() and walls[:, -1].all() and walls[:, :, 0].all() and walls[:, :, -1].all()
    assert (np.abs(agent - goal).sum(-1) >= SIZE // 2).all()
    interior = walls[:, 1:-1, 1:-1].mean()
    assert 0.15 < interior < 0.3  # density 0.3, minus the carved path


def test_moves_walls_and_goal_reward(small):
    env = small
    params = env.default_params.replace(max_steps_in_episode=10)
    key = jax.random.PRNGKey(0)
    state = hand_state(CORRIDOR, (1, 1), (3, 3), time=2)
    _, same, reward, terminated, _, _ = env.step(key, state, UP, params)  # into the border
    np.testing.assert_array_equal(same.agent_pos, [1, 1])
    assert int(same.time) == 3 and float(reward) == 0.0 and not terminated
    _, moved, *_ = env.step(key, state, RIGHT, params)
    np.testing.assert_array_equal(moved.agent_pos, [1, 2])
    _, blocked, *_ = env.step(key, moved, DOWN, params)  # into the inner wall at (2, 2)
    np.testing.assert_array_equal(blocked.agent_pos, [1, 2])
    _, back, *_ = env.step(key, moved, LEFT, params)
    np.testing.assert_array_equal(back.agent_pos, [1, 1])
    _, down, *_ = env.step(key, state, DOWN, params)
    np.testing.assert_array_equal(down.agent_pos, [2, 1])
    near = hand_state(CORRIDOR, (2, 3), (3, 3), time=4)
    obs, after, reward, terminated, truncated, info = env.step(key, near, DOWN, params)
    assert float(reward) == pytest.approx(1.0 - 0.9 * 5 / 10)
    assert bool(terminated) and not bool(truncated)
    final = np.asarray(info["final_observation"])
    assert final[3, 3, 1] == 1.0 and final[3, 3, 2] == 1.0  # agent on the goal before the auto-reset
    assert int(after.time) == 0  # auto-reset to a fresh level


def test_truncation_without_termination(small):
    env = small
    params = env.default_params.replace(max_steps_in_episode=3)
    state = hand_state(CORRIDOR, (1, 1), (3, 3))
    key = jax.random.PRNGKey(0)
    flags = []
    for _ in range(3):
        _, state, reward, terminated, truncated, _ = env.step(key, state, UP, params)
        flags.append((bool(terminated), bool(truncated), float(reward)))
    assert flags == [(False, False, 0.0), (False, False, 0.0), (False, True, 0.0)]
    assert int(state.time) == 0


@pytest.mark.parametrize("num_levels, offset", [(5, 0), (3, 1_000_000)])
def test_reset_draws_only_from_the_level_set(env, keys, num_levels, offset):
    params = env.default_params.replace(num_levels=num_levels, level_offset=offset)
    ids = np.asarray(batch_reset(env, keys, params)[1].level_id)
    assert set(ids.tolist()) == set(range(offset, offset + num_levels))
    ids = np.asarray(batch_reset(env, keys, params.replace(num_levels=0))[1].level_id)
    assert (ids >= offset).all() and len(set(ids.tolist())) > 250


def test_shortest_path_matches_numpy_bfs():
    rng = np.random.default_rng(0)
    walls = rng.random((40, 7, 7)) < 0.35
    starts, goals = rng.integers(0, 7, (40, 2)), rng.integers(0, 7, (40, 2))
    walls[np.arange(40), starts[:, 0], starts[:, 1]] = False
    ours = np.asarray(jax.jit(jax.vmap(maze.shortest_path_length))(walls, starts, goals))
    reference = np.array([numpy_bfs(*case) for case in zip(walls, starts, goals)])
    np.testing.assert_array_equal(ours, reference)
    assert (reference == -1).any() and (reference > 3).any()  # both cases exercised


def test_optimal_return_follows_the_shortest_path():
    walls = hand_state(CORRIDOR, (1, 1), (3, 3)).walls
    start, goal = jnp.array([1, 1]), jnp.array([3, 3])
    assert float(maze.optimal_return(walls, start, goal, 10)) == pytest.approx(1.0 - 0.9 * 4 / 10)
    assert float(maze.optimal_return(walls, start, goal, 3)) == 0.0  # too far for the horizon
    assert float(maze.optimal_return(jnp.ones((5, 5), bool), start, goal, 10)) == 0.0


def test_observation_channels(env, keys, levels):
    obs, states = batch_reset(env, keys, env.default_params.replace(num_levels=200))
    obs, ids, n = np.asarray(obs), np.asarray(states.level_id), len(keys)
    assert obs.shape == (n, SIZE, SIZE, 3) and obs.dtype == np.float32
    assert (obs[..., 1].sum((1, 2)) == 1).all() and (obs[..., 2].sum((1, 2)) == 1).all()
    agent, goal = np.asarray(states.agent_pos), np.asarray(states.goal_pos)
    assert (obs[np.arange(n), agent[:, 0], agent[:, 1], 1] == 1).all()
    assert (obs[np.arange(n), goal[:, 0], goal[:, 1], 2] == 1).all()
    np.testing.assert_array_equal(obs[..., 0], levels[0][ids])  # reset shows generate_level's walls
    assert obs.sum(-1).max() == 1  # agent and goal stand on distinct free cells
    assert env.observation_space(env.default_params).contains(jnp.asarray(obs[0]))


def test_jit_vmap_over_keys_and_params(env, keys):
    params = registry.make("maze", num_levels=8)[1]
    obs, states = batch_reset(env, keys, params)
    actions = jax.random.randint(keys[0], (len(keys),), 0, env.action_space(params).n)
    out = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))(keys, states, actions, params)
    assert out[0].shape == (len(keys), SIZE, SIZE, 3) and out[2].shape == (len(keys),)
    assert (np.asarray(out[1].agent_pos) != np.asarray(states.agent_pos)).any(-1).mean() > 0.3
    assert set(np.asarray(states.level_id).tolist()) <= set(range(8))
    # Per-environment parameters: half the batch on training ids, half on held-out ids.
    half = len(keys) // 2
    offsets = params.replace(level_offset=jnp.repeat(jnp.array([0, 1_000_000]), half))
    ids = np.asarray(batch_reset(env, keys, offsets)[1].level_id)
    assert (ids[:half] < 8).all() and ((ids[half:] >= 1_000_000) & (ids[half:] < 1_000_008)).all()


def test_registry_checks_params():
    with pytest.raises(ValueError, match="wall_density"):
        registry.make("maze", wall_density=1.5)
    env, params = registry.make("maze", num_levels=16, level_offset=1_000_000)
    assert isinstance(env, maze.ProceduralMaze) and params.num_levels == 16 and params.max_steps_in_episode == 64
