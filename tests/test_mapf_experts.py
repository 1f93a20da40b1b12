"""The classical MAPF solvers: valid joint paths on random instances (hypothesis), and they solve easy ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlx.envs.mapf import experts, maps
from rlx.envs.mapf.env import ROUTE_PENALTY

instance_strategy = dict(seed=st.integers(0, 100_000), side=st.integers(5, 14), density=st.floats(0.0, 0.3),
                         agents=st.integers(1, 14))


def draw(seed, side, density, agents):
    rng = np.random.default_rng(seed)
    grid = maps.random_map(side, density, rng)
    try:
        starts, goals = maps.sample_instance(grid, agents, rng)
    except Exception:
        return None
    return grid, starts, goals


# LaCAM within a small node budget: its partial answers must be valid too
ALWAYS_VALID = {"pibt": lambda grid, s, g, side: experts.pibt(grid, s, g, max_steps=3 * side),
                "pibt_swap": lambda grid, s, g, side: experts.pibt(grid, s, g, max_steps=3 * side, swap=True),
                "pibt_swap_defer": lambda grid, s, g, side: experts.pibt_swap_defer(grid, s, g, max_steps=3 * side),
                "pibt_swap_detour": lambda grid, s, g, side: experts.pibt_swap_detour(grid, s, g, max_steps=3 * side),
                "pibt_swap_route": lambda grid, s, g, side: experts.pibt_swap_route(grid, s, g, max_steps=3 * side),
                "lacam": lambda grid, s, g, side: experts.lacam(grid, s, g, max_steps=4 * side, node_limit=300)}


@pytest.mark.parametrize("solver", sorted(ALWAYS_VALID))
@settings(max_examples=35, deadline=None)
@given(**instance_strategy)
def test_pibt_and_lacam_paths_are_always_valid(solver, seed, side, density, agents):
    instance = draw(seed, side, density, agents)
    if instance is None:
        return
    grid, starts, goals = instance
    solution = ALWAYS_VALID[solver](grid, starts, goals, side)
    experts.check_paths(grid, solution.paths, goals, solution.finished)
    np.testing.assert_array_equal(solution.paths[0], starts)


@settings(max_examples=30, deadline=None)
@given(**instance_strategy)
@example(seed=1070, side=8, density=0.25, agents=14)  # an agent stuck on its own goal, run through by another
def test_prioritized_planning_complete_solutions_are_valid(seed, side, density, agents):
    instance = draw(seed, side, density, agents)
    if instance is None:
        return
    grid, starts, goals = instance
    solution = experts.prioritized_planning(grid, starts, goals, max_steps=3 * side)
    if solution.finished.all():
        experts.check_paths(grid, solution.paths, goals, solution.finished)
        single = [experts.distances_to(grid, g)[tuple(s)] for s, g in zip(starts, goals)]
        assert len(solution.paths) - 1 >= max(single)  # no agent beats its own shortest path


# A corridor with a dead-end pocket below its middle, and (starts, goals) of two agents that meet head-on
# there: one must reach the pocket's bottom while the other leaves it.
DEAD_END_POCKET = [".....", "##.##", "##.##"]
HEAD_ON_AT_THE_POCKET = [(np.array([[0, 2], [2, 2]]), np.array([[2, 2], [0, 0]])),
                         (np.array([[0, 3], [1, 2]]), np.array([[2, 2], [0, 4]]))]


@pytest.mark.parametrize("solver", ["pibt", "pibt_swap", "prioritized", "lacam"])
def test_agents_that_start_on_their_goals_need_no_steps(solver):
    grid = maps.from_strings(["..."])
    solution = experts.SOLVERS[solver](grid, np.array([[0, 1]]), np.array([[0, 1]]), 16)
    assert solution.finished.all() and solution.actions.shape == (len(solution.paths) - 1, 1)
    assert experts.joint_actions([solution], 4, 1).shape == (1, 4, 1)


def test_lacam_solves_a_corridor_swap_where_pibt_goes_round_in_circles():
    """Two agents swap ends of a corridor with one side pocket, a third must end on the pocket's mouth:
    PIBT keeps pushing back and forth; LaCAM's search over joint configurations finds the detour."""
    grid = maps.from_strings(DEAD_END_POCKET)
    starts, goals = np.array([[0, 0], [0, 4], [2, 2]]), np.array([[0, 4], [0, 0], [0, 2]])
    assert not experts.pibt(grid, starts, goals, 60, seed=0).finished.all()
    for seed in range(3):
        solution = experts.lacam(grid, starts, goals, 60, seed)
        assert solution.finished.all()
        experts.check_paths(grid, solution.paths, goals, solution.finished)
        assert len(solution.paths) - 1 <= 10  # it finds 6- or 7-step solutions with these seeds


