"""PIBT's priorities in the map observations, and DAgger's relabelled episodes for the map policy."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import train_subprocess
from rlx.agents import map_policy
from rlx.envs.mapf import dagger, evaluation, experts, first_goal_distances, instances, make_mapf, tie_noise
from rlx.envs.mapf.env import MAP_CHANNELS, PRIORITY_CHANNELS, MapfEnv, goal_pockets


def compiled(env):
    """``env``'s ``step_env``, ``waiting_steps`` and ``deferred`` compiled once: the tests below replay many
    steps one at a time from Python, where each eager call would dispatch dozens of small programs."""
    return jax.jit(env.step_env), jax.jit(env.waiting_steps), jax.jit(env.deferred)


def small_pool(agents=10, maps=3, horizon=40, seed=3):
    drawn = instances.random_instances(maps, agents, seed=seed, size=(9, 11))
    pool = instances.from_instances(drawn, horizon, num_agents=agents, shape=(11, 11))
    solutions = [experts.pibt(g, s, goals, horizon, seed=i, tiebreak="index") for i, (g, s, goals) in enumerate(drawn)]
    pool = pool.replace(expert_actions=jnp.asarray(experts.joint_actions(solutions, horizon, agents)))
    return drawn, solutions, pool.replace(goal_distances=first_goal_distances(pool))


def test_priority_planes_show_pibts_priorities_along_its_own_paths():
    """Replaying PIBT (index tie-breaks), the environment's waiting steps are the integer part of PIBT's
    priority at every step, and the planes carry them and the tie-breaker on each agent's cell."""
    drawn, solutions, pool = small_pool(agents=12)
    env = MapfEnv(12, 2, "soft", "nothing", pool, observation="map_priority")
    assert env.observation_space(pool).shape == (11, 11, MAP_CHANNELS + PRIORITY_CHANNELS + 1)
    step, waiting_steps, _ = compiled(env)
    for m, ((_, _, goals), solution) in enumerate(zip(drawn, solutions)):
        obs, state = env.reset_to(m, jax.random.PRNGKey(0), pool)
        assert obs.shape == (12, 11, 11, MAP_CHANNELS + PRIORITY_CHANNELS + 1)
        priority = experts.tiebreakers(12, "index", None)
        for t, actions in enumerate(solution.actions):
            priority = experts.raise_priorities(priority, solution.paths[t], goals)
            np.testing.assert_array_equal(np.floor(priority), waiting_steps(state))
            rows, cols = solution.paths[t].T
            planes = np.asarray(obs[0])[rows, cols, MAP_CHANNELS:MAP_CHANNELS + PRIORITY_CHANNELS]
            np.testing.assert_allclose(planes[:, 0], np.minimum(np.floor(priority) / 40, 1), atol=1e-6)
            np.testing.assert_allclose(planes[:, 1], priority % 1, atol=1e-6)
            obs, state, *_ = step(jax.random.PRNGKey(t), state, jnp.asarray(actions), pool)


def test_dagger_labels_are_conflict_free_pibt_steps_and_replay_reaches_the_learners_states():
    drawn, _, pool = small_pool()
    env = MapfEnv(10, 2, "soft", "nothing", pool, observation="map_priority")
    episodes = dagger.rollouts(env, pool, evaluation.random_actions(10), jax.random.PRNGKey(0))
    labels = dagger.pibt_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"])
    swap_labels = dagger.pibt_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"], swap=True)
    assert labels.shape == episodes["actions"].shape == (3, 40, 10) and labels.any()
    for m, (grid, _, goals) in enumerate(drawn):
        for t in range(40):
            here = episodes["positions"][m, t]
            for joint in (labels[m, t], swap_labels[m, t]):
                experts.check_paths(grid, np.stack([here, here + experts.MOVES[joint]]), goals)

    bigger = dagger.aggregate(pool, np.arange(3), episodes["actions"], labels)
    assert bigger.blocked.shape[0] == 6 and bigger.behaviour_actions.shape == (6, 40, 10)
    np.testing.assert_array_equal(bigger.behaviour_actions[:3], pool.expert_actions)
    np.testing.assert_array_equal(bigger.expert_actions[3:], labels)
    config = map_policy.Config(num_envs=2, num_steps=40, samples_per_episode=4, channels=(8,), total_timesteps=80)
    agent = map_policy.make(config, env, bigger)
    _, cells, _, replayed_labels = jax.jit(agent.replay)(4, jax.random.PRNGKey(1))  # the learner's episode on map 1
    np.testing.assert_array_equal(cells, episodes["positions"][1, ..., 0] * 11 + episodes["positions"][1, ..., 1])
    np.testing.assert_array_equal(replayed_labels, labels[1])
    _, metrics = jax.jit(agent.update)(agent.init(jax.random.PRNGKey(2)))
    assert np.isfinite(metrics["loss"])


