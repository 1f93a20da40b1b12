"""The model-based market-making problem as a gymnax environment.

One episode is a trading horizon ``T`` cut into ``max_steps_in_episode`` steps of
``dt = T / max_steps_in_episode``. At each step the agent posts a bid at depth
``delta_b`` below the mid price and an ask at depth ``delta_a`` above it. Then,
in this order (the order the Avellaneda-Stoikov simulations use):

1. Market orders arrive on each side: a market sell order (which would hit our
   bid) with probability ``lambda_b * dt``, a market buy order with
   ``lambda_a * dt``. ``lambda`` is the constant ``arrival_rate`` (Poisson) or
   ``arrival_rate`` plus a self-exciting part (Hawkes: each arrival adds
   ``hawkes_jump``, which decays at rate ``hawkes_decay``).
2. An arrival fills our quote with probability ``exp(-fill_decay * depth)``, so
   a quote fills with probability ``min(1, lambda * dt * exp(-k * depth))``;
   one uniform draw per side decides both arrival and fill. A bid fill buys one
   unit at ``mid - delta_b``, an ask fill sells one at ``mid + delta_a``. At the
   inventory limit the side that would exceed it does not fill.
3. The mid price moves: Brownian (``drift * dt + sigma * sqrt(dt) * N(0, 1)``),
   Ornstein-Uhlenbeck (mean-reverting to ``s0`` at rate ``ou_rate``), or
   Brownian plus Gaussian jumps arriving at rate ``jump_rate``.

Reward: the change of marked-to-market wealth ``cash + inventory * mid``, minus
a running inventory penalty ``inventory_penalty * q^2 * dt`` (q before the
step's fills), minus ``terminal_penalty * q_T^2`` at the last step. With both
penalties 0 it is the plain mark-to-market PnL; with them it is the objective
the Cartea-Jaimungal optimum maximises. The episode terminates (not
truncates) at ``T``: the value depends on the time left.

Observation: ``[t / T, q / max_inventory, (mid - s0) / (sigma * sqrt(T))]``.
Actions: the two depths (``actions="continuous"``, a Box of
``[0, max_depth]`` for learning agents; the dynamics accept any real depth, a
negative one filling as if at depth 0 or better), or an index into a grid of
``depth_levels`` x ``depth_levels`` depth pairs spread evenly over
``[0, max_depth]`` (``actions="discrete"``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlx.envs.registry import import_env_module
from rlx.errors import ConfigError

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")

PRICE_PROCESSES = ("brownian", "ou", "jump")
ARRIVAL_PROCESSES = ("poisson", "hawkes")
ACTION_KINDS = ("continuous", "discrete")


@struct.dataclass
class QuotingState(environment.EnvState):
    mid: jax.Array
    inventory: jax.Array  # float32 holding an integer
    cash: jax.Array
    excitation: jax.Array  # [2]: Hawkes excitation of sell (hits our bid) and buy (lifts our ask) arrivals
    time: int


@struct.dataclass
class QuotingParams(environment.EnvParams):
    """Defaults are the Avellaneda-Stoikov paper's simulation (S0=100, T=1, sigma=2, 200 steps, A=140, k=1.5)."""

    s0: float = 100.0
    sigma: float = 2.0
    drift: float = 0.0
    horizon: float = 1.0
    max_steps_in_episode: int = 200
    arrival_rate: float = 140.0  # A: market orders per unit time on each side (the Hawkes baseline)
    fill_decay: float = 1.5  # k: an arrival fills a quote at depth d with probability exp(-k d)
    max_inventory: float = 50.0
    max_depth: float = 4.0  # upper end of the action range
    inventory_penalty: float = 0.0  # phi: running penalty phi * q^2 * dt
    terminal_penalty: float = 0.0  # alpha: alpha * q_T^2 at the horizon
    price_process: int = 0  # index into PRICE_PROCESSES
    ou_rate: float = 1.0
    jump_rate: float = 0.0
    jump_std: float = 1.0
    arrival_process: int = 0  # index into ARRIVAL_PROCESSES
    hawkes_jump: float = 0.0
    hawkes_decay: float = 1.0


def _choice(field: str, value, valid: tuple[str, ...]) -> int:
    if isinstance(value, str):
        if value not in valid:
            raise ConfigError(f"env.params.{field}: unknown value {value!r}; valid: {', '.join(valid)}")
        return valid.index(value)
    if not 0 <= int(value) < len(valid):
        raise ConfigError(f"env.params.{field}: index {value} out of range; valid: {', '.join(valid)} (or 0-{len(valid) - 1})")
    return int(value)


