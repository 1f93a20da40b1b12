"""Helpers shared by the ``scripts/bench_*.py`` benchmarks (run as scripts, so this folder is on ``sys.path``)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, *args, repeats: int = 3):
    """``(compile seconds, median run seconds, last output)`` of ``jax.jit(fn)(*args)``, compiled ahead of time."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    runs, output = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        output = jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    return compile_s, statistics.median(runs), output


def save_table(name: str, table: str) -> Path:
    """Write a benchmark's markdown table to ``.bench/<name>.md``."""
    out = ROOT / ".bench" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table.rstrip("\n") + "\n")
    return out