def test_earlier_commitments_are_the_agents_decided_before_one_round_on_a_share_of_the_steps():
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 5, (4, 50, 6)).astype(np.int8)
    decided = rng.integers(0, 4, actions.shape)
    decided[0, :, 5] = -1  # an agent without a cell never counts as committed
    committed = dagger.earlier_commitments(actions, decided, 4, 0.5, rng)
    some = np.any(committed >= 0, -1)
    assert 0.4 < some.mean() < 0.6
    for m, t in zip(*np.nonzero(some)):
        before = [(decided[m, t] >= 0) & (decided[m, t] < cut) for cut in (1, 2, 3)]
        assert any(np.array_equal(committed[m, t] >= 0, agents) for agents in before), (m, t)
        np.testing.assert_array_equal(committed[m, t][committed[m, t] >= 0], actions[m, t][committed[m, t] >= 0])
    assert not np.any(committed[0, :, 5] >= 0)


def test_labels_answer_the_learners_commitments_or_drop_them_when_they_conflict():
    """With some agents' moves fixed (here: random moves, as a poor learner commits them), PIBT's labels keep
    those moves (a move into a wall: a wait) and plan the others around them, conflict-free; a step whose
    commitments collide among themselves gets the plain label and loses its commitments."""
    drawn, _, pool = small_pool()
    env = MapfEnv(10, 2, "soft", "nothing", pool, observation="map_priority")
    episodes = dagger.rollouts(env, pool, evaluation.random_actions(10), jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    decided = rng.integers(0, 4, episodes["actions"].shape)
    committed = dagger.earlier_commitments(episodes["actions"], decided, 4, 1.0, rng)
    labels, answered = dagger.answered_commitments(pool, np.arange(3), episodes["positions"], episodes["waiting"],
                                                   committed, swap=True)
    kept = dropped = 0
    for m, (grid, _, goals) in enumerate(drawn):
        moves = experts.neighbour_table(grid)
        for t in range(40):
            here = episodes["positions"][m, t]
            experts.check_paths(grid, np.stack([here, here + experts.MOVES[labels[m, t]]]), goals)
            fixed = dict(dagger.committed_cells(moves, [tuple(cell) for cell in here], committed[m, t]))
            targets = list(fixed.values())
            clash = len(set(targets)) < len(targets) or any(
                fixed.get(j) == tuple(here[i]) and fixed[i] == tuple(here[j]) for i in fixed for j in fixed if i != j)
            if np.all(answered[m, t] == -1):
                dropped += bool(fixed)
                continue
            assert not clash, (m, t)
            np.testing.assert_array_equal(answered[m, t], committed[m, t])
            kept += 1
            for i, cell in fixed.items():
                assert tuple(here[i] + experts.MOVES[labels[m, t, i]]) == cell, (m, t, i)
    assert kept >= 20 and dropped >= 5, (kept, dropped)


def test_lacam_labels_a_few_states_per_episode_with_conflict_free_moves_and_marks_the_rest_unasked():
    drawn, _, pool = small_pool()
    env = MapfEnv(10, 2, "soft", "nothing", pool, observation="map_priority")
    episodes = dagger.rollouts(env, pool, evaluation.random_actions(10), jax.random.PRNGKey(0))
    labels = dagger.lacam_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"],
                                 steps_per_episode=5, node_limit=200, processes=1)
    asked = np.all(labels >= 0, axis=-1)
    assert np.all(asked | np.all(labels == -1, axis=-1))  # a step is asked about for all agents or for none
    np.testing.assert_array_equal(asked.sum(1), [5, 5, 5])
    assert labels[asked].any()
    for m, (grid, _, goals) in enumerate(drawn):
        for t in np.nonzero(asked[m])[0]:
            here = episodes["positions"][m, t]
            experts.check_paths(grid, np.stack([here, here + experts.MOVES[labels[m, t]]]), goals)