def test_pibt_swap_lets_agents_pass_head_on_at_a_dead_end():
    """One agent must reach the bottom of a dead-end pocket that another is leaving: plain PIBT pushes the
    other back into the pocket (and mostly goes round in circles); with the swap operation the first backs
    out to the junction, pulling the other after it, steps aside, and both arrive, with every seed."""
    grid = maps.from_strings(DEAD_END_POCKET)
    for starts, goals in HEAD_ON_AT_THE_POCKET:
        plain = [experts.pibt(grid, starts, goals, 40, seed).finished.all() for seed in range(10)]
        assert sum(plain) <= 1
        for seed in range(10):
            for tiebreak in ("random", "index"):
                solution = experts.pibt(grid, starts, goals, 40, seed, tiebreak=tiebreak, swap=True)
                assert solution.finished.all(), (starts.tolist(), seed, tiebreak)
                experts.check_paths(grid, solution.paths, goals, solution.finished)
                assert len(solution.paths) - 1 <= 12


# An open room with a corridor off its right side leading to a goal, and a two-cell region behind that goal.
POCKET_BEHIND_A_GOAL = ["...###.", ".......", "...####"]


def test_goal_pocket_marks_what_a_goal_shuts_off_and_the_corridor_to_it():
    """By hand: the goal at (1, 5) cuts off (1, 6) and (0, 6) (inner), and is reached through the corridor
    (1, 3)-(1, 4) (way); a goal in the open room or at the bottom of the dead end shuts nothing off."""
    grid = maps.from_strings(POCKET_BEHIND_A_GOAL)
    expected = np.zeros(grid.shape, np.int8)
    expected[[1, 0], [6, 6]] = experts.POCKET_INNER
    expected[1, 3:6] = experts.POCKET_WAY
    np.testing.assert_array_equal(experts.goal_pocket(grid, (1, 5)), expected)
    assert not experts.goal_pocket(grid, (1, 1)).any() and not experts.goal_pocket(grid, (0, 6)).any()
    # deferred agents plan out of the pocket from every cell of it, and by plain distance outside it
    away = experts.deferred_distances(experts.distances_to(grid, (1, 5)), expected)
    assert away[0, 6] > away[1, 6] > away[1, 5] > away[1, 4] > away[1, 3] > away[1, 2] == 3 < away[1, 1] == 4


def test_deferral_lets_an_agent_into_a_pocket_that_pibt_with_swap_never_enters():
    """Agent 1 stands on its goal at the mouth of a pocket whose far end is agent 0's goal: PIBT (with swap,
    any tie-breaks) pushes it deeper and back for ever; deferring, it steps out of the corridor until agent
    0 is in, then returns, and all arrive."""
    grid = maps.from_strings(POCKET_BEHIND_A_GOAL)
    starts, goals = np.array([[1, 0], [1, 5], [0, 0]]), np.array([[0, 6], [1, 5], [2, 2]])
    pockets = np.stack([experts.goal_pocket(grid, goal) for goal in goals])
    np.testing.assert_array_equal(experts.deferred(pockets, goals, starts), [False, True, False])
    np.testing.assert_array_equal(experts.deferred(pockets, goals, np.array([[1, 6], [1, 2], [0, 0]])),
                                  [False, False, False])  # agent 0 is in: agent 1 may return
    for solver in ("pibt_swap", "pibt_swap_noise"):
        assert not experts.SOLVERS[solver](grid, starts, goals, 64).finished.all()
    solution = experts.pibt_swap_defer(grid, starts, goals, 64)
    assert solution.finished.all()
    experts.check_paths(grid, solution.paths, goals, solution.finished)
    assert len(solution.paths) - 1 <= 16


# a ring around two walls: column 0 is a corridor open at both ends
RING = [".##..",
        ".....",
        ".#...",
        ".#.#.",
        "....#"]


