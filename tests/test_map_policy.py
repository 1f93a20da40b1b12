"""The centralized map policy's decoding (rlx/agents/map_policy.py): agents deciding in rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct

from rlx.agents import map_policy as mp


def test_committed_planes_put_each_committed_agents_action_on_its_cell():
    me = np.zeros((3, 4, 5), np.float32)
    cells = [(0, 1), (2, 3), (3, 0)]
    for agent, (r, c) in enumerate(cells):
        me[agent, r, c] = 1.0
    committed, actions = jnp.array([True, False, True]), jnp.array([4, 2, 1])
    planes = np.asarray(mp.committed_planes(jnp.asarray(me), committed, actions))
    expected = np.zeros((4, 5, mp.NUM_ACTIONS), np.float32)
    expected[0, 1, 4] = expected[3, 0, 1] = 1.0  # agent 1 is not committed: nothing at (2, 3)
    np.testing.assert_array_equal(planes, expected)


def test_commit_most_confident_fixes_the_most_confident_undecided_agents():
    committed = jnp.array([[True, False, False, False, False]])
    actions = jnp.array([[3, 0, 0, 0, 0]])
    sampled = jnp.array([[1, 2, 3, 4, 1]])
    confidence = jnp.array([[0.0, -0.5, -0.1, -2.0, -0.3]])  # agent 0 is most confident but already decided
    new_committed, new_actions = mp.commit_most_confident(committed, sampled, actions, confidence, jnp.array([2]))
    np.testing.assert_array_equal(new_committed, [[True, False, True, False, True]])
    np.testing.assert_array_equal(new_actions, [[3, 0, 3, 0, 1]])  # the committed agent keeps its action


def coin_flip_pool(count: int, key) -> mp.ToyParams:
    """Two agents that could both step right; the expert moves exactly one of them, chosen by a coin."""
    starts = jnp.broadcast_to(jnp.array([[0, 0], [3, 0]]), (count, 2, 2))
    goals = jnp.broadcast_to(jnp.array([[0, 5], [3, 5]]), (count, 2, 2))
    first = jax.random.bernoulli(key, 0.5, (count,))
    actions = jnp.where(first[:, None], jnp.array([4, 0]), jnp.array([0, 4]))[:, None, :]  # [M, T=1, n]
    return mp.ToyParams(starts, goals, actions)


@pytest.mark.parametrize("rounds, lowest, highest", [(1, 0.35, 0.65), (2, 0.9, 1.0)])
def test_rounds_let_agents_coordinate_where_independent_choices_cannot(rounds, lowest, highest, optimised):
    env = mp.ToyGrid(num_agents=2)
    params = coin_flip_pool(256, jax.random.PRNGKey(0))
    config = mp.Config(total_timesteps=64 * 300, num_envs=64, num_steps=1, samples_per_episode=1,
                       channels=(32, 32, 32), lr=3e-3, decode_rounds=rounds)
    mp.validate(config)
    state, _ = jax.jit(lambda k: mp.train(config, env, params, k))(jax.random.PRNGKey(1))
    agent = mp.make(config, env, params)
    obs, _ = env.reset_to(0, None, params)
    actions = jax.jit(jax.vmap(lambda k: agent.act(state.policy, obs, k)))(jax.random.split(jax.random.PRNGKey(2), 512))
    moves = np.asarray(actions) == 4
    assert np.all((np.asarray(actions) == 0) | moves)  # the expert only ever waits or steps right
    exactly_one = float(np.mean(moves.sum(-1) == 1))
    # each agent alone moves half the time: independent choices give exactly one mover about half the time
    assert lowest <= exactly_one <= highest, exactly_one


def test_training_reads_decode_rounds_only_as_more_than_one():
    """The number of rounds is an inference choice (rlx.envs.mapf.study evaluates with its own): any count
    above one trains the same parameters, bit for bit; one round (no committed-action planes) does not."""
    env = mp.ToyGrid(num_agents=2)
    params = coin_flip_pool(32, jax.random.PRNGKey(0))
    trained = {}
    for rounds in (1, 2, 16):
        config = mp.Config(total_timesteps=16 * 5, num_envs=16, num_steps=1, samples_per_episode=1,
                           channels=(8, 8), decode_rounds=rounds)
        state, _ = jax.jit(lambda k, c=config: mp.train(c, env, params, k))(jax.random.PRNGKey(3))
        trained[rounds] = jax.tree.leaves(state.params)
    assert all(np.array_equal(a, b) for a, b in zip(trained[2], trained[16], strict=True))
    assert [a.shape for a in trained[1]] != [a.shape for a in trained[2]]
    # so a trained policy's rounds may be changed at inference, but one round stays one (no committed planes)
    assert mp.with_decode_rounds(mp.Config(decode_rounds=4), 16).decode_rounds == 16
    assert mp.with_decode_rounds(mp.Config(decode_rounds=1), 16).decode_rounds == 1


class WithoutObservations:
    """``ToyGrid`` hiding its ``observations``: training must then keep what ``step_env`` returns."""

    def __init__(self, env):
        self.num_agents, self.reset_to, self.step_env = env.num_agents, env.reset_to, env.step_env


def test_observing_only_the_sampled_steps_trains_as_observing_every_step():
    """With ``env.observations`` training observes only the steps it samples; without, every replayed step.
    Both see the same samples: the same replayed episode, and the same parameters after 5 updates."""
    env = mp.ToyGrid(num_agents=3)
    params = env.pool(jax.random.PRNGKey(1), 16, 12)
    config = mp.Config(total_timesteps=8 * 12 * 5, num_envs=8, num_steps=12, samples_per_episode=3,
                       channels=(8, 8), decode_rounds=2)
    trained, episodes = [], []
    for seen in (env, WithoutObservations(env)):
        episodes.append(mp.make(config, seen, params).replay(3, jax.random.PRNGKey(2)))
        state, _ = jax.jit(lambda k, e=seen: mp.train(config, e, params, k))(jax.random.PRNGKey(3))
        trained.append(jax.tree.leaves(state.params))
    assert episodes[0][0].shape == (12, 6, 6, 7) and np.any(np.asarray(episodes[0][3]) > 0)
    for ours, theirs in zip(episodes[0], episodes[1], strict=True):
        np.testing.assert_array_equal(ours, theirs)
    for ours, theirs in zip(trained[0], trained[1], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_decode_rounds_must_be_positive():
    with pytest.raises(ValueError, match="decode_rounds=0"):
        mp.validate(mp.Config(decode_rounds=0))


def test_training_samples_labelled_steps_up_to_the_experts_last_move():
    """``steps_worth_a_loss`` on hand-built episodes (-1 unlabelled, 0 wait, >0 a move), two agents, 5 steps."""
    W, U = 0, 1
    episodes = np.array([
        [[U, W], [W, U], [W, W], [W, W], [W, W]],      # last move at step 1: steps 0-1
        [[W, W], [W, W], [W, W], [W, W], [W, W]],      # never moves: the first step only
        [[-1, -1], [U, -1], [-1, -1], [W, U], [W, W]],  # unlabelled steps never, up to the last move at 3
        [[-1, -1], [-1, -1], [W, W], [W, W], [W, W]],  # never moves, first step unlabelled: still the first
        [[W, U], [U, W], [W, U], [U, W], [W, U]],      # moves to the end: every step
    ])
    expected = np.array([
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [0, 1, 0, 1, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ], bool)
    np.testing.assert_array_equal(np.asarray(mp.steps_worth_a_loss(jnp.asarray(episodes))), expected)


@struct.dataclass
class RelabelledPool:
    starts: jax.Array
    goals: jax.Array
    expert_actions: jax.Array  # [M, T, n], -1 where the expert was not asked
    behaviour_actions: jax.Array  # [M, T, n]


@pytest.mark.parametrize("unasked, expected", [((-1, -1), (4, 4)), ((0, 0), (0, 0)), ((0, -1), (0, 4))])
def test_steps_labelled_minus_one_never_enter_the_loss(unasked, expected, optimised):
    """Both agents step right four times; the expert labels steps 0 and 2 "right" and steps 1 and 3 with
    ``unasked`` (one label per agent). As -1 (not asked) those states get no loss term, and the policy carries
    "right" over to them; labelled "wait" (0) instead, the same states learn to wait, so the network can tell
    them apart. With one agent labelled and the other not, the step enters the loss for the labelled one
    only (a step counted whole would teach both to wait; one dropped whole, neither)."""
    env = mp.ToyGrid(num_agents=2)
    count, steps = 16, 4
    starts = jnp.broadcast_to(jnp.array([[0, 0], [3, 0]]), (count, 2, 2))
    goals = jnp.broadcast_to(jnp.array([[0, 5], [3, 5]]), (count, 2, 2))
    behaviour = jnp.full((count, steps, 2), 4)
    expert = behaviour.at[:, 1::2].set(jnp.array(unasked))
    params = RelabelledPool(starts, goals, expert, behaviour)
    config = mp.Config(total_timesteps=16 * steps * 150, num_envs=16, num_steps=steps, samples_per_episode=2,
                       channels=(32, 32, 32, 32), lr=3e-3)  # 9x9 receptive fields: each sees the goal differently
    state, metrics = jax.jit(lambda k: mp.train(config, env, params, k))(jax.random.PRNGKey(0))
    assert np.all(np.isfinite(np.asarray(metrics["loss"])))
    agent = mp.make(config, env, params)
    obs, env_state = env.reset_to(0, None, params)
    obs, *_ = env.step_env(None, env_state, jnp.array([4, 4]), params)  # the state of step 1
    np.testing.assert_array_equal(np.argmax(np.asarray(agent.logits(state.policy, obs)), -1), list(expected))


def test_the_eight_symmetries_turn_cells_and_moves_alike():
    """For every symmetry of a 5x5 map: the cell an action leads to maps to the cell the mapped action leads to
    from the mapped cell; the 8 symmetries are distinct, 0 is the identity, and ``transform_sample`` moves a
    marker plane and the agent's cell to where ``map_cells`` sends that cell."""
    size, moves = 5, mp.MOVES
    rows, cols = np.meshgrid(np.arange(1, size - 1), np.arange(1, size - 1), indexing="ij")
    rows, cols = rows.ravel(), cols.ravel()  # inner cells: every move stays on the map
    seen = set()
    for symmetry in range(8):
        permutation = np.asarray(mp.action_permutation(symmetry))
        assert sorted(permutation.tolist()) == list(range(5)) and permutation[0] == 0
        mapped = np.stack(mp.map_cells(symmetry, rows, cols, size), -1)
        for action in range(5):
            after = np.stack(mp.map_cells(symmetry, rows + moves[action, 0], cols + moves[action, 1], size), -1)
            np.testing.assert_array_equal(after, mapped + moves[permutation[action]])
        every = np.divmod(np.arange(size * size), size)
        seen.add(tuple(np.asarray(mp.map_cells(symmetry, *every, size)).ravel()))  # where every cell goes
        planes = np.zeros((size, size, 1), np.float32)
        planes[0, 1, 0] = 1.0
        turned, cells, _ = mp.transform_sample(symmetry, jnp.asarray(planes), jnp.array([1]), jnp.array([0]))
        marker = np.argwhere(np.asarray(turned)[..., 0] == 1.0)
        np.testing.assert_array_equal(marker, [np.asarray(mp.map_cells(symmetry, 0, 1, size))])
        assert int(cells[0]) == marker[0, 0] * size + marker[0, 1]  # the agent's cell moved with the planes
    assert len(seen) == 8
    np.testing.assert_array_equal(mp.action_permutation(0), np.arange(5))
    np.testing.assert_array_equal(mp.action_permutation(1), [0, 3, 4, 1, 2])  # transposed: up <-> left


