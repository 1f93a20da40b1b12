"""JaxMARL's dict environments behind rlx's array-per-agent contract (``rlx.envs.multi_agent``).

``make_jaxmarl("MPE_simple_spread_v3")``, ``make_jaxmarl("3m")`` or ``make_jaxmarl("2s3z")``
builds a JaxMARL environment and wraps it in ``JaxMARLEnv``, which adapts any
JaxMARL ``MultiAgentEnv`` whose agents share one observation and one action space:

* observations ``[n, obs_dim]`` float32, rewards ``[n]`` float32 and actions ``[n]`` in the
  fixed agent order ``env.agents`` (the dicts are built and unpacked at the edge);
* auto-reset by ``rlx.envs.multi_agent.MultiAgentEnv.step``: the adapter calls JaxMARL's
  ``step_env`` and ``reset`` (never its auto-resetting ``step``), so ``info`` keeps the
  pre-reset ``final_observation`` and ``final_world_state``. With the same key, the adapter's
  ``step`` passes JaxMARL's ``step_env`` the same sub-key as JaxMARL's own ``step`` does;
* ``params.max_steps_in_episode`` (default: the JaxMARL env's ``max_steps``) is the time
  limit and sets ``truncated``; the adapter counts ``state.time`` itself.

Per family:

* **MPE** (``MPE_*``): nothing terminates; JaxMARL's ``done`` is only its time limit and is
  ignored. Episodes are truncated after ``max_steps_in_episode`` = 25 steps (PettingZoo's
  ``max_cycles``; JaxMARL's own ``done`` fires one step later, after 26 transitions, because
  it compares the pre-increment step count -- pass ``max_steps_in_episode=26`` to reproduce
  that). The world state is every agent's observation, concatenated in agent order
  (``[n * obs_dim]``, as JaxMARL's MAPPO ``MPEWorldStateWrapper``). All actions are available.
* **SMAX** (any map name of ``map_name_to_scenario``: ``3m``, ``2s3z``, ...): the learning
  agents are the allies of ``HeuristicEnemySMAX`` (the scripted enemy JaxMARL trains MAPPO
  against). ``terminated[i]`` is "ally ``i`` is dead, or the battle is decided (all allies or
  all enemies dead)"; the time limit (default 100 transitions) is ``truncated`` unless the battle
  was decided on that step (JaxMARL's own SMAX ends after 101, for the same pre-increment reason as
  MPE's: pass ``max_steps_in_episode=101`` to reproduce it). ``info["won"]``: every enemy dead and some ally alive (a draw, both
  teams wiped out on the same step, is not a win); it is the environment's ``episode_outcomes``, so
  evaluation reports a win rate (``eval_won`` in ``metrics.jsonl``, ``won_mean`` in ``summary.json``). ``action_mask`` is JaxMARL's
  ``get_avail_actions`` (dead units may only stop), ``alive`` the allies' ``unit_alive``,
  ``world_state`` JaxMARL's ``get_world_state`` (every unit's features, teams and types).

JaxMARL's package ``__init__`` imports every environment family (about 6 s, plus brax and
prints); MPE and SMAX modules are imported directly instead (``import_jaxmarl_module``).
JaxMARL is an optional dependency: ``pip install jaxmarl``.
"""

from __future__ import annotations

import importlib.util
import inspect
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlx.envs.multi_agent import MultiAgentEnv, MultiAgentParams
from rlx.envs.registry import import_env_module, import_skipping_package_init, init_keywords, keyword_names
from rlx.errors import ConfigError, UnknownNameError

spaces = import_env_module("gymnax.environments.spaces")

# MPE scenarios whose agents share their spaces: id -> (module under jaxmarl.environments.mpe, class).
MPE_ENVIRONMENTS = {
    "MPE_simple_v3": ("simple", "SimpleMPE"),
    "MPE_simple_spread_v3": ("simple_spread", "SimpleSpreadMPE"),
    "MPE_simple_reference_v3": ("simple_reference", "SimpleReferenceMPE"),
}


def import_jaxmarl_module(module_name: str) -> types.ModuleType:
    """Import one JaxMARL module without running the package ``__init__`` files above it.

    ``import jaxmarl`` imports every environment (storm, jaxnav, coin game, brax's MABrax, ...:
    about 6 s on a 2-core machine) and prints two lines.
    """
    if importlib.util.find_spec("jaxmarl") is None:
        raise ConfigError("jaxmarl is not installed; pip install jaxmarl (see pyproject.toml for the version)")
    return import_skipping_package_init(module_name)


