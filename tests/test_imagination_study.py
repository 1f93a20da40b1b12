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
    assert "| dyna_ppo | `p` | 6.1k | 1.0k (5.1k) | 1.5k / 1.5k / 1.5k | 1.0k, 2.0k |" in table


def test_table_states_each_presets_evaluation_interval(tmp_path):
    """A preset whose update is longer than ``EVAL_EVERY`` (ppo_acrobot: 16 x 128 steps) is evaluated after
    every update; its row says so, with the real steps its "held" window spans."""
    hold = study.HOLD_EVALUATIONS

    def row(every):  # one seed: below the target at the first evaluation, above it from the second on
        return {"preset": "p", "budget": every * (hold + 1), "steps": [every * (i + 1) for i in range(hold + 1)],
                "returns": [[-500.0]] + [[-50.0]] * hold, "train_seconds": 1.0, "compile_seconds": 2.0}

    results = {"Acrobot-v1": {"dyna_ppo": row(1024), "PPO (model-free)": row(2048)}}
    table = study.write_table(tmp_path / "table.md", results, quick=False).read_text()
    assert f"evaluated every ({hold} evaluations)" in table
    assert f"| dyna_ppo | `p` | {1024 * (hold + 1) / 1000:.1f}k | 1.0k ({1024 * hold / 1000:.1f}k) | 2.0k / 2.0k" in table
    assert f"| PPO (model-free) | `p` | {2048 * (hold + 1) / 1000:.1f}k | 2.0k ({2048 * hold / 1000:.1f}k) | 4.1k / " in table


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
    settings = {**generalization.run_settings(quick=True, seeds=2), "minutes": 1.0}
    (tmp_path / "generalization_quick.json").write_text(json.dumps({"settings": settings, "results": {}}))
    generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("16",))
    results = json.loads((tmp_path / "generalization_quick.json").read_text())["results"]
    assert list(results) == ["16", "256"]
    assert results["16"]["classic imagination"]["test_mean"] == pytest.approx(0.15)
    assert "### N = 256 training levels" in (tmp_path / "generalization_quick.md").read_text()


def stub_generalization_training(monkeypatch):
    """The generalization study with its training replaced by constant rows (seeds long)."""
    from rlx.imagination import generalization

    monkeypatch.setattr(generalization, "dreamer_rows", lambda env, n, seeds, *args: {
        "classic imagination": (np.full(seeds, 0.1), np.full(seeds, 0.2))})
    monkeypatch.setattr(generalization, "reference_rows", lambda *args: {})
    monkeypatch.setattr(generalization, "optimal_returns", lambda env, n: (0.9, 0.9))
    return generalization


def test_generalization_drops_saved_rows_made_with_other_dreams(tmp_path, monkeypatch, capsys):
    """Rows of another N are kept only when they were made with the same dream strengths (and methods, PPO
    and evaluation); the table then describes the settings of the rows it has. The dropped rows are copied
    aside first, and the run says so (they used to vanish without a word)."""
    import json

    generalization = stub_generalization_training(monkeypatch)
    generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("16",))
    monkeypatch.setattr(generalization, "DREAMS", {**generalization.DREAMS, "dream_noise": 0.125})
    generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("64",))
    assert "rows for N = 16 were made with other settings (dreams differ" in capsys.readouterr().out
    (aside,) = tmp_path.glob("generalization_quick.*-*.json")
    assert list(json.loads(aside.read_text())["results"]) == ["16"]
    saved = json.loads((tmp_path / "generalization_quick.json").read_text())
    assert list(saved["results"]) == ["64"]  # N=16 was made with other dream strengths
    assert saved["settings"]["dreams"]["dream_noise"] == 0.125
    assert "'dream_noise': 0.125" in (tmp_path / "generalization_quick.md").read_text()


