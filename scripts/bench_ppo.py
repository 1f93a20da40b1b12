"""Benchmark rlx's PPO against rejax and Stable-Baselines3 on CartPole-v1, on this machine.

Usage::

    .venv/bin/python scripts/bench_ppo.py [--skip-rejax] [--skip-sb3] [--repeats N] [--quick]

Every measurement runs in a fresh subprocess and the script prints one markdown
table on stdout (progress goes to stderr). The peers get virtualenvs of their
own under ``.bench/`` (created on first use, reused afterwards):

* rejax 0.1.3 needs gymnax < 1.0, so ``.bench/rejax-venv`` pins it next to
  rlx's jax/jaxlib version; a driver written to a temporary file runs it.
* Stable-Baselines3 runs on PyTorch CPU in ``.bench/sb3-venv``.

Measured per implementation:

1. steps/s after compilation at the shared configuration (4 envs x 128 steps,
   5e5 steps, 4 epochs x 4 minibatches, one seed), and rlx's ratio to it;
2. import and compile seconds of that run (persistent compile cache off);
3. seconds from just before launching a fresh process until the mean greedy
   evaluation return first reaches 475, with each library's own tuned
   CartPole settings, and the whole process wall time: cold (empty compile
   cache) and warm (second run with the same cache).

Every implementation evaluates 16 greedy (deterministic) episodes at its own
interval (rlx's preset: every 13 updates of 8 x 64 = 6,656 env steps; rejax:
every 5,000; SB3: every 640 calls of its 8 envs = 5,120), stops training once
the mean reaches 475 and gives up after 1e5 steps. With ``--repeats N`` each
cell reports the median run (by steps/s, or by time to 475) whole, not
per-field medians. A peer that fails to install or run gets a row saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import median_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
RLX_PYTHON = ROOT / ".venv" / "bin" / "python"
THRESHOLD = 475.0
EVAL_EPISODES = 16
JAX_VERSION = "0.10.2"


@dataclass(frozen=True)
class Budgets:
    """Environment steps for the throughput run and the cap of a time-to-475 run."""

    speed_steps: int
    solve_steps: int
    sb3_speed_steps: int


FULL = Budgets(speed_steps=500_000, solve_steps=100_000, sb3_speed_steps=500_000)
QUICK = Budgets(speed_steps=20_480, solve_steps=10_240, sb3_speed_steps=4_096)


# --------------------------------------------------------------------------- drivers

REJAX_DRIVER = r'''
"""rejax PPO driver written by scripts/bench_ppo.py; argv: MODE OUT_JSON STEPS CACHE_DIR."""
import json, sys, time
T0 = time.perf_counter()
MODE, OUT, STEPS, CACHE = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import jax
if CACHE:
    jax.config.update("jax_compilation_cache_dir", CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import jax.numpy as jnp
import rejax
from rejax.evaluate import evaluate
IMPORT_S = time.perf_counter() - T0
HITS = {"hits": 0, "misses": 0}

def count(event, **_):
    for name in HITS:
        if event == f"/jax/compilation_cache/cache_{name}":
            HITS[name] += 1

jax.monitoring.register_event_listener(count)
COMMON = dict(gamma=0.99, gae_lambda=0.95, clip_eps=0.2, vf_coef=0.5, max_grad_norm=0.5,
              agent_kwargs={"activation": "tanh"})
# The shared configuration, rlx's PPO defaults where rejax has the same knob.
SHARED = dict(COMMON, num_envs=4, num_steps=128, num_epochs=4, num_minibatches=4,
              learning_rate=2.5e-4, ent_coef=0.01)
# rejax's own CartPole PPO settings (configs/gymnax/cartpole.yaml in its repository).
PRESET = dict(COMMON, num_envs=5, num_steps=100, num_epochs=5, num_minibatches=5,
              learning_rate=7.5e-4, ent_coef=0.01)
EVAL_EVERY = 5000  # 10 iterations of 500 steps

def greedy_eval(algo, ts, rng):
    """Mean-free returns of 16 greedy episodes (rejax's default samples 128 episodes)."""
    def act(obs, key):
        mode = lambda module, x: module._action_dist(x).mode()
        return jnp.squeeze(algo.actor.apply(ts.actor_ts.params, obs[None], method=mode))
    steps = algo.env_params.max_steps_in_episode
    return evaluate(act, rng, algo.env, algo.env_params, 16, steps)[1]

def make(config, steps, eval_freq):
    algo = rejax.PPO.create(env="CartPole-v1", total_timesteps=steps, eval_freq=eval_freq,
                            skip_initial_evaluation=True, **config)
    return algo.replace(eval_callback=greedy_eval)

def compile_(fn, *args):
    tick = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - tick

def speed():
    """The whole training as rejax runs it: one program, evaluated once at the end."""
    algo, key = make(SHARED, STEPS, STEPS), jax.random.PRNGKey(0)
    train, compile_s = compile_(algo.train, key)
    tick = time.perf_counter()
    ts, returns = jax.block_until_ready(train(key))
    run_s = time.perf_counter() - tick
    steps = int(ts.global_step)
    return dict(compile_s=compile_s, run_s=run_s, steps=steps, steps_per_s=steps / run_s,
                eval_return=float(returns.mean()))

def solve():
    """Chunks of 5000 steps (train(train_state=...)), evaluated in the program and checked on the host.

    Stops at 475 like the others; rejax's PPO has a constant learning rate, so chunking
    does not change what it learns.
    """
    algo, key = make(PRESET, EVAL_EVERY, EVAL_EVERY), jax.random.PRNGKey(0)
    init, init_s = compile_(algo.init_state, key)
    ts = init(key)
    chunk, chunk_s = compile_(lambda ts: algo.train(train_state=ts), ts)
    evals, run_s = [], 0.0
    for _ in range(max(1, STEPS // EVAL_EVERY)):
        tick = time.perf_counter()
        ts, returns = jax.block_until_ready(chunk(ts))
        run_s += time.perf_counter() - tick
        evals.append([time.time(), int(ts.global_step), float(returns.mean())])
        if evals[-1][2] >= 475.0:
            break
    return dict(compile_s=init_s + chunk_s, run_s=run_s, evals=evals, cache=HITS)

result = speed() if MODE == "speed" else solve()
from importlib.metadata import version
result.update(import_s=IMPORT_S, total_s=time.perf_counter() - T0,
              versions={p: version(p) for p in ("rejax", "jax", "jaxlib", "gymnax", "flax")})
open(OUT, "w").write(json.dumps(result))
'''

SB3_DRIVER = r'''
"""Stable-Baselines3 PPO driver written by scripts/bench_ppo.py; argv: MODE OUT_JSON STEPS."""
import json, sys, time
T0 = time.perf_counter()
MODE, OUT, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
IMPORT_S = time.perf_counter() - T0

def linear(start):
    return lambda progress_remaining: progress_remaining * start

# The shared configuration with rlx's PPO defaults.
SHARED = dict(n_steps=128, batch_size=128, n_epochs=4, learning_rate=2.5e-4, gamma=0.99,
              gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)
# rl-baselines3-zoo's CartPole-v1 hyper-parameters.
ZOO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
           learning_rate=linear(0.001), clip_range=linear(0.2))

class StopAt(BaseCallback):
    """After each evaluation: record (unix time, steps, mean return); stop at 475."""
    def __init__(self, evals):
        super().__init__()
        self.evals = evals
    def _on_step(self):
        mean = float(self.parent.last_mean_reward)
        self.evals.append([time.time(), int(self.num_timesteps), mean])
        return mean < 475.0

def speed():
    tick = time.perf_counter()
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), device="cpu", seed=0, **SHARED)
    setup_s = time.perf_counter() - tick
    tick = time.perf_counter()
    model.learn(total_timesteps=STEPS)
    run_s = time.perf_counter() - tick
    return dict(setup_s=setup_s, run_s=run_s, steps=model.num_timesteps,
                steps_per_s=model.num_timesteps / run_s)

