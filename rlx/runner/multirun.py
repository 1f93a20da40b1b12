"""Failed jobs of a Hydra multirun, counted wherever the launcher ran them.

The basic launcher runs a sweep's jobs in this process, joblib in worker processes and submitit on other
machines, so a list kept in memory sees only the first kind. Each failed job leaves ``job_failed.json`` in
its own directory instead, and ``FailedJobs`` (a Hydra callback, in the parent process) reads them from the
sweep directory once every job has ended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hydra.experimental.callback import Callback

MARKER = "job_failed.json"
EXIT_CODES: list[int] = []  # the failed jobs' exit codes, set at the end of each multirun in this process


def record_failure(job_dir: Path, code: int, message: str) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / MARKER).write_text(json.dumps({"exit_code": code, "error": message}) + "\n")


def clear_failure(job_dir: Path) -> None:
    """Forget a failure recorded in ``job_dir`` by an earlier sweep into the same directory."""
    (job_dir / MARKER).unlink(missing_ok=True)


def failed_exit_codes(sweep_dir: Path, since: float = 0.0) -> list[int]:
    """Exit codes of the failures recorded under ``sweep_dir`` at or after ``since`` (a Unix time): an earlier
    sweep into the same directory may have left markers in job directories that this one does not reuse."""
    markers = sorted(path for path in Path(sweep_dir).glob(f"*/{MARKER}") if path.stat().st_mtime >= since)
    return [json.loads(path.read_text())["exit_code"] for path in markers]


class FailedJobs(Callback):
    """Collects the sweep's failed jobs into ``EXIT_CODES`` when the multirun ends."""

    def __init__(self) -> None:
        self.started = 0.0

    def on_multirun_start(self, config, **kwargs) -> None:
        self.started = time.time() - 1.0  # file times may be rounded to the second

    def on_multirun_end(self, config, **kwargs) -> None:
        EXIT_CODES[:] = failed_exit_codes(Path(config.hydra.sweep.dir), self.started)
