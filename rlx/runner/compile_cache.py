"""Persistent XLA compilation cache.

A second identical run (same program, same shapes, same static config) loads
its executables from disk instead of compiling them.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlx" / "jax_compilation_cache"


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
