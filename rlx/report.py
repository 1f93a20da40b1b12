"""``python -m rlx.report DIR... [--out OUT]``: runs and sweeps -> report.md and comparison plots.

Each DIR may be a run directory, a Hydra multirun directory or any folder
above them; every ``summary.json`` below it is one run. A run with an
in-program sweep contributes one row (and one curve) per grid point.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx.errors import ConfigError, InputError
from rlx.runner import artifacts


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
    returns: list  # final evaluation return per seed
    env_steps: int
    wall_seconds: float
    curve_index: int | None  # grid point in metrics.jsonl, None when not swept

    @property
    def label(self) -> str:
        return f"{self.experiment} {self.setting}".strip()


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding summary.json) under the given paths, in a stable order."""
    runs = []
    for path in paths:
        if not path.exists():
            raise SystemExit(f"error: {path}: no such directory")
        runs += sorted({p.parent for p in path.rglob("summary.json")})
    if not runs:
        raise SystemExit(f"error: no summary.json under {', '.join(map(str, paths))}; nothing to report")
    return runs


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


def rows_of(run_dir: Path) -> list[Row]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{run_dir / 'summary.json'}: not valid JSON ({error})") from None
    common = dict(run_dir=run_dir, experiment=summary.get("experiment", "?"), env=summary.get("env", "?"),
                  env_steps=summary.get("env_steps_per_seed", 0), wall_seconds=summary.get("total_seconds", 0.0))
    overrides = hydra_overrides(run_dir)
    if "sweep" not in summary:
        final = summary.get("final_eval") or {}
        return [Row(setting=overrides, returns=final.get("return_per_seed", []), curve_index=None, **common)]
    rows = []
    for index, point in enumerate(summary["sweep"]["points"]):
        values = ", ".join(f"{k.split('.', 1)[1]}={v:g}" for k, v in point["point"].items())
        rows.append(Row(setting=f"{overrides} {values}".strip(), returns=point["return_per_seed"],
                        curve_index=index, **common))
    return rows


def markdown_table(rows: list[Row]) -> str:
    lines = ["| experiment | env | setting | final return (mean ± std over seeds) | seeds | env steps per seed | wall s |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        returns = np.asarray(row.returns, dtype=float)
        result = f"{returns.mean():.1f} ± {returns.std():.1f}" if returns.size else "—"
        lines.append(f"| {row.experiment} | {row.env} | {row.setting or '—'} | {result} | {returns.size} | "
                     f"{row.env_steps:,} | {row.wall_seconds:.1f} |")
    return "\n".join(lines) + "\n"


def plot_env(rows: list[Row], path: Path) -> None:
    """Evaluation return against env steps, one curve (mean, min–max band) per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        records = artifacts.read_metrics(row.run_dir / "metrics.jsonl")
        curves = artifacts.learning_curves(records, "eval_return")
        if curves is None:
            continue
        steps, values = curves
        values = values[:, row.curve_index or 0]
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


def write_report(paths: list[Path], out: Path) -> Path:
    rows = [row for run in find_runs(paths) for row in rows_of(run)]
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
    args = parser.parse_args(argv)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path("report"))
    try:
        report = write_report(args.dirs, out)
    except InputError as error:
        raise SystemExit(f"error: {error}") from None
    print(report.read_text().split("\n![")[0])
    print(f"wrote {report}", file=sys.stderr)


if __name__ == "__main__":
    main()
