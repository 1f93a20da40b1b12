"""XLA settings applied before JAX starts: the persistent compilation cache and runtime workarounds.

With the cache, a second identical run (same program, same shapes, same static
config) loads its executables from disk instead of compiling them.
"""

from __future__ import annotations

import os
from pathlib import Path


# jaxlib 0.10.x on CPU: programs with several vmapped seeds (Acrobot every
# time, CartPole sometimes) can hang forever waiting for a result that the
# concurrency-optimised thunk scheduler never signals. Turning that scheduler
# off removed every hang in our stress runs (0/13 against 14/17 with it on) at
# no measurable cost in steps per second.
WORKAROUND_XLA_FLAGS = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


# jaxlib 0.10 on CPU hands reductions to YNNPACK fusions, and one shape of them is very slow: a LayerNorm's
# parameter gradient under the runner's vmap over seeds, ``f32[1, rows, d] -> [1, d]`` over the middle axis,
# took about 150 ms a call against about 6 ms for the same sum without the leading axis (jax.profiler on
# MAPPO's learning step for mappo_mapf_random at 32 envs: 7.7 s, 2.5 s with the flag below). Leaving reductions to XLA's
# own emitter fixed it and slowed no training preset we timed (rlx.train, env steps/s without -> with the flag:
# mappo_mapf_random 491 -> 1,386, mappo_mpe_spread 21.7k -> 22.7k, ppo_cartpole 242k -> 242k, ppo_minatar
# 22.8k -> 23.1k, mapf_map_policy 662 -> 707 (short runs; past compiling, 1,190 steps/s either way),
# dreamer_cartpole 299 -> 317; 2026-12-07, 2 cores). Parts do
# get slower, large plain sums most: MAPPO's rollout on MAPF 0.46 -> 0.52 s per update while the whole
# update went 10.8 -> 5.5 s, and scripts/bench_mapf.py's checksum program 52 -> 82 ms (README). XLA aborts
# on a flag it does not know, so it is only added for the jaxlib that has it.
YNN_REDUCE_FLAG = "--xla_cpu_experimental_ynn_fusion_type=-reduce"
YNN_REDUCE_JAXLIB = "0.10."


def jaxlib_version() -> str:
    """The installed jaxlib's version ("" if none), read without importing JAX (XLA reads its flags once, at start)."""
    from rlx.runner.artifacts import installed_version

    return installed_version("jaxlib") or ""


def add_xla_flag(flag: str) -> None:
    """Append ``--name=value`` to ``XLA_FLAGS`` unless it already sets ``--name`` (the user's own setting wins)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag.split("=")[0] not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


def set_xla_flags() -> None:
    """Add the workaround flags to ``XLA_FLAGS`` unless the user set them; call before JAX runs anything."""
    add_xla_flag(WORKAROUND_XLA_FLAGS)
    if jaxlib_version().startswith(YNN_REDUCE_JAXLIB):
        add_xla_flag(YNN_REDUCE_FLAG)


def cpu_device_count(setting) -> int:
    """How many CPU devices ``run.cpu_devices`` asks for: ``auto`` is one per core this process may use
    (its CPU affinity, which taskset, cgroups and SLURM set; not every core of the machine)."""
    if setting == "auto":
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        return len(usable) if usable else os.cpu_count() or 1
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        from rlx.errors import ConfigError

        raise ConfigError(f"run.cpu_devices={setting!r}: must be 'auto' or an integer >= 1")
    return setting


def set_cpu_devices(setting) -> None:
    """Show XLA's CPU backend as ``run.cpu_devices`` devices; call before JAX creates its backends.

    XLA runs most of a small RL program on one thread, so on a CPU a run leaves all but
    one core idle. As several devices, the runner splits the seeds (or sweep points) over
    them (``rlx.runner.devices``) and each device's share runs on its own core: 2.2x the
    env steps/s of a 32-configuration CartPole sweep on 2 cores. A device count the user
    already put in ``XLA_FLAGS`` wins; GPU and TPU runs are unaffected (their devices are
    not the CPU's).
    """
    count = cpu_device_count(setting)
    if count > 1:
        add_xla_flag(f"--xla_force_host_platform_device_count={count}")


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


def cache_settings(cache_dir: str | os.PathLike) -> dict:
    """JAX's configuration (by option name) that caches every compiled program at ``cache_dir``, however
    quick to compile or small. A process that runs no rlx code takes the same from its environment, under the
    upper-cased names (``JAX_COMPILATION_CACHE_DIR``, ...)."""
    return {"jax_compilation_cache_dir": str(cache_dir), "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_persistent_cache_min_entry_size_bytes": 0}


def enable(cache_dir: str | os.PathLike | None) -> CacheCounter:
    """Turn the persistent cache on at ``cache_dir`` (``None`` or "" disables it)."""
    import jax

    counter = CacheCounter()
    jax.monitoring.register_event_listener(counter)
    if cache_dir:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        for name, value in cache_settings(cache_dir).items():
            jax.config.update(name, value)
    return counter


def prepare_command() -> CacheCounter:
    """What a command line that runs JAX in its own process (``rlx.reproduce``, the MAPF study's ``validate``,
    DAgger) does first, as ``rlx.train`` does: rlx's XLA flags and the persistent cache in its default place."""
    set_xla_flags()
    return enable(default_cache_dir())