TINY_MAP_POLICY = ("+exp=mapf_map_policy", "env.options.pool_size=4", "env.options.num_agents=4",
                   "env.options.size=[8,8]", "env.options.max_steps=24", "algo.num_steps=24",
                   "algo.total_timesteps=192", "algo.num_envs=2", "algo.channels=[8]", "run.eval_episodes=2",
                   "run.chunk_updates=4", "run.eval_every_chunks=1")


@pytest.fixture(scope="module")
def map_policy_run(tmp_path_factory):
    """A tiny finished behaviour-cloning run of the map policy, trained through the command line."""
    run_dir = tmp_path_factory.mktemp("map_policy") / "run"
    done = train_subprocess(TINY_MAP_POLICY, run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


# On the suite's fast-compile flags, not `optimised`: its rounds train for a few updates each, so compiling is most of
# its time (2026-12-07, alone: 32 s on an empty cache against 53 s with `optimised`; 20 s warm against 18 s).
def test_reproduce_refines_a_copy_of_the_map_policy_run_once_and_keeps_both(map_policy_run, tmp_path):
    """``study.refine_copy``: DAgger writes a newer checkpoint into a copy (the behaviour-cloning run keeps its
    parameters for its own row); rerunning the same schedule is a no-op; a longer one that starts with it goes
    on from it; another one moves the old copy aside."""
    from rlx.envs.mapf import study
    from rlx.runner.checkpoints import load_raw

    source = map_policy_run
    before, progress = load_raw(source)
    target = tmp_path / "refined"
    rounds = ((1, dict(rollout_maps=2, updates=2)),)
    study.refine_copy(source, target, rounds)

    refined, refined_progress = load_raw(target)
    assert refined_progress["updates_done"] == progress["updates_done"] + 2
    after, _ = load_raw(source)
    leaves = lambda tree: jax.tree.leaves(tree["params"])  # noqa: E731
    assert all(np.array_equal(a, b) for a, b in zip(leaves(before), leaves(after)))  # the source is untouched
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(before), leaves(refined)))
    assert json.loads((target / "dagger.json").read_text())["rounds"] == [[1, {"rollout_maps": 2, "updates": 2}]]

    stamp = (target / "dagger.json").stat().st_mtime_ns
    study.refine_copy(source, target, rounds)  # the same schedule on the same run: kept as it is
    assert (target / "dagger.json").stat().st_mtime_ns == stamp

    longer = rounds + ((1, dict(rollout_maps=2, updates=3, endgame_repeat=2, commitments=0.5)),)
    study.refine_copy(source, target, longer)  # a longer schedule goes on from the finished first round
    assert load_raw(target)[1]["updates_done"] == progress["updates_done"] + 2 + 3
    assert json.loads((target / "dagger.json").read_text())["rounds"] == [[count, options] for count, options in longer]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("refined.")]

    study.refine_copy(source, target, ((1, dict(rollout_maps=2, updates=1, attempts=2)),))  # self-imitation
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("refined.")]
    assert len(aside) == 1 and (aside[0] / "dagger.json").exists()  # the earlier refinement is kept, moved aside
    assert load_raw(target)[1]["updates_done"] == progress["updates_done"] + 1


# `optimised`: it plays 128 steps of 16 decoding rounds, which the fast-compile flags run slowly (2026-12-07,
# alone: 3 s warm against 9.5 s on the fast flags; 9 s against 10 s on an empty cache).
def test_validation_logs_one_summary_per_run_and_agent_count(map_policy_run, tmp_path, optimised):
    """``study.validate``: a summary and a log line per (run, agent count), with CSR <= ISR in [0, 1]."""
    import shutil

    from rlx.envs.mapf import study

    copy = tmp_path / "copy"
    shutil.copytree(map_policy_run, copy)
    lines = []
    results = study.validate([map_policy_run, copy], maps=3, counts=(4,), log=lines.append)
    assert list(results) == [(str(map_policy_run), 4), (str(copy), 4)]
    assert len(lines) == 2 and lines[0].startswith(f"{map_policy_run} N=4: CSR ") and lines[1].startswith(f"{copy} N=4")
    np.testing.assert_equal(results[(str(copy), 4)], results[(str(map_policy_run), 4)])  # same policy, maps, keys
    assert all(0.0 <= summary["csr"] <= summary["isr"] <= 1.0 for summary in results.values())


