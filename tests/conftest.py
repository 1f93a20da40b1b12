"""Test settings: JAX on the CPU with rlx's XLA flags, fast compilation and a persistent compile cache."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("RLX_TEST_CACHE", ROOT / ".pytest_cache" / "jax_cache"))

from rlx.runner import compile_cache  # noqa: E402

# The suite compiles a few hundred small programs and runs each one briefly, so on a cold cache
# (as in CI) compiling is most of its time, and LLVM's optimisation passes much of compiling.
# Without them (XLA's backend optimisation level 0; levels 1 and 2 save nothing) a compile-heavy
# subset ran 22% faster on our 2-core machine, and the whole cold suite 13% (1136 s to 989 s);
# every test passes with and without them. Long-running programs get slower, which is why the
# vendoring test's demo runs keep the default. RLX_TEST_XLA_OPT=full tests every program exactly
# as users compile it. The flag goes into XLA_FLAGS, so the `python -m rlx.train` subprocesses
# of the tests inherit it.
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
XLA_OPT = os.environ.get("RLX_TEST_XLA_OPT", "fast")
if XLA_OPT not in ("fast", "full"):
    raise pytest.UsageError(f"RLX_TEST_XLA_OPT={XLA_OPT!r}: must be 'fast' (the default) or 'full'")
if XLA_OPT == "fast":
    compile_cache.add_xla_flag(FAST_COMPILE_FLAG)
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
