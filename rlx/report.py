"""``python -m rlx.report DIR... [--out OUT]``: runs and sweeps -> report.md and comparison plots.

Each DIR may be a run directory, a Hydra multirun directory or any folder
above them; every run below it is one row (one per grid point for a run with an
in-program sweep). Runs that did not finish are rows too, with their status:
diverged (a NaN, at which update), failed (a sweep job's ``job_failed.json``)
or unfinished (a config and metrics but no summary: killed, or still running).
Jobs that differ only in ``run.seed`` (``-m ... run.seed=0,1,2``) pool their
seeds into one row, unless ``--per-job``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx.errors import ConfigError, InputError
from rlx.runner import artifacts
from rlx.runner.multirun import MARKER


def t_interval(values) -> float:
    """Half-width of the 95% Student-t interval of the mean of ``values`` (NaN for fewer than 2)."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float("nan")
    from scipy import stats

    return float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


@dataclass
class Row:
    """One trained configuration: a run, or one point of a run's sweep."""

    run_dir: Path
    experiment: str
    env: str
    setting: str  # the swept values (in-program sweep and Hydra overrides), "" for none
    status: str  # completed, reached_stop_at_return, diverged at update N, failed (exit N): ..., unfinished
    returns: list  # final evaluation return per seed (None for a non-finite one); empty without a final evaluation
    seeds: int  # seeds trained, also when there are no returns to show
    env_steps: int
    wall_seconds: float
    curve_index: int | None  # grid point in metrics.jsonl, None when not swept
    pooled: tuple = ()  # the one-job rows whose seeds this row pools (``pool_seed_jobs``)

    @property
    def label(self) -> str:
        return f"{self.experiment} {self.setting}".strip()


