"""MAPPO (rlx/agents/mappo.py): ordering of the env and agent axes, value normalisation, action masks,
returns, config checks, the group-relative baseline, and learning on Coop where teammates matter."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from rlx.agents import mappo
from rlx.envs.coop import Coop
from rlx.envs.multi_agent import MultiAgentEnv, MultiAgentParams
from rlx.runner.evaluation import evaluate, is_multi_agent

# --------------------------------------------------------------------------- a marker environment
# Every (episode, agent, time) carries a distinct, predictable signature, so any
# transposition of the env and agent axes anywhere in the pipeline shows.

N_AGENTS, N_ACTIONS, HORIZON = 3, 4, 5


@struct.dataclass
class MarkerState:
    marker: jax.Array  # float: an integer in [1, 1000) drawn per episode
    alive: jax.Array  # bool[n]
    time: jax.Array


def death_time(marker, agent):
    """Agent ``agent`` is alive while ``time < death_time`` (1..4, so some agents die before the horizon of 5)."""
    return 1 + (marker.astype(jnp.int32) + agent) % 4


class MarkerEnv(MultiAgentEnv):
    """obs_i = [marker, i, time, 1] (zeros once dead); world = [marker, time, alive count];
    reward_i = marker + 0.1 i + 0.01 time; only action (marker + i + time) % 4 is available."""

    num_agents = N_AGENTS

    @property
    def default_params(self):
        return MultiAgentParams(max_steps_in_episode=HORIZON)

    def obs(self, state):
        agents = jnp.arange(N_AGENTS, dtype=jnp.float32)
        rows = jnp.stack([jnp.full(N_AGENTS, state.marker), agents, jnp.full(N_AGENTS, state.time * 1.0),
                          jnp.ones(N_AGENTS)], -1)
        return rows * state.alive[:, None]

    def reset_env(self, key, params):
        marker = jax.random.randint(key, (), 1, 1000).astype(jnp.float32)
        state = MarkerState(marker, jnp.ones(N_AGENTS, bool), jnp.asarray(0, jnp.int32))
        return self.obs(state), state

    def step_env(self, key, state, actions, params):
        reward = state.marker + 0.1 * jnp.arange(N_AGENTS) + 0.01 * state.time
        time = state.time + 1
        alive = state.alive & (time < death_time(state.marker, jnp.arange(N_AGENTS)))
        new_state = MarkerState(state.marker, alive, time)
        return self.obs(new_state), new_state, reward.astype(jnp.float32), ~alive, {}

    def world_state(self, state, params):
        return jnp.stack([state.marker, state.time * 1.0, state.alive.sum() * 1.0])

    def action_mask(self, state, params):
        available = (state.marker.astype(jnp.int32) + jnp.arange(N_AGENTS) + state.time) % N_ACTIONS
        return jnp.arange(N_ACTIONS)[None, :] == available[:, None]

    def alive(self, state, params):
        return state.alive

    def action_space(self, params=None):
        return type("Discrete", (), {"n": N_ACTIONS})()


def marker_reference(traj_first_obs_marker, steps, envs, horizon=HORIZON):
    """NumPy simulation of MarkerEnv given each episode's marker (read where the episode starts)."""
    ref = {name: np.zeros((steps, envs, N_AGENTS, dim)) for name, dim in
           [("obs", 4), ("world", 3), ("final_obs", 4), ("final_world", 3)]}
    flat = {name: np.zeros((steps, envs, N_AGENTS)) for name in
            ["alive", "reward", "terminated", "done", "action", "final_alive"]}
    reset = np.zeros((steps, envs), bool)
    for e in range(envs):
        time, alive = 0, np.ones(N_AGENTS, bool)
        for t in range(steps):
            if time == 0:
                marker, alive, reset[t, e] = traj_first_obs_marker(t, e), np.ones(N_AGENTS, bool), True
            next_time = time + 1
            next_alive = alive & np.array([next_time < 1 + (int(marker) + i) % 4 for i in range(N_AGENTS)])
            over = (not next_alive.any()) or next_time >= horizon
            for i in range(N_AGENTS):
                ref["obs"][t, e, i] = np.array([marker, i, time, 1.0]) * alive[i]
                ref["world"][t, e, i] = [marker, time, alive.sum()]
                ref["final_obs"][t, e, i] = np.array([marker, i, next_time, 1.0]) * next_alive[i]
                ref["final_world"][t, e, i] = [marker, next_time, next_alive.sum()]
                flat["alive"][t, e, i] = alive[i]
                flat["final_alive"][t, e, i] = next_alive[i]
                flat["reward"][t, e, i] = marker + 0.1 * i + 0.01 * time
                flat["terminated"][t, e, i] = not next_alive[i]
                flat["done"][t, e, i] = (not next_alive[i]) or over
                flat["action"][t, e, i] = (int(marker) + i + time) % N_ACTIONS
            time, alive = (0, np.ones(N_AGENTS, bool)) if over else (next_time, next_alive)
    return ref, flat, reset