def test_validation_maps_are_neither_test_nor_training_maps():
    """Choices made on ``study.validate``'s maps must not peek at the table's maps (or train on either)."""
    from rlx.envs.mapf import study

    def keys(drawn):
        return {(grid.tobytes(), starts.tobytes(), goals.tobytes()) for grid, starts, goals in drawn}

    validation, _ = study.test_pool(8, 16, study.VALIDATION_SEED)
    test, _ = study.test_pool(8, 16)
    training = instances.random_instances(16, 8, seed=0)  # make_mapf's pool (seed 0 for every agent count)
    assert len(keys(validation)) == len(keys(test)) == 16
    assert not keys(validation) & keys(test) and not keys(validation) & keys(training)


def test_tie_noise_is_the_same_in_numpy_and_jax_and_spreads_evenly():
    """The teacher (NumPy, on the host) and the environment (JAX) must see bit-identical numbers."""
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 21, (8, 2))
    present = np.arange(8) < 6
    seed = tie_noise.instance_seed(starts, present)
    np.testing.assert_array_equal(seed, tie_noise.instance_seed(starts[:6], np.ones(6, bool)))  # unused slots: nothing
    assert seed != tie_noise.instance_seed(starts[::-1], present)
    grids = [tie_noise.noise_grid(seed, t, 21, 17) for t in range(50)]
    jax_grids = [tie_noise.noise_grid(jnp.asarray(seed), jnp.asarray(t), 21, 17, jnp) for t in range(50)]
    np.testing.assert_array_equal(np.stack(grids), np.stack(jax_grids))
    values = np.stack(grids).ravel()
    assert values.min() >= 0 and values.max() < 1
    counts = np.histogram(values, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - len(values) / 10) < 5 * np.sqrt(len(values) / 10))  # about uniform
    assert abs(np.corrcoef(np.stack(grids)[:-1].ravel(), np.stack(grids)[1:].ravel())[0, 1]) < 0.05  # fresh each step


def test_noise_teacher_is_a_function_of_the_map_noise_observation():
    """Along the ``pibt_swap_noise`` teacher's own paths, the environment's ``map_noise`` plane is the noise the
    teacher broke ties with, and one PIBT step from each state (DAgger's label, which sees only what the
    observation shows) repeats the teacher's joint action exactly; with random move ties it does not."""
    drawn = instances.random_instances(3, 12, seed=5, size=(9, 11))
    pool = instances.from_instances(drawn, 40, num_agents=12, shape=(11, 11))
    pool = pool.replace(goal_distances=first_goal_distances(pool))
    solutions = [experts.pibt_swap_noise(g, s, goals, 40, seed=i) for i, (g, s, goals) in enumerate(drawn)]
    actions = experts.joint_actions(solutions, 40, 12)
    env = MapfEnv(12, 2, "soft", "nothing", pool, observation="map_noise")
    assert env.observation_space(pool).shape == (11, 11, MAP_CHANNELS + PRIORITY_CHANNELS + 2)
    episodes = {"positions": np.zeros((3, 40, 12, 2), np.int64), "waiting": np.zeros((3, 40, 12), np.int64)}

    step, waiting_steps, _ = compiled(env)
    for m, ((grid, starts, _), solution) in enumerate(zip(drawn, solutions)):
        obs, state = env.reset_to(m, jax.random.PRNGKey(0), pool)
        seed = tie_noise.instance_seed(starts, np.ones(12, bool))
        for t in range(40):
            height, width = grid.shape
            np.testing.assert_array_equal(np.asarray(obs[0])[:height, :width, -2],
                                          tie_noise.noise_grid(seed, t, height, width))
            episodes["positions"][m, t] = state.positions
            episodes["waiting"][m, t] = waiting_steps(state)
            obs, state, *_ = step(jax.random.PRNGKey(t), state, jnp.asarray(actions[m, t]), pool)
    labels = dagger.pibt_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"],
                                **experts.STEPWISE_TEACHERS["pibt_swap_noise"])
    np.testing.assert_array_equal(labels, actions)
    coin_labels = dagger.pibt_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"], swap=True)
    assert np.any(coin_labels != actions)
    # LaCAM's first move tries the teacher's step first; these small instances leave it no reason to depart
    lacam = dagger.lacam_labels(pool, np.arange(3), episodes["positions"], episodes["waiting"], steps_per_episode=8,
                                processes=1, move_noise=True)
    asked = lacam[..., 0] >= 0
    assert asked.sum() >= 12
    np.testing.assert_array_equal(lacam[asked], actions[asked])


