"""Files a run leaves behind: metrics.jsonl, summary.json, config.yaml, learning_curve.png."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
from pathlib import Path

PACKAGES = ["rlx", "jax", "jaxlib", "flax", "optax", "chex", "distrax", "gymnax", "hydra-core", "omegaconf", "numpy"]


def installed_version(name: str) -> str | None:
    """The installed version of package ``name`` (None if it is not installed), read without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict:
    return {name: installed_version(name) for name in PACKAGES}


def git_commit() -> str | None:
    """Commit of the rlx checkout (with ``-dirty`` when it has local changes), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def flatten_dict(tree: dict, sep: str = ".", prefix: str = "") -> dict:
    """``{'algo.lr': 0.001, ...}`` from nested dicts; an empty nested dict stays a value (``{'sweep': {}}``)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_dict(value, sep, f"{name}{sep}"))
        else:
            flat[name] = value
    return flat


def config_hash(config_yaml: str) -> str:
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def _finite(value):
    """JSON has no NaN: non-finite numbers are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2) + "\n")
    os.replace(tmp, path)


class MetricsWriter:
    """Appends one JSON line per chunk and flushes it, so a killed run keeps every finished line."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "a")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if there is none); a last line cut short (a killed run) is left out.

    ``ConfigError`` names the file and line of any other line that is not a JSON object.
    """
    from rlx.errors import ConfigError

    if not path.exists():
        return []
    records, lines = [], path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # a line cut short by the kill
            raise ConfigError(f"{path}, line {number}: not a JSON line") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path}, line {number}: not a metrics record (a JSON object)")
        records.append(record)
    return records


def truncate_metrics(path: Path, updates_done: int) -> list[dict]:
    """Keep the metrics.jsonl lines up to ``updates_done`` (a resumed run rewrites the rest); return them."""
    if not path.exists():
        return []
    records = [record for record in read_metrics(path) if record["update"] <= updates_done]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)
    return records


def learning_curves(records: list[dict], key: str):
    """(env steps, values ``[row, grid point, seed]``) of the records that have ``key``; None if none do."""
    import numpy as np

    rows = [r for r in records if r.get(key) is not None]
    if not rows:
        return None
    steps = np.array([r["env_steps"] for r in rows])
    values = np.array([r[key] for r in rows], dtype=float)  # JSON null -> nan
    if values.ndim == 2:
        values = values[:, None, :]
    return steps, values


def plot_learning_curve(records: list[dict], path: Path, title: str, labels: list[str] | None = None) -> None:
    """Mean return over seeds with a min–max band: evaluation and training returns, or one curve per sweep point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    keys = (("eval_return", "evaluation"), ("train_return", "training episodes"))
    if labels:  # a sweep: evaluation curves only, one per point, or training curves if never evaluated
        keys = keys[:1] if learning_curves(records, "eval_return") is not None else keys[1:]
    for key, kind in keys:
        curves = learning_curves(records, key)
        if curves is None:
            continue
        steps, values = curves
        for point in range(values.shape[1]):
            label = f"{labels[point]}" if labels else f"{kind} (mean)"
            line = ax.plot(steps, np.nanmean(values[:, point], 1), label=label,
                           marker="o" if key == "eval_return" and not labels else None)
            ax.fill_between(steps, np.nanmin(values[:, point], 1), np.nanmax(values[:, point], 1), alpha=0.2,
                            color=line[0].get_color())
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