def solve():
    tick = time.perf_counter()
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), device="cpu", seed=0, **ZOO)
    evals = []
    callback = EvalCallback(make_vec_env("CartPole-v1", n_envs=1, seed=1000), n_eval_episodes=16,
                            eval_freq=640, deterministic=True, callback_after_eval=StopAt(evals), verbose=0)
    setup_s = time.perf_counter() - tick
    tick = time.perf_counter()
    model.learn(total_timesteps=STEPS, callback=callback)
    return dict(setup_s=setup_s, run_s=time.perf_counter() - tick, evals=evals)

result = speed() if MODE == "speed" else solve()
from importlib.metadata import version
result.update(import_s=IMPORT_S, total_s=time.perf_counter() - T0, torch_threads=torch.get_num_threads(),
              versions={p: version(p) for p in ("stable-baselines3", "torch", "gymnasium")})
open(OUT, "w").write(json.dumps(result))
'''


# --------------------------------------------------------------------------- helpers


def show(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def log(message: str) -> None:
    """Progress on stderr, so stdout holds only the table."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tail(text: str, lines: int = 1) -> str:
    """The last non-empty lines of ``text``, joined, for one-line error messages."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(kept[-lines:])[:300] or "no output"


def launch(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> tuple[float, float]:
    """Run ``cmd`` to completion; return (unix time just before launch, wall seconds).

    Raises RuntimeError with the end of stderr when the process fails.
    """
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {tail(proc.stderr or proc.stdout)}")
    return start, wall


def clean_env(**extra: str) -> dict:
    """This process's environment without JAX cache or XLA settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS")}
    env.update(extra)
    return env


def first_reach(evals: list, start: float) -> tuple[float | None, int | None, float]:
    """(seconds from ``start`` to the first eval >= 475, its env steps, best mean) from [time, steps, mean] rows."""
    best = max((row[2] for row in evals), default=float("nan"))
    for when, steps, mean in evals:
        if mean >= THRESHOLD:
            return when - start, steps, best
    return None, None, best


def median_speed(runs: list[dict]) -> dict:
    """The throughput run with the median steps/s (``bench_common.median_run``: one whole run)."""
    return median_run(runs, "steps_per_s")


def median_reach(runs: list[dict]) -> dict:
    """The time-to-475 run with the median time to 475 (runs that never reached it count as slowest)."""
    return median_run(runs, "reach_s")


def repeat(measure, repeats: int, *args) -> dict:
    """``measure(*args)`` ``repeats`` times; the median run by steps/s."""
    return median_speed([measure(*args) for _ in range(repeats)])


# --------------------------------------------------------------------------- rlx


def rlx_run(overrides: list[str], workdir: Path) -> tuple[dict, list[dict], float, float]:
    """One fresh ``python -m rlx.train`` process; returns (summary, metrics lines, launch time, wall s)."""
    run_dir = Path(tempfile.mkdtemp(prefix="rlx-run-", dir=workdir))
    cmd = [str(RLX_PYTHON), "-m", "rlx.train", "+exp=ppo_cartpole", "logger=none", "run.num_seeds=1",
           *overrides, f"hydra.run.dir={run_dir}"]
    start, wall = launch(cmd, env=clean_env())
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines], start, wall


def rlx_speed(budgets: Budgets, workdir: Path) -> dict:
    """Shared configuration, one chunk of all updates (like rejax's single program), no cache."""
    updates = budgets.speed_steps // 512
    summary, _, _, wall = rlx_run([
        f"algo.total_timesteps={budgets.speed_steps}", "algo.num_envs=4", "algo.num_steps=128",
        "algo.num_epochs=4", "algo.num_minibatches=4", "algo.lr=2.5e-4", "algo.ent_coef=0.01",
        "algo.gamma=0.99", "algo.gae_lambda=0.95", f"run.chunk_updates={updates}",
        "run.eval_every_chunks=1", "run.compile_cache=null"], workdir)
    return dict(steps_per_s=summary["steps_per_second"], import_s=summary["import_seconds"],
                compile_s=summary["compile_seconds"], speed_wall_s=wall)


def rlx_solve(budgets: Budgets, cache: Path, workdir: Path) -> dict:
    """Our preset as is (one seed), stopping at 475, with the compile cache at ``cache``."""
    summary, metrics, start, wall = rlx_run([
        f"algo.total_timesteps={budgets.solve_steps}", f"run.stop_at_return={THRESHOLD}",
        f"run.compile_cache={cache}"], workdir)
    evals = [[m["time"], m["env_steps"], sum(m["eval_return"]) / len(m["eval_return"])]
             for m in metrics if m.get("eval_return")]
    reach_s, reach_steps, best = first_reach(evals, start)
    cache_info = summary.get("compile_cache") or {}
    return dict(reach_s=reach_s, reach_steps=reach_steps, best=best, wall_s=wall,
                import_s=summary["import_seconds"], compile_s=summary["compile_seconds"],
                run_s=summary["run_seconds"], total_s=summary["total_seconds"],
                hits=cache_info.get("hits"), misses=cache_info.get("misses"))


# --------------------------------------------------------------------------- peers


@dataclass
class Peer:
    """A peer library: its virtualenv, the requirement sets to try in order, and its driver."""

    name: str
    venv: Path
    requirement_sets: list[list[str]]
    driver: str
    installed: list[str] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


REJAX = Peer("rejax", BENCH_DIR / "rejax-venv", [
    ["rejax==0.1.3", "gymnax<1.0", f"jax=={JAX_VERSION}", f"jaxlib=={JAX_VERSION}"],
    ["rejax==0.1.3", "gymnax<1.0", f"jax~={JAX_VERSION.rsplit('.', 1)[0]}.0"],
    ["rejax==0.1.3", "gymnax<1.0"],
], REJAX_DRIVER)
SB3 = Peer("sb3", BENCH_DIR / "sb3-venv", [["torch==2.13.0", "stable-baselines3==2.9.2"]], SB3_DRIVER)


def ensure_venv(peer: Peer) -> None:
    """Create ``peer.venv`` and install the first requirement set that resolves; reuse it later.

    A marker file records what was installed. Raises RuntimeError when no set installs.
    """
    marker = peer.venv / ".bench-installed.json"
    if marker.exists() and peer.python.exists():
        peer.installed = json.loads(marker.read_text())
        return
    install_log = BENCH_DIR / f"{peer.name}-install.log"
    errors = []
    for requirements in peer.requirement_sets:
        log(f"{peer.name}: creating {show(peer.venv)} with {' '.join(requirements)}")
        shutil.rmtree(peer.venv, ignore_errors=True)
        try:
            launch([sys.executable, "-m", "venv", str(peer.venv)], timeout=600)
            cmd = [str(peer.python), "-m", "pip", "install", "--quiet", *requirements]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        except (RuntimeError, subprocess.SubprocessError) as error:
            errors.append(str(error))
            continue
        with install_log.open("a") as handle:
            handle.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode == 0:
            marker.write_text(json.dumps(requirements))
            peer.installed = requirements
            return
        pip_errors = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("ERROR"))
        errors.append(tail(pip_errors or proc.stderr, 2))
    raise RuntimeError(f"install failed ({'; '.join(errors)}); see {show(install_log)}")


def peer_run(peer: Peer, mode: str, steps: int, workdir: Path, cache: Path | None = None) -> tuple[dict, float, float]:
    """Run the peer's driver in a fresh process; returns (its JSON result, launch time, wall s)."""
    driver = workdir / f"{peer.name}_driver.py"
    if not driver.exists():
        driver.write_text(peer.driver)
    out = workdir / f"{peer.name}-{mode}-{time.time_ns()}.json"
    extra = {"JAX_COMPILATION_CACHE_DIR": str(cache)} if cache else {}
    cmd = [str(peer.python), str(driver), mode, str(out), str(steps), str(cache or "")]
    start, wall = launch(cmd, env=clean_env(**extra))
    return json.loads(out.read_text()), start, wall


def peer_speed(peer: Peer, steps: int, workdir: Path) -> dict:
    """Throughput run of a peer at the shared configuration, compile cache off."""
    result, _, wall = peer_run(peer, "speed", steps, workdir)
    return dict(steps_per_s=result["steps_per_s"], import_s=result["import_s"],
                compile_s=result.get("compile_s"), speed_wall_s=wall, steps=result["steps"], versions=result["versions"],
                torch_threads=result.get("torch_threads"))


def peer_solve(peer: Peer, steps: int, cache: Path | None, workdir: Path) -> dict:
    """Time-to-475 run of a peer with its own tuned settings (``cache``: JAX compile cache dir)."""
    result, start, wall = peer_run(peer, "solve", steps, workdir, cache)
    reach_s, reach_steps, best = first_reach(result["evals"], start)
    cache_info = result.get("cache") or {}
    return dict(reach_s=reach_s, reach_steps=reach_steps, best=best, wall_s=wall,
                import_s=result["import_s"], compile_s=result.get("compile_s"), run_s=result["run_s"],
                total_s=result["total_s"], hits=cache_info.get("hits"), misses=cache_info.get("misses"))


# --------------------------------------------------------------------------- rows


# What a failed install, run or unreadable result raises; any of them only fails its row.
RUN_ERRORS = (RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError, TypeError)


@dataclass
class Row:
    """One implementation's line of the table; ``error`` replaces the numbers when set."""

    name: str
    speed: dict = field(default_factory=dict)
    cold: dict = field(default_factory=dict)
    warm: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def solve_pair(solve, repeats: int, workdir: Path) -> tuple[dict, dict]:
    """Cold then warm time-to-475 runs, a fresh cache directory per repeat; the median run of each."""
    colds, warms = [], []
    for _ in range(repeats):
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=workdir))
        colds.append(solve(cache))
        warms.append(solve(cache))
    return median_reach(colds), median_reach(warms)


def throughput_runs(args, budgets: Budgets, workdir: Path) -> dict[str, tuple[list[dict], str | None]]:
    """rlx's (and, unless ``--skip-rejax``, rejax's) throughput runs, in alternation.

    rlx goes first in odd-numbered pairs and rejax in even ones, so a drift in the machine's
    speed while the benchmark runs (other tenants, clock changes) hits both alike, and the
    rlx / rejax ratio can also be taken per pair of neighbouring runs. Returns
    ``{name: (runs, error)}``; a failure stops that implementation's runs and only fails its row.
    """
    measures = {"rlx": lambda: rlx_speed(budgets, workdir)}
    errors: dict[str, str | None] = {"rlx": None}
    if not args.skip_rejax:
        measures["rejax"] = lambda: peer_speed(REJAX, budgets.speed_steps, workdir)
        errors["rejax"] = None
        try:
            ensure_venv(REJAX)
        except RUN_ERRORS as failure:
            errors["rejax"] = str(failure)
    runs: dict[str, list[dict]] = {name: [] for name in measures}
    for index in range(args.repeats):
        for name in list(measures) if index % 2 == 0 else list(measures)[::-1]:
            if errors[name] is not None:
                continue
            log(f"{name}: throughput run {index + 1}/{args.repeats} ({budgets.speed_steps:,} steps)")
            try:
                runs[name].append(measures[name]())
            except RUN_ERRORS as failure:
                errors[name] = str(failure)
    for name, error in errors.items():
        if error is not None:
            log(f"{name}: FAILED: {error}")
    return {name: (runs[name], errors[name]) for name in measures}


def bench_rlx(args, budgets: Budgets, workdir: Path, speed: tuple[list[dict], str | None]) -> Row:
    """rlx through its CLI: its throughput runs (``throughput_runs``), then cold and warm time-to-475 runs."""
    row = Row("rlx", notes=["tuned: preset ppo_cartpole as is but 1 seed (8 envs x 64 steps, 4x4, lr 2.5e-3)"])
    runs, row.error = speed
    if row.error is not None:
        return row
    try:
        row.speed = median_speed(runs)
        log("rlx: time-to-475 runs (cold, warm)")
        row.cold, row.warm = solve_pair(lambda cache: rlx_solve(budgets, cache, workdir), args.repeats, workdir)
    except RUN_ERRORS as error:
        row.error = str(error)
        log(f"rlx: FAILED: {error}")
    return row


def bench_peer(peer: Peer, args, budgets: Budgets, workdir: Path,
               speed: tuple[list[dict], str | None] | None = None) -> Row:
    """A peer: install (or reuse) its venv, throughput runs (unless ``speed`` brings them), then cold and warm
    time-to-475 runs."""
    row = Row(peer.name)
    if speed is not None and speed[1] is not None:
        row.error = speed[1]
        return row
    try:
        ensure_venv(peer)
        if speed is not None:
            row.speed = median_speed(speed[0])
        else:
            speed_steps = budgets.sb3_speed_steps if peer is SB3 else budgets.speed_steps
            log(f"{peer.name}: throughput run ({speed_steps:,} steps)")
            row.speed = repeat(peer_speed, args.repeats, peer, speed_steps, workdir)
        log(f"{peer.name}: time-to-475 runs (cold, warm)")
        jax_cache = peer is REJAX
        solve = lambda cache: peer_solve(peer, budgets.solve_steps, cache if jax_cache else None, workdir)
        row.cold, row.warm = solve_pair(solve, args.repeats, workdir)
    except RUN_ERRORS as error:
        row.error = str(error)
        log(f"{peer.name}: FAILED: {error}")
    row.notes.extend(peer_notes(peer, row))
    return row


def pair_ratios(ours: list[dict], theirs: list[dict]) -> str:
    """The note listing rlx / rejax steps/s per pair of neighbouring runs, and their median."""
    ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(ours, theirs)]
    return ("steps/s ratio rlx / rejax per pair of neighbouring runs: " + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (median {statistics.median(ratios):.2f})")


def peer_notes(peer: Peer, row: Row) -> list[str]:
    """What differs about this peer's runs, for the notes column."""
    notes = [", ".join(f"{k} {v}" for k, v in row.speed.get("versions", {}).items())]
    if peer is REJAX:
        notes.append("tuned: rejax cartpole config (5 envs x 100 steps, 5x5, lr 7.5e-4); greedy eval")
    elif peer is SB3:
        notes.append("tuned: rl-zoo (8 envs x 32 steps, 20 epochs, batch 256, lin lr 1e-3)")
        if row.speed:
            notes.append(f"steps/s over {row.speed['steps']:,.0f} steps, torch threads {row.speed['torch_threads']}")
    return [note for note in notes if note]


# --------------------------------------------------------------------------- table


def cell(text: str) -> str:
    """``text`` made safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def fmt(value, spec: str = ".1f", missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def reach_cell(result: dict) -> str:
    """'12.3 s @ 40,960 steps (proc 14.0 s)', or why 475 was not reached."""
    if not result:
        return "—"
    wall = f"proc {fmt(result['wall_s'])} s"
    repeats = result.get("repeats", 1)
    missing = result.get("missing") if repeats > 1 else 0
    missed = f"; {missing} of {repeats} runs never reached 475" if missing else ""
    if result.get("reach_s") is None:
        return f"not reached (best {fmt(result.get('best'))}; {wall}{missed})"
    return f"{fmt(result['reach_s'])} s @ {result['reach_steps']:,.0f} steps ({wall}{missed})"


def breakdown_cell(result: dict) -> str:
    """import / compile / train+eval / other in-process / interpreter start+exit seconds, cache hits.

    All from one run (the median one), so "other" is that run's remainder and cannot come out negative
    from mixing runs (it can only where the parts' clocks overlap within a run)."""
    if not result:
        return "—"
    parts = [result["import_s"], result.get("compile_s"), result["run_s"]]
    other = result["total_s"] - sum(p or 0 for p in parts)
    cache = "" if result.get("hits") is None else f"; cache {result['hits']:.0f} hit/{result['misses']:.0f} miss"
    return " / ".join(fmt(p) for p in [*parts, other, result["wall_s"] - result["total_s"]]) + cache


LEGEND = (
    "steps/s: env steps / seconds of training after compilation at the shared configuration (4 envs x "
    "128 steps, 4 epochs x 4 minibatches (SB3: batch 128), 1 seed, 5e5 steps; rlx and rejax as one "
    "program with one evaluation at the end); rlx / peer: rlx's steps/s over the peer's. import s, "
    "compile s: that run's, persistent compile cache off. to 475: seconds from just before launching a "
    "fresh process until the host sees the first evaluation (16 greedy episodes) with mean return >= 475, "
    "and the env steps then; evaluations come every 6,656 env steps for rlx (its preset: every 13 updates "
    "of 8 envs x 64 steps), every 5,000 for rejax and every 5,120 for SB3 (640 calls of 8 envs), so the "
    "step counts are multiples of those; proc: the whole process's wall time; each library's own "
    "tuned CartPole settings, capped at 1e5 steps. cold: empty compile cache; warm: the same cache again "
    "(SB3 compiles nothing: warm is only a second run). With --repeats N every cell (and the breakdown "
    "below) is the run with the median steps/s or median time to 475, all its fields from that run."
)


def table(rows: list[Row]) -> str:
    """The markdown table: one line per implementation, then a breakdown of the 475 runs."""
    ours = next((r.speed.get("steps_per_s") for r in rows if r.name == "rlx"), None)
    lines = ["| implementation | steps/s (shared cfg) | rlx / peer | import s | compile s "
             "| cold: to 475 | warm: to 475 | notes |", "|---|---:|---:|---:|---:|---|---|---|"]
    for row in rows:
        sps = row.speed.get("steps_per_s")
        ratio = f"{ours / sps:.2f}x" if ours and sps else "—"
        if row.error and not sps:
            lines.append(f"| {row.name} | — | — | — | — | — | — | failed: {cell(row.error)} |")
            continue
        notes = cell("; ".join(row.notes + ([f"failed: {row.error}"] if row.error else [])))
        lines.append(f"| {row.name} | {fmt(sps, ',.0f')} | {ratio} | {fmt(row.speed.get('import_s'))} "
                     f"| {fmt(row.speed.get('compile_s'))} | {reach_cell(row.cold)} | {reach_cell(row.warm)} "
                     f"| {notes} |")
    lines += ["", LEGEND]
    lines += ["", "Time-to-475 runs, seconds: import / compile / train+eval / other in-process "
              "(config, set-up, files) / interpreter start + exit:", "",
              "| implementation | cold | warm |", "|---|---|---|"]
    lines += [f"| {r.name} | {breakdown_cell(r.cold)} | {breakdown_cell(r.warm)} |" for r in rows if not r.error]
    return "\n".join(lines)


def machine_lines() -> list[str]:
    """Date (``date -u`` style), CPUs and load, so numbers from different days can be compared."""
    model = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [l.split(":", 1)[1].strip() for l in cpuinfo.read_text().splitlines() if l.startswith("model name")]
        model = names[0] if names else model
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()),
            f"machine: nproc {cpus}, {model}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, load average at start {load}"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-rejax", action="store_true", help="do not install or run rejax")
    parser.add_argument("--skip-sb3", action="store_true", help="do not install or run Stable-Baselines3")
    parser.add_argument("--repeats", type=int, default=1, help="repeat every measurement N times; report medians")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: a smoke test of the plumbing")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    budgets = QUICK if args.quick else FULL
    header = machine_lines()
    BENCH_DIR.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=BENCH_DIR))
    try:
        speeds = throughput_runs(args, budgets, workdir)
        rows = [bench_rlx(args, budgets, workdir, speeds["rlx"])]
        if not args.skip_rejax:
            rejax = bench_peer(REJAX, args, budgets, workdir, speeds["rejax"])
            ours, theirs = speeds["rlx"][0], speeds["rejax"][0]
            if not rejax.error and len(theirs) == len(ours) > 1:
                rejax.notes.append(pair_ratios(ours, theirs))
            rows.append(rejax)
        if not args.skip_sb3:
            rows.append(bench_peer(SB3, args, budgets, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    mode = ("QUICK smoke test (tiny budgets; numbers meaningless)" if args.quick
            else f"repeats {args.repeats} (the median run of each)")
    print("\n".join([f"# PPO on CartPole-v1: rlx vs peers — {mode}", "", *header,
                     f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}", "", table(rows)]))


if __name__ == "__main__":
    main()
