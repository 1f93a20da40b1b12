"""rlx.report on hand-made run directories: the table's numbers and the plots."""

import json

import pytest

from rlx import report


def make_run(path, summary, records, overrides=None):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if overrides:
        (path / ".hydra").mkdir()
        (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def test_report_rows_numbers_and_plots(tmp_path):
    make_run(tmp_path / "multi" / "0_env=cartpole",
             {"experiment": "ppo_classic", "env": "CartPole-v1", "env_steps_per_seed": 1000, "total_seconds": 12.5,
              "final_eval": {"return_per_seed": [100.0, 300.0]}},
             [{"env_steps": 500, "eval_return": [50.0, 70.0]}, {"env_steps": 1000, "eval_return": [100.0, 300.0]}],
             overrides=["+exp=ppo_classic", "env=cartpole", "run.compile_cache=null", "++algo.adam_eps=1e-05",
                        "hydra/launcher=joblib"])
    make_run(tmp_path / "swept",
             {"experiment": "ppo_cartpole", "env": "CartPole-v1", "env_steps_per_seed": 2000, "total_seconds": 3.0,
              "final_eval": {}, "sweep": {"fields": ["algo.lr"], "points": [
                  {"point": {"algo.lr": 0.001}, "return_per_seed": [10.0, 20.0, 30.0]},
                  {"point": {"algo.lr": 0.003}, "return_per_seed": [40.0, 40.0, 40.0]}]}},
             [{"env_steps": 2000, "eval_return": [[10.0, 20.0, 30.0], [40.0, 40.0, 40.0]]}])

    path = report.write_report([tmp_path], tmp_path / "out")
    text = path.read_text()
    # 95% CI half-widths by hand: t(0.975, 1) = 12.706 x 141.42 / sqrt(2); t(0.975, 2) = 4.303 x 10 / sqrt(3)
    assert ("| ppo_classic | CartPole-v1 | env=cartpole algo.adam_eps=1e-05 | completed | 200.0 ± 100.0 | ± 1270.6 | 2 "
            "| 1,000 | 12.5 |") in text
    assert "| ppo_cartpole | CartPole-v1 | lr=0.001 | completed | 20.0 ± 8.2 | ± 24.8 | 3 | 2,000 | 3.0 |" in text
    assert "| ppo_cartpole | CartPole-v1 | lr=0.003 | completed | 40.0 ± 0.0 | ± 0.0 | 3 | 2,000 | 3.0 |" in text
    assert (tmp_path / "out" / "curves_CartPole-v1.png").stat().st_size > 1000


def test_report_without_runs_says_so(tmp_path):
    (tmp_path / "wandb" / "files").mkdir(parents=True)
    (tmp_path / "wandb" / "files" / "config.yaml").write_text("{}")  # wandb's, not a run's
    with pytest.raises(SystemExit, match=r"no run \(summary.json, or config.yaml with metrics.jsonl\) under"):
        report.write_report([tmp_path], tmp_path / "out")


@pytest.mark.filterwarnings("error:No artists with labels found:UserWarning")  # a run without curves
def test_malformed_run_files_name_the_file_and_line(tmp_path, capsys):
    record = {"env_steps": 500, "eval_return": [50.0]}
    make_run(tmp_path / "run", {"env": "CartPole-v1", "final_eval": {"return_per_seed": [1.0]}}, [record, record])
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(json.dumps(record) + "\n{oops\n" + json.dumps(record) + "\n")
    with pytest.raises(SystemExit, match=r"metrics.jsonl, line 2: not a JSON line"):
        report.main([str(tmp_path)])
    metrics.write_text(json.dumps(record) + "\n" + json.dumps(record)[:10])  # cut short by a kill: left out
    report.main([str(tmp_path)])
    metrics.unlink()  # no metrics: a row without a curve
    assert "CartPole-v1" in report.write_report([tmp_path], tmp_path / "out").read_text()
    (tmp_path / "run" / "summary.json").write_text("{")
    with pytest.raises(SystemExit, match=r"summary.json: not valid JSON"):
        report.main([str(tmp_path)])


def test_runs_that_did_not_finish_are_rows_with_their_status(tmp_path):
    """A diverged run used to show 0 seeds and no status; a failed sweep job and a killed run were left out."""
    record = {"env_steps": 640, "eval_return": [50.0, 60.0]}
    make_run(tmp_path / "nan", {"experiment": "ppo_cartpole", "env": "CartPole-v1", "num_seeds": 2,
                                "status": "diverged", "diverged_at_update": 3}, [record])
    make_run(tmp_path / "half_nan", {"experiment": "ppo_cartpole", "env": "CartPole-v1", "num_seeds": 2,
                                     "final_eval": {"return_per_seed": [None, 100.0]}}, [record])
    failed = tmp_path / "multi" / "1_algo.lr=-1"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- +exp=ppo_cartpole\n- algo.lr=-1\n")
    (failed / "job_failed.json").write_text(json.dumps({"exit_code": 2, "error": "algo.lr=-1: must be > 0"}))
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.yaml").write_text("exp_name: ppo_cartpole\nenv:\n  name: CartPole-v1\nrun:\n  num_seeds: 4\n")
    (killed / "metrics.jsonl").write_text(json.dumps(record) + "\n" + json.dumps({**record, "env_steps": 1280}))

    text = report.write_report([tmp_path], tmp_path / "out").read_text()
    assert "| ppo_cartpole | CartPole-v1 | — | diverged at update 3 | — | — | 2 | 0 | 0.0 |" in text
    assert "| ppo_cartpole | CartPole-v1 | — | completed | 100.0 ± 0.0 (1 of 2 seeds non-finite) | — | 2 |" in text
    assert "| ? | ? | algo.lr=-1 | failed (exit 2): algo.lr=-1: must be > 0 | — | — | 0 | 0 | 0.0 |" in text
    assert "| ppo_cartpole | CartPole-v1 | — | unfinished | — | — | 4 | 1,280 | 0.0 |" in text


@pytest.mark.parametrize("content, message", [("[]", "not an rlx run file"),
                                              ('{"final_eval": {"return_per_seed": 5}}', "return_per_seed is not a list")])
def test_summary_of_the_wrong_shape_is_named(tmp_path, content, message):
    make_run(tmp_path / "run", {}, [])
    (tmp_path / "run" / "summary.json").write_text(content)
    with pytest.raises(SystemExit, match=rf"summary.json: {message}"):
        report.main([str(tmp_path)])


def test_jobs_that_differ_only_in_their_root_seed_pool_into_one_row(tmp_path):
    """``-m ... run.seed=0,1`` (the CLI help's example) gives one job per root seed: one row of 4 seeds."""
    for seed, returns in ((0, [100.0, 200.0]), (1, [300.0, 400.0])):
        make_run(tmp_path / "multi" / f"{seed}_run.seed={seed}",
                 {"experiment": "ppo_cartpole", "env": "CartPole-v1", "env_steps_per_seed": 1000, "total_seconds": 10.0,
                  "final_eval": {"return_per_seed": returns}},
                 [{"env_steps": 1000, "eval_return": returns}], overrides=["+exp=ppo_cartpole", f"run.seed={seed}"])
    make_run(tmp_path / "again", {"experiment": "ppo_cartpole", "env": "CartPole-v1", "env_steps_per_seed": 1000,
                                  "final_eval": {"return_per_seed": [5.0, 5.0]}}, [], overrides=["run.seed=1"])

    text = report.write_report([tmp_path], tmp_path / "out").read_text()
    # mean 250, std 111.8; t(0.975, 3) = 3.182 x 129.1 / 2 = 205.4
    assert "| ppo_cartpole | CartPole-v1 | run.seed=0,1 | completed | 250.0 ± 111.8 | ± 205.4 | 4 | 1,000 | 20.0 |" in text
    assert "| run.seed=1 | completed | 5.0 ± 0.0 |" in text  # a second run of root seed 1 is not pooled
    per_job = report.write_report([tmp_path], tmp_path / "out", per_job=True).read_text()
    assert "| run.seed=0 | completed | 150.0 ± 50.0 |" in per_job and "run.seed=0,1" not in per_job
