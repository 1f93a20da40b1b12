"""Environment names -> (environment, parameters), following the gymnax 1.0 API.

Every environment rlx can train on is listed in ``ENVIRONMENTS``; ``make`` builds
one and applies parameter overrides (``env.params.*`` in the config), so a
config can change, e.g., CartPole's pole length without code.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
import types

from rlx.errors import ConfigError, UnknownNameError

# name -> (module, class) or (module, class, constructor keyword arguments).
# Modules are imported only when the environment is made.
ENVIRONMENTS = {
    "CartPole-v1": ("gymnax.environments.classic_control.cartpole", "CartPole"),
    "Acrobot-v1": ("gymnax.environments.classic_control.acrobot", "Acrobot"),
    "MountainCar-v0": ("gymnax.environments.classic_control.mountain_car", "MountainCar"),
    "Pendulum-v1": ("gymnax.environments.classic_control.pendulum", "Pendulum"),
    "MountainCarContinuous-v0": ("gymnax.environments.classic_control.continuous_mountain_car", "ContinuousMountainCar"),
    # bsuite memory task: the cue is seen only at the start (recurrent agents need memory).
    "MemoryChain-bsuite": ("gymnax.environments.bsuite.memory_chain", "MemoryChain"),
    # MinAtar: 10x10xC grids of 0/1 (float32), discrete actions.
    "Asterix-MinAtar": ("gymnax.environments.minatar.asterix", "MinAsterix"),
    "Breakout-MinAtar": ("gymnax.environments.minatar.breakout", "MinBreakout"),
    "Freeway-MinAtar": ("gymnax.environments.minatar.freeway", "MinFreeway"),
    "SpaceInvaders-MinAtar": ("gymnax.environments.minatar.space_invaders", "MinSpaceInvaders"),
    # Brax physics (optional dependency: pip install -e .[brax]), adapted in rlx/envs/brax.py;
    # spring backend, episodes truncated at params.max_steps_in_episode (1000).
    "brax-ant": ("rlx.envs.brax", "BraxEnv", {"env_name": "ant"}),
    "brax-halfcheetah": ("rlx.envs.brax", "BraxEnv", {"env_name": "halfcheetah"}),
    "brax-hopper": ("rlx.envs.brax", "BraxEnv", {"env_name": "hopper"}),
    "brax-inverted_pendulum": ("rlx.envs.brax", "BraxEnv", {"env_name": "inverted_pendulum"}),
    # Our cooperative multi-agent probe (rlx/envs/coop.py): optimum 6.67, teammate-blind bound 2.67.
    "Coop": ("rlx.envs.coop", "Coop"),
    # JaxMARL multi-agent environments in the array-per-agent contract (rlx/envs/jaxmarl.py; extra [marl]).
    "mpe_spread": ("rlx.envs.jaxmarl", "make_jaxmarl", {"name": "MPE_simple_spread_v3"}),
    "smax_3m": ("rlx.envs.jaxmarl", "make_jaxmarl", {"name": "3m"}),
    "smax_2s3z": ("rlx.envs.jaxmarl", "make_jaxmarl", {"name": "2s3z"}),
    # Multi-agent path finding with POGEMA's semantics (rlx/envs/mapf): env.options choose the instances and rules.
    "mapf_random": ("rlx.envs.mapf", "make_mapf", {"layout": "random"}),
    "mapf_maze": ("rlx.envs.mapf", "make_mapf", {"layout": "maze"}),
    "mapf_warehouse": ("rlx.envs.mapf", "make_mapf", {"layout": "warehouse"}),
    "mapf_file": ("rlx.envs.mapf", "make_mapf", {"layout": "file"}),
    # Market making, model-based (rlx/envs/market/quoting.py): Avellaneda-Stoikov / Cartea-Jaimungal quoting.
    "market_quoting": ("rlx.envs.market.quoting", "QuotingEnv"),
    # Market making on order-book days (rlx/envs/market/book.py): 17 actions, queue positions, time or event steps.
    "market_book": ("rlx.envs.market.book", "make_book"),
    # Procedurally generated sparse-reward maze (rlx/envs/maze.py): train on level ids [0, N), test on unseen ids.
    "maze": ("rlx.envs.maze", "ProceduralMaze"),
    # Probe tasks with known answers (rlx/envs/probes.py), for debugging agents.
    "Probe-ConstantReward": ("rlx.envs.probes", "ConstantReward"),
    "Probe-ObservationReward": ("rlx.envs.probes", "ObservationReward"),
    "Probe-ActionReward": ("rlx.envs.probes", "ActionReward"),
    "Probe-TwoStepCredit": ("rlx.envs.probes", "TwoStepCredit"),
    "Probe-ContinuousTarget": ("rlx.envs.probes", "ContinuousTarget"),
}


# Environment modules that need an optional dependency: module -> the package it imports.
OPTIONAL_PACKAGES = {"rlx.envs.brax": "brax", "rlx.envs.jaxmarl": "jaxmarl"}


MULTI_AGENT_MODULES = ("rlx.envs.coop", "rlx.envs.jaxmarl", "rlx.envs.mapf")


def names(multi_agent: bool | None = None) -> list[str]:
    """Every environment name, or only the multi-agent (``True``) or single-agent (``False``) ones."""
    return sorted(name for name, (module, *_) in ENVIRONMENTS.items()
                  if multi_agent is None or (module in MULTI_AGENT_MODULES) == multi_agent)


def installed(name: str) -> bool:
    """Whether the packages that ``make(name)`` needs are installed (brax is the optional extra ``[brax]``)."""
    package = OPTIONAL_PACKAGES.get(ENVIRONMENTS[name][0])
    return package is None or importlib.util.find_spec(package) is not None


def make(name: str, options: dict | None = None, **param_overrides):
    """Return ``(env, env_params)`` for a registered name.

    ``options`` (``env.options`` in the config) are keyword arguments of the
    environment's constructor, e.g. the MAPF agent count; ``param_overrides``
    (``env.params``) replace fields of its default parameters.
    """
    if name not in ENVIRONMENTS:
        raise UnknownNameError("env", name, names())
    module_name, class_name, *kwargs = ENVIRONMENTS[name]
    module = import_env_module(module_name)
    constructor = getattr(module, class_name)
    fixed = kwargs[0] if kwargs else {}
    arguments = {**fixed, **(options or {})}
    if options:
        accepted = [p for p in keyword_names(constructor) if p not in fixed]
        if has_var_keyword(constructor):  # what it forwards to the wrapped library's constructor
            forwarded = getattr(module, "forwarded_options", lambda **_: [])(**fixed)
            accepted += [p for p in forwarded if p not in accepted and p not in fixed]
        unknown = sorted(set(options) - set(accepted))
        if unknown and not accepted:
            params = ", ".join(sorted(f.name for f in dataclasses.fields(constructor(**fixed).default_params)))
            raise ConfigError(f"env.options.{unknown[0]}: {name} takes no env.options; its env.params are {params}")
        if unknown:
            raise ConfigError(f"env.options.{unknown[0]}: unknown option of {name}; valid: {', '.join(accepted)}")
    env = constructor(**arguments)
    params = env.default_params
    valid = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(param_overrides) - valid)
    if unknown:
        raise ConfigError(f"env.params.{unknown[0]}: unknown parameter of {name}; valid: {', '.join(sorted(valid))}")
    params = params.replace(**param_overrides)
    check = getattr(env, "check_params", None)
    return env, (check(params) if check else params)


def keyword_names(function) -> list[str]:
    """The named keyword arguments of ``function`` (not ``self``, ``*args`` or ``**kwargs``)."""
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, parameter in inspect.signature(function).parameters.items()
            if name != "self" and parameter.kind in keyword_kinds]


def has_var_keyword(function) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


def init_keywords(cls) -> list[str]:
    """Keyword arguments ``cls(...)`` accepts: its ``__init__``'s, and, where that passes ``**kwargs`` on to
    a base class, the base's (JaxMARL and brax environments forward options this way)."""
    names = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        names += [name for name in keyword_names(init) if name not in names]
        if not has_var_keyword(init):
            break
    return names


def import_env_module(module_name: str) -> types.ModuleType:
    """Import a gymnax environment module without gymnax's package ``__init__``.

    ``import gymnax`` loads every environment family plus matplotlib, seaborn and
    scipy (about 1.8 s on a 2-core machine) although one classic-control module
    needs none of them.
    """
    if not module_name.startswith("gymnax."):
        return importlib.import_module(module_name)
    return import_skipping_package_init(module_name)


def import_skipping_package_init(module_name: str) -> types.ModuleType:
    """Import ``a.b.c`` without running the ``__init__`` of packages ``a`` and ``a.b`` (if ``a`` is not loaded).

    Placeholder package modules let Python find the submodule on the real
    package path; they are removed afterwards, so a later ``import a`` runs the
    real ``__init__`` and reuses the modules (and classes) already loaded.
    """
    parts = module_name.split(".")
    if parts[0] in sys.modules:
        return importlib.import_module(module_name)
    placeholders = []
    path = list(importlib.util.find_spec(parts[0]).submodule_search_locations)
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
