"""The MAPF environment on its own: maps, instances, movement invariants, distances, metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.agents import map_policy as mp
from rlx.agents import mappo
from rlx.envs import registry
from rlx.envs.mapf import evaluation, experts, instances, make_mapf, maps, stores_initial_observations
from rlx.envs.mapf.env import (COLLISION_SYSTEMS, MAP_CHANNELS, MOVES, PRIORITY_CHANNELS, MapfEnv, dead_end_planes,
                               distance_fields, move, shortest_path_actions)
from rlx.errors import ConfigError


# -- maps and instances -------------------------------------------------------------------------------


def test_movingai_parser_reads_a_map_and_names_file_and_line_of_errors(tmp_path):
    good = tmp_path / "good.map"
    good.write_text("type octile\nheight 2\nwidth 3\nmap\n.@.\nT.G\n")
    np.testing.assert_array_equal(maps.parse_movingai(good), [[False, True, False], [True, False, False]])
    bad_char = tmp_path / "bad.map"
    bad_char.write_text("type octile\nheight 2\nwidth 3\nmap\n...\n.x.\n")
    with pytest.raises(ConfigError, match=r"bad.map:6: unknown terrain 'x' at column 2"):
        maps.parse_movingai(bad_char)
    short_row = tmp_path / "short.map"
    short_row.write_text("type octile\nheight 2\nwidth 3\nmap\n...\n..\n")
    with pytest.raises(ConfigError, match=r"short.map:6: row has 2 cells, expected width 3"):
        maps.parse_movingai(short_row)
    no_height = tmp_path / "noheight.map"
    no_height.write_text("type octile\nwidth 3\nmap\n...\n")
    with pytest.raises(ConfigError, match=r"noheight.map:3: header needs a positive integer 'height'"):
        maps.parse_movingai(no_height)
    with pytest.raises(ConfigError, match=r"absent.map: no such map file"):
        maps.parse_movingai(tmp_path / "absent.map")
    for name, content, message in (
            ("zero.map", b"type octile\nheight 0\nwidth 3\nmap\n", r"zero.map:2: header needs a positive integer 'height'"),
            ("word.map", b"type octile\nheight x\nwidth 3\nmap\n...\n", r"word.map:2: header needs a positive integer"),
            ("long.map", b"type octile\nheight 1\nwidth 3\nmap\n...\n...\nxyz\n\n",  # used to read row 1 only
             r"long.map:6: text after the 1 map rows the header declares"),
            ("binary.map", b"type octile\nheight 1\nwidth 2\nmap\n.\xff\n", r"binary.map:5: not text: byte 0xff"),
            ("empty.map", b"", r"empty.map: empty file")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConfigError, match=message):
            maps.parse_movingai(tmp_path / name)


def test_pogema_placement_uses_distinct_cells_and_reachable_goals():
    """POGEMA's rule (for measuring ours against it): 2N distinct cells, no goal on any start, every goal in
    its start's component; and None where one-cell components leave no room."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        grid = maps.random_map(int(rng.integers(6, 12)), float(rng.uniform(0.1, 0.4)), rng)
        n = int(rng.integers(1, 9))
        placed = maps.pogema_placement(grid, n, rng)
        if placed is None:
            continue
        starts, goals = placed
        cells = {tuple(c) for c in np.concatenate([starts, goals])}
        assert len(cells) == 2 * n and not grid[tuple(np.concatenate([starts, goals]).T)].any()
        labels = maps.connected_components(grid)
        assert all(labels[tuple(s)] == labels[tuple(g)] for s, g in zip(starts, goals))
    walled = maps.from_strings([".#.", "###", ".#."])  # four one-cell components
    assert maps.pogema_placement(walled, 1, rng) is None
    drawn = instances.random_instances(3, 5, size=(8, 8))
    again = instances.placed_as_pogema(drawn)
    assert [g.shape for g, _, _ in again] == [g.shape for g, _, _ in drawn] and all(len(s) == 5 for _, s, _ in again)