def smax_maps() -> list[str]:
    return sorted(import_jaxmarl_module("jaxmarl.environments.smax.smax_env").MAP_NAME_TO_SCENARIO)


def make_jaxmarl(name: str, **kwargs) -> JaxMARLEnv:
    """The adapted JaxMARL environment ``name``; ``kwargs`` go to JaxMARL's constructor.

    ``name`` is an MPE id (``MPE_simple_spread_v3``, 3 agents unless ``num_agents=``) or a SMAX
    map (``3m``, ``2s3z``, ...; a ``SMAX_`` prefix is accepted), played against JaxMARL's
    heuristic enemy (``HeuristicEnemySMAX(scenario=map_name_to_scenario(map))``).
    """
    if name in MPE_ENVIRONMENTS:
        module, class_name = MPE_ENVIRONMENTS[name]
        env = getattr(import_jaxmarl_module(f"jaxmarl.environments.mpe.{module}"), class_name)(**kwargs)
        return JaxMARLEnv(env, name=name)
    map_name = name.removeprefix("SMAX_")
    maps = smax_maps()
    if map_name in maps:
        scenario = import_jaxmarl_module("jaxmarl.environments.smax.smax_env").map_name_to_scenario(map_name)
        heuristic = import_jaxmarl_module("jaxmarl.environments.smax.heuristic_enemy_smax_env")
        return JaxMARLEnv(heuristic.HeuristicEnemySMAX(scenario=scenario, **kwargs), name=f"SMAX_{map_name}")
    raise UnknownNameError("JaxMARL environment", name, [*MPE_ENVIRONMENTS, *maps])


def forwarded_options(name: str) -> list[str]:
    """The options ``make_jaxmarl(name, **options)`` passes on to JaxMARL's constructor (for the registry's
    check of ``env.options``: JaxMARL's MPE classes silently ignore keywords they do not know)."""
    if name in MPE_ENVIRONMENTS:
        module, class_name = MPE_ENVIRONMENTS[name]
        cls = getattr(import_jaxmarl_module(f"jaxmarl.environments.mpe.{module}"), class_name)
        own = keyword_names(cls.__init__)
        return own + [option for option in init_keywords(cls) if option not in own and passes_through(cls, option)]
    heuristic = import_jaxmarl_module("jaxmarl.environments.smax.heuristic_enemy_smax_env")
    smax = import_jaxmarl_module("jaxmarl.environments.smax.smax_env").SMAX  # EnemySMAX builds one of these
    own = [option for option in init_keywords(heuristic.HeuristicEnemySMAX) if option != "num_agents"]
    set_by_the_map = ("scenario", "num_allies", "num_enemies")  # a map's scenario overrides these
    return own + [option for option in init_keywords(smax)
                  if option not in own and option not in set_by_the_map and not option.startswith("smacv2_")]


def passes_through(cls, option: str) -> bool:
    """Whether ``cls(option=...)`` reaches its base class: an MPE scenario sets some of its base's keywords
    itself, and passing one of those again fails (``got multiple values``)."""
    for klass in cls.__mro__[1:]:
        parameter = inspect.signature(klass.__init__).parameters.get(option) if "__init__" in vars(klass) else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            try:
                cls(**{option: parameter.default})
            except TypeError:
                return False
            return True
    return False


@struct.dataclass
class JaxMARLParams(MultiAgentParams):
    max_steps_in_episode: int = 25


@struct.dataclass
class JaxMARLState:
    env_state: Any  # JaxMARL's state
    time: jax.Array  # int32[]: steps since the reset


def _gymnax_space(space):
    """A JaxMARL Discrete or Box space as its gymnax counterpart."""
    if hasattr(space, "n"):
        return spaces.Discrete(int(space.n))
    return spaces.Box(space.low, space.high, tuple(space.shape), jnp.float32)


def _same_space(a, b) -> bool:
    """Whether two agents' spaces are one: the same kind and size, and for boxes the same bounds."""
    same = type(a) is type(b) and getattr(a, "n", None) == getattr(b, "n", None) and tuple(a.shape) == tuple(b.shape)
    return same and all(np.array_equal(np.asarray(getattr(a, bound, 0)), np.asarray(getattr(b, bound, 0)))
                        for bound in ("low", "high"))