def test_routed_distances_go_round_a_resting_agent_when_that_is_shorter():
    """On ``RING``, to (4, 0) with an agent resting on (2, 0): from (1, 1) round the ring (6, not 4 plus
    ``ROUTE_PENALTY``); from (1, 0) 7 either way (round, or 3 + 4 through); at (3, 0), behind the resting agent,
    straight on (1); on the resting cell itself, through it (2 + 4). The resting agent plans by its plain field."""
    grid = maps.from_strings(RING)
    resting = np.zeros_like(grid)
    resting[2, 0] = True
    plain = experts.distances_to(grid, (4, 0))
    routed = experts.routed_distances(grid, (4, 0), plain, resting)
    assert (plain[1, 0], plain[1, 1], plain[3, 0]) == (3, 4, 1)
    assert ROUTE_PENALTY == 4
    assert (routed[1, 0], routed[1, 1], routed[3, 0], routed[2, 0]) == (7, 6, 1, 6)
    fields = experts.planning_fields(grid, [(2, 0), (4, 0)], [(2, 0), (1, 0)],
                                     [experts.distances_to(grid, (2, 0)), plain], route=True)
    np.testing.assert_array_equal(fields[0], experts.distances_to(grid, (2, 0)))
    np.testing.assert_array_equal(fields[1], routed)


def test_routing_solves_two_agents_meeting_head_on_in_a_corridor_open_at_both_ends():
    """On ``RING`` agent 0 must pass agent 1 in column 0 to reach (2, 0), and agent 1 must pass it for (4, 0):
    each pushes the other off its goal in turn with ``pibt_swap_defer`` (the pocket rule does not see a
    corridor open at both ends); with ``pibt_swap_detour`` or ``pibt_swap_route`` one walks round and both
    arrive: routing alone does it, without giving way."""
    grid = maps.from_strings(RING)
    starts, goals = np.array([[4, 3], [1, 1]]), np.array([[2, 0], [4, 0]])
    assert not experts.pibt_swap_defer(grid, starts, goals, 64).finished.all()
    for solver in (experts.pibt_swap_detour, experts.pibt_swap_route):
        solution = solver(grid, starts, goals, 64)
        assert solution.finished.all()
        experts.check_paths(grid, solution.paths, goals, solution.finished)
        assert len(solution.paths) - 1 <= 12


def test_a_pushed_agent_gives_way_rather_than_walking_ahead_of_its_pusher():
    """Agent 0 (higher priority, goal (0, 2)) enters (0, 1), where agent 1 rests on its goal; among its equally
    good cells (0, 2) and (1, 1), agent 1 takes (1, 1) with ``give_way``, whatever the tie-breaks; without,
    the tie-breaks decide, and (0, 2), ahead of agent 0, comes up."""
    grid = maps.from_strings(["...", "..."])
    moves = experts.neighbour_table(grid)
    fields = [experts.distances_to(grid, (0, 2)), experts.distances_to(grid, (0, 1))]
    cost = lambda i, cell: fields[i][cell]  # noqa: E731
    taken = {True: set(), False: set()}
    for seed in range(16):
        for give_way in (True, False):
            step = experts.pibt_step(moves, [(0, 0), (0, 1)], cost, np.array([1.5, 0.5]),
                                     np.random.default_rng(seed), give_way=give_way)
            assert step[0] == (0, 1)
            taken[give_way].add(step[1])
    assert taken[True] == {(1, 1)} and (0, 2) in taken[False]


def test_checker_catches_each_kind_of_error():
    grid = maps.from_strings(["...", ".#.", "..."])
    goals = np.array([[0, 2], [0, 0]])
    swap = np.array([[[0, 0], [0, 1]], [[0, 1], [0, 0]]])
    vertex = np.array([[[0, 0], [0, 2]], [[0, 1], [0, 1]]])
    wall = np.array([[[1, 0], [2, 2]], [[1, 1], [2, 2]]])
    jump = np.array([[[0, 0], [2, 2]], [[0, 2], [2, 2]]])
    for paths, message in ((swap, "swapped"), (vertex, "vertex conflict"), (wall, "blocked"), (jump, "jumped")):
        try:
            experts.check_paths(grid, paths, goals)
        except AssertionError as error:
            assert message in str(error)
        else:
            raise AssertionError(f"{message} not caught")
    good = np.array([[[0, 0], [2, 0]], [[0, 1], [1, 0]], [[0, 2], [0, 0]]])
    experts.check_paths(grid, good, goals, np.array([True, True]))


def test_both_solvers_solve_a_sparse_instance_and_actions_replay_the_paths():
    rng = np.random.default_rng(0)
    grid = maps.random_map(16, 0.1, rng)
    starts, goals = maps.sample_instance(grid, 8, rng)
    for solve in (experts.pibt, experts.prioritized_planning, experts.lacam):
        solution = solve(grid, starts, goals, 64)
        assert solution.finished.all(), solve.__name__
        replayed = starts + np.cumsum(experts.MOVES[solution.actions], axis=0)
        np.testing.assert_array_equal(replayed, solution.paths[1:])