def test_impossible_instance_settings_fail_instead_of_drawing_forever():
    with pytest.raises(ConfigError, match="num_agents: 30 agents do not fit on maps of at most 5 x 5 cells"):
        instances.random_instances(1, 30, size=(4, 5))
    with pytest.raises(ConfigError, match=r"num_agents: 0 of 2 maps .* density in \(0.95, 0.99\) held 16 agents"):
        instances.random_instances(2, 16, size=(8, 8), density=(0.95, 0.99))
    short, long = (instances.random_pool(2, 2, size=(6, 6), max_steps_in_episode=t) for t in (16, 256))
    with pytest.raises(ConfigError, match=r"merge_pools: the pools differ in max_steps_in_episode \(16, 256\)"):
        instances.merge_pools([short, long])
    small, large = (instances.random_pool(2, 2, size=(side, side)) for side in (6, 8))
    with pytest.raises(ConfigError, match=r"merge_pools: the pools differ in map shape \(\(6, 6\), \(8, 8\)\)"):
        instances.merge_pools([small, large])


def test_maze_is_connected_and_warehouse_has_shelves():
    maze = maps.maze_map(15, np.random.default_rng(0))
    labels = maps.connected_components(maze)
    assert labels.max() == 0 and (~maze).sum() > 40  # one component
    assert maze[0].all() and maze[-1].all() and maze[:, 0].all() and maze[:, -1].all()
    warehouse = maps.warehouse_map(shelf_rows=2, shelf_columns=3, shelf_length=4, aisle=2, margin=3)
    assert warehouse.sum() == 2 * 3 * 4
    assert maps.connected_components(warehouse).max() == 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), side=st.integers(4, 16), density=st.floats(0.0, 0.35),
       agents=st.integers(1, 12))
def test_sampled_instances_have_distinct_reachable_goals(seed, side, density, agents):
    rng = np.random.default_rng(seed)
    grid = maps.random_map(side, density, rng)
    try:
        starts, goals = maps.sample_instance(grid, agents, rng)
    except ConfigError:
        return  # too crowded: refused with a message, never a bad instance
    labels = maps.connected_components(grid)
    assert len({tuple(s) for s in starts}) == agents and len({tuple(g) for g in goals}) == agents
    assert not grid[starts[:, 0], starts[:, 1]].any() and not grid[goals[:, 0], goals[:, 1]].any()
    assert (labels[starts[:, 0], starts[:, 1]] == labels[goals[:, 0], goals[:, 1]]).all()


def test_pool_refuses_bad_instances():
    grid = maps.from_strings(["..#", "..#", "###"])
    with pytest.raises(ConfigError, match="agent 1's goal .* not a free cell"):
        instances.from_instances([(grid, np.array([[0, 0], [1, 1]]), np.array([[0, 1], [2, 2]]))])
    split = maps.from_strings([".#.", ".#.", ".#."])
    with pytest.raises(ConfigError, match="agent 0's goal is not reachable"):
        instances.from_instances([(split, np.array([[0, 0]]), np.array([[0, 2]]))])
    with pytest.raises(ConfigError, match="share a start"):
        instances.from_instances([(grid, np.array([[0, 0], [0, 0]]), np.array([[0, 1], [1, 1]]))])
    two, three = np.array([[[0, 1], [1, 0]]]), np.array([[[0, 1], [1, 0], [1, 1]]])  # goal sequences of one agent
    with pytest.raises(ConfigError, match="instance 0: 2 goals per agent do not divide the pool's longest sequence"):
        instances.from_instances([(grid, np.array([[0, 0]]), two), (grid, np.array([[0, 0]]), three)])
    pool = instances.from_instances([(grid, np.array([[0, 0]]), two),
                                     (grid, np.array([[0, 0]]), np.tile(two, (1, 2, 1)))])
    np.testing.assert_array_equal(pool.goals[0, 0], [[0, 1], [1, 0], [0, 1], [1, 0]])  # the cycle, repeated whole


def test_registry_builds_mapf_and_lists_valid_options():
    env, params = registry.make("mapf_random", {"num_agents": 4, "pool_size": 8})
    assert params.blocked.shape == (8, 21, 21) and env.num_agents == 4
    with pytest.raises(ConfigError, match="env.options.radius: unknown option of mapf_random; valid: .*obs_radius"):
        registry.make("mapf_random", {"radius": 3})
    with pytest.raises(ConfigError, match="collision_system='gentle': valid: soft, priority, block_both"):
        registry.make("mapf_random", {"collision_system": "gentle", "pool_size": 2})


