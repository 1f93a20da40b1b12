"""The MAPF study's table: rerunning some row groups (``--tasks``) keeps the saved table's other rows."""

from __future__ import annotations

import json

import pytest

from rlx.envs.mapf import study


def summary(csr):
    return {"csr": csr, "isr": 1.0, "soc": 10.0, "makespan": 5.0, "throughput": 0.0}


def fake_rows(csr):
    """One row per task, labelled as the study labels them, each with CSR ``csr`` at every N."""
    labels = ("PIBT", f"{study.POLICY_LABEL}, sampled", f"{study.DAGGER_LABEL}, sampled",
              f"{study.MAPPO_LABEL}, sampled")
    return {label: {str(n): summary(csr) for n in study.AGENT_COUNTS} for label in labels}


def test_row_tasks_follow_the_labels():
    assert study.row_task(f"{study.DAGGER_LABEL} + PIBT shield (CS-PIBT)") == "dagger"
    assert study.row_task(f"{study.POLICY_LABEL}, greedy") == "map_policy"
    assert study.row_task(f"{study.MAPPO_LABEL}, greedy") == "mappo"
    assert study.row_task("LaCAM (ours, Python, PIBT with swap, at most 20,000 configurations)") == "baselines"


def test_rerunning_one_task_replaces_its_rows_and_keeps_the_others(tmp_path, monkeypatch):
    """A saved table with CSR 0.5 everywhere; ``--tasks dagger`` with every DAgger row now at 0.9: the DAgger
    rows (main table and lifelong) change, every other row and its evaluation date stays, in the same order."""
    saved = {**fake_rows(0.5), "lifelong": {"PIBT": {"mean": 2.0, "std": 0.1},
                                            f"{study.DAGGER_LABEL}, sampled": {"mean": 1.0, "std": 0.1}}}
    (tmp_path / "results_quick.json").write_text(json.dumps(saved))
    (tmp_path / "results_quick.md").write_text("# x\n\nGenerated 2026-12-04 23:41 UTC by `python -m ...`\n")
    fresh = {label: values for label, values in fake_rows(0.9).items() if study.row_task(label) == "dagger"}
    loaded_labels = []
    monkeypatch.setattr(study, "load_learned", lambda learned: loaded_labels.extend(learned) or dict(learned))
    monkeypatch.setattr(study, "test_pool", lambda n, maps: (None, None))
    monkeypatch.setattr(study, "baseline_rows", lambda *args: pytest.fail("baselines were not asked for"))
    monkeypatch.setattr(study.evaluation, "summarize", lambda metrics: metrics)
    monkeypatch.setattr(study, "learned_metrics", lambda loaded, n, *args: {
        label: per_n[str(n)] for label, per_n in fresh.items()})
    monkeypatch.setattr(study, "lifelong_rows", lambda maps, loaded, with_baselines: (
        {} if with_baselines else {f"{study.DAGGER_LABEL}, sampled": {"mean": 3.0, "std": 0.2}}))

    study.reproduce(tmp_path, quick=True, skip_training=True, tasks=("dagger",))
    assert loaded_labels == [study.DAGGER_LABEL]
    result = json.loads((tmp_path / "results_quick.json").read_text())
    rows = {label: values for label, values in result.items() if label not in ("lifelong", "evaluated")}
    assert list(rows) == list(saved)[:-1]
    for label, per_n in rows.items():
        expected = 0.9 if study.row_task(label) == "dagger" else 0.5
        assert [per_n[str(n)]["csr"] for n in study.AGENT_COUNTS] == [expected] * 4  # json keys: strings
    assert result["lifelong"] == {"PIBT": {"mean": 2.0, "std": 0.1},
                                  f"{study.DAGGER_LABEL}, sampled": {"mean": 3.0, "std": 0.2}}
    assert result["evaluated"]["baselines"] == "2026-12-04 23:41 UTC"
    assert result["evaluated"]["dagger"] != "2026-12-04 23:41 UTC"
    table = (tmp_path / "results_quick.md").read_text()
    assert "--tasks dagger`, which re-evaluated those rows and kept the others" in table
    assert "0.90 / 1.00" in table and "0.50 / 1.00" in table
    assert "| lifelong |" not in table and "| evaluated |" not in table  # the json's other keys are not rows
    study.reproduce(tmp_path, quick=True, skip_training=True, tasks=("dagger",))  # again, from a json with "evaluated"
    table = (tmp_path / "results_quick.md").read_text()
    assert "| lifelong |" not in table and "| evaluated |" not in table
    assert "rows evaluated: baselines 2026-12-04 23:41 UTC" in table


def test_unknown_tasks_and_missing_saved_tables_are_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="task 'dagger_rows': valid: baselines, map_policy, dagger, mappo"):
        study.reproduce(tmp_path, quick=True, skip_training=False, tasks=("dagger_rows",))
    with pytest.raises(SystemExit, match="no saved .*results_quick.json to keep the other rows from"):
        study.reproduce(tmp_path, quick=True, skip_training=False, tasks=("dagger",))