class QuotingEnv(environment.Environment):
    """Single-asset quoting with fills ``~ exp(-k * depth)``: the Avellaneda-Stoikov / Cartea-Jaimungal model."""

    def __init__(self, actions: str = "continuous", depth_levels: int = 8):
        super().__init__()
        if actions not in ACTION_KINDS:
            raise ConfigError(f"env.options.actions: unknown value {actions!r}; valid: {', '.join(ACTION_KINDS)}")
        if depth_levels < 2:
            raise ConfigError(f"env.options.depth_levels: {depth_levels} must be >= 2")
        self.actions = actions
        self.depth_levels = depth_levels

    @property
    def default_params(self) -> QuotingParams:
        return QuotingParams()

    def check_params(self, params: QuotingParams) -> QuotingParams:
        """Accept process names (``price_process="ou"``) and reject values the dynamics cannot use."""
        params = params.replace(
            price_process=_choice("price_process", params.price_process, PRICE_PROCESSES),
            arrival_process=_choice("arrival_process", params.arrival_process, ARRIVAL_PROCESSES),
        )
        positive = ("sigma", "horizon", "max_steps_in_episode", "arrival_rate", "fill_decay", "max_inventory", "max_depth")
        for field in positive:
            if not getattr(params, field) > 0:
                raise ConfigError(f"env.params.{field}: {getattr(params, field)} must be > 0")
        events = {"arrival_rate": params.arrival_rate}
        if params.arrival_process == ARRIVAL_PROCESSES.index("hawkes"):
            if not 0 <= params.hawkes_jump < params.hawkes_decay:
                raise ConfigError(f"env.params.hawkes_jump: {params.hawkes_jump} must be >= 0 and below hawkes_decay "
                                  f"({params.hawkes_decay}), or the arrivals excite themselves without bound")
            stationary = params.arrival_rate * params.hawkes_decay / (params.hawkes_decay - params.hawkes_jump)
            events = {"arrival_rate (its stationary Hawkes mean)": stationary}
        if params.price_process == PRICE_PROCESSES.index("jump"):
            events["jump_rate"] = params.jump_rate
        for name, per_unit_time in events.items():  # one Bernoulli draw a step stands for at most one event
            if per_unit_time * params.horizon / params.max_steps_in_episode > 1:
                raise ConfigError(
                    f"env.params.max_steps_in_episode: {name} * dt must be <= 1 (at most one event per step, or "
                    f"the draws saturate); use at least {int(per_unit_time * params.horizon) + 1} steps"
                )
        return params

    def reset_env(self, key, params: QuotingParams):
        state = QuotingState(
            mid=jnp.asarray(params.s0, jnp.float32),
            inventory=jnp.zeros((), jnp.float32),
            cash=jnp.zeros((), jnp.float32),
            excitation=jnp.zeros(2, jnp.float32),
            time=0,
        )
        return self.get_obs(state, params), state

    def depths(self, action, params: QuotingParams) -> jax.Array:
        """``[bid depth, ask depth]`` for an action of this environment's kind."""
        if self.actions == "continuous":
            return jnp.asarray(action, jnp.float32).reshape(2)
        grid = jnp.linspace(0.0, params.max_depth, self.depth_levels)
        return jnp.stack([grid[action // self.depth_levels], grid[action % self.depth_levels]])

    def step_env(self, key, state: QuotingState, action, params: QuotingParams):
        dt = params.horizon / params.max_steps_in_episode
        fill_key, price_key = jax.random.split(key)
        depth = self.depths(action, params)
        intensity = params.arrival_rate + state.excitation
        uniform = jax.random.uniform(fill_key, (2,))
        arrived = uniform < intensity * dt
        filled = uniform < intensity * dt * jnp.exp(-params.fill_decay * depth)
        room = jnp.stack([state.inventory < params.max_inventory, state.inventory > -params.max_inventory])
        bid_fill, ask_fill = (filled & room).astype(jnp.float32)
        inventory = state.inventory + bid_fill - ask_fill
        cash = state.cash - bid_fill * (state.mid - depth[0]) + ask_fill * (state.mid + depth[1])
        excitation = state.excitation * jnp.exp(-params.hawkes_decay * dt) + params.hawkes_jump * arrived * (
            params.arrival_process == 1
        )
        mid = next_mid(price_key, state.mid, params, dt)
        time = state.time + 1
        terminated = time >= params.max_steps_in_episode
        wealth_change = (cash + inventory * mid) - (state.cash + state.inventory * state.mid)
        reward = (
            wealth_change
            - params.inventory_penalty * state.inventory**2 * dt
            - terminated * params.terminal_penalty * inventory**2
        )
        new_state = QuotingState(mid=mid, inventory=inventory, cash=cash, excitation=excitation, time=time)
        info = {
            "inventory": inventory,
            "wealth": cash + inventory * mid,
            "bid_fill": bid_fill,
            "ask_fill": ask_fill,
            "spread": depth[0] + depth[1],
            "mid": mid,
        }
        return self.get_obs(new_state, params), new_state, reward.astype(jnp.float32), terminated, info

    def get_obs(self, state: QuotingState, params: QuotingParams, key=None) -> jax.Array:
        return jnp.stack(
            [
                state.time / params.max_steps_in_episode,
                state.inventory / params.max_inventory,
                (state.mid - params.s0) / (params.sigma * jnp.sqrt(params.horizon)),
            ]
        ).astype(jnp.float32)

    def is_terminated(self, state: QuotingState, params: QuotingParams) -> jax.Array:
        return state.time >= params.max_steps_in_episode

    def action_space(self, params: QuotingParams | None = None):
        params = params or self.default_params
        if self.actions == "discrete":
            return spaces.Discrete(self.depth_levels**2)
        return spaces.Box(0.0, params.max_depth, (2,), jnp.float32)

    def observation_space(self, params: QuotingParams):
        return spaces.Box(-jnp.inf, jnp.inf, (3,), jnp.float32)


def next_mid(key, mid, params: QuotingParams, dt):
    """The mid price one step of ``dt`` later under ``params.price_process``."""
    noise_key, jump_key, size_key = jax.random.split(key, 3)
    diffusion = params.sigma * jnp.sqrt(dt) * jax.random.normal(noise_key)
    jumped = jax.random.uniform(jump_key) < params.jump_rate * dt
    jump = jumped * params.jump_std * jax.random.normal(size_key)
    brownian = mid + params.drift * dt + diffusion
    ornstein_uhlenbeck = mid + params.ou_rate * (params.s0 - mid) * dt + diffusion
    return jnp.select(
        [params.price_process == 1, params.price_process == 2],
        [ornstein_uhlenbeck, brownian + jump],
        brownian,
    )
