"""Command line: ``python -m rlx.train +exp=NAME [overrides]``.

Reads the Hydra config, asks ``rlx.envs.registry`` for the environment and
``rlx.algorithms`` for the agent module, and hands both to ``rlx.runner``. Mistakes in
names or values are reported as one line with exit code 2, before compiling.
"""

from __future__ import annotations

import time

_PROCESS_START = time.perf_counter()

import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from rlx.errors import ConfigError, UnknownNameError  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("exp", "algo", "env", "logger")


def group_choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_choices(argv: list[str]) -> None:
    """Reject unknown preset, algorithm, environment or logger names before Hydra starts."""
    for arg in argv:
        match = re.fullmatch(r"\+{0,2}(\w+)=(.*)", arg)
        if not match or match.group(1) not in GROUPS:
            continue
        group, value = match.groups()
        for choice in value.split(","):
            if choice and choice not in group_choices(group):
                kind = "preset" if group == "exp" else group
                raise UnknownNameError(kind, choice, group_choices(group))


def fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def execute(cfg, run_dir: Path, hydra_seconds: float) -> dict:
    """Train one configuration and write every file of its run directory; return the summary."""
    from omegaconf import OmegaConf

    from rlx.runner import compile_cache

    tick = time.perf_counter()
    settings_values = OmegaConf.to_container(cfg.run, resolve=True)
    cache_setting = settings_values.get("compile_cache")
    cache_dir = compile_cache.default_cache_dir() if cache_setting == "default" else cache_setting
    import jax  # noqa: F401  (timed as part of the imports)
    import logging

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)

    from rlx import algorithms
    from rlx.envs import registry
    from rlx.runner import artifacts, loop

    algo_values = OmegaConf.to_container(cfg.algo, resolve=True)
    agent_module = algorithms.load(algo_values.pop("name"))
    env_values = OmegaConf.to_container(cfg.env, resolve=True)
    env, env_params = registry.make(env_values["name"], **(env_values.get("params") or {}))
    import_seconds = hydra_seconds + time.perf_counter() - tick

    config = loop.build_agent_config(agent_module, algo_values)
    settings_values["progress"] = bool(cfg.logger.progress)
    settings = loop.RunSettings.from_dict(settings_values)
    counter = compile_cache.enable(cache_dir)

    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    summary = {
        "experiment": cfg.exp_name,
        "algo": cfg.algo.name,
        "env": env_values["name"],
        "num_seeds": settings.num_seeds,
        "seed": settings.seed,
        "config_hash": artifacts.config_hash(config_yaml),
        "git_commit": artifacts.git_commit(),
        "versions": artifacts.package_versions(),
        "run_dir": str(run_dir),
    }
    title = f"{cfg.exp_name}"
    try:
        result = loop.run_training(agent_module, config, env, env_params, settings, run_dir, title)
    except loop.NonFiniteError as error:
        summary.update(status="diverged", diverged_at_update=error.update, error=str(error))
        artifacts.write_json_atomic(run_dir / "summary.json", summary)
        raise
    result.pop("state")
    summary.update(result)
    summary["import_seconds"] = import_seconds
    summary["total_seconds"] = time.perf_counter() - _PROCESS_START
    summary["compile_cache"] = {"dir": str(cache_dir) if cache_dir else None, "hits": counter.hits,
                                "misses": counter.misses}
    artifacts.write_json_atomic(run_dir / "summary.json", summary)
    if settings.progress:
        final = summary["final_eval"]
        print(
            f"{title}: eval return {final['return_mean']:.1f} ± {final['return_std']:.1f} over "
            f"{settings.num_seeds} seeds after {summary['env_steps_per_seed']:,} steps per seed "
            f"(import {import_seconds:.1f}s, compile {summary['compile_seconds']:.1f}s, "
            f"run {summary['run_seconds']:.1f}s) -> {run_dir}",
            file=sys.stderr,
        )
    return summary


def main() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except UnknownNameError as error:
        fail(str(error), 2)
    from rlx.runner import compile_cache

    compile_cache.set_xla_flags()
    import hydra
    from hydra.core.hydra_config import HydraConfig

    hydra_seconds = time.perf_counter() - _PROCESS_START

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def hydra_entry(cfg) -> None:
        from rlx.runner.loop import NonFiniteError

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        try:
            execute(cfg, run_dir, hydra_seconds)
        except ConfigError as error:
            fail(str(error), 2)
        except NonFiniteError as error:
            fail(str(error), 1)

    hydra_entry()


if __name__ == "__main__":
    main()
