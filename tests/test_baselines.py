"""Reference policies (rlx/baselines/) and the reproduce driver's plumbing."""

import importlib.util
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from rlx.baselines.multi_agent import best_assignment, random_policy, spread_scripted_policy

needs_jaxmarl = pytest.mark.skipif(importlib.util.find_spec("jaxmarl") is None, reason="jaxmarl is not installed")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_best_assignment_matches_scipy_hungarian(n):
    rng = np.random.default_rng(n)
    solve = jax.jit(best_assignment)
    for _ in range(20):
        cost = rng.uniform(0, 2, (n, n)).astype(np.float32)
        rows, cols = linear_sum_assignment(cost)
        ours = np.asarray(solve(jnp.asarray(cost)))
        assert sorted(ours.tolist()) == list(range(n))  # a permutation: distinct landmarks
        np.testing.assert_allclose(cost[np.arange(n), ours].sum(), cost[rows, cols].sum(), rtol=1e-6)


def test_best_assignment_refuses_large_teams():
    with pytest.raises(ValueError, match="n=7"):
        best_assignment(jnp.zeros((7, 7)))


def test_random_policy_respects_masks():
    act = jax.jit(random_policy(5).act)
    mask = jnp.asarray(np.random.default_rng(0).uniform(size=(64, 3, 5)) < 0.4).at[..., 2].set(True)
    for seed in range(10):
        actions = act(None, jnp.zeros((64, 3, 7)), jax.random.PRNGKey(seed), False, mask)
        assert bool(jnp.take_along_axis(mask, actions[..., None], -1).all())
    actions = act(None, jnp.zeros((4096, 1, 7)), jax.random.PRNGKey(0), False, None)
    np.testing.assert_allclose(np.bincount(np.asarray(actions).ravel(), minlength=5) / 4096, 0.2, atol=0.03)


def point_mass_rollout(policy, start, landmarks, steps=25, dt=0.1, damping=0.25, accel=5.0):
    """One agent per landmark on MPE's point-mass dynamics, written out in NumPy."""
    forces = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32) * accel
    pos, vel = start.copy(), np.zeros_like(start)
    n = len(start)
    for _ in range(steps):
        offsets = (landmarks[None] - pos[:, None]).reshape(n, -1)
        obs = np.concatenate([vel, pos, offsets], axis=1)[None]
        actions = np.asarray(policy.act(None, jnp.asarray(obs), jax.random.PRNGKey(0)))[0]
        pos = pos + vel * dt
        vel = vel * (1 - damping) + forces[actions] * dt
    return pos


def test_scripted_spread_policy_reaches_distinct_landmarks():
    """Every agent ends near a different landmark: the assignment is a matching and steering converges."""
    rng = np.random.default_rng(0)
    policy = spread_scripted_policy(3, 3)
    for _ in range(5):
        start = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
        landmarks = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
        final = point_mass_rollout(policy, start, landmarks)
        distance = np.linalg.norm(final[:, None] - landmarks[None], axis=-1)
        best = min(sum(distance[i, p[i]] for i in range(3)) for p in itertools.permutations(range(3)))
        assert best < 0.3, distance


def test_scripted_spread_policy_rejects_mismatched_teams():
    with pytest.raises(ValueError, match="as many agents as landmarks"):
        spread_scripted_policy(3, 4)


@needs_jaxmarl
def test_scripted_spread_beats_random_on_jaxmarl_mpe():
    from rlx.reproduce import mpe_spread_baselines

    results = mpe_spread_baselines(episodes=32, seeds=2)
    random_return = results["random policy"]["return"].mean()
    scripted = results["scripted (optimal assignment, steer to landmark)"]["return"].mean()
    assert scripted > random_return + 10, (scripted, random_return)