def test_pibt_moves_execute_unchanged_in_the_environment():
    """PIBT's joint moves have no vertex conflicts or swaps, so under soft collisions the environment
    carries them out exactly, and reports success when PIBT does."""
    import jax
    import jax.numpy as jnp

    from rlx.envs.mapf import instances
    from rlx.envs.mapf.env import MapfEnv

    rng = np.random.default_rng(1)
    grid = maps.random_map(12, 0.2, rng)
    starts, goals = maps.sample_instance(grid, 12, rng)
    solution = experts.pibt(grid, starts, goals, 48)
    assert solution.finished.all()
    pool = instances.from_instances([(grid, starts, goals)], max_steps_in_episode=64)
    env = MapfEnv(12, 2, "soft", "nothing", pool)
    _, state = env.reset_to(0, jax.random.PRNGKey(0), pool)
    step = jax.jit(env.step_env)  # compiled once: an eager step dispatches dozens of small programs
    for t, actions in enumerate(solution.actions):
        _, state, _, terminated, info = step(jax.random.PRNGKey(t), state, jnp.asarray(actions), pool)
        np.testing.assert_array_equal(state.positions, solution.paths[t + 1])
    assert terminated.all() and float(info["csr"]) == 1.0
    assert float(info["makespan"]) == len(solution.actions)


def test_lifelong_goal_sequences_stay_in_each_agents_component_and_never_repeat_a_goal_at_once():
    from rlx.envs.mapf import instances

    for grid, starts, sequences in instances.lifelong_instances(6, 16, 12, seed=3, size=(9, 12)):
        labels = maps.connected_components(grid)
        assert sequences.shape == (16, 12, 2)
        for start, sequence in zip(starts, sequences):
            assert all(labels[tuple(goal)] == labels[tuple(start)] and not grid[tuple(goal)] for goal in sequence)
            assert np.all(np.any(sequence[1:] != sequence[:-1], axis=-1))
        assert len({tuple(goal) for goal in sequences[:, 0].tolist()}) == 16  # first goals distinct
        instances.check_instance(grid, starts, sequences)


def test_lifelong_pibt_is_valid_and_the_restart_environment_counts_the_same_arrivals():
    """PIBT following goal sequences hands the environment conflict-free moves; in ``restart`` mode the
    environment hands out the same next goals, so its throughput is PIBT's arrivals over the horizon."""
    from rlx.envs.mapf import evaluation, instances
    from rlx.envs.mapf.env import MapfEnv

    horizon, n = 40, 10
    drawn = instances.lifelong_instances(3, n, 16, seed=4, size=(9, 11))
    solutions = [experts.pibt(grid, starts, goals, horizon, seed=i, lifelong=True)
                 for i, (grid, starts, goals) in enumerate(drawn)]
    for (grid, _, goals), solution in zip(drawn, solutions):
        assert solution.paths.shape == (horizon + 1, n, 2)
        experts.check_paths(grid, solution.paths, goals[:, 0])
    pool = instances.from_instances(drawn, horizon, num_agents=n, shape=(11, 11))
    actions = experts.joint_actions(solutions, horizon, n)
    metrics = evaluation.evaluate_actions(MapfEnv(n, 2, "soft", "restart", pool), pool, actions)
    reached = np.array([solution.goals_reached for solution in solutions])
    assert reached.min() > n  # most agents pass several goals in 40 steps on these small maps
    np.testing.assert_allclose(metrics["throughput"] * horizon, reached)


@pytest.mark.parametrize("sequence", [[[0, 3], [1, 3], [0, 3]], [[0, 3]]], ids=["wraps_onto_its_goal", "one_goal"])
def test_lifelong_pibt_counts_a_goal_handed_out_under_foot_as_the_environment_does(sequence):
    """A cyclic sequence A, B, A hands out A again on A (and a one-goal sequence hands out its goal on it):
    ``restart`` mode earns it only by leaving and coming back, and PIBT used to count it at once, 18
    arrivals to the environment's 10 here, then aimed at goals the environment had not handed out."""
    from rlx.envs.mapf import evaluation, instances
    from rlx.envs.mapf.env import MapfEnv

    grid, starts, horizon = maps.from_strings(["....", "...."]), np.array([[0, 0]], np.int32), 20
    goals = np.array([sequence], np.int32)
    solution = experts.pibt(grid, starts, goals, horizon, lifelong=True)
    pool = instances.from_instances([(grid, starts, goals)], horizon, num_agents=1)
    metrics = evaluation.evaluate_actions(MapfEnv(1, 2, "soft", "restart", pool), pool,
                                          experts.joint_actions([solution], horizon, 1))
    assert solution.goals_reached == round(float(metrics["throughput"][0]) * horizon) == len(sequence)


