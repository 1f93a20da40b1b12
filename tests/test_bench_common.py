"""The benchmark scripts' shared helpers (scripts/bench_common.py): median-run selection and the checksum."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_common import action_rollout, checksum, median_run, random_rollout  # noqa: E402


def test_median_run_keeps_one_run_whole():
    # Per-field medians would give run_s 2.0 (from b) with total_s 4.0 (from a): "other" = -1.
    runs = [dict(name="a", reach_s=3.0, run_s=1.0, total_s=4.0),
            dict(name="b", reach_s=5.0, run_s=2.0, total_s=6.0),
            dict(name="c", reach_s=4.0, run_s=3.0, total_s=3.5)]
    chosen = median_run(runs, "reach_s")
    assert chosen["name"] == "c"
    assert (chosen["run_s"], chosen["total_s"]) == (3.0, 3.5)
    assert (chosen["repeats"], chosen["missing"]) == (3, 0)
    assert "repeats" not in runs[2]  # the inputs are left as they were


def test_median_run_even_count_takes_lower_middle_and_none_sorts_last():
    runs = [dict(name="a", reach_s=None), dict(name="b", reach_s=2.0),
            dict(name="c", reach_s=1.0), dict(name="d", reach_s=3.0)]
    chosen = median_run(runs, "reach_s")
    assert chosen["name"] == "b"  # sorted: c (1), b (2), d (3), a (never reached)
    assert chosen["missing"] == 1
    assert median_run([dict(reach_s=None), dict(reach_s=None)], "reach_s")["reach_s"] is None
    assert median_run([dict(steps_per_s=7.0)], "steps_per_s")["steps_per_s"] == 7.0
    with pytest.raises(ValueError):
        median_run([], "reach_s")


def test_checksum_reads_every_leaf():
    tree = {"obs": jnp.ones((2, 3)), "done": jnp.array([True, False]), "count": jnp.array(4, jnp.int32),
            "key": jax.random.key(0), "nested": (jnp.full(2, 0.5),)}
    key_sum = float(jax.random.key_data(jax.random.key(0)).astype(jnp.float32).sum())
    assert float(checksum(tree)) == pytest.approx(6 + 1 + 4 + key_sum + 1)
    # under jit the scalar depends on every leaf: a change in any of them changes it
    assert float(jax.jit(checksum)(dict(tree, done=jnp.array([True, True])))) == pytest.approx(7 + 1 + 4 + key_sum + 1)


class _Counter:
    """A toy environment whose observation is ``[state, 10 * state]``: the second entry is work a rollout
    that read only each observation's first entry would let the compiler drop."""

    def reset(self, key, params):
        return jnp.zeros(2), jnp.zeros(())

    def step(self, key, state, action, params):
        state = state + action
        return jnp.stack([state, 10.0 * state]), state, jnp.zeros(()), jnp.asarray(False), {"extra": 2.0 * state}


def test_random_rollout_sums_every_observation_entry_reward_flag_info_and_the_final_state():
    # 2 envs, 3 steps, action 1 each step: states 1, 2, 3. Per env and step: obs s + 10 s, info 2 s (the
    # reward and the done flag are 0), so 13 * (1 + 2 + 3) per env; the final states add 3 each.
    rollout = random_rollout(_Counter(), None, batch=2, steps=3, sample_actions=lambda key: jnp.ones(2))
    assert float(jax.jit(rollout)(jax.random.PRNGKey(0))) == pytest.approx(2 * (13 * 6 + 3))


def test_action_rollout_steps_through_the_given_actions():
    # 2 envs, 3 steps with actions 1, 2, 3 (the same for both): states 1, 3, 6; per env 13 * 10 + 6.
    actions = jnp.repeat(jnp.arange(1.0, 4.0)[:, None], 2, axis=1)
    rollout = action_rollout(_Counter(), None, batch=2)
    assert float(jax.jit(rollout)(jax.random.PRNGKey(0), actions)) == pytest.approx(2 * (13 * 10 + 6))
