"""Coop: a tiny cooperative test environment whose optimum and "ignores teammates" bound are exact.

**The game.** ``n`` agents (``num_agents``, default 2) each hold a card in
``{0, ..., K-1}`` (``num_cards``, default 3), drawn uniformly and independently
at every step. The *team target* is the sum of all cards modulo ``K``. Each
agent names a target (``K`` actions). The shared reward of a step is
``(number of alive agents that named the team target) / n``, given to every
agent. Episodes last ``max_steps_in_episode`` (``T``, default 8) steps and are
then truncated.

**Action masks.** Every step, independently for each agent and independently
of the cards, with probability ``q = params.mask_prob`` (default 0.5) one
uniformly chosen action is disabled (``action_mask`` False). Naming a disabled
action scores nothing. The mask tells nothing about the target.

**Observations** (agent ``i``, ``n*K + 1`` floats): the one-hot of its own card,
then the one-hots of its teammates' cards in the order ``i+1, ..., i+n-1``
(mod ``n``; zeros when ``params.show_teammates`` is False), then ``time / T``.
Dead agents observe zeros. The world state is every card's one-hot in agent
order, the alive flags and ``time / T``.

**Deaths** (``params.death_prob = p``, default 0): after each step every alive
agent dies with probability ``p``; it then stays ``terminated`` (not alive),
observes zeros and scores nothing. The episode ends early if all agents die.

**Optimum.** An agent that sees all cards knows the target and scores unless
the target is its disabled action, which happens with probability ``q / K``.
Agent ``i`` is alive at decision ``t`` (0-based) with probability ``(1-p)^t``,
so the optimal expected team return (the sum of the shared rewards over an
episode) is

    R* = (1 - q/K) * sum_{t=0}^{T-1} (1-p)^t
       = (1 - 0.5/3) * 8 = 6.667                             (defaults, p = 0)
       = (5/6) * (1 - 0.9^8) / 0.1 = (5/6) * 5.6953 = 4.746  (p = 0.1)

**A policy that ignores its teammates** (whatever it sees of itself: own card,
id, time, mask, alive flag) scores at most ``B = sum_t (1-p)^t / K``. For
``n >= 2`` the sum of the teammates' cards is uniform on ``{0..K-1}`` and
independent of everything the agent sees of itself (a uniform card plus
anything independent is uniform mod ``K``; masks and deaths are drawn
independently of the cards). So given the agent's own information the team
target is uniform, and any choice -- random or not -- hits it with probability
exactly ``1/K`` (and scores only if not disabled). Hence

    B = 8 / 3 = 2.667                                        (defaults: 40% of R*)
    B = 5.6953 / 3 = 1.898                                   (p = 0.1)

which is also what a uniformly random policy over the available actions gets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlx.envs.multi_agent import MultiAgentEnv, MultiAgentParams
from rlx.envs.registry import import_env_module

spaces = import_env_module("gymnax.environments.spaces")


@struct.dataclass
class CoopParams(MultiAgentParams):
    max_steps_in_episode: int = 8
    death_prob: float = 0.0
    mask_prob: float = 0.5
    show_teammates: bool = True


@struct.dataclass
class CoopState:
    cards: jax.Array  # int32[n]
    disabled: jax.Array  # int32[n]: agent i's disabled action, or -1 when none is
    alive: jax.Array  # bool[n]
    time: jax.Array  # int32[]


class Coop(MultiAgentEnv):
    """The card-sum team game; see the module docstring for its optimum and bounds."""

    def __init__(self, num_agents: int = 2, num_cards: int = 3):
        if num_agents < 2:
            raise ValueError(f"num_agents={num_agents!r}: must be >= 2 (teammates are what the game is about)")
        if num_cards < 2:
            raise ValueError(f"num_cards={num_cards!r}: must be >= 2")
        self.num_agents = num_agents
        self.num_cards = num_cards

    @property
    def default_params(self) -> CoopParams:
        return CoopParams()

    # -- exact figures (see the module docstring) ---------------------------------------------
    def expected_alive_steps(self, params: CoopParams) -> float:
        """sum_{t<T} (1-p)^t: an agent's expected number of decisions in an episode."""
        p, horizon = float(params.death_prob), int(params.max_steps_in_episode)
        return float(horizon) if p == 0 else (1.0 - (1.0 - p) ** horizon) / p

    def optimal_return(self, params: CoopParams) -> float:
        return (1.0 - float(params.mask_prob) / self.num_cards) * self.expected_alive_steps(params)

    def teammate_blind_bound(self, params: CoopParams) -> float:
        return self.expected_alive_steps(params) / self.num_cards

    # -- dynamics -------------------------------------------------------------------------------
    def _draw(self, key, alive, time, params):
        card_key, mask_key, which_key = jax.random.split(key, 3)
        cards = jax.random.randint(card_key, (self.num_agents,), 0, self.num_cards)
        masked = jax.random.bernoulli(mask_key, params.mask_prob, (self.num_agents,))
        disabled = jnp.where(masked, jax.random.randint(which_key, (self.num_agents,), 0, self.num_cards), -1)
        return CoopState(cards=cards, disabled=disabled, alive=alive, time=jnp.asarray(time, jnp.int32))

    def target(self, state: CoopState) -> jax.Array:
        return state.cards.sum() % self.num_cards

    def get_obs(self, state: CoopState, params: CoopParams) -> jax.Array:
        n, k = self.num_agents, self.num_cards
        one_hot = jax.nn.one_hot(state.cards, k)  # [n, K]
        # Row i: agent i's card, then i+1, ..., i+n-1 (mod n).
        order = (jnp.arange(n)[:, None] + jnp.arange(n)[None, :]) % n
        cards = one_hot[order]  # [n, n, K]
        teammates = cards[:, 1:] * jnp.asarray(params.show_teammates, jnp.float32)
        time = jnp.full((n, 1), state.time / params.max_steps_in_episode, jnp.float32)
        obs = jnp.concatenate([cards[:, 0], teammates.reshape(n, -1), time], -1)
        return obs * state.alive[:, None]

    def reset_env(self, key, params):
        state = self._draw(key, jnp.ones(self.num_agents, bool), 0, params)
        return self.get_obs(state, params), state

    def step_env(self, key, state, actions, params):
        draw_key, death_key = jax.random.split(key)
        actions = jnp.asarray(actions, jnp.int32)
        scored = state.alive & (actions != state.disabled) & (actions == self.target(state))
        reward = jnp.full(self.num_agents, scored.sum() / self.num_agents, jnp.float32)
        dies = jax.random.bernoulli(death_key, params.death_prob, (self.num_agents,))
        alive = state.alive & ~dies
        new_state = self._draw(draw_key, alive, state.time + 1, params)
        return self.get_obs(new_state, params), new_state, reward, ~alive, {}

    def world_state(self, state, params):
        cards = jax.nn.one_hot(state.cards, self.num_cards).reshape(-1)
        time = jnp.asarray(state.time / params.max_steps_in_episode, jnp.float32)[None]
        return jnp.concatenate([cards, state.alive.astype(jnp.float32), time])

    def action_mask(self, state, params):
        return jnp.arange(self.num_cards)[None, :] != state.disabled[:, None]

    def alive(self, state, params):
        return state.alive

    # -- spaces ----------------------------------------------------------------------------------
    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (self.num_agents * self.num_cards + 1,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(self.num_cards)

    def world_state_space(self, params):
        return spaces.Box(0.0, 1.0, (self.num_agents * self.num_cards + self.num_agents + 1,), jnp.float32)