def test_generalization_header_shows_the_saved_settings_not_the_modules(tmp_path, monkeypatch):
    """``--skip-training`` re-renders rows made under other dreams and evaluation episodes than the module's
    current ones: the header names those the rows were made with."""
    generalization = stub_generalization_training(monkeypatch)
    made_with, episodes = dict(generalization.DREAMS), generalization.EVAL_EPISODES
    generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("16",))
    monkeypatch.setattr(generalization, "DREAMS", {**made_with, "dream_noise": 0.125})
    monkeypatch.setattr(generalization, "EVAL_EPISODES", episodes + 1)
    table = generalization.reproduce(tmp_path, quick=True, skip_training=True).read_text()
    assert f"Dream strengths: {made_with}." in table and f" over {episodes} episodes per seed" in table


def test_generalization_settings_cover_what_the_rows_depend_on():
    import json

    from rlx.imagination import generalization

    settings = generalization.run_settings(quick=False, seeds=3)
    assert json.loads(json.dumps(settings)) == settings  # compares equal to itself after a save
    assert {"dreams", "methods", "ppo", "eval_episodes", "dreamer"} <= set(settings)
    assert settings["ppo"]["hidden_sizes"] == list(generalization.PPO["hidden_sizes"])


@pytest.mark.parametrize("quick", [True, False])
def test_seeds_given_with_quick_are_used(tmp_path, monkeypatch, quick):
    """``--seeds`` reaches both studies also under ``--quick``; without it, 2 seeds under ``--quick``."""
    generalization = stub_generalization_training(monkeypatch)
    used, constant_rows = [], generalization.dreamer_rows

    def dreamer_rows(env, n, seeds, *args):
        used.append(seeds)
        return constant_rows(env, n, seeds, *args)

    monkeypatch.setattr(generalization, "dreamer_rows", dreamer_rows)
    generalization.reproduce(tmp_path, quick=quick, skip_training=False, seeds=3, tasks=("16",))
    if quick:
        generalization.reproduce(tmp_path, quick=True, skip_training=False, tasks=("16",))
    assert used == ([3, 2] if quick else [3])

    def evaluation_curve(preset, seeds, overrides=()):
        used.append(seeds)
        return {"steps": [1024], "returns": [[0.0] * seeds], "compile_seconds": 0.0, "train_seconds": 0.0,
                "budget": 1024}

    monkeypatch.setattr(study, "evaluation_curve", evaluation_curve)
    used.clear()
    study.reproduce(tmp_path, quick=quick, skip_training=False, seeds=3)
    study.reproduce(tmp_path, quick=quick, skip_training=False)
    presets = sum(len(presets) for _, presets in study.TASKS.values())
    assert used == [3] * presets + [2 if quick else study.SEEDS] * presets


def test_seed_count_rejects_fewer_than_one():
    from rlx.errors import ConfigError
    from rlx.imagination import seed_count

    assert seed_count(None, True, 5) == 2 and seed_count(None, False, 5) == 5 and seed_count(4, True, 5) == 4
    with pytest.raises(ConfigError, match=r"--seeds=0: must be >= 1"):
        seed_count(0, False, 5)


@pytest.mark.parametrize("module, name", [("generalization", "imagination_generalization"),
                                          ("sample_efficiency", "imagination_efficiency"),
                                          ("model_error", "imagination_model_error")])
def test_skip_training_without_a_saved_json_names_the_file_and_the_command(tmp_path, module, name):
    import importlib

    from rlx.errors import ConfigError

    reproduce = importlib.import_module(f"rlx.imagination.{module}").reproduce
    with pytest.raises(ConfigError, match=rf"_quick\.json does not exist.*`python -m rlx\.reproduce {name} --quick`"):
        reproduce(tmp_path, quick=True, skip_training=True)
    with pytest.raises(ConfigError, match=rf"{tmp_path}/\w+\.json does not exist.*`python -m rlx\.reproduce {name}`"):
        reproduce(tmp_path, quick=False, skip_training=True)


@pytest.mark.parametrize("module, content, message", [
    ("generalization", "{\n", "is not valid JSON"), ("model_error", "[]", "holds no saved results"),
    ("sample_efficiency", '{"measured": "2026-12-01"}', "holds no saved results")])
