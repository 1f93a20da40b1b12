"""Benchmark: train N PPO CartPole-v1 configurations (learning rates x seeds) with rlx, rejax and SB3.

Usage::

    .venv/bin/python scripts/bench_sweep.py [--steps 100000] [--sizes 1,8,32,128] [--quick]
                                            [--skip-rejax] [--skip-sb3] [--repeats 1]

For N = 1, 8, 32 and 128 configurations (1 lr x 1 seed, 2 x 4, 4 x 8, 8 x 16) at
one shared configuration (4 envs x 128 steps, 4 epochs x 4 minibatches, the
same env steps per configuration, one 16-episode greedy evaluation at the end):

* rlx: ONE ``python -m rlx.train`` process, one compiled program for the whole
  grid (``sweep.algo.lr=[...]`` x ``run.num_seeds``), with a fresh empty
  compile cache directory (cold) and then the same directory again (warm);
* rejax 0.1.3: ONE process that compiles ``PPO.train`` once (AOT, the algorithm
  as a traced argument: ``learning_rate`` is a pytree leaf, so one program
  serves every learning rate) and then runs the N configurations one after
  another in a Python loop;
* Stable-Baselines3 (PyTorch CPU, torch's default thread count): ONE process
  that trains the N configurations one after another in a Python loop.

The cores are not used alike: with ``run.cpu_devices=auto`` (rlx's default) rlx
shows each CPU core as an XLA device and splits the grid's runs over them when
they divide evenly (on 2 cores: every even N), so its one program trains on all
cores at once, while rejax runs one configuration at a time as one XLA program,
which keeps about one core busy. The ratios include that difference.

Each cell is ONE run unless ``--repeats R`` (then, per cell, the run with the
median whole-process seconds, all its fields from that run; rlx's cold and warm
runs pair up, a fresh cache directory per repeat).

Times are wall seconds of the whole process (interpreter start to exit,
imports and compilation included). SB3 is measured at up to 8 configurations
(``--sb3-max``) and rejax while a run is predicted to take at most
``--max-run-seconds``; larger N are extrapolated linearly from the largest
measured run (its fixed cost, plus N times its mean seconds per configuration)
and marked "(extrapolated)". The peers' virtualenvs and several helpers come
from ``scripts/bench_ppo.py``. Prints a markdown table and writes it to
``.bench/bench_sweep.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import median_run  # noqa: E402
from bench_ppo import (  # noqa: E402
    BENCH_DIR,
    REJAX,
    RUN_ERRORS,
    SB3,
    Peer,
    cell,
    clean_env,
    ensure_venv,
    fmt,
    launch,
    log,
    machine_lines,
    rlx_run,
    show,
)

# N configurations -> (learning rates, seeds).
GRIDS = {1: (1, 1), 8: (2, 4), 32: (4, 8), 128: (8, 16)}
# The first k of these are the k learning rates of a grid (2.5e-4 is the shared configuration's).
LR_LADDER = (2.5e-4, 1e-3, 5e-4, 2.5e-3, 1e-4, 7.5e-4, 1.5e-3, 5e-3)
BATCH = 4 * 128  # env steps per update at the shared configuration
FULL_STEPS, QUICK_STEPS = 100_000, 1_024
QUICK_SIZES = (1, 8, 32)
REPORT = BENCH_DIR / "bench_sweep.md"
QUIET_LOAD = 1.5  # a 1-minute load average above this at the start gets a warning in the report
RUN_TIMEOUT = 4 * 3600


def learning_rates(k: int) -> list[float]:
    return sorted(LR_LADDER[:k])


# --------------------------------------------------------------------------- drivers

REJAX_LOOP = r'''
"""rejax loop driver written by scripts/bench_sweep.py; argv: OUT STEPS LRS SEEDS CACHE_DIR."""
import json, sys, time
T0 = time.perf_counter()
OUT, STEPS, SEEDS, CACHE = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), sys.argv[5]
LRS = [float(x) for x in sys.argv[3].split(",")]
import jax
if CACHE:
    jax.config.update("jax_compilation_cache_dir", CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import jax.numpy as jnp
import rejax
from rejax.evaluate import evaluate
IMPORT_S = time.perf_counter() - T0

# The shared configuration (as in scripts/bench_ppo.py), learning rate swept.
SHARED = dict(gamma=0.99, gae_lambda=0.95, clip_eps=0.2, vf_coef=0.5, max_grad_norm=0.5,
              agent_kwargs={"activation": "tanh"}, num_envs=4, num_steps=128, num_epochs=4,
              num_minibatches=4, ent_coef=0.01)

def greedy_eval(algo, ts, rng):
    """Returns of 16 greedy episodes (rejax's default samples 128 episodes)."""
    def act(obs, key):
        mode = lambda module, x: module._action_dist(x).mode()
        return jnp.squeeze(algo.actor.apply(ts.actor_ts.params, obs[None], method=mode))
    return evaluate(act, rng, algo.env, algo.env_params, 16, algo.env_params.max_steps_in_episode)[1]

tick = time.perf_counter()
# One evaluation, at the end (eval_freq = total_timesteps).
base = rejax.PPO.create(env="CartPole-v1", total_timesteps=STEPS, eval_freq=STEPS,
                        skip_initial_evaluation=True, learning_rate=LRS[0], **SHARED)
base = base.replace(eval_callback=greedy_eval)
setup_s = time.perf_counter() - tick
tick = time.perf_counter()
# The algorithm is an argument, so learning_rate (a pytree leaf) is traced: one program for all runs.
# An AOT-compiled function refuses arguments of another structure, so this cannot silently recompile.
train = jax.jit(type(base).train).lower(base, jax.random.PRNGKey(0)).compile()
compile_s = time.perf_counter() - tick
runs = []
for lr in LRS:
    algo = base.replace(learning_rate=lr)
    for seed in range(SEEDS):
        tick = time.perf_counter()
        ts, returns = jax.block_until_ready(train(algo, jax.random.PRNGKey(seed)))
        runs.append(dict(lr=lr, seed=seed, seconds=time.perf_counter() - tick, steps=int(ts.global_step),
                         eval_return=float(returns.mean())))
from importlib.metadata import version
result = dict(import_s=IMPORT_S, setup_s=setup_s, compile_s=compile_s, runs=runs, compiles=1,
              total_s=time.perf_counter() - T0,
              versions={p: version(p) for p in ("rejax", "jax", "jaxlib", "gymnax", "flax")})
open(OUT, "w").write(json.dumps(result))
'''

SB3_LOOP = r'''
"""Stable-Baselines3 loop driver written by scripts/bench_sweep.py; argv: OUT STEPS LRS SEEDS THREADS."""
import json, sys, time
T0 = time.perf_counter()
OUT, STEPS, SEEDS, THREADS = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
LRS = [float(x) for x in sys.argv[3].split(",")]
import torch
if THREADS > 0:
    torch.set_num_threads(THREADS)
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
IMPORT_S = time.perf_counter() - T0

# The shared configuration (as in scripts/bench_ppo.py), learning rate swept; SB3's minibatch = 512 / 4.
SHARED = dict(n_steps=128, batch_size=128, n_epochs=4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
              ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)
runs = []
for lr in LRS:
    for seed in range(SEEDS):
        tick = time.perf_counter()
        model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=seed), device="cpu", seed=seed,
                    learning_rate=lr, **SHARED)
        model.learn(total_timesteps=STEPS)
        mean, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=1000 + seed),
                                  n_eval_episodes=16, deterministic=True)
        runs.append(dict(lr=lr, seed=seed, seconds=time.perf_counter() - tick, steps=int(model.num_timesteps),
                         eval_return=float(mean)))
