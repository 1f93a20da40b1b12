"""Test settings: JAX on the CPU with rlx's XLA flags, fast compilation and a persistent compile cache."""

import contextlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("RLX_TEST_CACHE", ROOT / ".pytest_cache" / "jax_cache"))

from rlx.runner import compile_cache  # noqa: E402

# The suite compiles a few hundred small programs and runs most of them briefly, so on a cold
# cache (as in CI) compiling is most of its time. Two XLA settings make compiling faster: no LLVM
# optimisation passes (backend optimisation level 0; levels 1 and 2 save nothing), which took the
# whole cold suite from 1136 s to 989 s on our 2-core machine, and XLA CPU's older loop emitters
# instead of its new fusion emitters, which halved the compile time of Dreamer's training program
# (19 s to 10 s at level 0) and of the PbRL test file (202 s to 109 s). The programs they make run
# several times slower (PPO on CartPole: 5.5x), so tests that train for many steps ask for XLA's
# defaults back: in process with the `optimised` fixture, in subprocesses with `full_opt_env()`.
# RLX_TEST_XLA_OPT=full compiles every program exactly as users do. The flags go into XLA_FLAGS,
# so the `python -m rlx.train` subprocesses of the tests inherit them.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
FULL_OPT_OPTIONS = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}  # XLA's defaults
XLA_OPT = os.environ.get("RLX_TEST_XLA_OPT", "fast")
if XLA_OPT not in ("fast", "full"):
    raise pytest.UsageError(f"RLX_TEST_XLA_OPT={XLA_OPT!r}: must be 'fast' (the default) or 'full'")
if XLA_OPT == "fast":
    for flag in FAST_COMPILE_FLAGS:
        compile_cache.add_xla_flag(flag)
compile_cache.set_xla_flags()
compile_cache.enable(TEST_CACHE)


def env_without_xla_flags(*flags: str, env=None) -> dict:
    """``env`` (default: this process's environment) with ``flags`` (``--name``, any value) out of XLA_FLAGS."""
    env = dict(os.environ if env is None else env)
    names = tuple(flag.split("=")[0] for flag in flags)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(names))
    return env


def full_opt_env(env=None) -> dict:
    """``env`` (default: this process's environment) without the suite's fast-compile XLA flags."""
    return env_without_xla_flags(*FAST_COMPILE_FLAGS, env=env)


@contextlib.contextmanager
def full_optimisation():
    """Inside: every ``jax.jit`` compiles with XLA's default optimisation, for code that trains for many steps.

    The agents' ``train`` functions and the runner jit at call time, so this reaches them; functions
    jitted when their module was imported keep the suite's fast-compile settings.
    """
    import jax

    plain_jit = jax.jit

    def jit(*fun, **kwargs):
        kwargs.setdefault("compiler_options", FULL_OPT_OPTIONS)
        return plain_jit(*fun, **kwargs)

    jax.jit = jit
    try:
        yield
    finally:
        jax.jit = plain_jit


@pytest.fixture(autouse=True)
def suite_compile_cache():
    """Keep every test on the suite's persistent compile cache. Entry points called in process
    (``reproduce.main``, ``load_trained``) set JAX's cache directory to the user's default; JAX reads the
    setting when a process first compiles, so a worker whose first compile came after such a test would
    have compiled everything again, into the home directory."""
    yield
    import jax

    if jax.config.jax_compilation_cache_dir != str(TEST_CACHE):
        compile_cache.enable(TEST_CACHE)


@pytest.fixture
def optimised():
    """The test's programs compile with XLA's default optimisation (see ``full_optimisation``)."""
    with full_optimisation():
        yield


def with_run_defaults(args, run_dir, cache) -> list[str]:
    """``rlx.train`` arguments plus a run directory and compile cache, unless ``args`` name their own."""
    args = list(args)
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={run_dir}")
    if not any(a.startswith("run.compile_cache=") for a in args):
        args.append(f"run.compile_cache={cache}")
    return args


def train_subprocess(args, run_dir, timeout=300, cache=str(TEST_CACHE), full_opt=False):
    """Run ``python -m rlx.train ARGS`` into ``run_dir`` (unless ``args`` name their own) in a subprocess;
    returns the CompletedProcess. ``full_opt=True``: it compiles with XLA's defaults, for runs that train for
    many steps."""
    import subprocess

    command = [sys.executable, "-m", "rlx.train", *with_run_defaults(args, run_dir, cache)]
    env = full_opt_env() if full_opt else None
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture
def run_cli(tmp_path):
    """``train_subprocess`` into the test's ``tmp_path / "run"``: ``run_cli(*args, timeout=, cache=, full_opt=)``."""
    return lambda *args, **options: train_subprocess(args, tmp_path / "run", **options)


@pytest.fixture
def train_in_process(tmp_path, monkeypatch, capsys):
    """``python -m rlx.train ARGS`` for runs that must stop before training (bad input), in this process.

    Returns (exit code, stderr). It skips a fresh interpreter's ~3 s of imports per case; test_cli's
    unknown-name tests check the same kind of failure through real processes. The environment (XLA_FLAGS) is
    restored afterwards, and Hydra leaves logging alone (its handlers would outlive the test's captured streams).
    """
    import rlx.train

    def run(*args) -> tuple[int, str]:
        argv = ["rlx.train", *with_run_defaults(args, tmp_path / "run", TEST_CACHE),
                "hydra/job_logging=none", "hydra/hydra_logging=none"]
        monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
        monkeypatch.setattr(sys, "argv", argv)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            rlx.train.main()
        return stopped.value.code, capsys.readouterr().err

    return run
