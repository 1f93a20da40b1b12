"""The command line end to end: files and keys of a run, reproducibility, the compile cache, bad input."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

TINY = ["+exp=ppo_cartpole", "algo.total_timesteps=2048", "algo.num_envs=4", "algo.num_steps=64",
        "run.num_seeds=2", "run.chunk_updates=3", "run.eval_episodes=2", "logger=none"]

SUMMARY_KEYS = {
    "experiment", "algo", "env", "num_seeds", "seed", "status", "final_eval", "updates", "env_steps_per_seed",
    "env_steps_total", "import_seconds", "compile_seconds", "run_seconds", "total_seconds", "steps_per_second",
    "versions", "git_commit", "config_hash", "compile_cache",
}
RECORD_KEYS = {"chunk", "update", "env_steps", "time", "elapsed_seconds", "steps_per_second", "train_return", "loss",
               "policy_loss", "value_loss", "entropy", "approx_kl"}


@pytest.fixture(scope="module")
def cli_cache(tmp_path_factory):
    """A compile cache that starts empty in this module."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def two_identical_runs(tmp_path_factory, cli_cache):
    """The same tiny config twice with a fresh compile cache: (summary, records) per run."""
    results = []
    for name in ("first", "second"):
        run_dir = tmp_path_factory.mktemp(name)
        done = subprocess.run(
            [sys.executable, "-m", "rlx.train", *TINY, f"hydra.run.dir={run_dir}", f"run.compile_cache={cli_cache}"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        results.append((run_dir, summary, records))
    return results


def test_run_writes_every_file_with_documented_keys(two_identical_runs):
    run_dir, summary, records = two_identical_runs[0]
    for name in ("summary.json", "metrics.jsonl", "config.yaml", "learning_curve.png"):
        assert (run_dir / name).stat().st_size > 0, name
    assert SUMMARY_KEYS <= set(summary), SUMMARY_KEYS - set(summary)
    assert summary["status"] == "completed"
    assert summary["updates"] == 8 and summary["env_steps_per_seed"] == 2048 and summary["env_steps_total"] == 4096
    final = summary["final_eval"]
    assert len(final["return_per_seed"]) == 2
    assert final["return_mean"] == pytest.approx(sum(final["return_per_seed"]) / 2)
    assert summary["versions"]["jax"] == "0.10.2"
    assert len(records) == 3  # chunks of 3, 3 and 2 updates
    assert [r["update"] for r in records] == [3, 6, 8]
    for record in records:
        assert RECORD_KEYS <= set(record), RECORD_KEYS - set(record)
        assert len(record["train_return"]) == 2 and len(record["eval_return"]) == 2
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exp_name: ppo_cartpole" in (run_dir / "config.yaml").read_text()


def test_same_seed_gives_identical_returns(two_identical_runs):
    (_, first, first_records), (_, second, second_records) = two_identical_runs
    assert first["final_eval"] == second["final_eval"]
    assert [r["train_return"] for r in first_records] == [r["train_return"] for r in second_records]
    assert first["config_hash"] == second["config_hash"]


def test_second_identical_run_compiles_nothing(two_identical_runs):
    (_, first, _), (_, second, _) = two_identical_runs
    assert first["compile_cache"]["misses"] >= 3
    assert second["compile_cache"]["misses"] == 0
    assert second["compile_cache"]["hits"] == first["compile_cache"]["misses"]


def test_different_seed_gives_different_returns(run_cli, two_identical_runs, cli_cache, tmp_path):
    # The same programs as the first runs' (the seed is data): their compile cache serves this run too.
    done = run_cli(*TINY, "run.seed=1", f"hydra.run.dir={tmp_path / 'other'}", cache=str(cli_cache))
    assert done.returncode == 0, done.stderr
    other = json.loads((tmp_path / "other" / "summary.json").read_text())
    assert other["compile_cache"]["misses"] == 0, other["compile_cache"]
    assert [r["train_return"] for r in two_identical_runs[0][2]] != other  # sanity: parsed
    first_curve = json.loads((two_identical_runs[0][0] / "metrics.jsonl").read_text().splitlines()[-1])
    other_curve = json.loads((tmp_path / "other" / "metrics.jsonl").read_text().splitlines()[-1])
    assert first_curve["loss"] != other_curve["loss"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["+exp=ppo_nothing"], "unknown preset 'ppo_nothing'; valid: "
         + ", ".join(sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml")))),
        (["+exp=ppo_cartpole", "env=cartpol"], "unknown env 'cartpol'; valid: "
         + ", ".join(sorted(p.stem for p in (ROOT / "conf" / "env").glob("*.yaml")))),
        (["+exp=ppo_cartpole", "algo=dqn"], "unknown algo 'dqn'; valid: "
         + ", ".join(sorted(p.stem for p in (ROOT / "conf" / "algo").glob("*.yaml")))),
    ],
)
def test_unknown_names_list_valid_choices(run_cli, args, message):
    done = run_cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_unknown_environment_name_in_config(run_cli):
    done = run_cli("+exp=ppo_cartpole", "env.name=CartPole-v9")
    assert done.returncode == 2
    from rlx.envs import registry

    assert f"unknown env 'CartPole-v9'; valid: {', '.join(registry.names())}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.lr=-0.1", "algo.lr=-0.1: must be > 0"),
        ("algo.lr=inf", "algo.lr=inf: must be finite"),
        ("algo.adam_eps=-1.0", "algo.adam_eps=-1.0: must be > 0"),
        ("algo.num_minibatches=3", "algo.num_minibatches=3: must divide the batch num_envs*num_steps=512"),
        ("run.num_seeds=0", "run.num_seeds=0: must be >= 1"),
        ("+algo.learning_rate=0.1", "algo.learning_rate: unknown field; valid:"),
        ("algo.learning_rate=0.1", "algo.learning_rate: unknown field; valid:"),  # no +: Hydra's error otherwise
        ("run.seeds=3", "run.seeds: unknown field; valid:"),
        ("+env.params.gravity_x=1", "env.params.gravity_x: unknown parameter of CartPole-v1"),
        ("run.eval_greedy=maybe", "run.eval_greedy='maybe': must be true or false"),
        ("algo.torso=cnn", "algo.torso='cnn': needs HxWxC observations, this environment's have shape (4,)"),
        ("algo.hidden_sizes=[64.5]", "algo.hidden_sizes=(64.5,): every width must be an integer >= 1"),
        ("run.seed=abc", "run.seed='abc': must be an integer"),
        ("env=coop", "env=Coop: algo=ppo trains on single-agent environments, and Coop is not one; single-agent "
                     "environments: Acrobot-v1,"),
    ],
)
def test_invalid_values_fail_before_compiling(train_in_process, override, message, tmp_path):
    """In process (``train_in_process``): the unknown-name tests above show the one-line exit of a real process."""
    code, stderr = train_in_process("+exp=ppo_cartpole", override)
    assert code == 2, stderr
    assert message in stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before training