# -- movement -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("collision_system", COLLISION_SYSTEMS)
def test_random_joint_moves_never_collide_or_swap(collision_system):
    """Over many random crowded steps: no two active agents share a cell, none swap, none enter a wall,
    every move is at most one cell."""
    pool = instances.random_pool(8, 24, seed=3, size=(8, 10), density=(0.1, 0.3))
    rng = np.random.default_rng(0)
    step = jax.jit(jax.vmap(lambda b, s, p, a: move(collision_system, b, s, p, a, jnp.ones(24, bool))))
    positions = pool.starts
    for _ in range(40):
        actions = jnp.asarray(rng.integers(0, 5, (8, 24)))
        new = np.asarray(step(pool.blocked, pool.sizes, positions, actions))
        old = np.asarray(positions)
        for b in range(8):
            cells = {tuple(p) for p in new[b]}
            assert len(cells) == 24, "two agents share a cell"
            assert not np.asarray(pool.blocked)[b][new[b, :, 0], new[b, :, 1]].any()
            assert (np.abs(new[b] - old[b]).sum(-1) <= 1).all()
            index = {tuple(p): i for i, p in enumerate(old[b])}
            for i in range(24):
                j = index.get(tuple(new[b, i]))
                if j is not None and j != i:
                    assert tuple(new[b, j]) != tuple(old[b, i]), "swap"
        positions = jnp.asarray(new)


def test_soft_lets_a_cycle_rotate_but_priority_does_not():
    """Four agents on a 2x2 block each step into the next one's cell: ``soft`` rotates them all,
    ``priority`` (no following of a higher index) and ``block_both`` (no following at all) do not."""
    blocked = jnp.zeros((2, 2), bool)
    positions = jnp.array([[0, 0], [0, 1], [1, 1], [1, 0]])
    actions = jnp.array([4, 2, 3, 1])  # right, down, left, up: a clockwise cycle
    rotated = move("soft", blocked, jnp.array([2, 2]), positions, actions, jnp.ones(4, bool))
    np.testing.assert_array_equal(rotated, [[0, 1], [1, 1], [1, 0], [0, 0]])
    for system in ("priority", "block_both"):
        np.testing.assert_array_equal(move(system, blocked, jnp.array([2, 2]), positions, actions,
                                           jnp.ones(4, bool)), positions)


def test_vertex_conflict_goes_to_the_lowest_index_under_soft_and_to_nobody_under_block_both():
    blocked = jnp.zeros((1, 3), bool)
    positions = jnp.array([[0, 2], [0, 0]])
    actions = jnp.array([3, 4])  # both want the middle cell
    size = jnp.array([1, 3])
    np.testing.assert_array_equal(move("soft", blocked, size, positions, actions, jnp.ones(2, bool)),
                                  [[0, 1], [0, 0]])
    np.testing.assert_array_equal(move("block_both", blocked, size, positions, actions, jnp.ones(2, bool)),
                                  positions)
    # an inactive agent (finished) neither moves nor blocks
    np.testing.assert_array_equal(move("soft", blocked, size, positions, actions, jnp.array([False, True])),
                                  [[0, 2], [0, 1]])


# -- distances, metrics, episodes ----------------------------------------------------------------------


def test_distance_fields_match_a_numpy_bfs_and_point_downhill():
    rng = np.random.default_rng(5)
    grid = maps.random_map(12, 0.25, rng)
    starts, goals = maps.sample_instance(grid, 6, rng)
    fields = np.asarray(distance_fields(jnp.asarray(grid), jnp.asarray(goals), jnp.array([12, 12])))
    for agent, goal in enumerate(goals):
        expected = experts.distances_to(grid, goal)  # NumPy BFS
        np.testing.assert_array_equal(np.where(grid, grid.size, fields[agent]), np.where(grid, grid.size, expected))
    actions = np.asarray(shortest_path_actions(jnp.asarray(fields), jnp.asarray(starts)))
    moves = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])
    for agent, (start, action) in enumerate(zip(starts, actions)):
        after = start + moves[action]
        here = fields[agent][tuple(start)]
        assert fields[agent][tuple(after)] == (here - 1 if here > 0 else 0)