def test_transform_sample_reorders_per_move_planes_and_keeps_unlabelled_agents():
    """A per-move plane group (up, down, left, right) at channel 1 follows its moves: after a quarter turn the
    value that "up" held is where the mapped move's channel is; a -1 label stays -1."""
    size = 3
    planes = np.zeros((size, size, 6), np.float32)
    planes[1, 1, 1:5] = [10, 20, 30, 40]  # up, down, left, right
    planes[1, 1, 5] = 7.0  # a scalar plane rides along unchanged
    for symmetry in range(8):
        permutation = np.asarray(mp.action_permutation(symmetry))
        turned, _, actions = mp.transform_sample(symmetry, jnp.asarray(planes), jnp.array([4, 4]),
                                                 jnp.array([2, -1]), move_planes=(1,))
        values = np.asarray(turned)[1, 1]  # the centre stays the centre
        for action in range(1, 5):
            assert values[permutation[action]] == planes[1, 1, action]
        assert values[5] == 7.0
        np.testing.assert_array_equal(actions, [permutation[2], -1])


def test_augment_needs_the_envs_move_planes():
    params = coin_flip_pool(4, jax.random.PRNGKey(0))
    config = mp.Config(total_timesteps=16, num_envs=4, num_steps=1, samples_per_episode=1, channels=(4,), augment=True)
    with pytest.raises(ValueError, match="move_planes"):
        mp.make(config, mp.ToyGrid(num_agents=2), params)  # its closer-planes are per move, and it does not say so