def is_run_dir(path: Path) -> bool:
    """A run's directory: finished (``summary.json``), a failed sweep job (``job_failed.json``), or started
    (its ``config.yaml`` and ``metrics.jsonl``; wandb's own folders hold a config.yaml but no metrics)."""
    return any((path / name).exists() for name in ("summary.json", MARKER)) or (
        (path / "config.yaml").exists() and (path / "metrics.jsonl").exists())


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories under the given paths, each once, in a stable order."""
    runs: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise SystemExit(f"error: {path}: no such directory")
        candidates = {p.parent for p in path.rglob("*") if p.name in ("summary.json", MARKER, "config.yaml")}
        runs.update((run.resolve(), None) for run in sorted(candidates) if is_run_dir(run))
    if not runs:
        raise SystemExit(f"error: no run (summary.json, or config.yaml with metrics.jsonl) under "
                         f"{', '.join(map(str, paths))}; nothing to report")
    return list(runs)


# Overrides that do not change what a run learns: left out of the report's setting column.
NOT_A_SETTING = ("hydra.", "exp=", "logger=", "hydra/", "run.compile_cache=", "run.resume=", "run.cpu_devices=")


def hydra_overrides(run_dir: Path) -> str:
    """The Hydra command-line overrides of a job that change what it learns, e.g. 'env=acrobot' ('' if none
    or unknown), written as keys (``algo.lr=1e-3``, whether given with ``+``, ``++`` or neither)."""
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if not overrides.exists():
        return ""
    lines = [line.strip()[2:].lstrip("+") for line in overrides.read_text().splitlines()
             if line.strip().startswith("- ")]
    return " ".join(o for o in lines if not o.startswith(NOT_A_SETTING))


def read_object(path: Path) -> dict:
    """A JSON object file, or a one-line ``ConfigError`` naming it."""
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: not an rlx run file (a JSON object)")
    return value


def unfinished_summary(run_dir: Path) -> dict:
    """What a run without ``summary.json`` tells of itself: its config (experiment, env, seeds), the steps of
    its last metrics line, and why it stopped (a sweep job's ``job_failed.json``) or that it did not."""
    from omegaconf import OmegaConf

    summary = {"status": "unfinished"}
    if (run_dir / "config.yaml").exists():
        config = OmegaConf.load(run_dir / "config.yaml")
        summary.update(experiment=OmegaConf.select(config, "exp_name", default="?"),
                       env=OmegaConf.select(config, "env.name", default="?"),
                       num_seeds=OmegaConf.select(config, "run.num_seeds", default=0))
    records = artifacts.read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    if records:
        summary["env_steps_per_seed"] = records[-1].get("env_steps", 0)
    if (run_dir / MARKER).exists():
        failure = read_object(run_dir / MARKER)
        error = str(failure.get("error", "")).splitlines()[0] if failure.get("error") else ""
        summary["status"] = f"failed (exit {failure.get('exit_code', '?')}): {error}".rstrip(": ")
    return summary


def status_of(summary: dict) -> str:
    if summary.get("status") == "diverged":
        return f"diverged at update {summary.get('diverged_at_update', '?')}"
    return summary.get("status", "completed")


def returns_of(entry: dict, where: Path) -> list:
    returns = entry.get("return_per_seed", [])
    if not isinstance(returns, list):
        raise ConfigError(f"{where}: return_per_seed is not a list")
    return returns


def rows_of(run_dir: Path) -> list[Row]:
    path = run_dir / "summary.json"
    summary = read_object(path) if path.exists() else unfinished_summary(run_dir)
    final = summary.get("final_eval") or {}
    common = dict(run_dir=run_dir, experiment=summary.get("experiment", "?"), env=summary.get("env", "?"),
                  status=status_of(summary), env_steps=summary.get("env_steps_per_seed", 0),
                  wall_seconds=summary.get("total_seconds", 0.0))
    overrides = hydra_overrides(run_dir)
    if "sweep" not in summary:
        returns = returns_of(final, path)
        return [Row(setting=overrides, returns=returns, seeds=len(returns) or summary.get("num_seeds", 0),
                    curve_index=None, **common)]
    rows = []
    for index, point in enumerate(summary["sweep"].get("points", [])):
        values = ", ".join(f"{k.split('.', 1)[1]}={v:g}" for k, v in point.get("point", {}).items())
        returns = returns_of(point, path)
        rows.append(Row(setting=f"{overrides} {values}".strip(), returns=returns,
                        seeds=len(returns) or summary.get("num_seeds", 0), curve_index=index, **common))
    return rows


SEED_OVERRIDE = re.compile(r"(?:^| )run\.seed=(\S+)")


def pool_seed_jobs(rows: list[Row]) -> list[Row]:
    """One row for the jobs of a ``-m ... run.seed=0,1,2`` sweep: rows of one multirun directory that differ
    only in ``run.seed`` (all distinct) pool their seeds' returns, seed counts and wall seconds, and their
    curves. Rows that also differ in anything else, or repeat a root seed, stay apart."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        key = (row.run_dir.parent, row.experiment, row.env, SEED_OVERRIDE.sub("", row.setting).strip(), row.status,
               row.curve_index)
        groups.setdefault(key, []).append(row)
    pooled = []
    for (_, _, _, setting, _, _), members in groups.items():
        seeds = [SEED_OVERRIDE.search(member.setting) for member in members]
        if len(members) < 2 or not all(seeds) or len({m.group(1) for m in seeds}) < len(members):
            pooled += members
            continue
        first = members[0]
        pooled.append(Row(run_dir=first.run_dir, experiment=first.experiment, env=first.env, status=first.status,
                          setting=f"{setting} run.seed={','.join(m.group(1) for m in seeds)}".strip(),
                          returns=[r for member in members for r in member.returns],
                          seeds=sum(member.seeds for member in members),
                          env_steps=max(member.env_steps for member in members),
                          wall_seconds=sum(member.wall_seconds for member in members),
                          curve_index=first.curve_index, pooled=tuple(members)))
    return pooled


def return_cells(returns: list) -> tuple[str, str]:
    """The table's "mean ± std" and "95% CI" cells over the seeds with a finite return (a NaN is saved as
    None), saying how many seeds were not finite."""
    values = np.array([np.nan if r is None else r for r in returns], dtype=float)
    finite = values[np.isfinite(values)]
    if not finite.size:
        return ("—" if not values.size else f"— ({values.size} of {values.size} seeds non-finite)"), "—"
    result = f"{finite.mean():.1f} ± {finite.std():.1f}"
    if finite.size < values.size:
        result += f" ({values.size - finite.size} of {values.size} seeds non-finite)"
    interval = t_interval(finite)
    return result, ("—" if np.isnan(interval) else f"± {interval:.1f}")


def markdown_table(rows: list[Row]) -> str:
    lines = ["| experiment | env | setting | status | final return (mean ± std over seeds) | 95% CI of the mean | "
             "seeds | env steps per seed | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        result, interval = return_cells(row.returns)
        status = row.status.replace("|", "\\|")
        lines.append(f"| {row.experiment} | {row.env} | {row.setting or '—'} | {status} | {result} | {interval} | "
                     f"{row.seeds} | {row.env_steps:,} | {row.wall_seconds:.1f} |")
    return "\n".join(lines) + "\n"


def curve_of(row: Row):
    """``(steps [T], returns [T, seeds])`` of one run's evaluations (its grid point's), or None."""
    path = row.run_dir / "metrics.jsonl"
    curves = artifacts.learning_curves(artifacts.read_metrics(path), "eval_return") if path.exists() else None
    if curves is None:
        return None
    steps, values = curves
    return steps, values[:, row.curve_index or 0]


def plot_env(rows: list[Row], path: Path) -> None:
    """Evaluation return against env steps, one curve (mean, min–max band) per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        curves = [curve_of(member) for member in (row.pooled or (row,))]
        if any(curve is None for curve in curves) or not all(np.array_equal(c[0], curves[0][0]) for c in curves):
            continue  # pooled jobs whose evaluations do not line up (one unfinished, say): no curve
        steps, values = curves[0][0], np.concatenate([c[1] for c in curves], 1)
        line = ax.plot(steps, np.nanmean(values, 1), label=row.label)
        ax.fill_between(steps, np.nanmin(values, 1), np.nanmax(values, 1), alpha=0.15, color=line[0].get_color())
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel("evaluation return")
    ax.set_title(rows[0].env)
    ax.grid(alpha=0.3)
    if ax.lines:  # some run recorded a curve
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no evaluation curve recorded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(paths: list[Path], out: Path, per_job: bool = False) -> Path:
    """``out/report.md`` and one plot per environment for the runs under ``paths``; ``per_job``: one row per
    job even for jobs that differ only in ``run.seed`` (``pool_seed_jobs``)."""
    rows = [row for run in find_runs(paths) for row in rows_of(run)]
    rows = rows if per_job else pool_seed_jobs(rows)
    out.mkdir(parents=True, exist_ok=True)
    sections = ["# rlx report\n", f"Runs from: {', '.join(str(p) for p in paths)}\n", markdown_table(rows)]
    for env in sorted({row.env for row in rows}):
        name = f"curves_{env.replace('/', '_')}.png"
        plot_env([row for row in rows if row.env == env], out / name)
        sections.append(f"\n![{env}]({name})\n")
    report = out / "report.md"
    report.write_text("\n".join(sections))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlx.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run, multirun or parent directories")
    parser.add_argument("--out", type=Path, default=None,
                        help="where report.md and the plots go (default: the directory given, or ./report)")
    parser.add_argument("--per-job", action="store_true",
                        help="one row per job, also for jobs that differ only in run.seed (pooled by default)")
    args = parser.parse_args(argv)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path("report"))
    try:
        report = write_report(args.dirs, out, args.per_job)
    except InputError as error:
        raise SystemExit(f"error: {error}") from None
    print(report.read_text().split("\n![")[0])
    print(f"wrote {report}", file=sys.stderr)


if __name__ == "__main__":
    main()
