"""The straight-line threefry lowering on the CPU: the same random bits as JAX's rolled loop, no loop."""

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir
from jax._src.random import threefry2x32 as threefry

from rlx.runner import fast_random


def draws(key):
    """A bit of everything RL code asks jax.random for, in shapes a rollout uses."""
    keys = jax.random.split(key, 5)
    return {
        "split": jax.random.split(keys[0], 4),
        "fold_in": jax.random.fold_in(keys[0], 7),
        "uniform": jax.random.uniform(keys[1], (4, 3), minval=-0.05, maxval=0.05),
        "normal": jax.random.normal(keys[2], (64,)),
        "categorical": jax.random.categorical(keys[3], jnp.log(jnp.array([[0.1, 0.2, 0.7]] * 256))),
        "permutation": jax.random.permutation(keys[4], 512),
        "bits": jax.random.bits(keys[4], (1000,)),
    }


def compiled(key):
    """A fresh jit of ``draws``, lowered under the lowering registered now, and its HLO text."""
    program = jax.jit(lambda k: draws(k)).lower(key).compile()
    return program, program.as_text()


def test_same_bits_without_the_rolled_loop():
    key = jax.random.PRNGKey(20261201)
    # JAX's own CPU lowering (a five-round loop per hash), whether or not this process switched already
    mlir.register_lowering(threefry.threefry2x32_p, threefry._threefry2x32_cpu_lowering_rule, platform="cpu")
    rolled, rolled_text = compiled(key)
    assert "while" in rolled_text
    expected = jax.device_get(rolled(key))

    assert fast_random.use_straight_line_threefry()
    straight, straight_text = compiled(key)
    assert "while" not in straight_text
    got = jax.device_get(straight(key))
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert len(np.unique(got["permutation"])) == 512 and got["categorical"].mean() > 1.4  # real draws (mean 1.6)


def test_newer_jax_keeps_the_rolled_loop(monkeypatch):
    """jax 0.11's CPU compiler is slow on the straight-line rounds: a newer release is left as it is."""
    key = jax.random.PRNGKey(7)
    mlir.register_lowering(threefry.threefry2x32_p, threefry._threefry2x32_cpu_lowering_rule, platform="cpu")
    monkeypatch.setattr(fast_random, "jax_release", lambda: (0, 11))
    assert not fast_random.use_straight_line_threefry()
    assert "while" in compiled(key)[1]
    monkeypatch.setattr(fast_random, "jax_release", lambda: fast_random.NEWEST_MEASURED_JAX)
    assert fast_random.use_straight_line_threefry()
    assert "while" not in compiled(key)[1]