def test_decode_reports_the_round_in_which_each_agent_chose():
    """Each round commits the most confident share of the undecided agents (all by the last); ``decode``
    returns ``act``'s actions and each agent's round: round k holds ceil(n (k + 1) / K) - ceil(n k / K) agents."""
    env = mp.ToyGrid(size=6, num_agents=5)
    params = env.pool(jax.random.PRNGKey(0), 4, 6)
    config = mp.Config(total_timesteps=8 * 6, num_envs=8, num_steps=6, samples_per_episode=2, channels=(8,),
                       decode_rounds=3)
    agent = mp.make(config, env, params)
    policy = agent.init(jax.random.PRNGKey(1)).policy
    obs, _ = env.reset_to(0, None, params)
    for seed in range(4):
        key = jax.random.PRNGKey(seed)
        actions, rounds = agent.decode(policy, obs, key)
        np.testing.assert_array_equal(actions, agent.act(policy, obs, key))
        np.testing.assert_array_equal(np.bincount(np.asarray(rounds), minlength=3), [2, 2, 1])


def test_recorded_commitments_replace_the_random_ones_only_where_a_sample_has_them():
    batch = (None, None, jnp.array([[True, True, True], [True, True, False]]), jnp.array([[1, 2, 3], [4, 0, 2]]))
    random_commits = jnp.array([[False, True, False], [True, False, False]])
    fixed = jnp.array([[-1, -1, -1], [-1, 3, 1]])  # sample 1 recorded agents 1 and 2 (2 is inactive)
    (_, _, _, actions), committed = mp.with_recorded_commits(batch, random_commits, fixed)
    np.testing.assert_array_equal(committed, [[False, True, False], [False, True, False]])
    np.testing.assert_array_equal(actions, [[1, 2, 3], [4, 3, 1]])  # committed agents show what they chose