def test_path_channel_is_the_numpy_distance_difference_around_each_agent():
    """``local_path``'s fourth channel against a NumPy BFS: (d(cell) - d(agent)) / 2R clipped to [-1, 1],
    1 on walls and outside the map; the first three channels are POGEMA's ``local`` windows unchanged."""
    rng = np.random.default_rng(11)
    radius = 3
    drawn = [(maps.random_map(side, 0.25, rng),) for side in (9, 12)]
    drawn = [(grid, *maps.sample_instance(grid, 5, rng)) for (grid,) in drawn]
    pool = instances.from_instances(drawn, num_agents=5, shape=(12, 12))
    env = MapfEnv(5, radius, "soft", "nothing", pool, observation="local_path")
    plain = MapfEnv(5, radius, "soft", "nothing", pool)
    assert env.observation_space(pool).shape == (7, 7, 4)
    for instance, (grid, starts, goals) in enumerate(drawn):
        obs, _ = env.reset_to(instance, jax.random.PRNGKey(0), pool)
        local, _ = plain.reset_to(instance, jax.random.PRNGKey(0), pool)
        np.testing.assert_array_equal(obs[..., :3], local)
        for agent, (start, goal) in enumerate(zip(starts, goals)):
            field = experts.distances_to(grid, goal).astype(float)
            field[grid] = np.inf
            here = field[tuple(start)]
            for dr in range(-radius, radius + 1):
                for dc in range(-radius, radius + 1):
                    r, c = start[0] + dr, start[1] + dc
                    inside = 0 <= r < grid.shape[0] and 0 <= c < grid.shape[1]
                    expected = np.clip((field[r, c] - here) / (2 * radius), -1, 1) if inside else 1.0
                    assert obs[agent, dr + radius, dc + radius, 3] == pytest.approx(expected), (instance, agent, dr, dc)


def test_progress_reward_pays_each_step_closer_and_takes_each_step_back():
    """A 1x5 corridor, goal at the right end: right, left, wait, right pays +0.1, -0.1, 0, +0.1 on top of
    the ``nothing`` mode's rewards; the cached distance fields equal the searched ones."""
    grid = maps.from_strings(["....."])
    drawn = [(grid, np.array([[0, 1]]), np.array([[0, 4]]))]
    pool = instances.from_instances(drawn)
    env = MapfEnv(1, 2, "soft", "nothing", pool, progress_reward=0.1)
    _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    earned = []
    for action in (4, 3, 0, 4, 4, 4):
        _, state, rewards, terminated, _ = env.step_env(jax.random.PRNGKey(1), state, jnp.array([action]), pool)
        earned.append(float(rewards[0]))
    np.testing.assert_allclose(earned, [0.1, -0.1, 0.0, 0.1, 0.1, 1.1])  # the last step arrives: +1 and +0.1
    assert terminated.all()
    env, params = registry.make("mapf_random", {"num_agents": 4, "pool_size": 6, "observation": "local_path"})
    searched = MapfEnv(4, 5, "soft", "nothing", params.replace(goal_distances=None), "local_path")
    for instance in range(6):
        cached = env.reset_to(instance, jax.random.PRNGKey(0), params)
        fresh = searched.reset_to(instance, jax.random.PRNGKey(0), params.replace(goal_distances=None))
        np.testing.assert_array_equal(cached[1].distances, fresh[1].distances)
        np.testing.assert_array_equal(cached[0], fresh[0])
    with pytest.raises(ConfigError, match="progress_reward=-1.0: must be >= 0"):
        MapfEnv(1, 2, pool=pool, progress_reward=-1.0)