def test_a_directory_that_holds_a_run_is_refused_and_left_as_it_was(run_cli, tmp_path):
    done = run_cli(*TINY)
    assert done.returncode == 0, done.stderr
    kept = {name: (tmp_path / "run" / name).read_bytes() for name in ("metrics.jsonl", "summary.json", "config.yaml",
                                                                       ".hydra/config.yaml", ".hydra/overrides.yaml")}
    again = run_cli(*TINY, "algo.lr=1e-3")
    assert again.returncode == 2, again.stderr
    assert f"hydra.run.dir={tmp_path / 'run'}: already holds a run (metrics.jsonl, summary.json, checkpoints)" \
        in again.stderr and "Traceback" not in again.stderr
    assert {name: (tmp_path / "run" / name).read_bytes() for name in kept} == kept


def test_resuming_a_directory_that_is_no_run_creates_nothing(run_cli, tmp_path):
    nowhere = tmp_path / "nowhere"  # a real process (Hydra sets up its logging), run where the resume points
    done = run_cli(f"run.resume={nowhere}", f"hydra.run.dir={nowhere}", "logger=none")
    assert done.returncode == 2 and "no config.yaml there" in done.stderr
    assert not nowhere.exists()


def test_nan_stops_with_update_number_and_keeps_files(run_cli, tmp_path):
    # A cart of zero mass divides by zero: observations, then the loss, become NaN on the first update.
    done = run_cli(*TINY, "+env.params.total_mass=0.0", "+env.params.masscart=0.0")
    assert done.returncode == 1
    assert "non-finite" in done.stderr and "at update 1;" in done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at_update"] == 1
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""  # no non-finite line written