def test_goal_pockets_in_jax_match_the_host_ones_on_random_maps():
    """``env.goal_pockets`` (JAX, padded maps) against ``experts.goal_pocket`` (NumPy) for every agent's goal
    on crowded random maps, where many goals shut a region off."""
    drawn = instances.random_instances(12, 48, seed=7)
    pockets = jax.jit(goal_pockets)
    marked = 0
    for grid, _, goals in drawn:
        padded = np.ones((21, 21), bool)
        padded[:grid.shape[0], :grid.shape[1]] = grid
        ours = np.asarray(pockets(jnp.asarray(padded), jnp.asarray(goals), jnp.asarray(grid.shape)))
        expected = np.zeros_like(ours)
        for i, goal in enumerate(goals):
            expected[i, :grid.shape[0], :grid.shape[1]] = experts.goal_pocket(grid, goal)
        np.testing.assert_array_equal(ours, expected)
        marked += int(np.any(expected, axis=(1, 2)).sum())
    assert marked >= 20  # the comparison covered real pockets


@pytest.mark.parametrize("teacher, observation, weaker", [("pibt_swap_defer", "map_defer", "pibt_swap_noise"),
                                                          ("pibt_swap_route", "map_route", "pibt_swap_defer")])
def test_teacher_is_a_function_of_its_observation(teacher, observation, weaker):
    """Along the teacher's paths on crowded maps, the environment's deferred agents are the teacher's, its
    waiting steps are the teacher's priorities, its move planes rank every agent's moves as the teacher's
    cost-to-go fields do (``experts.planning_fields``: deferred agents', and with ``map_route`` the fields
    routed around resting agents), and one teacher step from each state (DAgger's label) repeats the
    teacher's joint action; the teacher without its last rule (``weaker``) does not."""
    n, horizon = 24, 40
    drawn = instances.random_instances(4, n, seed=11, size=(9, 11), density=(0.25, 0.3))
    pool = instances.from_instances(drawn, horizon, num_agents=n, shape=(11, 11))
    pool = pool.replace(goal_distances=first_goal_distances(pool))
    solutions = [experts.SOLVERS[teacher](g, s, goals, horizon) for g, s, goals in drawn]
    actions = experts.joint_actions(solutions, horizon, n)
    env = MapfEnv(n, 2, "soft", "nothing", pool, observation=observation)
    assert env.observation_space(pool).shape == (11, 11, MAP_CHANNELS + PRIORITY_CHANNELS + 2)
    episodes = {"positions": np.zeros((4, horizon, n, 2), np.int64), "waiting": np.zeros((4, horizon, n), np.int64)}
    route = observation == "map_route"
    deferred_steps = routed_moves = 0
    step, waiting_steps, env_deferred = compiled(env)
    for m, ((grid, _, goals), solution) in enumerate(zip(drawn, solutions)):
        plain = [experts.distances_to(grid, goal) for goal in goals]
        pockets = np.stack([experts.goal_pocket(grid, goal) for goal in goals])
        away = [experts.deferred_distances(field, pocket) for field, pocket in zip(plain, pockets)]
        priority = experts.tiebreakers(n, "index", None)
        obs, state = env.reset_to(m, jax.random.PRNGKey(0), pool)
        for t in range(horizon):
            here = np.asarray(state.positions)
            keep_off = experts.deferred(pockets, goals, here)
            np.testing.assert_array_equal(np.asarray(env_deferred(state, pool)), keep_off)
            if t < len(solution.actions):
                priority = experts.raise_priorities(priority, here, goals)
                priority = np.where(keep_off, priority % 1, priority)  # as the teacher ranks deferred agents
                np.testing.assert_array_equal(np.floor(priority), waiting_steps(state))
            fields = experts.planning_fields(grid, goals, here, plain, away, keep_off, route)
            deferred_steps += int(keep_off.sum())
            planes = np.asarray(obs[0])
            for i in range(n):
                r, c = here[i]
                for k, (dr, dc) in enumerate(experts.MOVES[1:]):
                    inside = 0 <= r + dr < grid.shape[0] and 0 <= c + dc < grid.shape[1] and not grid[r + dr, c + dc]
                    expected = np.sign(fields[i][r + dr, c + dc] - fields[i][r, c]) if inside else 1
                    assert planes[r, c, 3 + k] == expected
                    plain_sign = np.sign(plain[i][r + dr, c + dc] - plain[i][r, c]) if inside else 1
                    routed_moves += int(not keep_off[i] and expected != plain_sign)
            episodes["positions"][m, t] = here
            episodes["waiting"][m, t] = waiting_steps(state)
            obs, state, *_ = step(jax.random.PRNGKey(t), state, jnp.asarray(actions[m, t]), pool)
    assert deferred_steps >= 10
    assert (routed_moves >= 10) == route  # the routed planes differ from the plain ones only with map_route
    labels = dagger.pibt_labels(pool, np.arange(4), episodes["positions"], episodes["waiting"],
                                **experts.STEPWISE_TEACHERS[teacher])
    np.testing.assert_array_equal(labels, actions)
    without = dagger.pibt_labels(pool, np.arange(4), episodes["positions"], episodes["waiting"],
                                 **experts.STEPWISE_TEACHERS[weaker])
    assert np.any(without != actions)


