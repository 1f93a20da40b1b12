"""PPO's loss terms against a hand computation on a two-sample batch."""

import math

import jax
import numpy as np
import pytest

from rlx.agents import ppo


@pytest.mark.parametrize("jit", [False, True])
def test_loss_terms_by_hand(jit):
    config = ppo.Config(clip_eps=0.2, vf_clip_eps=0.5, vf_coef=0.5, ent_coef=0.01, normalize_advantages=False)
    log_prob = np.array([math.log(1.5), math.log(0.5)], np.float32)  # ratios 1.5 and 0.5
    old_log_prob = np.zeros(2, np.float32)
    entropy = np.array([0.6, 0.8], np.float32)
    value = np.array([2.0, 0.0], np.float32)
    old_value = np.array([1.0, 0.5], np.float32)
    advantages = np.array([1.0, -2.0], np.float32)
    targets = np.array([3.0, 1.0], np.float32)

    fn = jax.jit(ppo.ppo_loss_terms, static_argnums=0) if jit else ppo.ppo_loss_terms
    total, terms = fn(config, log_prob, old_log_prob, entropy, value, old_value, advantages, targets)

    # Sample 1: ratio 1.5, A=+1 -> min(1.5, 1.2) = 1.2. Sample 2: ratio 0.5, A=-2 -> min(-1.0, -1.6) = -1.6.
    policy_loss = -(1.2 + -1.6) / 2
    # Value clipping to old +- 0.5: sample 1 -> 1.5, errors max(1, 2.25) = 2.25; sample 2 -> 0.0, max(1, 1) = 1.
    value_loss = 0.5 * (2.25 + 1.0) / 2
    entropy_mean = 0.7
    expected_total = policy_loss + 0.5 * value_loss - 0.01 * entropy_mean
    assert terms["policy_loss"] == pytest.approx(policy_loss, abs=1e-6)
    assert terms["value_loss"] == pytest.approx(value_loss, abs=1e-6)
    assert terms["entropy"] == pytest.approx(entropy_mean, abs=1e-6)
    assert total == pytest.approx(expected_total, abs=1e-6)
    assert terms["clip_fraction"] == pytest.approx(1.0)  # both ratios are outside [0.8, 1.2]
    kl = ((1.5 - 1) - math.log(1.5) + (0.5 - 1) - math.log(0.5)) / 2
    assert terms["approx_kl"] == pytest.approx(kl, abs=1e-6)


def test_advantage_normalisation_and_unclipped_value_loss():
    config = ppo.Config(clip_value_loss=False, normalize_advantages=True, ent_coef=0.0, vf_coef=1.0)
    zeros = np.zeros(2, np.float32)
    advantages = np.array([3.0, 5.0], np.float32)  # normalise to -1, +1
    value = np.array([1.0, 2.0], np.float32)
    targets = np.array([3.0, 3.0], np.float32)  # old values 0: clipped to 0.2 they would miss by 2.8
    total, terms = ppo.ppo_loss_terms(config, zeros, zeros, zeros, value, zeros, advantages, targets)
    assert terms["policy_loss"] == pytest.approx(0.0, abs=1e-5)  # ratio 1: -mean(normalised A) = 0
    assert terms["value_loss"] == pytest.approx(0.5 * (4 + 1) / 2)
    clipped = ppo.ppo_loss_terms(config.replace(clip_value_loss=True), zeros, zeros, zeros, value, zeros, advantages,
                                 targets)[1]["value_loss"]
    assert clipped == pytest.approx(0.5 * 2.8**2)
    assert total == pytest.approx(terms["policy_loss"] + terms["value_loss"])


def test_running_stats_match_numpy():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)).astype(np.float32) for n in (5, 17, 8)]
    stats = ppo.RunningStats.create((3,))
    for batch in batches:
        stats = stats.update(batch)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(stats.var, everything.var(0), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["ppo", "ppo_rnn", "a2c"])
def test_annealed_learning_rate_stops_at_zero_when_training_runs_past_its_budget(name):
    """``train(..., num_updates=N)`` may run past ``config.num_updates`` (vendored use): the annealed rate
    reaches 0 there and stays, instead of turning negative (which would climb the loss)."""
    from gymnax.environments.classic_control.cartpole import CartPole

    from rlx.agents import a2c, ppo_rnn

    module = {"ppo": ppo, "ppo_rnn": ppo_rnn, "a2c": a2c}[name]
    minibatches = {} if name == "a2c" else {"num_minibatches": 2}
    config = module.Config(total_timesteps=4 * 4 * 8, num_envs=4, num_steps=8, lr=1e-3, hidden_sizes=(8,), **minibatches)
    assert config.num_updates == 4
    env = CartPole()
    _, metrics = module.train(config, env, env.default_params, jax.random.PRNGKey(0), num_updates=6)
    np.testing.assert_allclose(metrics["learning_rate"], [1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0, 0.0], atol=1e-9)