@settings(max_examples=30, deadline=None)
@given(**instance_strategy)
def test_pibt_shield_turns_any_preferences_into_a_conflict_free_step(seed, side, density, agents):
    instance = draw(seed, side, density, agents)
    if instance is None:
        return
    grid, starts, goals = instance
    rng = np.random.default_rng(seed)
    position = [tuple(map(int, s)) for s in starts]
    actions = experts.pibt_shield(experts.neighbour_table(grid), position, goals, rng.normal(size=(agents, 5)),
                                  np.zeros(agents), rng)
    experts.check_paths(grid, np.stack([starts, starts + experts.MOVES[actions]]), goals)


def test_pibt_shield_takes_each_agents_favourite_move_unless_it_conflicts():
    grid = maps.from_strings([".....", "##.##"])
    starts, goals = np.array([[0, 1], [0, 3]]), np.array([[0, 4], [0, 0]])
    scores = np.full((2, 5), -5.0)
    scores[0, 4] = scores[1, 3] = 5.0  # both want the middle cell (0, 2): right and left
    scores[1, 0] = 1.0  # the second agent's next choice: wait
    priority = np.array([0.5, 0.1])  # the first agent plans first
    actions = experts.pibt_shield(experts.neighbour_table(grid), [(0, 1), (0, 3)], goals, scores, priority,
                                  np.random.default_rng(0))
    np.testing.assert_array_equal(actions, [4, 0])
    np.testing.assert_allclose(priority, [1.5, 1.1])  # neither stands on its goal: both gain priority


def test_pibt_shield_swaps_at_a_dead_end_when_the_policy_prefers_shortest_paths():
    """The dead-end pockets of the swap test, with a "policy" whose scores are minus each move's distance to
    goal: the shield's swap reads "wants the other's cell" from those scores and lets both arrive; without
    swap the shield goes round in circles like plain PIBT."""
    grid = maps.from_strings(DEAD_END_POCKET)
    table = experts.neighbour_table(grid)

    def arrives(starts, goals, seed, swap):
        fields = [experts.distances_to(grid, tuple(goal)) for goal in goals]
        position = [tuple(map(int, s)) for s in starts]
        priority, rng = np.zeros(len(starts)), np.random.default_rng(seed)
        for _ in range(40):
            if all(cell == tuple(goal) for cell, goal in zip(position, goals)):
                return True
            scores = np.array([[-fields[i][tuple(np.clip(np.add(cell, move), 0, np.array(grid.shape) - 1))]
                                for move in experts.MOVES] for i, cell in enumerate(position)], float)
            actions = experts.pibt_shield(table, position, goals, scores, priority, rng, swap=swap)
            nxt = np.array(position) + experts.MOVES[actions]
            experts.check_paths(grid, np.stack([np.array(position), nxt]), goals)
            position = [tuple(map(int, cell)) for cell in nxt]
        return False

    for starts, goals in HEAD_ON_AT_THE_POCKET:
        assert sum(arrives(starts, goals, seed, swap=False) for seed in range(10)) <= 1
        assert all(arrives(starts, goals, seed, swap=True) for seed in range(10))


def test_shielded_actions_replay_unchanged_in_the_environment():
    """The host loop's joint actions never conflict, so the environment carries out every move as chosen."""
    import jax
    import jax.numpy as jnp

    from rlx.envs.mapf import evaluation, instances
    from rlx.envs.mapf.env import MapfEnv

    drawn = instances.random_instances(3, 6, seed=2, size=(7, 9))
    pool = instances.from_instances(drawn, 12, num_agents=6, shape=(9, 9))
    env = MapfEnv(6, 2, "soft", "nothing", pool)
    uniform = lambda obs: jnp.zeros(obs.shape[:2] + (5,))  # noqa: E731  (Gumbel noise alone: random rankings)
    actions = evaluation.shielded_actions(env, pool, drawn, uniform, seed=1)
    assert actions.shape == (3, 12, 6) and (actions != 0).any()
    step = jax.jit(env.step_env)
    for m in range(3):
        _, state = env.reset_to(m, jax.random.PRNGKey(0), pool)
        for t in range(12):
            before = np.asarray(state.positions)
            _, state, _, _, _ = step(jax.random.PRNGKey(t), state, jnp.asarray(actions[m, t]), pool)
            np.testing.assert_array_equal(state.positions, before + experts.MOVES[actions[m, t]])
