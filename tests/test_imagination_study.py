"""The sample-efficiency study (rlx/imagination/sample_efficiency.py): its step counting and its presets."""

import math

import numpy as np
import pytest

from rlx.imagination import sample_efficiency as study


def test_steps_to_target_first_touch_holding_and_staying():
    steps = [1000, 2000, 3000, 4000, 5000]
    returns = np.array([[100, 480, 500, 480],  # one column per seed
                        [480, 470, 500, 480],
                        [200, 490, 500, 480],
                        [490, 490, 100, 400],
                        [490, 490, 500, 480]]).astype(float)
    metrics = study.steps_to_target(steps, returns, 475.0, hold=2)
    assert metrics["first"] == [2000, 1000, 1000, 1000]
    assert metrics["held"] == [4000, 3000, 1000, 1000]  # two evaluations in a row at or above 475
    assert metrics["settled"] == [4000, 3000, 5000, 5000]  # seeds 2 and 3 dip at the 4th evaluation
    # a window cut short by the end of the run counts when every evaluation left in it is above the target
    assert study.steps_to_target(steps, returns, 475.0, hold=4)["held"] == [4000, 3000, 5000, 5000]
    assert study.steps_to_target(steps, returns[:3], 475.0, hold=2)["held"] == [None, 3000, 1000, 1000]


def test_median_counts_a_seed_that_never_arrives_as_infinite():
    assert study.median_steps([1000, 3000, None]) == 3000
    assert math.isinf(study.median_steps([None, None, 1000]))


def test_presets_are_read_as_rlx_train_reads_them():
    module, config, env, params = study.preset_parts("dyna_ppo_cartpole")
    assert module.__name__ == "rlx.agents.dyna_ppo"
    assert config.total_timesteps == 20480 and config.hidden_sizes == (64, 64)
    _, ppo_config, _, _ = study.preset_parts("ppo_cartpole", ("algo.num_envs=4",))
    assert ppo_config.num_envs == 4 and ppo_config.hidden_sizes == config.hidden_sizes  # same network sizes


def test_dreamer_maze_preset_has_the_generalization_study_world_model():
    from rlx.imagination import generalization

    module, config, _, _ = study.preset_parts("dreamer_maze")
    assert module.__name__ == "rlx.agents.dreamer"
    for field in (*generalization.SPATIAL_MODEL, "horizon", "batch_size", "seq_len", "gamma", "ent_coef"):
        assert getattr(config, field) == generalization.DREAMER[field], field
    _, gpu_config, _, _ = study.preset_parts("dreamer_maze_gpu")  # valid, and the same kind of model, scaled up
    assert gpu_config.world_model == "conv" and gpu_config.deter_size > config.deter_size


def test_table_names_the_ratios_and_judges_the_target_on_holding(tmp_path):
    def row(*per_seed_returns):  # evaluations every 1024 steps, one column per seed
        returns = np.array(per_seed_returns, float).T.tolist()
        return {"preset": "p", "budget": 1024 * len(returns), "steps": [1024 * (i + 1) for i in range(len(returns))],
                "returns": returns, "train_seconds": 1.0, "compile_seconds": 2.0}

    hold = [500.0] * study.HOLD_EVALUATIONS
    results = {"CartPole-v1": {"dyna_ppo": row([500.0, *hold], [0.0, *hold]),
                               "PPO (model-free)": row([0.0] * 3 + [500.0, 0.0] + hold, [0.0] * 5 + hold)}}
    path = study.write_table(tmp_path / "table.md", results, quick=False)
    table = path.read_text()
    # dyna: first = held = stays 1,024 / 2,048 (median 1,536); PPO: first 4,096 / 6,144, held = stays 6,144
    assert "first 0.30, held 0.25, stays 0.25. Target <= 0.25 (held): HOLDS" in table
    assert "| dyna_ppo | `p` | 6.1k | 1.5k / 1.5k / 1.5k | 1.0k, 2.0k |" in table


# --------------------------------------------------------------------------- generalization with dreams


def test_level_sets_of_the_generalization_study_are_disjoint():
    from rlx.envs import registry
    from rlx.imagination import generalization

    env, _ = registry.make("maze")
    train = generalization.level_params(env, 256)
    test = generalization.level_params(env, 0, generalization.TEST_OFFSET)
    assert (train.num_levels, train.level_offset) == (256, 0)
    assert test.num_levels == 0 and test.level_offset >= max(generalization.LEVEL_COUNTS)  # unlimited, unseen ids
    assert generalization.EVAL_STEPS == env.default_params.max_steps_in_episode


def test_generalization_table_reports_gap_and_optimum():
    from rlx.imagination import generalization

    row = generalization.summarize(np.array([0.5, 0.7]), np.array([0.2, 0.4]))
    assert np.isclose(row["train_mean"], 0.6) and np.isclose(row["test_mean"], 0.3)
    results = {"16": {"classic imagination": row, "optimal (shortest path)": {"train": 0.9, "test": 0.91}}}
    settings = {"quick": False, "seeds": 2, "real_steps": 100, "grad_steps": 10, "minutes": 1.0}
    table = generalization.markdown(results, settings)
    assert "| classic imagination | 0.600 ± " in table and "| +0.300 | 0.20, 0.40 |" in table
    assert "| optimal (shortest path) | 0.900 | 0.910 | | |" in table


