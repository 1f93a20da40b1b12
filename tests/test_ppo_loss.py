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
    targets = np.array([0.0, 0.0], np.float32)
    total, terms = ppo.ppo_loss_terms(config, zeros, zeros, zeros, value, zeros, advantages, targets)
    assert terms["policy_loss"] == pytest.approx(0.0, abs=1e-5)  # ratio 1: -mean(normalised A) = 0
    assert terms["value_loss"] == pytest.approx(0.5 * (1 + 4) / 2)
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