class JaxMARLEnv(MultiAgentEnv):
    """A JaxMARL dict environment as an rlx ``MultiAgentEnv`` (see the module docstring)."""

    def __init__(self, env, name: str | None = None):
        self.env = env
        self.agents = list(env.agents)
        self.num_agents = len(self.agents)
        self._name = name or type(env).__name__
        modules = [cls.__module__ for cls in type(env).__mro__]
        families = {m.split(".")[2] for m in modules if m.startswith("jaxmarl.environments.")}
        self.family = "mpe" if "mpe" in families else "smax" if "smax" in families else "other"
        # evaluation reports the share of episodes that ended with info["won"] (a win rate)
        self.episode_outcomes = ("won",) if self.family == "smax" else ()
        first_obs, first_action = env.observation_space(self.agents[0]), env.action_space(self.agents[0])
        for agent in self.agents[1:]:
            if not (_same_space(env.observation_space(agent), first_obs)
                    and _same_space(env.action_space(agent), first_action)):
                raise ConfigError(f"{self._name}: agents' observation or action spaces differ; the adapter needs equal ones")
        self._observation_space = _gymnax_space(first_obs)
        self._action_space = _gymnax_space(first_action)
        base = import_jaxmarl_module("jaxmarl.environments.multi_agent_env").MultiAgentEnv
        self._has_avail_actions = getattr(type(env), "get_avail_actions", None) is not base.get_avail_actions
        self._max_steps = int(getattr(env, "max_steps", 10**9))
        state = jax.eval_shape(self.reset_env, jax.random.PRNGKey(0), self.default_params)[1]
        self._world_state_dim = jax.eval_shape(self.world_state, state, self.default_params).shape[0]

    @property
    def name(self) -> str:
        return self._name

    @property
    def default_params(self) -> JaxMARLParams:
        return JaxMARLParams(max_steps_in_episode=self._max_steps)

    # -- dicts <-> arrays ---------------------------------------------------------------------------
    def _stack(self, per_agent: dict, dtype=None) -> jax.Array:
        stacked = jnp.stack([jnp.asarray(per_agent[agent]) for agent in self.agents])
        return stacked if dtype is None else stacked.astype(dtype)

    def _smax_units(self, env_state):
        """SMAX's own state (HeuristicEnemySMAX keeps it in ``.state``)."""
        return env_state.state if hasattr(env_state, "enemy_policy_state") else env_state

    def _battle(self, state: JaxMARLState):
        """(allies all dead, enemies all dead) of a SMAX state."""
        alive = self._smax_units(state.env_state).unit_alive
        allies = self.env.num_allies
        return ~jnp.any(alive[:allies]), ~jnp.any(alive[allies:])

    # -- the contract ------------------------------------------------------------------------------
    def reset_env(self, key, params):
        obs, env_state = self.env.reset(key)
        return self._stack(obs, jnp.float32), JaxMARLState(env_state=env_state, time=jnp.zeros((), jnp.int32))

    def step_env(self, key, state, actions, params):
        action_dict = {agent: actions[i] for i, agent in enumerate(self.agents)}
        obs, env_state, rewards, dones, _ = self.env.step_env(key, state.env_state, action_dict)
        new_state = JaxMARLState(env_state=env_state, time=state.time + 1)
        info = {}
        if self.family == "mpe":  # only a time limit, handled by is_truncated
            terminated = jnp.zeros(self.num_agents, bool)
        elif self.family == "smax":
            allies_dead, enemies_dead = self._battle(new_state)
            terminated = jnp.logical_or(~self.alive(new_state, params), allies_dead | enemies_dead)
            info["won"] = enemies_dead & ~allies_dead
        else:  # JaxMARL's per-agent dones; a time limit inside them cannot be told apart
            terminated = self._stack(dones, bool)
        return self._stack(obs, jnp.float32), new_state, self._stack(rewards, jnp.float32), terminated, info

    def is_truncated(self, state, params):
        at_limit = state.time >= params.max_steps_in_episode
        if self.family == "smax":  # a battle decided on the last step is terminal, not truncated
            allies_dead, enemies_dead = self._battle(state)
            at_limit = at_limit & ~(allies_dead | enemies_dead)
        return at_limit

    def world_state(self, state, params):
        if self.family != "mpe" and hasattr(self.env, "get_world_state"):
            return jnp.asarray(self.env.get_world_state(state.env_state), jnp.float32)
        return self._stack(self.env.get_obs(state.env_state), jnp.float32).reshape(-1)

    def action_mask(self, state, params):
        if self._has_avail_actions:
            return self._stack(self.env.get_avail_actions(state.env_state), bool)
        return super().action_mask(state, params)

    def alive(self, state, params):
        if self.family == "smax":
            return self._smax_units(state.env_state).unit_alive[: self.num_agents]
        return super().alive(state, params)

    def observation_space(self, params):
        return self._observation_space

    def action_space(self, params):
        return self._action_space

    def world_state_space(self, params):
        return spaces.Box(-jnp.inf, jnp.inf, (self._world_state_dim,), jnp.float32)