def test_episode_metrics_on_a_corridor_by_hand():
    """Two agents in a 1x4 corridor walk to their goals: arrival steps 2 and 1, so SoC 3, makespan 2."""
    grid = maps.from_strings(["...."])
    pool = instances.from_instances([(grid, np.array([[0, 0], [0, 2]]), np.array([[0, 2], [0, 3]]))])
    env = MapfEnv(2, 1, "soft", "nothing", pool)
    obs, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    assert obs.shape == (2, 3, 3, 3)
    _, state, rewards, terminated, info = env.step_env(jax.random.PRNGKey(1), state, jnp.array([4, 4]), pool)
    assert float(info["isr"]) == 0.5 and float(info["csr"]) == 0.0 and not terminated.any()
    np.testing.assert_array_equal(rewards, [0.0, 0.0])
    _, state, rewards, terminated, info = env.step_env(jax.random.PRNGKey(2), state, jnp.array([4, 0]), pool)
    np.testing.assert_array_equal(rewards, [1.0, 1.0])
    assert terminated.all()
    assert (float(info["csr"]), float(info["isr"]), float(info["soc"]), float(info["makespan"])) == (1.0, 1.0, 3.0, 2.0)


def test_an_agent_that_leaves_its_goal_is_charged_the_whole_episode():
    """A deliberate difference from POGEMA (README): an agent off its goal when the episode ends costs every
    step so far, also when it stood on its goal before; POGEMA's sum-of-costs keeps the earlier arrival
    if the agent leaves on the final, truncating step. Only unsolved episodes differ."""
    grid = maps.from_strings(["....", "...."])
    pool = instances.from_instances([(grid, np.array([[0, 0], [1, 0]]), np.array([[0, 1], [1, 3]]))],
                                    max_steps_in_episode=2)
    env = MapfEnv(2, 1, "soft", "nothing", pool)
    _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    _, state, _, _, info = env.step_env(jax.random.PRNGKey(1), state, jnp.array([4, 4]), pool)
    assert (float(info["isr"]), float(info["soc"])) == (0.5, 2.0)  # agent 0 on its goal from step 1
    _, state, _, _, info = env.step_env(jax.random.PRNGKey(2), state, jnp.array([3, 4]), pool)
    assert (float(info["isr"]), float(info["soc"]), float(info["makespan"])) == (0.0, 4.0, 2.0)  # POGEMA: soc 3


def test_lifelong_mode_draws_new_goals_in_the_component_and_counts_throughput():
    grid = maps.from_strings(["....", "####", "...."])
    pool = instances.from_instances([(grid, np.array([[0, 0], [2, 0]]), np.array([[0, 1], [2, 1]]))],
                                    random_goals=True)
    env = MapfEnv(2, 1, "soft", "restart", pool)
    _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    _, state, rewards, terminated, info = env.step_env(jax.random.PRNGKey(3), state, jnp.array([4, 4]), pool)
    np.testing.assert_array_equal(rewards, [1.0, 1.0])
    assert not terminated.any()
    goals = np.asarray(state.goals)
    assert goals[0, 0] == 0 and goals[1, 0] == 2  # stays in its own row (component)
    assert not np.array_equal(goals[0], [0, 1]) and not np.array_equal(goals[1], [2, 1])
    assert float(info["throughput"]) == 2.0  # two goals in one step


def test_lifelong_waiting_on_a_next_goal_under_foot_earns_nothing():
    """An agent walled into one cell gets its own cell as its next goal, and a sequence may return to the
    cell an agent stands on; standing there is not an arrival (POGEMA never hands out such goals), only
    leaving and coming back is."""
    grid = maps.from_strings([".#..", "##..", "...."])
    cyclic = np.array([[[0, 0], [0, 0]], [[0, 3], [0, 3]]])  # agent 1's sequence returns to the cell it reaches
    for random_goals, goals in ((True, np.array([[0, 0], [0, 3]])), (False, cyclic)):
        pool = instances.from_instances([(grid, np.array([[0, 0], [0, 2]]), goals)], random_goals=random_goals)
        env = MapfEnv(2, 1, "soft", "restart", pool)
        _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
        rewards = []
        for t, joint in enumerate([[0, 4]] + [[0, 0]] * 4):
            _, state, r, _, info = env.step_env(jax.random.PRNGKey(t), state, jnp.array(joint), pool)
            rewards.append(np.asarray(r).tolist())
        assert rewards[0] == [1.0, 1.0] and rewards[1:] == [[0.0, 0.0]] * 4, (random_goals, rewards)
        assert int(state.goals_reached) == 2
    # Leaving the cell and coming back is an arrival (agent 1: right to (0, 3), left, right again).
    _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    rewards = []
    for t, joint in enumerate([[0, 4], [0, 3], [0, 4]]):
        _, state, r, _, _ = env.step_env(jax.random.PRNGKey(t), state, jnp.array(joint), pool)
        rewards.append(float(r[1]))
    assert rewards == [1.0, 0.0, 1.0]


