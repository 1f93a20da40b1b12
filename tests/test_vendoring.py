"""Each agent file runs alone: copied into an empty folder, it imports no rlx module and trains."""

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import FAST_COMPILE_FLAGS, ROOT, TEST_CACHE
from rlx.runner import compile_cache

AGENT_FILES = sorted((ROOT / "rlx" / "agents").glob("[!_]*.py"))
ALLOWED = {"jax", "flax", "optax", "distrax", "chex", "numpy", "__future__", "dataclasses", "typing", "functools",
           "argparse", "time", "math", "os"}


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda p: p.name)
def test_agent_imports_only_allowed_modules(path):
    imported = set(re.findall(r"^\s*(?:from|import)\s+([\w]+)", path.read_text(), flags=re.M))
    # gymnax appears only inside the file's own command-line demo, as the environment to train on.
    assert imported - ALLOWED - {"gymnax"} == set(), imported - ALLOWED


# file -> (timesteps for its demo, final train return it must beat; a random policy is far below)
DEMOS = {
    "a2c.py": (60000, 150.0),  # CartPole: random averages about 22
    "cpl.py": (1000, 200.0),  # CartPole from oracle preferences on an erring controller's data: BC-all about 100
    "dreamer.py": (5120, 100.0),  # CartPole from 5,120 real steps, actor-critic in imagination: random about 22
    "dyna_ppo.py": (3072, 100.0),  # CartPole from 3,072 real steps, PPO on imagined rollouts: random about 22
    "map_policy.py": (20480, 0.9),  # toy MAPF imitation accuracy: chance 0.2
    "mappo.py": (20480, 5.0),  # built-in card game: optimum 6.67, random or teammate-blind 2.67
    "ppo.py": (40960, 150.0),  # CartPole
    "ppo_rnn.py": (20480, 0.9),  # MemoryChain: chance is 0, the maximum 1
    "pref_ppo.py": (61440, 100.0),  # CartPole from 100 oracle preferences (no true reward): random about 22
}
# Demos that take far longer than the fast suite's ~30 s per test (dreamer's: about two minutes)
# train to their threshold as `slow`; the fast suite runs them alone with these arguments, to the
# end, compiled with the fast-compile XLA flags of the rest of the suite.
SHORT_DEMOS = {"dreamer.py": ("--timesteps", "64", "--small")}
# The demos compile as a user's do (XLA's defaults; their bare environment does not inherit the suite's
# fast-compile XLA_FLAGS), on the suite's persistent cache: with the cache warm that took the seven
# demos measured one by one on 2 cores from 76 s to 52 s (cpl 16 s to 10 s, pref_ppo 14 s to 9 s);
# with it cold, the slower compiles cost about as much again.


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda p: p.name)
def test_validate_answers_zero_or_negative_counts_with_a_value_error(path):
    """Each integer field set to 0 or -1 is either allowed or refused by ``validate`` with a ``ValueError`` naming a
    field: never a ``ZeroDivisionError`` from a derived count (the runner turns only ``ValueError`` into a one-line
    config error)."""
    agent = importlib.import_module(f"rlx.agents.{path.stem}")
    default = agent.Config()
    counts = [f.name for f in dataclasses.fields(default)
              if isinstance(getattr(default, f.name), int) and not isinstance(getattr(default, f.name), bool)]
    assert counts
    for name in counts:
        for value in (0, -1):
            try:
                agent.validate(default.replace(**{name: value}))
            except ValueError as error:
                assert re.match(r"\w+=", str(error)), (name, value, error)


def test_every_agent_file_has_a_demo():
    assert {p.name for p in AGENT_FILES} <= set(DEMOS), "add the new agent's demo budget to DEMOS"


def jax_cache_env() -> dict:
    """The suite's persistent compile cache as JAX's own environment variables, which the demo reads without
    any rlx code: on a warm cache each demo skips its compiles (dyna_ppo's took 29 s without, 20 s with)."""
    return {name.upper(): str(value) for name, value in compile_cache.cache_settings(TEST_CACHE).items()}


def run_alone(tmp_path, name, args, xla_flags=None):
    """Copy one agent file into an empty folder and run its demo there with a bare environment."""
    shutil.copy(ROOT / "rlx" / "agents" / name, tmp_path / name)
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "HOME": str(tmp_path), **jax_cache_env()}
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    done = subprocess.run([sys.executable, name, *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return float(re.search(r"final train return\s+(-?[\d.]+|nan)", done.stdout).group(1)), done.stdout


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SHORT_DEMOS else [])
                                  for n in sorted(DEMOS)])
def test_agent_file_trains_alone(tmp_path, name):
    timesteps, threshold = DEMOS[name]
    final, stdout = run_alone(tmp_path, name, ("--timesteps", str(timesteps)))
    assert final > threshold, stdout


@pytest.mark.parametrize("name", sorted(SHORT_DEMOS))
def test_slow_agent_file_runs_alone_to_the_end(tmp_path, name):
    # With XLA_FLAGS already set, as a user's may be: the demo adds its scheduler workaround to them.
    final, stdout = run_alone(tmp_path, name, SHORT_DEMOS[name], xla_flags=" ".join(FAST_COMPILE_FLAGS))
    assert np.isfinite(final), stdout
