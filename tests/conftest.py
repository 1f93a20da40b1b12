"""Test settings: JAX on the CPU with rlx's XLA flags and a persistent compile cache."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("RLX_TEST_CACHE", ROOT / ".pytest_cache" / "jax_cache"))

from rlx.runner import compile_cache  # noqa: E402

compile_cache.set_xla_flags()
compile_cache.enable(TEST_CACHE)


@pytest.fixture
def run_cli(tmp_path):
    """Run ``python -m rlx.train ARGS`` in a subprocess; returns the CompletedProcess."""
    import subprocess

    def run(*args, timeout=300, cache=str(TEST_CACHE)):
        command = [sys.executable, "-m", "rlx.train", *args]
        if not any(a.startswith("hydra.run.dir=") for a in args):
            command.append(f"hydra.run.dir={tmp_path / 'run'}")
        if not any(a.startswith("run.compile_cache=") for a in args):
            command.append(f"run.compile_cache={cache}")
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    return run