def test_cached_distance_fields_hold_unreachable_cells_on_large_maps():
    """Blocked and unreachable cells are H * W away; past 32,767 cells that needs more than int16 (it
    wrapped to a negative distance, the nearest cell there is)."""
    from rlx.envs.mapf import first_goal_distances

    grid = np.zeros((182, 182), bool)
    grid[5, :100] = True
    pool = instances.from_instances([(grid, np.array([[0, 0]]), np.array([[9, 9]]))])
    cached = np.asarray(first_goal_distances(pool))
    assert cached[0, 0, 5, 0] == 182 * 182 and cached.min() == 0
    small = instances.from_instances([(np.zeros((20, 20), bool), np.array([[0, 0]]), np.array([[9, 9]]))])
    assert first_goal_distances(small).dtype == jnp.int16  # a quarter of int32's memory where it fits


@pytest.mark.parametrize("observation", ["local", "local_path", "map"])
def test_auto_reset_observes_the_returned_state_as_the_generic_select_does(observation):
    """``step`` observes the state it returns once (``observations_of``); the contract's generic path observes
    both the continued and the fresh episode and selects; with the pool's stored initial observations
    (local windows) it observes only the continued one and reads the fresh one. Same keys, so same resets:
    outputs must agree at every step, episode ends included (horizon 3, so several pass), and local windows
    stay 0/1 ``uint8``."""

    class Selecting(MapfEnv):
        def observations_of(self, state, params):
            return None

    pool = instances.random_pool(4, 5, seed=2, size=(7, 9), density=(0.1, 0.3), max_steps_in_episode=3)
    ours, generic = (cls(5, 3, "soft", "nothing", pool, observation=observation) for cls in (MapfEnv, Selecting))
    assert ours.observations_of(ours.reset(jax.random.PRNGKey(0))[1], pool) is not None

    def rollout(env, params):
        def step(state, key):
            action_key, step_key = jax.random.split(key)
            obs, state, rewards, terminated, truncated, info = env.step(
                step_key, state, jax.random.randint(action_key, (5,), 0, 5), params)
            return state, (obs, info["final_observation"], info["episode_over"], state.instance)

        first_obs, state = env.reset(jax.random.PRNGKey(0), params)
        return first_obs, jax.lax.scan(step, state, jax.random.split(jax.random.PRNGKey(1), 10))[1]

    runs = [rollout(ours, pool), rollout(generic, pool)]
    if observation != "map":
        stored = ours.with_initial_observations(pool)
        assert ours.observations_of(ours.reset(jax.random.PRNGKey(0), stored)[1], stored) is None
        runs.append(rollout(ours, stored))
    (first, (obs, final, over, instance)) = runs[0]
    assert int(over.sum()) >= 3 and len(set(np.asarray(instance).tolist())) > 1
    for other in runs[1:]:
        jax.tree.map(np.testing.assert_array_equal, runs[0], other)
    if observation == "local":
        assert obs.dtype == jnp.uint8 and set(np.unique(obs)) <= {0, 1}
        assert ours.observation_space(pool).dtype == jnp.uint8


