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


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


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


def plot_learning_curve(records: list[dict], path: Path, title: str) -> None:
    """Mean return over seeds with a min–max band, for evaluation and training returns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("eval_return", "evaluation"), ("train_return", "training episodes")):
        rows = [r for r in records if r.get(key) is not None]
        if not rows:
            continue
        steps = np.array([r["env_steps"] for r in rows])
        values = np.array([[np.nan if v is None else v for v in r[key]] for r in rows], dtype=float)
        line = ax.plot(steps, np.nanmean(values, 1), label=f"{label} (mean)", marker="o" if key == "eval_return" else None)
        ax.fill_between(steps, np.nanmin(values, 1), np.nanmax(values, 1), alpha=0.2, color=line[0].get_color())
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