def test_skip_training_with_a_broken_saved_json_says_so_in_one_line(tmp_path, module, content, message):
    """A json cut short, or of the wrong shape, used to end in a JSONDecodeError, TypeError or StopIteration."""
    import importlib

    from rlx.errors import ConfigError

    (tmp_path / f"{module}_quick.json").write_text(content)
    reproduce = importlib.import_module(f"rlx.imagination.{module}").reproduce
    with pytest.raises(ConfigError, match=rf"{module}_quick\.json {message}.*rlx\.reproduce"):
        reproduce(tmp_path, quick=True, skip_training=True)


def test_model_error_is_nan_at_a_horizon_no_sequence_reaches():
    """Every sequence restarts its episode 3 steps after the context: no error is measured from h=3 on."""
    from rlx.imagination import model_error

    horizons = np.array(model_error.HORIZONS)
    is_first = np.zeros((max(horizons), 2))
    is_first[2] = 1.0
    errors = np.asarray(model_error.per_horizon(np.ones((max(horizons), 2)), is_first))
    np.testing.assert_array_equal(np.isnan(errors), horizons >= 3)
    np.testing.assert_allclose(errors[horizons < 3], 1.0)
    counts = model_error.horizon_counts(model_error.still_alive(is_first))
    np.testing.assert_array_equal(counts, np.where(horizons < 3, 2, 0))


def test_dreamer_multistep_error_is_nan_where_every_episode_restarted():
    import jax

    from rlx.agents import dreamer
    from rlx.envs import registry

    env, params = registry.make("CartPole-v1")
    config = dreamer.Config(**dreamer.SMALL)
    agent = dreamer.make(config, env, params)
    data = dreamer.collect(config, env, params, jax.random.PRNGKey(0), 6)
    data = data._replace(is_first=data.is_first.at[:].set(0).at[4].set(1))  # every episode restarts at step 4
    errors = np.asarray(agent.multistep_error(agent.init(jax.random.PRNGKey(1)).learner.model, data, (1, 2), 3))
    assert np.isfinite(errors[0]) and np.isnan(errors[1]), errors  # step 3 counted; steps 3-4 cross the restart


def test_model_error_table_shows_a_dash_where_nothing_was_measured_and_the_counts():
    from rlx.imagination import model_error

    results = {"horizons": [1, 2], "rows": {"CartPole-v1: m": [[0.1, float("nan")]]}, "reward_error": {},
               "sequences_per_horizon": {"CartPole-v1, held out": [3, 0]},
               "settings": {"quick": False, "grad_steps": 1, "real_steps": 1, "seeds": 1}}
    table = model_error.markdown(results)
    assert "| CartPole-v1: m | 0.1000 | — |" in table and "- CartPole-v1, held out: h=1: 3, h=2: 0" in table


def test_re_rendered_tables_keep_the_date_they_were_measured():
    """A ``--skip-training`` re-render used to stamp the table with the day it ran."""
    from rlx import imagination
    from rlx.imagination import model_error

    assert imagination.measured_on("2026-12-02") == "2026-12-02"
    assert imagination.measured_on(None).startswith("on an unrecorded date (re-rendered ")
    results = {"settings": {"quick": False, "grad_steps": 10, "real_steps": 20, "seeds": 2, "measured": "2001-02-03"},
               "horizons": [1], "rows": {"CartPole: model": [[0.5]]}, "reward_error": {}}
    assert model_error.markdown(results).startswith("Measured 2001-02-03 on this machine's CPU")


@pytest.mark.parametrize("quick, overrides", [(True, ("algo.total_timesteps=4096",)), (False, ())])
def test_model_error_quick_run_shrinks_the_dyna_ppo_budget_too(monkeypatch, quick, overrides):
    """``--quick`` trained the dyna_ppo ensemble at its preset's full 20,480 steps."""
    from rlx.imagination import model_error, sample_efficiency

    asked = []

    def record(preset, given=()):
        asked.append((preset, tuple(given)))
        raise RuntimeError("stop before training")

    monkeypatch.setattr(sample_efficiency, "preset_parts", record)
    with pytest.raises(RuntimeError, match="stop before training"):
        model_error.dyna_errors(None, 2, quick)
    assert asked == [("dyna_ppo_cartpole", overrides)]
