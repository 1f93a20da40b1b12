"""The feedback-efficiency study (rlx/pbrl/feedback_study.py) on a tiny budget: its rows and its normalisation."""

import json

import numpy as np
import pytest

from rlx.pbrl import feedback_study as study


def test_interval_is_the_student_t_95_percent_half_width():
    """t(0.975, 3) = 3.182 by the table; the normal 1.96 it used to take is 39% narrower with 4 seeds."""
    values = np.array([1.0, 2.0, 3.0, 4.0])
    assert np.isclose(study.summarise(values, 0.0, 1.0)["ci95"], 3.1824 * np.std(values, ddof=1) / 2.0, rtol=1e-4)
    assert np.isnan(study.summarise(np.array([5.0]), 0.0, 1.0)["ci95"])


@pytest.mark.slow
def test_quick_cartpole_study_has_every_row_normalised_between_random_and_ppo(monkeypatch):
    monkeypatch.setattr(study, "BUDGETS", (10,))
    monkeypatch.setattr(study, "TEACHERS", {"CartPole-v1": {"mistake": dict(teacher_epsilon=0.5)}})
    monkeypatch.setattr(study, "STRATEGIES", {"query-aligned": study.STRATEGIES["query-aligned"]})
    settings = study.task_configs(quick=True)["CartPole-v1"]
    rows = study.study_task("CartPole-v1", settings, seeds=2, log=lambda line: None)
    assert list(rows) == ["random", "PPO, true reward", "query-aligned, 10 labels",
                          "mistake teacher, uniform, 100 labels"]
    assert rows["random"]["normalized"] == 0.0 and rows["PPO, true reward"]["normalized"] == 1.0
    assert 12 < rows["random"]["mean"] < 40  # a uniformly random CartPole policy lasts about 22 steps
    for row in rows.values():
        assert len(row["returns"]) == 2 and np.isclose(row["mean"], np.mean(row["returns"]))
    table = study.markdown({"CartPole-v1": rows}, 1.0)
    assert "| query-aligned, 10 labels |" in table and "### CartPole-v1 (2 seeds)" in table


def test_feedback_headings_describe_each_tasks_own_rows():
    """A ``--tasks`` rerun kept older tasks' rows under a header giving the new run's seed count and date."""
    row = lambda *returns: {"returns": list(returns), "mean": float(np.mean(returns)), "ci95": 1.0,  # noqa: E731
                            "normalized": 0.5}
    results = {"CartPole-v1": {"random": row(20, 22, 24, 26, 28)}, "Acrobot-v1": {"random": row(-500, -490, -480)},
               study.MEASURED: {"Acrobot-v1": "2026-12-08"}}
    table = study.markdown(results, 60.0)
    assert "### CartPole-v1 (5 seeds)" in table and "### Acrobot-v1 (3 seeds, 2026-12-08)" in table
    assert "_measured" not in table and "The last run took 1 min" in table


def test_query_study_compares_aligned_queries_seed_by_seed():
    from rlx.pbrl import query_study

    rows = {"random": [20.0, 22.0, 24.0], "PPO, true reward": [500.0, 500.0, 500.0],
            "uniform, 25 labels": [500.0, 300.0, 400.0], "disagreement, 25 labels": [100.0, 100.0, 100.0],
            "query-aligned, 25 labels": [500.0, 320.0, 380.0],
            "uniform, 50 labels": [500.0, 500.0, 500.0], "disagreement, 50 labels": [500.0, 490.0, 480.0],
            "query-aligned, 50 labels": [200.0, 210.0, 190.0]}
    found = {(c["budget"], c["against"]): c for c in query_study.comparisons(rows)}
    assert set(found) == {(25, "uniform"), (25, "disagreement"), (50, "uniform"), (50, "disagreement")}
    tie = found[(25, "uniform")]  # differences 0, +20, -20: equal means, not significantly worse
    assert tie["difference"] == 0.0 and tie["mean_holds"] and tie["not_worse"]
    assert np.isclose(tie["ci95"], 4.3027 * np.std([0.0, 20.0, -20.0], ddof=1) / np.sqrt(3), rtol=1e-4)  # t(0.975, 2)
    assert found[(25, "disagreement")]["difference"] > 0 and found[(25, "disagreement")]["not_worse"]
    worse = found[(50, "uniform")]  # 290 to 310 lower on every seed
    assert worse["difference"] == -300.0 and not worse["mean_holds"] and not worse["not_worse"]
    table = query_study.markdown({"seeds": {"CartPole-v1": 3}, "seconds": {"CartPole-v1": 60.0},
                                  "tasks": {"CartPole-v1": rows}})
    assert "| 50 | uniform | -300.0 ± 24.8 | does not hold | does not hold |" in table
    assert "| query-aligned, 25 labels | 400.0 ± " in table and "| 1.00 |" in table
    assert "### CartPole-v1 (3 seeds)" in table
    dated = query_study.markdown({"seeds": {"CartPole-v1": 3}, "seconds": {"CartPole-v1": 60.0},
                                  "measured": {"CartPole-v1": "2026-12-01"}, "tasks": {"CartPole-v1": rows}})
    assert "### CartPole-v1 (3 seeds, 2026-12-01)" in dated
    older = query_study.markdown({"seeds": 3, "seconds": {"CartPole-v1": 60.0}, "tasks": {"CartPole-v1": rows}})
    assert "### CartPole-v1 (3 seeds)" in older  # files written before seeds were counted per task