@struct.dataclass
class RecordedPool:
    starts: jax.Array
    goals: jax.Array
    expert_actions: jax.Array  # [M, T, n]
    committed_actions: jax.Array  # [M, T, n], -1: not committed


def test_policy_learns_to_answer_commitments_its_expert_never_makes(optimised):
    """The expert moves one of two agents right. Half the entries record agent 0 committed to "up", a move the
    expert never makes (its own label there: none), and label agent 1 "down". Trained with the records, the
    policy answers agent 0's "up" with "down" and its "right" with a wait; with the same labels but no records
    agent 0 is never committed in those entries, and "down" is not tied to its "up"."""
    env = mp.ToyGrid(num_agents=2)
    count = 256
    plain = coin_flip_pool(count, jax.random.PRNGKey(0))
    recorded = jnp.arange(count)[:, None, None] % 2 == 1
    expert = jnp.where(recorded, jnp.array([-1, 2]), plain.expert_actions)
    committed = jnp.where(recorded, jnp.array([1, -1]), -1)
    config = mp.Config(total_timesteps=64 * 300, num_envs=64, num_steps=1, samples_per_episode=1,
                       channels=(32, 32, 32), lr=3e-3, decode_rounds=2)
    obs, _ = env.reset_to(0, None, plain)
    planes, me = obs[0, ..., :-1], obs[..., -1]
    network = mp.FullyConvolutional(config.channels)
    down = {}
    for name, params in (("recorded", RecordedPool(plain.starts, plain.goals, expert, committed)),
                         ("unrecorded", mp.ToyParams(plain.starts, plain.goals, expert))):
        state, _ = jax.jit(lambda k, p=params: mp.train(config, env, p, k))(jax.random.PRNGKey(1))
        for first in (1, 4):
            fixed = mp.committed_planes(me, jnp.array([True, False]), jnp.array([first, 0]))
            logits = mp.agent_logits(network.apply(state.params, jnp.concatenate([planes, fixed], -1)), me)
            down[name, first] = float(jax.nn.softmax(logits[1])[2])
    assert down["recorded", 1] > 0.95 and down["recorded", 4] < 0.05
    assert down["unrecorded", 1] < 0.8  # about the share of entries labelled "down" (0.5): a guess, not an answer


# --------------------------------------------------------------------------- messages between agents


def two_agent_maps(key, count: int, size: int = 8):
    """``count`` maps with two agents in distinct cells: the shared plane marks occupied cells
    ``[count, size, size, 1]``, ``me [count, 2, size, size]``, and each agent's label: right (4) if the
    other agent stands in a column to its right, else left (3)."""
    cells = jax.vmap(lambda k: jax.random.choice(k, size * size, (2,), replace=False))(jax.random.split(key, count))
    me = jax.nn.one_hot(cells, size * size).reshape(count, 2, size, size)
    columns = cells % size
    labels = jnp.where(columns[:, ::-1] > columns, 4, 3)
    return jnp.sum(me, 1)[..., None], me, cells, labels


