"""Environment names -> (environment, parameters), following the gymnax 1.0 API.

Every environment rlx can train on is listed in ``ENVIRONMENTS``; ``make`` builds
one and applies parameter overrides (``env.params.*`` in the config), so a
config can change, e.g., CartPole's pole length without code.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types

from rlx.errors import ConfigError, UnknownNameError

# name -> (module, class). Modules are imported only when the environment is made.
ENVIRONMENTS = {
    "CartPole-v1": ("gymnax.environments.classic_control.cartpole", "CartPole"),
    "Acrobot-v1": ("gymnax.environments.classic_control.acrobot", "Acrobot"),
    "MountainCar-v0": ("gymnax.environments.classic_control.mountain_car", "MountainCar"),
    "Pendulum-v1": ("gymnax.environments.classic_control.pendulum", "Pendulum"),
    "MountainCarContinuous-v0": ("gymnax.environments.classic_control.continuous_mountain_car", "ContinuousMountainCar"),
    # bsuite memory task: the cue is seen only at the start (recurrent agents need memory).
    "MemoryChain-bsuite": ("gymnax.environments.bsuite.memory_chain", "MemoryChain"),
    # Probe tasks with known answers (rlx/envs/probes.py), for debugging agents.
    "Probe-ConstantReward": ("rlx.envs.probes", "ConstantReward"),
    "Probe-ObservationReward": ("rlx.envs.probes", "ObservationReward"),
    "Probe-ActionReward": ("rlx.envs.probes", "ActionReward"),
    "Probe-TwoStepCredit": ("rlx.envs.probes", "TwoStepCredit"),
    "Probe-ContinuousTarget": ("rlx.envs.probes", "ContinuousTarget"),
}


def names() -> list[str]:
    return sorted(ENVIRONMENTS)


def make(name: str, **param_overrides):
    """Return ``(env, env_params)`` for a registered name; overrides replace default parameters."""
    if name not in ENVIRONMENTS:
        raise UnknownNameError("env", name, names())
    module_name, class_name = ENVIRONMENTS[name]
    env = getattr(import_env_module(module_name), class_name)()
    params = env.default_params
    valid = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(param_overrides) - valid)
    if unknown:
        raise ConfigError(f"env.params.{unknown[0]}: unknown parameter of {name}; valid: {', '.join(sorted(valid))}")
    return env, params.replace(**param_overrides)


def import_env_module(module_name: str) -> types.ModuleType:
    """Import a gymnax environment module without gymnax's package ``__init__``.

    ``import gymnax`` loads every environment family plus matplotlib, seaborn and
    scipy (about 1.8 s on a 2-core machine) although one classic-control module
    needs none of them. Placeholder package modules let Python find the
    submodule on the real package path; they are removed afterwards, so a later
    ``import gymnax`` runs the real ``__init__`` and reuses the same classes.
    """
    if not module_name.startswith("gymnax.") or "gymnax" in sys.modules:
        return importlib.import_module(module_name)
    parts = module_name.split(".")
    placeholders = []
    spec = importlib.util.find_spec("gymnax")
    path = list(spec.submodule_search_locations)
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        module = types.ModuleType(package)
        module.__path__ = path
        sys.modules[package] = module
        placeholders.append(package)
        path = [f"{path[0]}/{parts[depth]}"]
    try:
        return importlib.import_module(module_name)
    finally:
        for package in placeholders:
            sys.modules.pop(package, None)