def test_reproduce_reruns_only_the_named_tasks_of_studies_that_have_them(tmp_path, monkeypatch):
    from rlx import reproduce
    from rlx.pbrl import query_study

    with pytest.raises(SystemExit, match="--tasks: mm_quoting has no tasks to choose from"):
        reproduce.reproduce("mm_quoting", None, True, tasks=("Pendulum-v1",))
    with pytest.raises(SystemExit, match="--seeds: mm_quoting runs its own fixed number of seeds"):
        reproduce.reproduce("mm_quoting", 3, True)
    with pytest.raises(SystemExit, match="--tasks: mappo_mpe has no tasks to choose from"):  # a preset table
        reproduce.reproduce("mappo_mpe", None, True, tasks=("MAPPO",))
    with pytest.raises(SystemExit, match="--skip-training: smax_3m keeps no runs to evaluate again"):
        reproduce.reproduce("smax_3m", None, True, skip_training=True)
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error
        reproduce.main(["mappo_mpe", "--seeds", "0"])
    asked = {}
    monkeypatch.setattr(query_study, "reproduce", lambda out, quick, skip, seeds=None, tasks=None: asked.update(
        seeds=seeds, tasks=tasks) or out)
    reproduce.reproduce("pbrl_queries", 3, True)
    assert asked == {"seeds": 3, "tasks": None}  # --seeds reaches the studies that take it
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="task 'Pendulum': valid: CartPole-v1, Acrobot-v1, Pendulum-v1"):
        query_study.reproduce(tmp_path, True, False, tasks=("Pendulum",))
    with pytest.raises(SystemExit, match="task 'Pendulum': valid: CartPole-v1, Acrobot-v1, Pendulum-v1"):
        reproduce.reproduce("pbrl_feedback", None, True, tasks=("CartPole-v1", "Pendulum"))  # before any training
    saved = {"seeds": 16, "seconds": {"CartPole-v1": 1.0}, "tasks": {"CartPole-v1": {"random": [1.0]}}}
    (tmp_path / "queries_quick.json").write_text(json.dumps(saved))
    ran = []
    monkeypatch.setattr(query_study, "study_task", lambda task, settings, seeds, log: ran.append((task, seeds)) or {
        "random": [0.0, 1.0], "PPO, true reward": [2.0, 3.0],
        **{f"{s}, {b} labels": [1.0, 2.0] for s in ("uniform", "disagreement", "query-aligned") for b in (25, 50)}})
    monkeypatch.setattr(query_study, "markdown", lambda saved: "table")
    query_study.reproduce(tmp_path, True, False, tasks=("Pendulum-v1",))
    kept = json.loads((tmp_path / "queries_quick.json").read_text())
    assert ran == [("Pendulum-v1", 2)] and kept["seeds"] == {"CartPole-v1": 16, "Pendulum-v1": 2}
    assert list(kept["measured"]) == ["Pendulum-v1"]  # the date of the rows just run
    assert kept["tasks"]["CartPole-v1"] == {"random": [1.0]} and "Pendulum-v1" in kept["tasks"]
    assert query_study.TASK_SEEDS["Pendulum-v1"] > query_study.SEEDS
