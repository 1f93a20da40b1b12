"""The console view of a run: a rich progress bar with throughput and returns over seeds."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressView:
    """Progress bar over environment steps; ``enabled=False`` makes every call a no-op."""

    def __init__(self, title: str, total_steps: int, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(stderr=True)
        if not enabled:
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

    def update(self, env_steps: int, steps_per_second: float, label: str, returns) -> None:
        if not self.enabled:
            return
        text = f"{label} {sum(returns) / len(returns):8.1f} [{min(returns):.1f}, {max(returns):.1f}]"
        self.progress.update(self.task, completed=env_steps, speed=f"{steps_per_second:,.0f} steps/s", returns=text)

    def message(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()