def test_rank_planes_compare_neighbours_by_the_teachers_priorities():
    """Along ``pibt_swap_defer``'s paths on crowded maps, ``map_rank``'s per-move planes say, on each agent's
    cell, whether the neighbour that way plans before it (+1) or after it (-1) in the teacher's own priority
    order (``experts.raise_priorities`` with deferred agents at the bottom, index tie-breaks), and 0 where no
    agent stands; the other channels are ``map_defer``'s."""
    n, horizon = 24, 40
    drawn = instances.random_instances(3, n, seed=12, size=(9, 11), density=(0.25, 0.3))
    pool = instances.from_instances(drawn, horizon, num_agents=n, shape=(11, 11))
    pool = pool.replace(goal_distances=first_goal_distances(pool))
    solutions = [experts.SOLVERS["pibt_swap_defer"](g, s, goals, horizon) for g, s, goals in drawn]
    actions = experts.joint_actions(solutions, horizon, n)
    env = MapfEnv(n, 2, "soft", "nothing", pool, observation="map_rank")
    defer_env = MapfEnv(n, 2, "soft", "nothing", pool, observation="map_defer")
    rank = MAP_CHANNELS + PRIORITY_CHANNELS + 1
    assert env.observation_space(pool).shape == (11, 11, rank + 4 + 1)
    assert env.move_planes == (3, rank)
    seen = {1: 0, -1: 0}
    step, _, _ = compiled(env)
    defer_observations = jax.jit(defer_env.observations)
    for m, ((grid, _, goals), solution) in enumerate(zip(drawn, solutions)):
        pockets = np.stack([experts.goal_pocket(grid, goal) for goal in goals])
        priority = experts.tiebreakers(n, "index", None)
        obs, state = env.reset_to(m, jax.random.PRNGKey(0), pool)
        for t in range(len(solution.actions)):
            here = np.asarray(state.positions)
            priority = experts.raise_priorities(priority, here, goals)
            priority = np.where(experts.deferred(pockets, goals, here), priority % 1, priority)
            occupant = {tuple(cell): i for i, cell in enumerate(here)}
            planes = np.asarray(obs[0])
            for i, (r, c) in enumerate(here):
                for k, (dr, dc) in enumerate(experts.MOVES[1:]):
                    j = occupant.get((r + dr, c + dc))
                    expected = 0 if j is None else (1 if priority[j] > priority[i] else -1)
                    assert planes[r, c, rank + k] == expected, (m, t, i, k)
                    seen[expected] = seen.get(expected, 0) + 1
            defer_obs = defer_observations(state, pool)
            np.testing.assert_array_equal(np.asarray(obs[..., :rank]), np.asarray(defer_obs[..., :rank]))
            np.testing.assert_array_equal(np.asarray(obs[..., -1]), np.asarray(defer_obs[..., -1]))
            obs, state, *_ = step(jax.random.PRNGKey(t), state, jnp.asarray(actions[m, t]), pool)
    assert seen[1] == seen[-1] >= 100  # every adjacent pair counted once each way, and there were many