@needs_jaxmarl
def test_smax_heuristic_team_wins_against_its_mirror_and_random_does_not():
    """JaxMARL's script on both sides: about half the battles each way; random allies almost never win."""
    from rlx.reproduce import SMAX_HEURISTIC, smax_baselines

    results = smax_baselines(episodes=64, seeds=2)
    heuristic, random_team = results[SMAX_HEURISTIC], results["random policy"]
    assert 0.25 <= heuristic["won"].mean() <= 0.75, heuristic
    assert random_team["won"].mean() <= 0.05 and heuristic["return"].mean() > random_team["return"].mean() + 0.5


def test_results_table_adds_the_outcome_column_and_drops_a_missing_score():
    from rlx.reproduce import EXPERIMENTS, SMAX_HEURISTIC, render

    rows = {"MAPPO": {"per_seed": {"return": np.array([1.0, 2.0]), "won": np.array([0.5, 1.0])}, "env_steps": 4096},
            "random policy": {"per_seed": {"return": np.array([0.0, 0.5]), "won": np.array([0.0, 0.0])},
                              "env_steps": None},
            SMAX_HEURISTIC: {"per_seed": {"return": np.array([1.5, 1.5]), "won": np.array([0.5, 0.5])}, "env_steps": None}}
    table = render("smax_3m", EXPERIMENTS["smax_3m"], rows, "python -m rlx.reproduce smax_3m", quick=False)
    assert "| method | env steps per seed | seeds | final return (mean ± std over seeds) | win rate (mean ± std " \
           "over seeds) |\n|---|---:|---:|---:|---:|" in table
    assert "| MAPPO | 4,096 | 2 | 1.50 ± 0.50 | 75% ± 25% |" in table
    assert "| random policy | — | 2 | 0.25 ± 0.25 | 0% ± 0% |" in table
    assert "HOLDS (MAPPO 75%, heuristic 50%)" in table


def test_reproduce_unknown_experiment_lists_valid(capsys):
    from rlx.reproduce import main

    with pytest.raises(SystemExit) as exit_info:
        main(["no_such_table"])
    assert exit_info.value.code == 2
    assert "mappo_mpe" in capsys.readouterr().err


def test_single_agent_uniform_policy_covers_discrete_grid_and_continuous_spaces():
    from rlx.baselines.single_agent import uniform_policy
    from rlx.envs import registry

    maze, maze_params = registry.make("maze")  # (9, 9, 3) grid observations, 4 actions
    actions = np.asarray(jax.jit(uniform_policy(maze, maze_params).act)(None, jnp.zeros((4000, 9, 9, 3)),
                                                                         jax.random.PRNGKey(0)))
    assert actions.shape == (4000,)
    np.testing.assert_allclose(np.bincount(actions, minlength=4) / 4000, 0.25, atol=0.03)
    pendulum, pendulum_params = registry.make("Pendulum-v1")  # one torque in [-2, 2]
    torques = np.asarray(uniform_policy(pendulum, pendulum_params).act(None, jnp.zeros((4000, 3)),
                                                                       jax.random.PRNGKey(1)))
    assert torques.shape == (4000, 1) and torques.min() >= -2 and torques.max() <= 2
    assert abs(torques.mean()) < 0.1 and torques.std() > 1.0  # uniform on [-2, 2]: std 1.15


@pytest.mark.parametrize("name", ["pbrl_feedback", "pbrl_offline", "mm_event_vs_time"])
def test_skip_training_is_refused_by_studies_that_train_each_time(name, tmp_path, monkeypatch):
    """They used to ignore the flag, retrain for hours and overwrite the saved tables."""
    from rlx import reproduce

    monkeypatch.setattr(reproduce, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=f"--skip-training: {name} keeps no trained"):
        reproduce.reproduce(name, None, quick=True, skip_training=True)
    assert not any(tmp_path.rglob("*.md"))


def test_quoting_study_scores_only_a_run_that_trained_to_its_end(tmp_path):
    import json

    from rlx.envs.market.quoting_study import check_finished
    from rlx.errors import ConfigError

    with pytest.raises(ConfigError, match="no finished run there"):
        check_finished(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "diverged"}))
    with pytest.raises(ConfigError, match="did not finish \\(status diverged\\)"):
        check_finished(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    check_finished(tmp_path)