def with_random_message_output(params, key):
    """``params`` with the message's zero-initialised output layer drawn at random (it would hide the
    messages' reach at initialisation)."""
    inner = dict(params["params"]["AgentMessages_0"])
    last = max((name for name in inner if name.startswith("Dense_")), key=lambda name: int(name.split("_")[1]))
    inner[last] = {**inner[last], "kernel": jax.random.normal(key, inner[last]["kernel"].shape)}
    return {"params": {**params["params"], "AgentMessages_0": inner}}


def test_messages_ignore_agent_order_and_agents_without_a_cell():
    planes, me, _, _ = two_agent_maps(jax.random.PRNGKey(0), 4)
    net = mp.FullyConvolutional((8, 8), message_heads=2)
    params = with_random_message_output(net.init(jax.random.PRNGKey(1), planes, me), jax.random.PRNGKey(2))
    apply = jax.jit(net.apply)
    out = apply(params, planes, me)
    padded = jnp.concatenate([me[:, ::-1], jnp.zeros_like(me[:, :1])], 1)  # swapped, and a third agent off the map
    np.testing.assert_allclose(apply(params, planes, padded), out, atol=1e-5)
    without_second = apply(params, planes, me.at[:, 1].set(0.0))
    assert float(jnp.max(jnp.abs(without_second - out))) > 1e-3  # the other agent's message did matter


@pytest.mark.parametrize("heads", [0, 2])
def test_messages_reach_agents_beyond_the_convolutions_receptive_field(heads):
    me = jnp.zeros((1, 2, 9, 9)).at[0, 0, 0, 0].set(1.0).at[0, 1, 8, 8].set(1.0)  # 16 cells apart
    planes = jnp.zeros((1, 9, 9, 2)).at[..., 0].set(jnp.sum(me, 1))
    net = mp.FullyConvolutional((8, 8), message_heads=heads)
    params = net.init(jax.random.PRNGKey(0), planes, me)
    if heads:
        params = with_random_message_output(params, jax.random.PRNGKey(1))
    far = net.apply(params, planes.at[0, 8, 8, 1].set(1.0), me)[0, 0, 0]  # a plane changed at the far agent
    moved = float(jnp.max(jnp.abs(far - net.apply(params, planes, me)[0, 0, 0])))
    assert (moved > 1e-4) == bool(heads), moved  # two 3x3 layers alone see 2 cells around (0, 0)


@pytest.mark.parametrize("heads, lowest, highest", [(0, 0.0, 0.8), (2, 0.95, 1.0)])
def test_messages_learn_where_the_other_agent_stands(heads, lowest, highest):
    """Which way the other agent stands is beyond a single 3x3 layer's view; one round of messages shows it."""
    net = mp.FullyConvolutional((16,), message_heads=heads)
    planes, me, _, _ = two_agent_maps(jax.random.PRNGKey(0), 64)
    params = net.init(jax.random.PRNGKey(1), planes, me)
    optimizer = optax.adam(3e-3)

    def loss(params, planes, me, cells, labels):
        flat = net.apply(params, planes, me).reshape(planes.shape[0], -1, mp.NUM_ACTIONS)
        logits = jnp.take_along_axis(flat, cells[..., None], 1)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))

    @jax.jit
    def step(carry, key):
        params, opt_state = carry
        grads = jax.grad(loss)(params, *two_agent_maps(key, 64))
        updates, opt_state = optimizer.update(grads, opt_state)
        return (optax.apply_updates(params, updates), opt_state), None

    (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), jax.random.split(jax.random.PRNGKey(2), 400))
    planes, me, cells, labels = two_agent_maps(jax.random.PRNGKey(3), 512)
    flat = net.apply(params, planes, me).reshape(512, -1, mp.NUM_ACTIONS)
    chosen = jnp.argmax(jnp.take_along_axis(flat, cells[..., None], 1), -1)
    accuracy = float(jnp.mean(chosen == labels))
    assert lowest <= accuracy <= highest, accuracy


def test_networks_without_messages_keep_their_parameters():
    """A config without messages builds the same parameter tree as before they existed (saved runs load)."""
    planes, me, _, _ = two_agent_maps(jax.random.PRNGKey(0), 1)
    names = set(mp.FullyConvolutional((8, 8, 8)).init(jax.random.PRNGKey(0), planes, me)["params"])
    assert names == {"Dense_0", "Dense_1", "Dense_2", "Dense_3"}
    with_messages = set(mp.FullyConvolutional((8, 8, 8), 2).init(jax.random.PRNGKey(0), planes, me)["params"])
    assert with_messages == names | {"AgentMessages_0"}
