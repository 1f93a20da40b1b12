"""Weights & Biases logging that can never block or fail a run.

Offline by default (files under ``RUN_DIR/wandb``). Any error from wandb, at
start or later, is reported once on the console and wandb logging stops;
training and the run directory's own files carry on.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class WandbLogger:
    """Config at start, per-chunk metrics per seed and their mean, then images and the summary."""

    def __init__(self, settings: dict, config: dict, run_dir: Path, default_name: str, warn):
        self._warn, self._run = warn, None
        try:
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self._wandb = wandb
            self._run = wandb.init(
                mode=settings.get("mode") or "offline",
                project=settings.get("project"),
                entity=settings.get("entity"),
                group=settings.get("group"),
                tags=list(settings.get("tags") or []),
                name=settings.get("name") or default_name,
                dir=str(run_dir),
                config=config,
                settings=wandb.Settings(init_timeout=30, console="off", x_disable_stats=True),
            )
        except Exception as error:  # noqa: BLE001 - wandb must never stop training
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        self._warn(f"wandb disabled: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        self._run = None

    def chunk(self, record: dict) -> None:
        """Each metric as ``name/mean`` plus ``name/seed_i`` (``name/point_j/seed_i`` in a sweep)."""
        if self._run is None:
            return
        logged = {}
        for name, values in record.items():
            if not isinstance(values, list):
                if isinstance(values, (int, float)) and name not in ("time",):
                    logged[name] = values
                continue
            array = np.asarray(values, dtype=float)
            logged[f"{name}/mean"] = float(np.nanmean(array))
            if array.ndim == 1:
                logged.update({f"{name}/seed_{i}": float(v) for i, v in enumerate(array)})
            else:
                for point, row in enumerate(array):
                    logged[f"{name}/point_{point}/mean"] = float(np.nanmean(row))
                    logged.update({f"{name}/point_{point}/seed_{i}": float(v) for i, v in enumerate(row)})
        try:
            self._run.log(logged, step=int(record["env_steps"]))
        except Exception as error:  # noqa: BLE001
            self._fail(error)

    def finish(self, summary: dict | None, images: list[Path]) -> None:
        """Images and the flattened summary, then close the run: failed after a crash (``summary`` None) or a
        divergence (the summary's ``status``)."""
        if self._run is None:
            return
        try:
            for image in images:
                if image.exists():
                    self._run.log({f"plots/{image.stem}": self._wandb.Image(str(image))})
            if summary is not None:
                self._run.summary.update(flat_scalars(summary))
            failed = summary is None or summary.get("status") == "diverged"
            self._run.finish(exit_code=1 if failed else 0)
        except Exception as error:  # noqa: BLE001
            self._fail(error)


def flat_scalars(tree: dict) -> dict:
    """{'final_eval/return_mean': 500.0, ...}: the numbers and strings of a nested summary."""
    from rlx.runner.artifacts import flatten_dict

    return {name: value for name, value in flatten_dict(tree, "/").items()
            if isinstance(value, (int, float, str, bool)) or value is None}