def test_endgame_rounds_keep_only_the_stuck_agents_and_their_neighbours():
    """Hand-built: at step 0 three agents stand off their goals (more than ``most_off=2``: nothing kept); at
    step 1 only agent 0 does, and its label is kept with that of agent 1, two cells away; agent 2, three
    cells away, and agent 3, an unused slot next to agent 0, are not asked (-1)."""
    goals = np.array([[[0, 5], [0, 2], [2, 1], [0, 1]]])
    positions = np.array([[[[0, 0], [0, 3], [2, 2], [0, 1]],
                           [[0, 0], [0, 2], [2, 1], [0, 1]]]])
    present = np.array([[True, True, True, False]])
    labels = np.array([[[4, 3, 3, 0], [4, 0, 0, 0]]], np.int8)
    kept = dagger.endgame_only(labels, positions, goals, present, most_off=2, reach=2)
    np.testing.assert_array_equal(kept, [[[-1, -1, -1, -1], [4, 0, -1, -1]]])
    everything = dagger.endgame_only(labels, positions, goals, present, most_off=3, reach=3)
    np.testing.assert_array_equal(everything, [[[4, 3, 3, -1], [4, 0, 0, -1]]])


def test_self_imitation_picks_each_maps_fastest_solved_attempt_or_its_first():
    """Two maps, three attempts each, one agent (goal at (0, 2)) and an unused slot. Map 0: attempt 0 fails,
    attempt 1 arrives at step 2, attempt 2 at step 1 (the pick). Map 1: no attempt is solved, so its first
    one goes to the teacher. An attempt flagged unsolved is never picked, even if its agents stand on goal."""
    goal = np.array([[0, 2], [5, 5]])
    at = lambda *cells: np.array([[list(cell), [0, 0]] for cell in cells])  # noqa: E731
    positions = np.stack([at((0, 0), (0, 1), (0, 1)), at((0, 0), (0, 1), (0, 2)), at((0, 1), (0, 2), (0, 2)),
                          at((0, 0), (0, 0), (0, 0)), at((0, 2), (0, 2), (0, 2)), at((0, 1), (0, 1), (0, 1))])
    solved = np.array([False, True, True, False, False, False])
    goals = np.repeat(goal[None], 6, 0)
    present = np.array([[True, False]] * 6)
    chosen, own = dagger.best_attempts(solved, positions, goals, present, attempts=3)
    np.testing.assert_array_equal(chosen, [2, 3])
    np.testing.assert_array_equal(own, [True, False])
    # solved only by its last step, so its recorded states never show every agent on goal: still the pick
    last_step = dagger.best_attempts(np.array([False, True]), positions[[0, 0]], goals[:2], present[:2], attempts=2)
    np.testing.assert_array_equal(last_step[0], [1])
    with pytest.raises(ValueError, match="attempts"):
        dagger.refine("unused", attempts=0)


def test_endgames_rest_every_agent_on_its_goal_but_pairs_placed_on_each_others_goals():
    """``endgame_instances``: valid instances in which 1–3 pairs stand off their goals, each agent of a pair on
    (or next to) its partner's goal, the pair's goals at most 4 steps apart, one of them in a corridor or a
    dead end; everyone else starts on its goal."""
    drawn = instances.endgame_instances(24, 32, seed=3)
    assert len(drawn) >= 20
    for index, (grid, starts, goals) in enumerate(drawn):
        instances.check_instance(grid, starts, goals[:, None], index)
        off = np.nonzero(np.any(starts != goals, 1))[0]
        assert len(off) in (2, 4, 6)
        for i in off:
            partners = [j for j in off if j != i and np.abs(starts[j] - goals[i]).sum() <= 1]
            assert partners, (index, i)
            assert any(experts.distances_to(grid, goals[i])[tuple(goals[j])] <= 4 for j in partners)
        free_neighbours = [len(experts.neighbours(grid, tuple(goals[i]))) - 1 for i in off]
        assert min(free_neighbours) <= 2


def test_endgame_pools_keep_only_what_the_teacher_solves():
    """``make_mapf(layout="endgame")`` keeps the endgames whose teacher solution ends with every agent on its
    goal: replaying the solutions' moves (conflict-free, so no collision undoes one) lands them all there."""
    env = make_mapf(layout="endgame", num_agents=32, pool_size=12, seed=4, expert="pibt_swap_defer",
                    observation="map_defer")
    pool = env.default_params
    kept = pool.blocked.shape[0]
    assert 0 < kept <= 12
    moves = experts.MOVES[np.asarray(pool.expert_actions)]  # [M, T, n, 2]
    final = np.asarray(pool.starts) + moves.sum(1)
    np.testing.assert_array_equal(final, np.asarray(pool.goals)[:, :, 0])
    drawn = instances.endgame_instances(12, 32, seed=4)
    solved = [experts.pibt_swap_defer(grid, starts, goals, 128).finished.all() for grid, starts, goals in drawn]
    assert kept == sum(solved)