from importlib.metadata import version
result = dict(import_s=IMPORT_S, runs=runs, total_s=time.perf_counter() - T0, torch_threads=torch.get_num_threads(),
              versions={p: version(p) for p in ("stable-baselines3", "torch", "gymnasium")})
open(OUT, "w").write(json.dumps(result))
'''

LOOP_DRIVERS = {REJAX.name: REJAX_LOOP, SB3.name: SB3_LOOP}


# --------------------------------------------------------------------------- measurements


def rlx_overrides(steps: int, lrs: list[float], seeds: int, cache: Path) -> list[str]:
    """The rlx.train overrides of one measurement (besides +exp=ppo_cartpole logger=none)."""
    lr = f"algo.lr={lrs[0]:g}" if len(lrs) == 1 else f"sweep.algo.lr=[{','.join(f'{x:g}' for x in lrs)}]"
    return [f"algo.total_timesteps={steps}", "algo.num_envs=4", "algo.num_steps=128", "algo.num_epochs=4",
            "algo.num_minibatches=4", "algo.ent_coef=0.01", "algo.gamma=0.99", "algo.gae_lambda=0.95", lr,
            f"run.num_seeds={seeds}", f"run.chunk_updates={steps // BATCH}", "run.eval_every_chunks=1",
            "run.checkpoint_every_chunks=0", f"run.compile_cache={cache}"]


def rlx_measure(steps: int, lrs: list[float], seeds: int, cache: Path, workdir: Path) -> dict:
    """One rlx process training the whole grid; ``cache`` is its persistent compile cache."""
    summary, _, _, wall = rlx_run(rlx_overrides(steps, lrs, seeds, cache), workdir)
    n = len(lrs) * seeds
    if summary["env_steps_total"] != n * steps:
        raise RuntimeError(f"rlx trained {summary['env_steps_total']} env steps, expected {n * steps}")
    points = summary["sweep"]["points"] if "sweep" in summary else [summary["final_eval"]]
    cache_info = summary.get("compile_cache") or {}
    return dict(wall_s=wall, import_s=summary["import_seconds"], compile_s=summary["compile_seconds"],
                run_s=summary["run_seconds"], total_s=summary["total_seconds"],
                eval_return=statistics.mean(p["return_mean"] for p in points),
                hits=cache_info.get("hits"), misses=cache_info.get("misses"), devices=summary.get("devices"))


def peer_loop(peer: Peer, steps: int, lrs: list[float], seeds: int, workdir: Path, threads: int = 0) -> dict:
    """One fresh process of the peer running the grid's configurations one after another.

    ``threads``: SB3's torch thread count (0: torch's default).
    """
    driver = workdir / f"{peer.name}_loop.py"
    if not driver.exists():
        driver.write_text(LOOP_DRIVERS[peer.name])
    out = workdir / f"{peer.name}-loop-{time.time_ns()}.json"
    cmd = [str(peer.python), str(driver), str(out), str(steps), ",".join(repr(x) for x in lrs), str(seeds)]
    extra = {}
    if peer is REJAX:  # a fresh, empty JAX compile cache: its one compilation counts
        cache = Path(tempfile.mkdtemp(prefix="rejax-cache-", dir=workdir))
        cmd.append(str(cache))
        extra["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    else:
        cmd.append(str(threads))
    _, wall = launch(cmd, env=clean_env(**extra), timeout=RUN_TIMEOUT)
    result = json.loads(out.read_text())
    runs = result["runs"]
    wrong = [r for r in runs if r["steps"] != steps]
    if len(runs) != len(lrs) * seeds or wrong:
        raise RuntimeError(f"{peer.name}: {len(runs)} runs, steps {sorted({r['steps'] for r in runs})}; expected "
                           f"{len(lrs) * seeds} runs of {steps}")
    loop_s = sum(r["seconds"] for r in runs)
    return dict(wall_s=wall, import_s=result["import_s"], compile_s=result.get("compile_s"), run_s=loop_s,
                total_s=result["total_s"], per_run_s=loop_s / len(runs),
                eval_return=statistics.mean(r["eval_return"] for r in runs),
                versions=result["versions"], torch_threads=result.get("torch_threads"))


def extrapolate(measured: dict[int, dict], n: int) -> dict:
    """Whole-process seconds for ``n`` configurations from the largest measured run.

    Fixed cost (interpreter, imports, compilation: wall minus the loop's seconds)
    plus ``n`` times that run's mean seconds per configuration.
    """
    base_n = max(measured)
    base = measured[base_n]
    fixed = base["wall_s"] - base["run_s"]
    return dict(wall_s=fixed + n * base["per_run_s"], extrapolated_from=base_n)


# --------------------------------------------------------------------------- output


def total_cell(result: dict | None) -> str:
    if not result:
        return "—"
    if result.get("error"):
        return f"failed: {cell(result['error'])}"
    text = f"{result['wall_s']:,.1f}"
    return f"{text} (extrapolated)" if "extrapolated_from" in result else text


def per_cell(result: dict | None, n: int) -> str:
    if not result or result.get("error"):
        return "—"
    text = f"{result['wall_s'] / n:,.2f}"
    return f"{text} (extrapolated)" if "extrapolated_from" in result else text


def ratio(peer: dict | None, ours: dict | None) -> float | None:
    if not peer or not ours or peer.get("error") or ours.get("error"):
        return None
    return peer["wall_s"] / ours["wall_s"]


def ratio_cell(value: float | None, peer: dict | None) -> str:
    if value is None:
        return "—"
    return f"{value:.1f}x" + (" (extrapolated)" if "extrapolated_from" in peer else "")


def breakdown_cell(result: dict | None) -> str:
    """import / compile / train+eval / other in-process / interpreter start+exit seconds; mean return."""
    if not result or result.get("error") or "extrapolated_from" in result:
        return "—"
    parts = [result["import_s"], result.get("compile_s"), result["run_s"]]
    other = result["total_s"] - sum(p or 0 for p in parts)
    text = " / ".join(fmt(p) for p in [*parts, other, result["wall_s"] - result["total_s"]])
    if result.get("hits") is not None:
        text += f"; cache {result['hits']:.0f} hit/{result['misses']:.0f} miss"
    return f"{text}; return {result['eval_return']:.1f}"


def target_lines(sizes: list[int], results: dict) -> list[str]:
    """Whether, at 32 configurations, rlx per-config time is >= 10x below SB3's and below rejax's."""
    if 32 not in sizes:
        return ["Target (at 32 configurations): not measured (32 not in --sizes)."]
    ours = results["rlx cold"].get(32)
    lines = []
    for name, factor, rule in (("sb3", 10.0, ">= 10x lower than SB3"), ("rejax", 1.0, "lower than rejax")):
        peer = results[name].get(32)
        value = ratio(peer, ours)
        if value is None:
            lines.append(f"- rlx per-configuration time {rule}: not measured")
            continue
        holds = value >= factor if factor > 1 else value > factor
        how = " (extrapolated)" if "extrapolated_from" in peer else ""
        lines.append(f"- rlx per-configuration time {rule}: {'HOLDS' if holds else 'DOES NOT HOLD'} — "
                     f"{name} / rlx (cold) = {value:.1f}x{how}; rlx {ours['wall_s'] / 32:.2f} s vs {name} "
                     f"{peer['wall_s'] / 32:.2f} s per configuration")
    return ["Target at 32 configurations (rlx cold, i.e. with compilation):", "", *lines]


def report(args, steps: int, sizes: list[int], results: dict, header: list[str]) -> str:
    mode = "QUICK smoke test (tiny budget; numbers meaningless)" if args.quick else f"{steps:,} env steps per configuration"
    devices = getattr(args, "rlx_devices", "") or "n/a"
    command = " ".join([".venv/bin/python scripts/bench_sweep.py", *(args.argv or [])])
    rejax_meta = next((r for r in results["rejax"].values() if r.get("versions")), {})
    sb3_meta = next((r for r in results["sb3"].values() if r.get("versions")), {})
    versions = "; ".join(", ".join(f"{k} {v}" for k, v in meta["versions"].items())
                         for meta in (rejax_meta, sb3_meta) if meta)
    threads = sb3_meta.get("torch_threads")
    lines = [f"# PPO CartPole-v1: N configurations in one rlx program vs sequential rejax and SB3 — {mode}", "",
             *header, f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"command: `{command}`", ""]
    if args.load_at_start > QUIET_LOAD:
        lines += [f"WARNING: 1-minute load average {args.load_at_start:.2f} > {QUIET_LOAD} at the start: other work "
                  "shared the CPUs, so these numbers are unreliable.", ""]
    skipped = [name for name, skip in (("rejax", args.skip_rejax), ("SB3", args.skip_sb3)) if skip]
    if skipped:
        lines += [f"Skipped: {', '.join(skipped)}.", ""]
    lines += ["| N configs (lrs x seeds) | rlx cold: total s | rlx cold: s/config | rlx warm: total s "
              "| rlx warm: s/config | rejax: total s | rejax: s/config | SB3: total s | SB3: s/config "
              "| rejax / rlx | SB3 / rlx |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        k, seeds = GRIDS[n]
        cold, warm = results["rlx cold"].get(n), results["rlx warm"].get(n)
        rejax, sb3 = results["rejax"].get(n), results["sb3"].get(n)
        lines.append(f"| {n} ({k} x {seeds}) | {total_cell(cold)} | {per_cell(cold, n)} | {total_cell(warm)} "
                     f"| {per_cell(warm, n)} | {total_cell(rejax)} | {per_cell(rejax, n)} | {total_cell(sb3)} "
                     f"| {per_cell(sb3, n)} | {ratio_cell(ratio(rejax, cold), rejax)} "
                     f"| {ratio_cell(ratio(sb3, cold), sb3)} |")
    lrs = "; ".join(f"{GRIDS[n][0]} lrs: {', '.join(f'{x:g}' for x in learning_rates(GRIDS[n][0]))}" for n in sizes)
    lines += ["", (
        f"Each configuration: PPO on CartPole-v1, 4 envs x 128 steps, 4 epochs x 4 minibatches (SB3: batch 128), "
        f"{steps:,} env steps ({steps // BATCH} updates), gamma 0.99, GAE 0.95, ent 0.01, clip 0.2, tanh 64x64 "
        f"MLPs, then one 16-episode greedy evaluation. N = learning rates x seeds ({lrs}). "
        "total s: wall seconds of the whole process, from just before launching it until it exits (imports, "
        "compilation, training, evaluation, files); s/config: total / N; rejax / rlx, SB3 / rlx: the peer's "
        "per-configuration time over rlx's cold one (so also the ratio of totals). "
        "rlx: ONE `python -m rlx.train` process and ONE compiled program for the whole grid (`sweep.algo.lr=[...]` "
        "x `run.num_seeds`, vmapped), all updates in one chunk, the runs split over the machine's cores as "
        f"XLA CPU devices when they divide evenly (`run.cpu_devices=auto`, the default; devices used per N: "
        f"{devices}), `logger=none`, `run.checkpoint_every_chunks=0`. So rlx trains on all the cores in "
        "parallel where the runs split, while rejax trains one configuration at a time (one XLA CPU program, "
        "about one core busy): the rejax / rlx ratio includes rlx using more cores, not only one program "
        "against a loop. "
        "cold: a fresh empty compile cache directory; warm: the same command again with that cache filled. "
        "rlx anneals the learning rate linearly (its default); rejax and SB3 keep it constant. "
        "rejax \"sequential\": ONE process, `PPO.train` compiled ONCE ahead of time with the algorithm as a traced "
        "argument (`learning_rate` is a pytree leaf in rejax 0.1.3, so the program serves every learning rate; "
        "a fresh empty JAX compile cache), then the N configurations one after another in a Python loop "
        "(rejax could vmap a grid too; this measures one-run-at-a-time use). "
        f"SB3 \"sequential\": ONE process (PyTorch CPU, torch threads: {threads}"
        f"{' (torch default)' if not args.sb3_threads else ' (--sb3-threads)'}), the N "
        "configurations one after another in a Python loop, a new model and vector env each. Neither peer pays "
        "a process start or import per configuration, which favours them. "
        f"(extrapolated): not run (SB3 above {args.sb3_max} configurations; rejax when predicted over "
        f"{args.max_run_seconds:.0f} s); the fixed cost of the largest measured run (wall minus its loop) plus N x "
        f"its mean seconds per configuration. "
        + ("Every cell is a single run (no repeats), so run-to-run noise of a shared machine is not averaged "
           "out. " if args.repeats == 1 else
           f"Every measured cell is the run with the median total of {args.repeats} (`--repeats`), all its "
           "fields (and the breakdown below) from that run. ")
        + f"Versions: {versions or 'n/a'}.")]
    lines += ["", "Measured runs, seconds: import / compile / train+eval / other in-process / interpreter start + "
              "exit; mean final greedy return over the configurations:", "",
              "| N | rlx cold | rlx warm | rejax | SB3 |", "|---|---|---|---|---|"]
    for n in sizes:
        lines.append(f"| {n} | " + " | ".join(breakdown_cell(results[key].get(n))
                                             for key in ("rlx cold", "rlx warm", "rejax", "sb3")) + " |")
    lines += ["", *target_lines(sizes, results)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help=f"env steps per configuration, rounded down to a multiple of {BATCH} "
                             f"(default {FULL_STEPS:,}; --quick: {QUICK_STEPS:,})")
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated N from {sorted(GRIDS)} (default all; --quick: "
                             f"{','.join(map(str, QUICK_SIZES))})")
    parser.add_argument("--quick", action="store_true", help="tiny budget: a smoke test of the plumbing")
    parser.add_argument("--skip-rejax", action="store_true", help="do not install or run rejax")
    parser.add_argument("--skip-sb3", action="store_true", help="do not install or run Stable-Baselines3")
    parser.add_argument("--sb3-max", type=int, default=8, help="largest N that SB3 runs; larger N are extrapolated")
    parser.add_argument("--sb3-threads", type=int, default=0,
                        help="torch threads for SB3 (default 0: torch's default, one per core)")
    parser.add_argument("--max-run-seconds", type=float, default=600.0,
                        help="extrapolate a rejax run predicted to take longer than this")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure every cell R times and report the run with the median total (default 1)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else FULL_STEPS)
    if steps < BATCH:
        parser.error(f"--steps must be >= {BATCH}")
    args.steps = steps // BATCH * BATCH
    sizes = args.sizes.split(",") if args.sizes else [str(n) for n in (QUICK_SIZES if args.quick else GRIDS)]
    try:
        args.sizes = sorted({int(n) for n in sizes})
    except ValueError:
        parser.error(f"--sizes: not integers: {args.sizes}")
    if not set(args.sizes) <= set(GRIDS):
        parser.error(f"--sizes: each must be one of {sorted(GRIDS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    steps, sizes = args.steps, args.sizes
    header = machine_lines()
    args.load_at_start = os.getloadavg()[0]
    if args.load_at_start > QUIET_LOAD:
        log(f"WARNING: load average {args.load_at_start:.2f} > {QUIET_LOAD}: the machine is busy")
    BENCH_DIR.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-sweep-", dir=BENCH_DIR))
    results: dict[str, dict[int, dict]] = {"rlx cold": {}, "rlx warm": {}, "rejax": {}, "sb3": {}}
    device_counts: dict[int, str | None] = {}  # N -> rlx's own line on where its runs executed
    peers = []
    for peer, skip in ((REJAX, args.skip_rejax), (SB3, args.skip_sb3)):
        if skip:
            continue
        try:
            ensure_venv(peer)
            peers.append(peer)
        except RUN_ERRORS as error:
            log(f"{peer.name}: FAILED to install: {error}")
            for n in sizes:
                results[peer.name][n] = dict(error=f"install: {error}")
    try:
        for n in sizes:
            k, seeds = GRIDS[n]
            lrs = learning_rates(k)
            runs: dict[str, list[dict]] = {"rlx cold": [], "rlx warm": []}
            try:
                for index in range(args.repeats):
                    cache = Path(tempfile.mkdtemp(prefix="rlx-cache-", dir=workdir))
                    for key in ("rlx cold", "rlx warm"):
                        log(f"{key}: {n} configurations ({k} lrs x {seeds} seeds), {steps:,} steps each, "
                            f"run {index + 1}/{args.repeats}, cache {show(cache)}")
                        runs[key].append(rlx_measure(steps, lrs, seeds, cache, workdir))
                        log(f"{key}: {n}: {runs[key][-1]['wall_s']:.1f} s")
                for key in runs:
                    results[key][n] = median_run(runs[key], "wall_s")
                device_counts[n] = results["rlx cold"][n].get("devices")
            except RUN_ERRORS as error:
                for key in runs:
                    results[key][n] = dict(error=str(error))
                log(f"rlx: FAILED: {error}")
            for peer in peers:
                measured = {m: r for m, r in results[peer.name].items() if "per_run_s" in r}
                if measured:
                    predicted = extrapolate(measured, n)
                    too_long = (n > args.sb3_max) if peer is SB3 else predicted["wall_s"] > args.max_run_seconds
                    if too_long:
                        results[peer.name][n] = predicted
                        log(f"{peer.name}: {n}: extrapolated from {predicted['extrapolated_from']}: "
                            f"{predicted['wall_s']:.0f} s")
                        continue
                elif peer is SB3 and n > args.sb3_max:
                    results[peer.name][n] = dict(error="not measured and nothing to extrapolate from")
                    continue
                log(f"{peer.name}: {n} configurations one after another in one process, {args.repeats} run(s)")
                try:
                    results[peer.name][n] = median_run(
                        [peer_loop(peer, steps, lrs, seeds, workdir, args.sb3_threads) for _ in range(args.repeats)],
                        "wall_s")
                    log(f"{peer.name}: {n}: {results[peer.name][n]['wall_s']:.1f} s")
                except RUN_ERRORS as error:
                    results[peer.name][n] = dict(error=str(error))
                    log(f"{peer.name}: FAILED: {error}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.rlx_devices = "; ".join(f"N={n}: {d or 'not reported'}" for n, d in device_counts.items())
    text = report(args, steps, sizes, results, header)
    REPORT.write_text(text + "\n")
    print(text)
    log(f"written to {show(REPORT)}")


if __name__ == "__main__":
    main()