def test_stored_initial_observations_must_fit_the_environment():
    """Windows stored by one environment are refused by another that observes differently, naming the fix;
    whole-map observations are not stored; ``make_mapf`` stores local windows, ``merge_pools`` drops them."""
    pool = instances.random_pool(3, 4, seed=1, size=(7, 9), density=(0.1, 0.3))
    radius_3 = MapfEnv(4, 3, "soft", "nothing", pool).with_initial_observations(pool)
    with pytest.raises(ConfigError, match=r"obs_radius=5\): store them with this env's with_initial_observations"):
        MapfEnv(4, 5, "soft", "nothing", pool).reset(jax.random.PRNGKey(0), radius_3)
    with pytest.raises(ConfigError, match="observation='local_path'"):
        MapfEnv(4, 3, "soft", "nothing", pool, observation="local_path").reset(jax.random.PRNGKey(0), radius_3)
    with pytest.raises(ConfigError, match="only local observations can be stored"):
        MapfEnv(4, 3, "soft", "nothing", pool, observation="map").with_initial_observations(pool)
    env, params = registry.make("mapf_random", {"num_agents": 3, "pool_size": 4, "observation": "local_path"})
    assert params.initial_observations.shape == (4, 3, 11, 11, 4)
    assert stores_initial_observations(env, params, max_bytes=4 * 3 * 11 * 11 * 4 * 4)
    assert not stores_initial_observations(env, params, max_bytes=4 * 3 * 11 * 11 * 4 * 4 - 1)
    assert instances.merge_pools([params, params]).initial_observations is None


def test_every_mapf_layout_builds_and_steps(tmp_path):
    map_file = tmp_path / "tiny.map"
    map_file.write_text("type octile\nheight 4\nwidth 5\nmap\n.....\n.@@..\n.....\n..T..\n")
    for name, options in (("mapf_random", {}), ("mapf_maze", {"size": [9, 11]}), ("mapf_warehouse", {}),
                          ("mapf_file", {"map_file": str(map_file)})):
        env, params = registry.make(name, {"num_agents": 3, "pool_size": 4, **options})
        obs, state = env.reset(jax.random.PRNGKey(0), params)
        obs, state, rewards, terminated, truncated, info = env.step(
            jax.random.PRNGKey(1), state, jnp.zeros(3, jnp.int32), params)
        assert obs.shape == (3, 11, 11, 3) and rewards.shape == (3,), name
    with pytest.raises(ConfigError, match="map_file: a MovingAI .map file is needed"):
        registry.make("mapf_file", {"num_agents": 2, "pool_size": 2})


# -- learning ------------------------------------------------------------------------------------------


def test_mappo_with_the_path_channel_solves_small_unseen_instances(optimised):
    """Decentralized MAPPO on 4-agent 8x8 maps (``local_path`` windows, progress reward, no agent ids)
    solves most unseen instances at once; random agents solve none. The experiment at full size is
    ``python -m rlx.reproduce mapf_random`` (N=16 on 17-21 maps)."""
    options = dict(num_agents=4, obs_radius=3, size=(8, 8), density=(0.1, 0.2), max_steps=32)
    env = make_mapf(pool_size=256, seed=1, observation="local_path", progress_reward=0.1, **options)
    config = mappo.Config(lr=1e-3, num_envs=32, num_steps=32, num_epochs=4, num_minibatches=4, ent_coef=0.01,
                          hidden_sizes=(64, 64), centralized_critic=False, agent_id=False,
                          total_timesteps=32 * 32 * 120)
    mappo.validate(config)
    agent = mappo.make(config, env, env.default_params)
    state, _ = jax.jit(lambda key: jax.lax.scan(lambda s, _: agent.update(s), agent.init(key), None,
                                                config.num_updates))(jax.random.PRNGKey(0))
    unseen = make_mapf(pool_size=64, seed=2, observation="local_path", **options)
    pool = unseen.default_params
    learned = evaluation.evaluate_policy(unseen, pool, agent.act, jax.random.PRNGKey(3), state.policy)
    random = evaluation.evaluate_policy(unseen, pool, evaluation.random_actions(4), jax.random.PRNGKey(3))
    print(f"CSR learned {learned['csr'].mean():.2f}, random {random['csr'].mean():.2f}")
    assert learned["csr"].mean() >= 0.8 and random["csr"].mean() <= 0.1