def gae_reference(rewards, values, next_values, terminated, done, gamma, lam):
    """Per (env, agent) sequence: A_t = sum_l (gamma lam)^l delta_{t+l}, stopping at the sequence's end."""
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    for index in np.ndindex(rewards.shape[1:]):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for u in range(t, steps):
                bootstrap = 0.0 if terminated[(u, *index)] else gamma * next_values[(u, *index)]
                total += weight * (rewards[(u, *index)] + bootstrap - values[(u, *index)])
                if done[(u, *index)]:
                    break
                weight *= gamma * lam
            advantages[(t, *index)] = total
    return advantages, advantages + values


def random_policy(agent, scale=1.0, seed=0, stats=None):
    """A policy with random flat parameters (no orthogonal initialisation to compile)."""
    size = jax.eval_shape(agent.init, jax.random.PRNGKey(0)).params.shape
    params = scale * jax.random.normal(jax.random.PRNGKey(seed), size)
    return mappo.Policy(params, stats or mappo.RunningStats.create())


# --------------------------------------------------------------------------- ordering


def critic_values(agent, policy, ref, flat, reset, recurrent):
    """The critic's values of the states acted in and of the states reached (before any auto-reset), from
    the public value functions on the reference inputs; recurrent: a step at a time from the rollout's resets,
    each state reached read with the memory left after its step."""
    alive, final_alive = flat["alive"].astype(bool), flat["final_alive"].astype(bool)
    world, final_world = ref["world"][:, :, 0], ref["final_world"][:, :, 0]
    if not recurrent:
        value = jax.jit(agent.value)
        return value(policy, ref["obs"], world, alive), value(policy, ref["final_obs"], final_world, final_alive)
    step = jax.jit(agent.value)
    carry, values, next_values = agent.init_carry(reset.shape[1]), [], []
    for t in range(reset.shape[0]):
        carry, acted_in = step(policy, carry, ref["obs"][t], world[t], reset[t], alive[t])
        _, reached = step(policy, carry, ref["final_obs"][t], final_world[t], np.zeros_like(reset[t]), final_alive[t])
        values.append(acted_in)
        next_values.append(reached)
    return np.stack(values), np.stack(next_values)


