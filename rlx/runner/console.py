"""The console view of a run: a rich progress bar with throughput and returns over seeds.

On a terminal (or in a notebook) the bar redraws in place. Written to a file or a pipe (a cluster job's log, CI), a bar
would be drawn once, cut to 80 columns; there the view prints one plain line per ``log_every`` seconds
instead (and the last state when the run ends), so the log keeps every field in full.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressView:
    """Progress over environment steps; ``enabled=False`` makes every call a no-op."""

    def __init__(self, title: str, total_steps: int, enabled: bool = True, console: Console | None = None,
                 log_every: float = 10.0):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.title, self.total_steps, self.log_every = title, total_steps, log_every
        self.started = time.monotonic()
        self.last_logged = self.pending = None
        if not self.live:
            return
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
            TextColumn("{task.fields[speed]}"),
            TextColumn("{task.fields[returns]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(title, total=total_steps, speed="compiling", returns="")
        self.progress.start()

    @property
    def live(self) -> bool:
        """Whether the bar redraws in place: on a terminal or in a notebook, not in a file or a pipe."""
        return self.enabled and (self.console.is_terminal or self.console.is_jupyter)

    def update(self, env_steps: int, steps_per_second: float, label: str, returns) -> None:
        if not self.enabled:
            return
        text = f"{label} {sum(returns) / len(returns):8.1f} [{min(returns):.1f}, {max(returns):.1f}]"
        speed = f"{steps_per_second:,.0f} steps/s"
        if self.live:
            self.progress.update(self.task, completed=env_steps, speed=speed, returns=text)
            return
        self.pending = f"{self.title} {env_steps:,}/{self.total_steps:,} steps  {speed}  {' '.join(text.split())}"
        now = time.monotonic()
        if self.last_logged is None or now - self.last_logged >= self.log_every:
            self._log_pending(now)

    def _log_pending(self, now: float) -> None:
        seconds = int(now - self.started)
        elapsed = f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
        self.console.print(f"{self.pending}  {elapsed}", soft_wrap=True, highlight=False)
        self.last_logged, self.pending = now, None

    def message(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, soft_wrap=not self.live)

    def close(self) -> None:
        if self.live:
            self.progress.stop()
        elif self.enabled and self.pending is not None:
            self._log_pending(time.monotonic())
