"""Persistent XLA compilation cache and compile-time settings, applied before JAX starts.

A second identical run (same program, same shapes, same static config) loads
its executables from disk instead of compiling them.
"""

from __future__ import annotations

import os
from pathlib import Path

# LLVM's level-1 pipeline halves CPU compile time of the training programs
# and, measured on the PPO chunk, leaves run time unchanged.
DEFAULT_XLA_FLAGS = "--xla_backend_optimization_level=1"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlx" / "jax_compilation_cache"


def set_xla_flags() -> None:
    """Add rlx's default XLA flags unless the user chose the same flag already."""
    flags = os.environ.get("XLA_FLAGS", "")
    name = DEFAULT_XLA_FLAGS.split("=")[0]
    if name not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEFAULT_XLA_FLAGS}".strip()


class CacheCounter:
    """Counts persistent-cache hits and misses reported by JAX's monitoring events."""

    def __init__(self):
        self.hits = 0
        self.misses = 0

    def __call__(self, event: str, **_):
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.misses += 1


def enable(cache_dir: str | os.PathLike | None) -> CacheCounter:
    """Turn the persistent cache on at ``cache_dir`` (``None`` or "" disables it)."""
    import jax

    counter = CacheCounter()
    jax.monitoring.register_event_listener(counter)
    if cache_dir:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(cache_dir))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return counter
