"""The feedback-efficiency study (rlx/pbrl/feedback_study.py) on a tiny budget: its rows and its normalisation."""

import numpy as np
import pytest

from rlx.pbrl import feedback_study as study


def test_interval_is_the_normal_95_percent_half_width():
    values = np.array([1.0, 2.0, 3.0, 4.0])
    assert np.isclose(study.interval(values), 1.96 * np.std(values, ddof=1) / 2.0)
    assert np.isnan(study.interval([5.0]))


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
    table = study.markdown({"CartPole-v1": rows}, 2, 1.0)
    assert "| query-aligned, 10 labels |" in table and "### CartPole-v1" in table