def test_optimal_return_of_training_levels_matches_a_bfs_by_hand():
    from rlx.envs import maze, registry
    from rlx.imagination import generalization

    env, _ = registry.make("maze")
    train, _ = generalization.optimal_returns(env, 4)
    by_hand = []
    for level in range(4):
        walls, start, goal = (np.asarray(x) for x in maze.generate_level(level, env.size, 0.3))
        distance, frontier, seen = 0, [tuple(start)], {tuple(start)}
        while tuple(goal) not in seen:
            distance += 1
            frontier = [(r + dr, c + dc) for r, c in frontier for dr, dc in maze.MOVES
                        if not walls[r + dr, c + dc] and (r + dr, c + dc) not in seen]
            seen.update(frontier)
        by_hand.append(1 - 0.9 * distance / 64)
    assert np.isclose(train, np.mean(by_hand), atol=1e-5)


# --------------------------------------------------------------------------- prediction error against horizon


def test_copy_last_error_counts_only_sequences_still_in_their_episode():
    from types import SimpleNamespace

    from rlx.imagination import model_error

    context, horizons = model_error.CONTEXT, model_error.HORIZONS
    steps = context + max(horizons)
    obs = np.zeros((steps, 2, 1))
    obs[:, 0, 0] = np.arange(steps)  # sequence 0 drifts by 1 per step: error h**2 at horizon h
    obs[:, 1, 0] = 100.0 * np.arange(steps)  # sequence 1 starts a new episode right after the context
    is_first = np.zeros((steps, 2))
    is_first[context, 1] = 1.0
    errors = model_error.copy_last_error(SimpleNamespace(obs=obs, is_first=is_first))
    np.testing.assert_allclose(errors, [h**2 for h in horizons])


def test_model_error_table_and_plot(tmp_path):
    from rlx.imagination import model_error

    results = {"horizons": [1, 2], "rows": {"CartPole-v1: m": [[0.1, 0.2], [0.3, 0.4]], "maze: n": [[1.0, 2.0]]},
               "reward_error": {"r": [0.5, 1.5]}, "settings": {"quick": False, "grad_steps": 1, "real_steps": 1,
                                                               "seeds": 2}}
    table = model_error.markdown(results)
    assert "| CartPole-v1: m | 0.2000 | 0.3000 |" in table and "- r: 1" in table
    model_error.plot(results, tmp_path / "e.png")
    assert (tmp_path / "e.png").stat().st_size > 1000


def test_generalization_level_counts_are_checked_before_any_training():
    from rlx.imagination import generalization

    assert generalization.check_level_counts(None) == generalization.LEVEL_COUNTS
    assert generalization.check_level_counts(("64", "16")) == (64, 16)
    with pytest.raises(SystemExit, match=r"unknown level count '32'; this study runs N in \[16, 64, 256\]"):
        generalization.check_level_counts(("16", "32"))


def test_generalization_keeps_saved_rows_only_from_the_same_settings(tmp_path):
    import json

    from rlx.imagination import generalization

    settings = {"quick": False, "seeds": 3, "dreamer": generalization.DREAMER, "minutes": 5.0}
    saved = tmp_path / "generalization.json"
    assert generalization.kept_results(saved, settings) == {}
    saved.write_text(json.dumps({"settings": {**settings, "minutes": 63.0}, "results": {"64": {"row": 1}}}))
    assert generalization.kept_results(saved, settings) == {"64": {"row": 1}}
    flat = {k: v for k, v in generalization.DREAMER.items() if k not in generalization.SPATIAL_MODEL}
    assert generalization.kept_results(saved, {**settings, "dreamer": flat}) == {}


def test_generalization_keeps_rows_another_process_saved_while_it_ran(tmp_path, monkeypatch):
    """Two processes running different N (``--tasks 16`` and ``--tasks 256``) both end up in the table."""
    import json

    from rlx.imagination import generalization

    def other_process_finishes_meanwhile(env, n, seeds, grad_steps, real_steps):
        saved = json.loads((tmp_path / "generalization_quick.json").read_text())
        saved["results"]["256"] = {"dream-augmented imagination": generalization.summarize(
            np.array([0.3, 0.5]), np.array([0.2, 0.4]))}
        (tmp_path / "generalization_quick.json").write_text(json.dumps(saved))
        return {"classic imagination": (np.array([0.1, 0.3]), np.array([0.1, 0.2]))}

    monkeypatch.setattr(generalization, "dreamer_rows", other_process_finishes_meanwhile)
    monkeypatch.setattr(generalization, "reference_rows", lambda *args: {})
    monkeypatch.setattr(generalization, "optimal_returns", lambda env, n: (0.9, 0.9))
    settings = {"quick": True, "seeds": 2, "real_steps": 2048, "grad_steps": 20, "dreamer": generalization.DREAMER,
                "minutes": 1.0}
    (tmp_path / "generalization_quick.json").write_text(json.dumps({"settings": settings, "results": {}}))
    generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("16",))
    results = json.loads((tmp_path / "generalization_quick.json").read_text())["results"]
    assert list(results) == ["16", "256"]
    assert results["16"]["classic imagination"]["test_mean"] == pytest.approx(0.15)
    assert "### N = 256 training levels" in (tmp_path / "generalization_quick.md").read_text()