def test_a_failing_job_does_not_end_the_sweep(run_cli, tmp_path):
    """Job 0 diverges (zero total mass); job 1 still trains, and the sweep exits non-zero naming job 0."""
    done = run_cli("-m", *TINY, "+env.params.total_mass=0.0,1.1", f"hydra.sweep.dir={tmp_path / 'multi'}",
                   "hydra/launcher=basic")
    assert done.returncode == 1, done.stderr
    assert "error: job 0 (" in done.stderr and "non-finite" in done.stderr
    assert "error: 1 job of the sweep failed" in done.stderr and "error: job 1" not in done.stderr
    summaries = sorted((tmp_path / "multi").glob("*/summary.json"))  # job directories start with their number
    statuses = [json.loads(path.read_text())["status"] for path in summaries]
    assert statuses == ["diverged", "completed"], statuses
    assert [path.parent for path in (tmp_path / "multi").glob("*/job_failed.json")] == [summaries[0].parent]


def test_jobs_failing_in_the_parallel_launchers_workers_make_the_sweep_fail(run_cli, tmp_path):
    """joblib runs each job in a worker process: their failures reach the parent through each job's
    ``job_failed.json``, so the sweep still exits non-zero (both jobs are refused before compiling)."""
    import os
    import time

    stale = tmp_path / "multi" / "old_job" / "job_failed.json"  # an earlier sweep's failure: not counted
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"exit_code": 1, "error": "an earlier sweep's"}))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    done = run_cli("-m", *TINY, "algo.lr=-1,-2", f"hydra.sweep.dir={tmp_path / 'multi'}", "hydra/launcher=parallel")
    assert done.returncode == 2, done.stderr
    assert "error: job 0 (" in done.stderr and "error: job 1 (" in done.stderr
    assert "error: 2 jobs of the sweep failed" in done.stderr
    markers = sorted((tmp_path / "multi").glob("[0-9]_*/job_failed.json"))
    assert [json.loads(path.read_text())["error"] for path in markers] == ["algo.lr=-1.0: must be > 0",
                                                                          "algo.lr=-2.0: must be > 0"]


def test_readme_presets_table_lists_every_preset():
    """Each ``conf/exp`` preset has a row in the README's presets table (a row may name several), and each
    preset a row names exists."""
    import re

    section = (ROOT / "README.md").read_text().split("### Presets (`+exp=NAME`)\n", 1)[1].lstrip("\n")
    table = section[:section.find("\n\n")].splitlines()
    rows = [re.match(r"\| (`\w+`(?:, `\w+`)*) \|", line) for line in table[2:]]  # after header and rule
    assert all(rows), [line for line, row in zip(table[2:], rows) if not row]
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row.group(1))}
    presets = {path.stem for path in (ROOT / "conf" / "exp").glob("*.yaml")}
    assert presets - listed == set(), f"presets without a README row: {sorted(presets - listed)}"
    assert listed - presets == set(), f"README rows naming no preset: {sorted(listed - presets)}"


def test_help_lists_presets(run_cli):
    done = run_cli("--help")
    assert done.returncode == 0
    presets = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))
    assert len(presets) >= 3 and f"exp: {', '.join(presets)}" in done.stdout


def test_a_malformed_data_file_is_one_line_not_a_traceback(monkeypatch, capsys):
    """Data-file errors (market days, preference datasets, queries, labels) share configuration errors'
    base, so the command lines print them as one line and exit 2, as they print bad settings."""
    from rlx import reproduce
    from rlx.envs.market.data import DataError
    from rlx.errors import InputError
    from rlx.pbrl.datasets import DatasetError
    from rlx.pbrl.labels import LabelError
    from rlx.pbrl.queries import QueryFileError

    assert all(issubclass(error, InputError) for error in (DataError, DatasetError, LabelError, QueryFileError))

    def malformed(*args):
        raise DataError("days/day_3.npz:12: NaN in bid_prices")

    monkeypatch.setattr(reproduce, "reproduce", malformed)
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["mm_event_vs_time"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: days/day_3.npz:12: NaN in bid_prices\n"
