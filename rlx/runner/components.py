"""From a resolved config to the parts a run needs: agent module, grid of configs, environment, settings.

Shared by training (``rlx.train``) and reloading a finished run (``rlx.evaluate``,
the Gymnasium adapter), so both read a config the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any


@dataclasses.dataclass
class Components:
    agent_module: Any
    grid: Any  # rlx.runner.sweep.Grid
    env: Any
    env_params: Any
    env_name: str
    settings: Any  # rlx.runner.loop.RunSettings
    resume: str | None


def quiet_logs() -> None:
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax reports every save at INFO


def check_agent_kind(algo_name: str, env, env_name: str) -> None:
    """ConfigError when a multi-agent algorithm meets a single-agent environment, or the reverse."""
    from rlx import algorithms
    from rlx.envs import registry
    from rlx.errors import ConfigError
    from rlx.runner.evaluation import is_multi_agent

    multi = algo_name in algorithms.MULTI_AGENT
    if multi != is_multi_agent(env):
        kind = "multi-agent" if multi else "single-agent"
        raise ConfigError(f"env={env_name}: algo={algo_name} trains on {kind} environments, and {env_name} is not "
                          f"one; {kind} environments: {', '.join(registry.names(multi_agent=multi))}")


def build(cfg, **run_overrides) -> Components:
    """Check and build everything ``cfg`` (an OmegaConf config) describes; ConfigError on bad input."""
    from omegaconf import OmegaConf

    from rlx import algorithms
    from rlx.envs import registry
    from rlx.errors import ConfigError
    from rlx.runner import loop, sweep

    quiet_logs()
    algo_values = OmegaConf.to_container(cfg.algo, resolve=True)
    algo_name = algo_values.pop("name")
    agent_module = algorithms.load(algo_name)
    env_values = OmegaConf.to_container(cfg.env, resolve=True)
    env, env_params = registry.make(env_values["name"], env_values.get("options"), **(env_values.get("params") or {}))
    check_agent_kind(algo_name, env, env_values["name"])
    agent_module = algorithms.bind_host_inputs(algo_name, agent_module, algo_values, env_values["name"])
    sweep_values = OmegaConf.to_container(cfg.sweep, resolve=True) if cfg.get("sweep") else {}
    grid = sweep.build_grid(sweep_values, algo_values, agent_module, loop.build_agent_config)
    check_for_env = getattr(agent_module, "validate_for_env", None)  # checks that need the environment
    for config in grid.configs if check_for_env else ():
        try:
            check_for_env(config, env, env_params)
        except ValueError as error:
            raise ConfigError(f"algo.{error}") from None
    settings_values = OmegaConf.to_container(cfg.run, resolve=True)
    settings_values["progress"] = bool(cfg.logger.progress) if "logger" in cfg else False
    resume = settings_values.pop("resume", None)
    settings = loop.RunSettings.from_dict({**settings_values, **run_overrides})
    return Components(agent_module, grid, env, env_params, env_values["name"], settings, resume)


@dataclasses.dataclass
class TrainedRun:
    """A finished (or checkpointed) run, reloaded: its parts, evaluation program and state."""

    parts: Components
    programs: Any  # rlx.runner.loop.Programs with the evaluation compiled
    state: Any
    progress: dict

    def policy(self, point: int, seed: int):
        """The policy parameters of one grid point and seed."""
        import jax

        index = (point, seed) if self.parts.grid.swept else (seed,)
        return jax.tree.map(lambda x: x[index], self.state.policy)

    def agent(self, point: int):
        """The agent functions of one grid point (its own hyper-parameters)."""
        return self.parts.agent_module.make(self.parts.grid.configs[point], self.parts.env, self.parts.env_params)


def load_trained(run_dir, **run_overrides) -> TrainedRun:
    """Reload ``run_dir``'s config and latest checkpoint; ConfigError if either is missing or unreadable."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from rlx.errors import ConfigError
    from rlx.runner import checkpoints, compile_cache, devices, loop

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir={run_dir}: no config.yaml there; not an rlx run directory")
    parts = build(OmegaConf.load(run_dir / "config.yaml"), progress=False, **run_overrides)
    cache = parts.settings.compile_cache
    compile_cache.enable(compile_cache.default_cache_dir() if cache == "default" else cache)
    layout = devices.plan(parts.settings.num_seeds, parts.grid.size, parts.grid.swept)
    programs = loop.Programs(parts.agent_module, parts.grid.stacked_config(), parts.env, parts.env_params,
                             parts.settings, parts.grid.swept, training=False, layout=layout)
    state, progress = checkpoints.restore_latest(run_dir, programs.abstract_state(), label=f"run_dir={run_dir}")
    return TrainedRun(parts, programs, state, progress)