@pytest.mark.parametrize("horizon, recurrent", [(HORIZON, False), (3, False), (3, True)])
def test_rollout_keeps_every_env_and_agent_position_aligned(horizon, recurrent):
    """Observations, world states (critic inputs), masks/actions, rewards, dones, resets, values, bootstrap
    values and advantages of each (time, env, agent) agree with a per-episode NumPy simulation of the marker
    environment; at horizon 3 some agents' episodes are cut by the time limit (their values bootstrapped)."""
    env = MarkerEnv()
    params = MultiAgentParams(max_steps_in_episode=horizon)
    steps, envs = 12, 4
    config = mappo.Config(num_envs=envs, num_steps=steps, total_timesteps=envs * steps, hidden_sizes=(16,),
                          num_minibatches=2, num_epochs=1, gamma=0.9, gae_lambda=0.8, recurrent=recurrent, gru_size=8)
    assert is_multi_agent(env)
    agent = mappo.make(config, env, params)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    state, traj = jax.jit(agent.collect)(state)
    value_stats, batch = jax.jit(agent.prepare)(state, traj)
    markers = np.asarray(traj.actor_in[:, :, 0, 0])  # agent 0's view; agent 0 is alive at every episode start
    ref, flat, reset = marker_reference(lambda t, e: markers[t, e], steps, envs, horizon)
    assert len(set(markers[0])) == envs  # distinct episodes in every env
    assert reset[1:].any()  # episodes end (and restart) inside the rollout

    ids = np.broadcast_to(np.eye(N_AGENTS), (steps, envs, N_AGENTS, N_AGENTS))
    np.testing.assert_allclose(traj.actor_in, np.concatenate([ref["obs"], ids], -1))
    # Centralised critic: world state + id; a dead agent gets zeros + its id.
    alive = flat["alive"][..., None]
    np.testing.assert_allclose(traj.critic_in, np.concatenate([ref["world"] * alive, ids], -1))
    np.testing.assert_array_equal(traj.alive, flat["alive"].astype(bool))
    np.testing.assert_array_equal(traj.action, flat["action"])  # the only available action, everywhere
    np.testing.assert_allclose(traj.reward, flat["reward"], rtol=1e-6)
    np.testing.assert_array_equal(traj.terminated, flat["terminated"])
    np.testing.assert_array_equal(traj.done, flat["done"])
    np.testing.assert_array_equal(traj.reset, reset)

    # Values from the public value functions on the reference inputs; advantages from a per-sequence NumPy GAE.
    values, next_values = critic_values(agent, state.policy, ref, flat, reset, recurrent)
    np.testing.assert_allclose(traj.value, values, rtol=1e-5, atol=1e-5)
    # Episodes cut by the horizon, not by the agent's end: the rollout kept the value of the state reached.
    cut = flat["done"].astype(bool) & ~flat["terminated"].astype(bool)
    assert cut.any() == (horizon < 4)
    np.testing.assert_allclose(traj.bootstrap_value, np.where(cut, next_values, 0.0), rtol=1e-5, atol=1e-5)
    want_adv, want_targets = gae_reference(flat["reward"], np.asarray(values), np.asarray(next_values),
                                           flat["terminated"], flat["done"], 0.9, 0.8)
    np.testing.assert_allclose(batch.advantage, want_adv, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(batch.target, want_targets, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(batch.weight, flat["alive"].astype(bool))  # dead agents: no loss
    # Value normalisation: the statistics absorbed the targets of alive agents only.
    targets = want_targets[flat["alive"].astype(bool)]
    np.testing.assert_allclose(value_stats.mean, targets.mean(), rtol=1e-4)
    np.testing.assert_allclose(value_stats.var, targets.var(), rtol=1e-3)


@pytest.mark.parametrize("recurrent", [False, True])
def test_unrolled_rollout_collects_the_same_transitions(recurrent):
    """``rollout_unroll`` (env steps per loop iteration, a speed knob) changes no transition, also when it
    does not divide ``num_steps``, with sampled actions and episodes ending inside the rollout."""
    env = Coop()
    params = env.default_params
    trajectories = []
    for unroll in (1, 5):
        config = mappo.Config(num_envs=4, num_steps=12, total_timesteps=48, hidden_sizes=(16,), recurrent=recurrent,
                              gru_size=8, num_minibatches=2, rollout_unroll=unroll)
        agent = mappo.make(config, env, params)
        state = jax.jit(agent.init)(jax.random.PRNGKey(3))
        trajectories.append(jax.jit(agent.collect)(state)[1])
    assert np.asarray(trajectories[0].done).any()
    for first, unrolled in zip(jax.tree.leaves(trajectories[0]), jax.tree.leaves(trajectories[1])):
        np.testing.assert_allclose(first, unrolled, rtol=1e-6, atol=1e-6)


def test_layers_after_the_gru_are_trained_and_replayed_consistently():
    """``post_gru_sizes`` (JaxMARL's MAPPO has a Dense 128 after its GRU): the layers sit between GRU and
    output in actor and critic, and learning replays the rollout's outputs exactly (at lr 0: ratio 1)."""
    env = Coop()
    params = env.default_params
    config = mappo.Config(num_envs=4, num_steps=12, total_timesteps=48, hidden_sizes=(16,), recurrent=True,
                          gru_size=8, post_gru_sizes=(6,), num_minibatches=2, num_epochs=1, lr=1e-12)
    agent = mappo.make(config, env, params)
    state = jax.jit(agent.init)(jax.random.PRNGKey(3))
    without = jax.jit(mappo.make(config.replace(post_gru_sizes=()), env, params).init)(jax.random.PRNGKey(3))
    # Per branch a Dense 8 -> 6 (54 parameters); the heads read 6 units instead of 8 (actor 3 actions, critic 1).
    assert state.params.size - without.params.size == 2 * 54 - 2 * 3 - 2 * 1
    _, metrics = jax.jit(agent.update)(state)
    assert float(metrics["approx_kl"]) < 1e-6, metrics


def test_gru_input_projection_inside_or_before_the_scan_learns_the_same(monkeypatch):
    """Where the GRU's input projection runs during replay (a speed choice by size) changes no number."""
    env = Coop()
    config = mappo.Config(num_envs=4, num_steps=12, total_timesteps=48, hidden_sizes=(16,), recurrent=True,
                          gru_size=8, num_minibatches=2)
    updated = []
    for threshold in (0, 2**62):
        monkeypatch.setattr(mappo, "PROJECTION_IN_SCAN_BYTES", threshold)
        agent = mappo.make(config, env, env.default_params)
        state, metrics = jax.jit(agent.update)(jax.jit(agent.init)(jax.random.PRNGKey(3)))
        updated.append((state.params, metrics["value_loss"]))
    np.testing.assert_allclose(updated[0][0], updated[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(updated[0][1], updated[1][1], rtol=1e-5)


@pytest.mark.parametrize("recurrent", [False, True])
def test_minibatches_keep_fields_and_carries_aligned(recurrent):
    steps, envs, n, minibatches = 6, 8, 3, 4
    t, e, i = np.meshgrid(np.arange(steps), np.arange(envs), np.arange(n), indexing="ij")
    code = jnp.asarray(10000 * t + 100 * e + i, jnp.float32)  # [T, E, n]
    features = jnp.stack([code, -code], -1)
    batch = mappo.Batch(actor_in=features, critic_in=features + 0.5, mask=features, weight=code, reset=code[..., 0],
                        action=code, log_prob=code, value=code, advantage=code, target=code)
    carries = (jnp.asarray(100 * e[0] + i[0], jnp.float32)[..., None], jnp.asarray(100 * e[0] + i[0] + 0.5)[..., None])
    mb, mb_carries = jax.jit(mappo.make_minibatches, static_argnums=(3, 4))(
        batch, carries, jax.random.PRNGKey(3), minibatches, recurrent)
    row = mb.reset[..., None] + jnp.arange(n)  # what every per-agent field must hold: its (time, env) code + agent
    for name in ("weight", "action", "log_prob", "value", "advantage", "target"):
        np.testing.assert_array_equal(getattr(mb, name), row, err_msg=name)
    np.testing.assert_array_equal(mb.actor_in[..., 0], row)
    np.testing.assert_array_equal(mb.actor_in[..., 1], -row)
    np.testing.assert_array_equal(mb.critic_in[..., 0], row + 0.5)
    if recurrent:
        # [M, T, E/M, n]: whole sequences in time order, starting from their own env's carries.
        assert mb.reset.shape == (minibatches, steps, envs // minibatches)
        env_code = np.asarray(mb.reset) % 10000  # 100 * env, constant along each sequence
        np.testing.assert_array_equal(env_code, np.broadcast_to(env_code[:, :1], env_code.shape))
        np.testing.assert_array_equal(np.asarray(mb.reset) // 10000,
                                      np.broadcast_to(np.arange(steps)[None, :, None], env_code.shape))
        np.testing.assert_array_equal(mb_carries[0][..., 0], env_code[:, 0, :, None] + np.arange(n))
        np.testing.assert_array_equal(mb_carries[1][..., 0], env_code[:, 0, :, None] + np.arange(n) + 0.5)
    else:
        assert mb.reset.shape == (minibatches, steps * envs // minibatches)
    # Un-batching: every (time, env) appears exactly once.
    np.testing.assert_array_equal(np.sort(np.asarray(mb.reset).ravel()), np.sort(np.asarray(code[..., 0]).ravel()))


def test_recurrent_resets_restart_every_agent_of_that_env_only():
    env = Coop(3, 3)
    params = env.default_params
    config = mappo.Config(recurrent=True, gru_size=8, hidden_sizes=(8,), num_envs=2, num_minibatches=2)
    agent = mappo.make(config, env, params)
    policy = random_policy(agent)
    rng = np.random.default_rng(0)
    obs = rng.random((2, 3, env.observation_space(params).shape[0]), np.float32)
    world = rng.random((2, env.world_state_space(params).shape[0]), np.float32)
    old, zeros = rng.normal(size=(2, 3, 8)).astype(np.float32), np.zeros((2, 3, 8), np.float32)
    key = jax.random.PRNGKey(4)
    act = jax.jit(lambda carry, reset: agent.act(policy, carry, obs, reset, key, True))
    value = jax.jit(lambda carry, reset: agent.value(policy, carry, obs, world, reset))
    fresh, _ = act(zeros, np.zeros(2, bool))
    mixed, _ = act(old, np.array([True, False]))
    np.testing.assert_allclose(mixed[0], fresh[0], atol=1e-6)  # env 0: all three agents start over
    assert np.abs(np.asarray(mixed[1] - fresh[1])).max(-1).min() > 1e-3  # env 1: every agent keeps its memory
    # Per-agent flags work too.
    per_agent, _ = act(old, np.array([[True, False, True], [False, False, False]]))
    np.testing.assert_allclose(per_agent[0, ::2], fresh[0, ::2], atol=1e-6)
    assert np.abs(np.asarray(per_agent[0, 1] - fresh[0, 1])).max() > 1e-3
    # The critic's memory resets the same way.
    critic_fresh, v_fresh = value(zeros, np.zeros(2, bool))
    critic_mixed, v_mixed = value(old, np.array([True, False]))
    np.testing.assert_allclose(critic_mixed[0], critic_fresh[0], atol=1e-6)
    np.testing.assert_allclose(v_mixed[0], v_fresh[0], atol=1e-5)
    assert np.abs(np.asarray(critic_mixed[1] - critic_fresh[1])).max(-1).min() > 1e-3
    assert agent.init_carry().shape == (3, 8) and agent.init_carry(2).shape == (2, 3, 8)


# --------------------------------------------------------------------------- value normalisation


def test_running_value_statistics_match_numpy_with_dead_agents_left_out():
    rng = np.random.default_rng(0)
    stats, seen = mappo.RunningStats.create(), []
    update = jax.jit(lambda s, x, w: s.update(x, w))
    for size in (7, 1, 33, 12):
        batch = rng.normal(3.0, 2.0, size=(size, 3)).astype(np.float32)
        alive = rng.random((size, 3)) < 0.7
        stats = update(stats, batch, alive)
        seen.append(batch[alive])
        reference = np.concatenate(seen)
        # The prior (mean 0, var 1, count 1e-4) weighs 1e-4 of a sample.
        np.testing.assert_allclose(stats.mean, reference.mean(), rtol=1e-4)
        np.testing.assert_allclose(stats.var, reference.var(), rtol=1e-4)
        np.testing.assert_allclose(stats.count, reference.size + 1e-4, rtol=1e-6)
    x = jnp.asarray(rng.normal(size=5), jnp.float32)
    np.testing.assert_allclose(stats.denormalize(stats.normalize(x)), x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.normalize(x), (x - reference.mean()) / reference.std(), rtol=1e-3, atol=1e-4)
    # A batch where everyone is dead changes nothing.
    unchanged = update(stats, jnp.ones((4, 3)), jnp.zeros((4, 3), bool))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), unchanged, stats)


def test_value_is_the_denormalised_critic_output_and_dead_agents_see_only_their_id():
    env = Coop(2, 3)
    params = env.default_params
    config = mappo.Config(hidden_sizes=(8,))
    stats = mappo.RunningStats(jnp.asarray(3.0), jnp.asarray(4.0), jnp.asarray(10.0))
    normalised_agent = mappo.make(config, env, params)
    raw_agent = mappo.make(config.replace(normalize_values=False), env, params)
    policy = random_policy(normalised_agent, 0.3, stats=stats)
    rng = np.random.default_rng(0)
    obs, world, other_world = rng.random((5, 2, 7), np.float32), rng.random((5, 9), np.float32), \
        rng.random((5, 9), np.float32)
    alive = np.array([True, False])
    values = jax.jit(lambda world: (normalised_agent.value(policy, obs, world, alive),
                                    raw_agent.value(policy, obs, world, alive)))
    normalised, raw = values(world)
    np.testing.assert_allclose(normalised, raw * np.sqrt(4.0 + 1e-8) + 3.0, rtol=1e-5, atol=1e-5)
    again, _ = values(other_world)
    np.testing.assert_allclose(again[:, 1], normalised[:, 1], rtol=1e-6)  # dead: the state does not matter
    assert np.abs(np.asarray(again[:, 0] - normalised[:, 0])).max() > 1e-4


class GridCoop(Coop):
    """The same game with each agent's observation as a one-row grid ``[n, 1, d]``."""

    def reset_env(self, key, params):
        obs, state = super().reset_env(key, params)
        return obs[:, None], state

    def step_env(self, key, state, actions, params):
        obs, *rest = super().step_env(key, state, actions, params)
        return (obs[:, None], *rest)

    def observation_space(self, params):
        space = super().observation_space(params)
        return type(space)(space.low, space.high, (space.shape[0], 1, *space.shape[1:]), space.dtype)


@pytest.mark.parametrize("recurrent", [False, True])
def test_value_without_alive_flags_counts_every_agent_alive_for_grid_observations(recurrent):
    env = GridCoop(2, 3)
    params = env.default_params
    agent = mappo.make(mappo.Config(hidden_sizes=(8,), recurrent=recurrent, gru_size=8), env, params)
    policy = agent.init(jax.random.PRNGKey(0)).policy
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(jax.random.PRNGKey(1), 3), params)
    world = jax.vmap(env.world_state, (0, None))(state, params)
    alive = jnp.ones((3, 2), bool)
    if recurrent:
        carry, reset = agent.init_carry(3), jnp.zeros(3, bool)
        _, given = agent.value(policy, carry, obs, world, reset, alive)
        _, default = agent.value(policy, carry, obs, world, reset)
    else:
        given, default = agent.value(policy, obs, world, alive), agent.value(policy, obs, world)
    assert given.shape == default.shape == (3, 2)
    np.testing.assert_array_equal(default, given)


def test_value_clip_is_centred_on_the_critics_output_when_it_acted():
    """With lr=0, one epoch and one minibatch the critic never moves, so clipping its loss changes nothing,
    although the first update moves the running statistics a long way (mean 0 -> about 0.6)."""
    env = Coop(2, 3)
    config = mappo.Config(num_envs=16, num_steps=32, hidden_sizes=(16,), gamma=0.9, lr=0.0, num_epochs=1,
                          num_minibatches=1)
    losses = {}
    for clip in (False, True):
        agent = mappo.make(config.replace(clip_value_loss=clip), env, env.default_params)
        state = agent.init(jax.random.PRNGKey(0))
        new_state, metrics = jax.jit(agent.update)(state)
        assert abs(float(new_state.value_stats.mean) - float(state.value_stats.mean)) > 0.1
        losses[clip] = float(metrics["value_loss"])
    assert losses[True] == pytest.approx(losses[False], rel=1e-5), losses


# --------------------------------------------------------------------------- action masks


def test_sampled_and_greedy_actions_are_always_available():
    env = Coop(3, 4)
    params = env.default_params
    agent = mappo.make(mappo.Config(hidden_sizes=(16,)), env, params)
    envs, keys = 16, 2000
    rng = np.random.default_rng(0)
    obs = rng.random((envs, 3, env.observation_space(params).shape[0]), np.float32)
    mask = rng.random((envs, 3, 4)) < 0.4
    mask[:, :, 0] |= ~mask.any(-1)  # at least one available action
    mask[0, 0] = np.arange(4) == 2  # a single available action
    sample = jax.jit(jax.vmap(lambda policy, k: agent.act(policy, obs, k, False, mask), in_axes=(None, 0)))
    greedy = jax.jit(lambda policy, mask: agent.act(policy, obs, jax.random.PRNGKey(0), True, mask))
    key_batch = jax.random.split(jax.random.PRNGKey(3), keys)
    for scale in (0.3, 3.0):  # near-uniform and sharp random policies
        policy = random_policy(agent, scale)
        actions = np.asarray(sample(policy, key_batch))  # [keys, envs, 3]
        available = np.take_along_axis(np.broadcast_to(np.asarray(mask), (keys, envs, 3, 4)), actions[..., None], -1)
        assert available.all(), scale
        assert (actions[:, 0, 0] == 2).all()
        chosen = np.asarray(greedy(policy, mask))
        assert np.take_along_axis(np.asarray(mask), chosen[..., None], -1).all()
        if scale > 1:  # the sharp policy's own favourites are often masked: the mask is doing the work
            favourite = np.asarray(greedy(policy, np.ones_like(mask)))
            assert not np.take_along_axis(np.asarray(mask), favourite[..., None], -1).all()
        else:  # the mask removes actions without collapsing the rest: each available one comes up
            seen = np.stack([(actions == a).any(0) for a in range(4)], -1)
            np.testing.assert_array_equal(seen, np.asarray(mask))
    dist = mappo.masked_policy(jnp.zeros((2, 3)), jnp.array([[True, False, True], [False, False, True]]))
    np.testing.assert_array_equal(jax.nn.softmax(dist.logits), [[0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(dist.entropy(), [np.log(2), 0.0], atol=1e-6)


# --------------------------------------------------------------------------- returns


@pytest.mark.parametrize("jit", [False, True])
def test_gae_matches_numpy_per_env_and_agent_with_termination_and_truncation(jit):
    rng = np.random.default_rng(0)
    steps, envs, n, gamma, lam = 10, 2, 3, 0.97, 0.9
    rewards, values, next_values = (rng.normal(size=(steps, envs, n)).astype(np.float32) for _ in range(3))
    terminated = np.zeros((steps, envs, n), np.float32)
    truncated = np.zeros((steps, envs, n), np.float32)
    terminated[3:, 0, 1] = 1  # agent 1 of env 0 dies at step 3 and stays terminated
    truncated[5, 1, :] = 1  # env 1 hits its time limit at step 5: every agent
    terminated[7, 0, :] = 1  # env 0: all agents done at step 7
    done = np.maximum(terminated, truncated)
    fn = jax.jit(mappo.gae) if jit else mappo.gae
    adv, targets = fn(rewards, values, next_values, terminated, done, gamma, lam)
    want_adv, want_targets = gae_reference(rewards, values, next_values, terminated, done, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, want_targets, rtol=1e-5, atol=1e-5)
    # Truncation bootstraps, termination does not.
    assert adv[5, 1, 0] == pytest.approx(rewards[5, 1, 0] + gamma * next_values[5, 1, 0] - values[5, 1, 0], abs=1e-5)
    assert adv[3, 0, 1] == pytest.approx(rewards[3, 0, 1] - values[3, 0, 1], abs=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_group_relative_advantage_matches_numpy(jit):
    rng = np.random.default_rng(1)
    steps, envs, n, group, gamma = 6, 6, 2, 3, 0.9
    rewards = rng.normal(size=(steps, envs, n)).astype(np.float32)
    done = (rng.random((steps, envs, n)) < 0.2).astype(np.float32)
    alive = rng.random((steps, envs, n)) < 0.8
    returns_fn = jax.jit(mappo.discounted_returns) if jit else mappo.discounted_returns
    relative_fn = jax.jit(mappo.group_relative_advantages, static_argnums=2) if jit else mappo.group_relative_advantages
    returns = np.asarray(returns_fn(rewards, done, gamma))
    want = np.zeros_like(rewards)
    for index in np.ndindex(envs, n):  # reward-to-go inside the episode, cut at the rollout's end
        following = 0.0
        for t in reversed(range(steps)):
            following = rewards[(t, *index)] + gamma * (1 - done[(t, *index)]) * following
            want[(t, *index)] = following
    np.testing.assert_allclose(returns, want, rtol=1e-5, atol=1e-5)
    adv = np.asarray(relative_fn(jnp.asarray(returns), jnp.asarray(alive), group))
    for t, e, i in np.ndindex(steps, envs, n):
        members = range(e // group * group, e // group * group + group)
        alive_members = [m for m in members if alive[t, m, i]]
        baseline = np.mean([returns[t, m, i] for m in alive_members]) if alive_members else 0.0
        assert adv[t, e, i] == pytest.approx(returns[t, e, i] - baseline, abs=1e-5)


def test_group_baseline_shares_environment_randomness_inside_groups_only():
    env = Coop(2, 3)
    config = mappo.Config(baseline="group", group_size=4, num_envs=8, num_steps=6, hidden_sizes=(8,),
                          num_minibatches=2, total_timesteps=48)
    mappo.validate(config)
    agent = mappo.make(config, env, env.default_params)
    state, traj = jax.jit(lambda k: agent.collect(agent.init(k)))(jax.random.PRNGKey(0))
    cards = np.asarray(traj.actor_in[..., :3])  # each agent's own card, [T, E, n, 3]
    groups = cards.reshape(6, 2, 4, 2, 3)
    np.testing.assert_array_equal(groups, np.broadcast_to(groups[:, :, :1], groups.shape))  # same draws in a group
    assert not np.array_equal(groups[:, 0], groups[:, 1])  # different groups, different draws
    assert not np.array_equal(traj.action[:, 0], traj.action[:, 1])  # but each rollout samples its own actions
    assert np.asarray(traj.value).sum() == 0.0  # critic-free


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(lr=0.0), "lr=0.0: must be > 0"),
        (dict(gamma=1.5), "gamma=1.5: must be in"),
        (dict(num_envs=4, num_steps=10, num_minibatches=3), r"num_minibatches=3: must divide num_envs\*num_steps=40"),
        (dict(recurrent=True, num_envs=6, num_minibatches=4), "num_minibatches=4: must divide num_envs=6"),
        (dict(baseline="value"), r"baseline='value': must be one of \['critic', 'group'\]"),
        (dict(baseline="group", group_size=1), "group_size=1: must be >= 2"),
        (dict(baseline="group", num_envs=12, group_size=8), "group_size=8: must divide num_envs=12"),
        (dict(gru_size=0), "gru_size=0: must be >= 1"),
        (dict(post_gru_sizes=(8,)), r"post_gru_sizes=\(8,\): every width must be an integer >= 1, with recurrent=true"),
        (dict(rollout_unroll=0), "rollout_unroll=0: must be >= 1"),
        (dict(hidden_sizes=(16, 0)), r"hidden_sizes=\(16, 0\): every width must be an integer >= 1"),
        (dict(activation="sigmoid"), "activation='sigmoid': must be one of"),
        (dict(total_timesteps=100, num_envs=4, num_steps=64), "total_timesteps=100: must be >= one batch"),
    ],
)
def test_validate_names_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        mappo.validate(mappo.Config(**overrides))


def test_default_config_is_valid_and_numeric_fields_are_traced():
    mappo.validate(mappo.Config())
    leaves = jax.tree.leaves(mappo.Config())
    assert len(leaves) == 9  # lr, gamma, gae_lambda, clip_eps, vf_clip_eps, ent_coef, vf_coef, max_grad_norm, adam_eps


# --------------------------------------------------------------------------- learning on Coop

COOP = Coop(2, 3)
# Deaths on, so death masking is exercised. Expected alive decisions per agent: (1 - 0.9^8) / 0.1 = 5.695;
# optimum 5.695 * (1 - 0.5/3) = 4.746; teammate-blind bound 5.695 / 3 = 1.898 (see rlx/envs/coop.py).
COOP_PARAMS = COOP.default_params.replace(death_prob=0.1)
# ReLU and an entropy bonus of 0.05: with tanh and 0.01, about 1 seed in 10 locks one of the nine card pairs onto a
# wrong target (the sum mod 3 is XOR-like, and once the right target's probability is ~0 nobody samples it).
LEARN_CONFIG = mappo.Config(total_timesteps=16 * 32 * 40, num_envs=16, num_steps=32, lr=3e-3, gamma=0.9,
                            ent_coef=0.05, activation="relu", hidden_sizes=(64, 64))
EVAL_EPISODES = 1024


@jax.jit
def coop_update(config, env_params, state):
    """One update; config and env params are traced, so lr=0 or hidden teammates reuse the compiled program."""
    return mappo.make(config, COOP, env_params).update(state)


@jax.jit
def coop_evaluate(env_params, policy, key):
    agent = mappo.make(LEARN_CONFIG, COOP, env_params)
    return evaluate(agent, COOP, env_params, policy, key, EVAL_EPISODES, True, COOP_PARAMS.max_steps_in_episode)


@jax.jit
def coop_init(env_params, key):
    return mappo.make(LEARN_CONFIG, COOP, env_params).init(key)


def train_coop(show_teammates: bool):
    params = COOP_PARAMS.replace(show_teammates=show_teammates)
    state = coop_init(params, jax.random.PRNGKey(0))
    for _ in range(LEARN_CONFIG.num_updates):
        state, metrics = coop_update(LEARN_CONFIG, params, state)
    returns = coop_evaluate(params, state.policy, jax.random.PRNGKey(1))
    return state, metrics, float(returns.mean()), params


@pytest.fixture(scope="module")
def trained_coop():
    return train_coop(True)


def test_mappo_reaches_the_optimum_and_a_teammate_blind_policy_cannot(trained_coop):
    optimum, bound = COOP.optimal_return(COOP_PARAMS), COOP.teammate_blind_bound(COOP_PARAMS)
    assert optimum == pytest.approx(5.6953279 * 5 / 6) and bound == pytest.approx(1.8984426)
    _, metrics, mappo_return, _ = trained_coop
    _, _, blind_return, _ = train_coop(False)  # the same agent, teammates' cards hidden from it
    print(f"coop: MAPPO {mappo_return:.3f}, teammate-blind {blind_return:.3f}; optimum {optimum:.3f}, "
          f"blind bound {bound:.3f}")
    assert mappo_return >= 0.95 * optimum
    assert blind_return <= bound + 0.2  # 1024 episodes: standard error about 0.04
    assert float(metrics["train_return"]) > 0.8 * optimum
    assert 0 < float(metrics["alive_fraction"]) < 1  # agents died, and were masked


def test_learning_replay_reproduces_rollout_log_probs(trained_coop):
    """With lr=0 the minibatches re-read exactly what the rollout acted on: ratio 1 for every sample."""
    state, _, _, params = trained_coop
    _, metrics = coop_update(LEARN_CONFIG.replace(lr=0.0), params, state)
    assert float(metrics["approx_kl"]) < 1e-6 and float(metrics["clip_fraction"]) == 0.0, metrics


# --------------------------------------------------------------------------- slower variants


def train_variant(config, params, updates, seed=0):
    agent = mappo.make(config, COOP, params)
    update = jax.jit(agent.update)
    state = jax.jit(agent.init)(jax.random.PRNGKey(seed))
    for _ in range(updates):
        state, metrics = update(state)
    returns = jax.jit(lambda p, k: evaluate(agent, COOP, params, p, k, EVAL_EPISODES, True))(
        state.policy, jax.random.PRNGKey(1))
    return agent, state, float(returns.mean())


@pytest.mark.slow
@pytest.mark.parametrize("variant", [dict(recurrent=True, gru_size=32), dict(baseline="group"),
                                     dict(centralized_critic=False)], ids=["gru", "group", "ippo"])
def test_variants_reach_near_the_optimum(variant):
    config = LEARN_CONFIG.replace(**variant, total_timesteps=16 * 32 * 60)
    mappo.validate(config)
    params = COOP.default_params
    agent, state, mean = train_variant(config, params, config.num_updates)
    print(f"coop {variant}: {mean:.3f} (optimum 6.667, blind bound 2.667)")
    assert mean >= 0.95 * COOP.optimal_return(params)
    if config.recurrent:  # replay through the GRU with the stored carries and resets: ratio 1
        _, metrics = jax.jit(mappo.make(config.replace(lr=0.0), COOP, params).update)(state)
        assert float(metrics["approx_kl"]) < 1e-6, metrics


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib.util").util.find_spec("jaxmarl") is None, reason="jaxmarl is not installed")
@pytest.mark.parametrize("preset", ["mappo_smax_3m", "mappo_mpe_spread"])
def test_jaxmarl_presets_run_with_a_tiny_budget(run_cli, tmp_path, preset):
    """The GPU-sized SMAX preset and the MPE preset compose, compile and train end to end on the CPU."""
    import json

    done = run_cli(f"+exp={preset}", "algo.total_timesteps=1024", "algo.num_envs=8", "algo.num_steps=64",
                   "algo.num_minibatches=2", "run.num_seeds=1", "run.eval_episodes=2", "logger=none",
                   "run.checkpoint_every_chunks=0", timeout=900)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps_per_seed"] == 1024
    assert np.isfinite(summary["final_eval"]["return_mean"])
    if "smax" in preset:  # the win rate: a share of the evaluation episodes, per seed and in every record
        assert 0.0 <= summary["final_eval"]["won_mean"] <= 1.0 and len(summary["final_eval"]["won_per_seed"]) == 1
        records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert all("eval_won" in r for r in records if "eval_return" in r)
