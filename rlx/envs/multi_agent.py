"""The multi-agent environment contract: gymnax-style pure functions over arrays with an agent axis.

Observations, actions, rewards and termination flags carry a leading agent
axis ``[num_agents, ...]`` (arrays, not dicts, so hundreds of agents
vectorise). Subclasses implement ``reset_env``, ``step_env``, ``world_state``
and the spaces; ``step`` adds auto-reset exactly like gymnax 1.0:

- ``terminated[i]``: agent ``i`` is finished (reached its end or died) and
  stays so until the episode resets; ``alive(state)`` says which agents still act
  (all of them by default; environments with deaths override it).
- ``truncated``: the time limit, the same for every agent (broadcast to ``[n]``).
- The episode ends when every agent is terminated or at truncation; then the
  environment resets and ``info`` keeps the pre-reset ``final_observation``
  ``[n, ...]`` and ``final_world_state``, for bootstrapping truncated values.

``action_mask(state, params)`` (``bool[n, num_actions]``) lists the actions
each agent may take; by default all of them.
``observations_of(state, params)``, where an environment can give it, lets
``step`` observe only the state it returns.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class MultiAgentParams:
    max_steps_in_episode: int = 25


class MultiAgentEnv:
    """Base class of cooperative multi-agent environments with the array-per-agent contract."""

    num_agents: int = 1

    @property
    def default_params(self) -> Any:
        return MultiAgentParams()

    @property
    def name(self) -> str:
        return type(self).__name__

    # -- what a subclass implements -------------------------------------------------------------
    def reset_env(self, key, params) -> tuple[jax.Array, Any]:
        """(observations ``[n, ...]``, state) of a new episode."""
        raise NotImplementedError

    def step_env(self, key, state, actions, params) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict]:
        """(observations, state, rewards ``[n]``, terminated ``bool[n]``, info) of one joint step."""
        raise NotImplementedError

    def world_state(self, state, params) -> jax.Array:
        """The global state a centralised critic sees (no agent axis)."""
        raise NotImplementedError

    def is_truncated(self, state, params) -> jax.Array:
        """True once the episode reached its time limit (subclasses keep a ``time`` field)."""
        return state.time >= params.max_steps_in_episode

    def observation_space(self, params):
        """One agent's observation space."""
        raise NotImplementedError

    def action_space(self, params):
        """One agent's action space."""
        raise NotImplementedError

    def world_state_space(self, params):
        raise NotImplementedError

    # -- optional ----------------------------------------------------------------------------------
    def action_mask(self, state, params) -> jax.Array:
        """``bool[n, num_actions]``: True where an agent may take the action."""
        return jnp.ones((self.num_agents, self.action_space(params).n), bool)

    def alive(self, state, params) -> jax.Array:
        """``bool[n]``: agents still acting (dead agents are masked out of losses)."""
        return jnp.ones(self.num_agents, bool)

    def observations_of(self, state, params) -> jax.Array | None:
        """The observations ``[n, ...]`` of ``state``, for environments that compute them from the state alone;
        None (the default) where they cannot.

        With them, ``step`` observes the state it returns (the continued or the fresh episode) once, instead
        of observing both and selecting: under ``vmap`` a select computes and reads both sides, which for
        large observations costs more than the step itself.
        """
        return None

    # -- the contract's calls ----------------------------------------------------------------------
    def reset(self, key, params=None):
        return self.reset_env(key, self.default_params if params is None else params)

    def step(self, key, state, actions, params=None):
        """Joint step with auto-reset; see the module docstring for the flags and ``info`` keys."""
        params = self.default_params if params is None else params
        step_key, reset_key = jax.random.split(key)
        obs_step, state_step, rewards, terminated, info = self.step_env(step_key, state, actions, params)
        truncated = jnp.broadcast_to(self.is_truncated(state_step, params), (self.num_agents,))
        episode_over = jnp.logical_or(jnp.all(terminated), truncated[0])
        obs_reset, state_reset = self.reset_env(reset_key, params)  # obs_reset is dropped when unused
        choose = lambda fresh, stepped: jax.lax.select(episode_over, fresh, stepped)  # noqa: E731
        state = jax.tree.map(choose, state_reset, state_step)
        obs = self.observations_of(state, params)
        if obs is None:
            obs = choose(obs_reset, obs_step)
        info = {**info, "final_observation": obs_step, "final_world_state": self.world_state(state_step, params),
                "episode_over": episode_over}
        return obs, state, rewards, terminated, truncated, info