@pytest.mark.parametrize("observation", ["map_defer", "map_rank", "map_corridor"])
def test_map_planes_turn_with_the_map(observation):
    """``map_policy``'s ``augment`` trains on turned and mirrored samples: for each of the 8 symmetries, the
    planes of a turned instance must be the turned planes of the original (``transform_sample`` with the env's
    ``move_planes``), at the start and after the same (turned) random joint moves, for every ``map_defer``
    channel but the tie-break numbers (drawn per cell position, which a turn does not keep), and ``map_rank``'s
    per-move comparisons. One pool holds the original and its 8 turned copies, so the environment's reset and
    step compile once."""
    rng = np.random.default_rng(5)
    size, n = 9, 6
    grid = maps.random_map(size, 0.2, rng)
    starts, goals = maps.sample_instance(grid, n, rng)

    def turn(cells, symmetry):
        return np.stack(mp.map_cells(symmetry, cells[..., 0], cells[..., 1], size), -1)

    drawn = [(grid, starts, goals)]
    for symmetry in range(8):
        turned_grid = np.zeros_like(grid)
        turned_grid[tuple(turn(np.argwhere(np.ones_like(grid)), symmetry).T)] = grid.ravel()
        drawn.append((turned_grid, turn(starts, symmetry), turn(goals, symmetry)))
    pool = instances.from_instances(drawn, 32, num_agents=n)
    env = MapfEnv(n, 5, "soft", "nothing", pool, observation=observation)
    noise = MAP_CHANNELS + PRIORITY_CHANNELS
    key = jax.random.PRNGKey(0)
    reset = jax.jit(env.reset_to)
    step = jax.jit(env.step_env)  # compiled once: eager steps dispatch dozens of small programs each
    transform = jax.jit(lambda symmetry, planes, cells: mp.transform_sample(  # the symmetry traced: one compile
        symmetry, planes, cells, jnp.zeros(n, jnp.int32), env.move_planes))
    keep = [c for c in range(env.observation_space(pool).shape[-1] - 1) if c != noise]
    for symmetry in range(8):
        permutation = np.asarray(mp.action_permutation(symmetry))
        (obs, state), (turned_obs, turned_state) = reset(0, key, pool), reset(1 + symmetry, key, pool)
        for t in range(12):
            planes, me = obs[0, ..., :-1], obs[..., -1]
            cells = jnp.argmax(me.reshape(n, -1), -1)
            expected, expected_cells, _ = transform(symmetry, planes, cells)
            np.testing.assert_array_equal(np.asarray(turned_obs[0])[..., keep], np.asarray(expected)[..., keep],
                                          err_msg=f"symmetry {symmetry}, step {t}")
            np.testing.assert_array_equal(np.argmax(turned_obs[..., -1].reshape(n, -1), -1), expected_cells,
                                          err_msg=f"symmetry {symmetry}, step {t}")
            actions = rng.integers(0, 5, n)
            obs, state, *_ = step(key, state, jnp.asarray(actions), pool)
            turned_obs, turned_state, *_ = step(key, turned_state, jnp.asarray(permutation[actions]), pool)


@pytest.mark.parametrize("seed", range(6))
def test_dead_end_planes_match_a_walk_along_each_corridor(seed):
    """``dead_end_planes`` (a fixed point in JAX) against the teacher's own walk (``experts.ways_on``) from
    every free cell away from each free neighbour, on random maps of several densities and sizes, and on a
    ring of corridor cells."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(5, 22))
    grid = maps.random_map(size, [0.0, 0.2, 0.35, 0.5, 0.3, 0.25][seed], rng)
    if seed == 0:  # a ring of corridor cells round a block that walls in one free cell
        grid = np.zeros((5, 5), bool)
        grid[1:4, 1:4] = True
        grid[2, 2] = False
        grid[2, 1] = grid[2, 3] = True
    moves = experts.neighbour_table(grid)
    planes = np.asarray(dead_end_planes(jnp.asarray(grid)))
    expected = np.zeros_like(planes)
    for (r, c) in moves:
        for d, (dr, dc) in enumerate(MOVES[1:]):
            behind = (r + int(dr), c + int(dc))
            if behind in moves:
                expected[r, c, d] = experts.ways_on(moves, (r, c), behind) == 0
    np.testing.assert_array_equal(planes, expected)
    assert seed != 0 or expected[0, 0].sum() == 2  # the ring: both ways round end where they began
