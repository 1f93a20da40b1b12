"""The MAPF results table: ``python -m rlx.reproduce mapf_random [--quick] [--skip-training]``.

Unseen random maps as POGEMA's benchmark draws them (17-21 cells a side,
obstacle density 0.1-0.3, horizon 128, soft collisions, ``nothing`` mode), a
fixed number of maps per agent count N in {8, 16, 32, 64}, drawn with seeds
that no training pool uses. Rows: random actions, every agent on its own shortest path
(no coordination; the environment resolves conflicts), PIBT, prioritized planning
(space-time A*), LaCAM (search over joint configurations), the centralized map policy (``+exp=mapf_map_policy``, trained
at N=32 by imitation of PIBT with its swap operation, ties between agents broken by index and between moves by the
shared numbers that its ``map_defer`` planes show, agents deferring at the pockets that other agents' goals shut
off (the teacher ``pibt_swap_defer``, its own row), and applied at every N: it is size- and count-agnostic), the
same policy
refined by DAgger (``rlx.envs.mapf.dagger``: ``DAGGER_ROUNDS`` on a copy of the run), and
decentralized MAPPO (``+exp=mappo_mapf_random``, trained at N=16 on local windows with the
shortest-path channel, no agent ids, so applied at every N too). Every method's joint actions run in ``MapfEnv``;
metrics as POGEMA defines them (``rlx.envs.mapf.env.MapfEnv.metrics``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from rlx.envs.mapf import evaluation, instances
from rlx.envs.mapf.env import MAP_OBSERVATIONS, MapfEnv
from rlx.reproduce import check_tasks, train_preset

AGENT_COUNTS = (8, 16, 32, 64)
HORIZON = 128
# Lifelong (``restart``) table: 64 agents, each with a fixed sequence of goals (a new one on every arrival).
LIFELONG_AGENTS, LIFELONG_HORIZON, GOALS_PER_AGENT = 64, 256, 64
TEST_SEED = 10_000  # training pools use seed 0
VALIDATION_SEED = 20_000  # maps for choosing presets and schedules (``validate``); the table never sees them
# DAgger after behaviour cloning: 3 rounds on 256 rollouts of N=32 training maps, then one on 384 rollouts from
# a pool of N=32 and N=64 maps with 32 samples per episode, all labelled by the run's teacher. LaCAM's labels
# (``labeller="lacam"``) were worth about nothing after these with the ``map_noise`` teacher, and LaCAM does not
# defer at goal pockets, so its labels would contradict the ``pibt_swap_defer`` teacher's. Measured on the
# study's maps: see experiments/mapf_random/README.md. ``(rounds, dagger.refine options)``.
# Map policies decide in this many rounds here, whatever their run's config says: training reads
# ``decode_rounds`` only as "more than one" (tests/test_map_policy.py), so the count is an inference choice.
# Validation maps (``validate``), N=64, after DAgger: CSR 0.58 / 0.65 / 0.71 with 4 / 8 / 16 rounds.
DECODE_ROUNDS = 16
DAGGER_ROUNDS = ((3, dict(rollout_maps=256)),
                 (1, dict(rollout_maps=384, extra_agents=(64,), samples_per_episode=32)))
QUICK_DAGGER_ROUNDS = ((1, dict(rollout_maps=4, updates=4)),
                       (1, dict(rollout_maps=4, updates=4, extra_agents=(64,), samples_per_episode=4)))
MAPPO_LABEL = "MAPPO (decentralized, local windows)"
# Row groups that ``reproduce(..., tasks=...)`` can rerun alone, keeping the saved table's other rows.
TASKS = ("baselines", "map_policy", "dagger", "mappo")
POLICY_LABEL = "map policy (centralized, imitates PIBT with swap, shown tie-breaks and deferral at goal pockets)"
DAGGER_LABEL = f"{POLICY_LABEL} + DAgger (teacher labels)"
# POGEMA's published CSR at N=64 on its random maps, for reference (not run here).
PUBLISHED_N64 = {"LaCAM": 1.00, "MAPF-GPT-85M": 0.94, "SCRIMP": 0.70, "DCC": 0.06, "pure MARL": 0.0}


def test_pool(num_agents: int, maps: int, seed: int = TEST_SEED):
    """``maps`` unseen instances with ``num_agents`` agents: the table's (``TEST_SEED``) or, with
    ``VALIDATION_SEED``, the ones that choices between presets and schedules are made on."""
    drawn = instances.random_instances(maps, num_agents, seed=seed + num_agents)
    return drawn, pool_of(drawn, num_agents)


def pool_of(drawn: list[tuple], num_agents: int):
    """The table's environment pool of ``drawn`` instances: its horizon, 21 x 21 maps, ``num_agents`` slots."""
    return instances.from_instances(drawn, HORIZON, num_agents=num_agents, shape=(21, 21))


def lifelong_pool(maps: int):
    drawn = instances.lifelong_instances(maps, LIFELONG_AGENTS, GOALS_PER_AGENT, seed=TEST_SEED + 1)
    return drawn, instances.from_instances(drawn, LIFELONG_HORIZON, num_agents=LIFELONG_AGENTS, shape=(21, 21))


def lifelong_rows(maps: int, learned: dict[str, tuple], with_baselines: bool = True) -> dict[str, dict]:
    """Goal arrivals per step at N=64 in ``restart`` mode over ``LIFELONG_HORIZON`` steps, per method
    (the ``learned`` policies', and with ``with_baselines`` random actions', shortest paths' and PIBT's).

    Every method runs in ``MapfEnv`` on the same maps and goal sequences; PIBT
    plans on the host one joint step at a time, taking each agent's next goal
    as the environment hands it out, and its joint actions replay unchanged.
    """
    n = LIFELONG_AGENTS
    drawn, pool = lifelong_pool(maps)
    env = lambda observation="local": MapfEnv(n, 5, "soft", "restart", pool, observation=observation)  # noqa: E731
    rows = {}
    if with_baselines:
        rows = {"random actions": evaluation.evaluate_policy(env(), pool, evaluation.random_actions(n),
                                                             jax.random.PRNGKey(1)),
                "shortest path, no coordination": evaluation.evaluate_policy(
                    env("map"), pool, evaluation.greedy_shortest_path(n), jax.random.PRNGKey(1)),
                "PIBT": evaluation.evaluate_actions(
                    env(), pool, evaluation.solver_actions(drawn, "pibt", LIFELONG_HORIZON, n, lifelong=True))}
    rows.update(learned_metrics(learned, n, pool, drawn, "restart", jax.random.PRNGKey(2)))
    return {label: {"mean": float(np.mean(m["throughput"])), "std": float(np.std(m["throughput"]))}
            for label, m in rows.items()}


def trained_actors(run_dir: Path, decode_rounds: int | None = None):
    """``({"sampled": act, "greedy": act}, policy, run)`` for seed 0 of a finished run; ``act(policy, obs, key)
    -> actions`` (``evaluation.evaluate_policy``'s form: the parameters are an argument, not a constant).
    ``decode_rounds``: for a map policy that decodes in rounds, this many instead of its config's."""
    from rlx.runner.components import load_trained

    run = load_trained(run_dir)
    policy, module = run.policy(0, 0), run.parts.agent_module
    if decode_rounds is not None and hasattr(module, "with_decode_rounds"):
        config = module.with_decode_rounds(run.parts.grid.configs[0], decode_rounds)
        agent = module.make(config, run.parts.env, run.parts.env_params)
    else:
        agent = run.agent(0)
    acts = {mode: (lambda policy, obs, key, greedy=(mode == "greedy"): agent.act(policy, obs, key, greedy))
            for mode in ("sampled", "greedy")}
    return acts, policy, run


def load_learned(learned: dict[str, Path]) -> dict[str, tuple]:
    """``{label: trained_actors(run_dir)}`` for the finished runs among ``learned``, each loaded once."""
    return {label: trained_actors(run_dir, DECODE_ROUNDS) for label, run_dir in learned.items()
            if (run_dir / "summary.json").exists()}


def learned_metrics(loaded: dict[str, tuple], n: int, pool, drawn: list[tuple], on_target: str,
                    key) -> dict[str, dict[str, np.ndarray]]:
    """Per-instance metrics of every loaded policy that can act with ``n`` agents: sampled, greedy and, for
    map policies, PIBT-shielded (``evaluation.shielded_actions``)."""
    rows = {}
    for label, (acts, policy, run) in loaded.items():
        observation = getattr(run.parts.env, "observation", "local")
        with_ids = getattr(run.parts.grid.configs[0], "agent_id", False) and observation not in MAP_OBSERVATIONS
        if with_ids and run.parts.env.num_agents != n:
            continue  # agent-id inputs fix the count
        env = MapfEnv(n, 5, "soft", on_target, pool, observation=observation)
        for mode, act in acts.items():
            rows[f"{label}, {mode}"] = evaluation.evaluate_policy(env, pool, act, key, policy)
        if observation in MAP_OBSERVATIONS:
            actions = evaluation.shielded_actions(env, pool, drawn, map_logits(run), seed=n)
            rows[f"{label} + PIBT shield (CS-PIBT)"] = evaluation.evaluate_actions(
                MapfEnv(n, 5, "soft", on_target, pool), pool, actions)
    return rows


def map_logits(run):
    """``obs [M, n, ...] -> logits [M, n, 5]`` of seed 0 of a trained map policy, jitted (its parameters an
    argument of the program, not a constant)."""
    logits = jax.jit(run.agent(0).logits)
    policy = run.policy(0, 0)
    return lambda obs: logits(policy, obs)


def validate(run_dirs: list[Path], maps: int = 256, counts: tuple[int, ...] = (32, 64), log: Callable = print,
             decode_rounds: int = DECODE_ROUNDS) -> dict[tuple[str, int], dict[str, float]]:
    """Sampled CSR, ISR and makespan of finished MAPF runs on ``maps`` validation maps per agent count
    (``VALIDATION_SEED``: neither training pools nor the table use them), so that a preset or a DAgger
    schedule is chosen without looking at the test maps. ``{(run_dir, n): summary}``."""
    results = {}
    for run_dir in run_dirs:
        loaded = trained_actors(Path(run_dir), decode_rounds)
        for n in counts:
            _, pool = test_pool(n, maps, VALIDATION_SEED)
            summary = sampled_summary(loaded, n, pool)
            results[(str(run_dir), n)] = summary
            log(f"{run_dir} N={n}: CSR {summary['csr']:.3f} ISR {summary['isr']:.3f} "
                f"makespan {summary['makespan']:.1f} ({maps} validation maps, sampled)")
    return results


def sampled_summary(loaded: tuple, num_agents: int, pool) -> dict[str, float]:
    """CSR, ISR and makespan of a run loaded by ``trained_actors``, acting by sampling on ``pool`` with the
    table's key for ``num_agents``."""
    acts, policy, run = loaded
    env = MapfEnv(num_agents, 5, "soft", "nothing", pool, observation=getattr(run.parts.env, "observation", "local"))
    return evaluation.summarize(evaluation.evaluate_policy(env, pool, acts["sampled"],
                                                           jax.random.PRNGKey(100 + num_agents), policy))


def refine_copy(source: Path, target: Path, rounds: tuple) -> None:
    """``target``: a copy of the finished run ``source`` refined by DAgger ``rounds``; the copy keeps the
    behaviour-cloning run for its own row. A ``target`` whose ``dagger.json`` records the same rounds on the
    same source run (its ``summary.json``) is kept as it is, a finished refinement; one that records the first
    rounds of ``rounds`` goes on with the rest (each entry of ``rounds`` runs on its own, so this is what
    running all of them would do); any other is moved aside to ``target.<date-time>``, never deleted."""
    from rlx.envs.mapf import dagger

    record = target / "dagger.json"
    source_summary = json.loads((source / "summary.json").read_text())
    schedule = lambda done: json.dumps({"rounds": [[count, options] for count, options in done],  # noqa: E731
                                        "source_summary": source_summary}, indent=1)
    previous = record.read_text() if record.exists() else None
    done = next((k for k in range(len(rounds), 0, -1) if previous == schedule(rounds[:k])), 0)
    if done == len(rounds):
        return
    if done == 0:
        if target.exists():
            target.rename(target.with_name(f"{target.name}.{time.strftime('%Y%m%d-%H%M%S')}"))
        shutil.copytree(source, target)
    for k in range(done, len(rounds)):
        count, options = rounds[k]
        print(f"[mapf_random] DAgger: {count} round(s), {options}", flush=True)
        dagger.refine(target, iterations=count, log=lambda line: print(line, flush=True), **options)
        record.write_text(schedule(rounds[:k + 1]))


def row_task(label: str) -> str:
    """The task (``TASKS``) whose run or solvers a row of the table comes from."""
    if label.startswith(DAGGER_LABEL):
        return "dagger"
    if label.startswith(POLICY_LABEL):
        return "map_policy"
    return "mappo" if label.startswith(MAPPO_LABEL) else "baselines"


def merge_rows(fresh: dict, kept: dict, tasks: tuple[str, ...]) -> dict:
    """The rows of ``tasks`` from ``fresh``, the others from ``kept``, grouped in ``TASKS`` order."""
    return {label: values for task in TASKS
            for label, values in (fresh if task in tasks else kept).items() if row_task(label) == task}


SAVED_EXTRAS = ("lifelong", "evaluated")  # results.json keys beside the table's rows


def saved_results(out: Path, quick: bool, tasks: tuple[str, ...]) -> dict:
    """The saved table's json when only some ``tasks`` are rerun (their rows replace the saved ones), else {};
    ``evaluated`` (each task's evaluation time) falls back on the saved markdown's "Generated" line."""
    check_tasks(tasks, TASKS)
    if set(tasks) == set(TASKS):
        return {}
    suffix = "_quick" if quick else ""
    saved, markdown = out / f"results{suffix}.json", out / f"results{suffix}.md"
    if not saved.is_file():
        raise SystemExit(f"--tasks {','.join(tasks)}: no saved {saved} to keep the other rows from; run them all")
    results = {label: value if label in SAVED_EXTRAS else {int(n): row for n, row in value.items()}
               for label, value in json.loads(saved.read_text()).items()}  # json keys are strings: N back to int
    if "evaluated" not in results:
        generated = markdown.read_text().split("Generated ", 1)[1].split(" by ", 1)[0] if markdown.is_file() else "?"
        results["evaluated"] = {task: generated for task in TASKS}
    return results


def reproduce(out: Path, quick: bool, skip_training: bool, tasks: tuple[str, ...] | None = None) -> Path:
    """Train (unless ``skip_training``), evaluate and write ``results.md`` / ``results.json`` into ``out``.

    ``tasks`` (``TASKS``): train and evaluate only those runs' rows (``baselines``: the solvers and untrained
    rows; ``dagger`` refines the existing behaviour-cloning run, it does not retrain it) and keep the saved
    table's other rows; the table says when each task's rows were evaluated."""
    tasks = tuple(tasks or TASKS)
    saved = saved_results(out, quick, tasks)
    maps = 8 if quick else 128
    runs, suffix = out / "runs", "_quick" if quick else ""
    cloned, refined, mappo = (runs / f"{name}{suffix}" for name in
                              ("mapf_map_policy", "mapf_map_policy_dagger", "mappo_mapf_random"))
    if not skip_training:
        quick_overrides = ("algo.total_timesteps=4096", "env.options.pool_size=16", "run.eval_episodes=4")
        for task, preset, run_dir in (("map_policy", "mapf_map_policy", cloned), ("mappo", "mappo_mapf_random", mappo)):
            if task in tasks:
                train_preset(preset, run_dir, 1, quick_overrides if quick else ())  # the presets train one seed
        if "dagger" in tasks or "map_policy" in tasks:
            refine_copy(cloned, refined, QUICK_DAGGER_ROUNDS if quick else DAGGER_ROUNDS)
    learned = {"map_policy": (POLICY_LABEL, cloned), "dagger": (DAGGER_LABEL, refined), "mappo": (MAPPO_LABEL, mappo)}
    loaded = load_learned(dict(value for task, value in learned.items() if task in tasks))
    rows: dict[str, dict[int, dict]] = {}
    started = time.time()
    for n in AGENT_COUNTS:
        drawn, pool = test_pool(n, maps)
        print(f"[mapf_random] N={n}: {maps} maps", flush=True)
        if "baselines" in tasks:
            rows.update({label: {**rows.get(label, {}), n: values}
                         for label, values in baseline_rows(n, drawn, pool).items()})
        for label, metrics in learned_metrics(loaded, n, pool, drawn, "nothing", jax.random.PRNGKey(100 + n)).items():
            rows.setdefault(label, {})[n] = evaluation.summarize(metrics)
    print(f"[mapf_random] lifelong: N={LIFELONG_AGENTS}, {maps} maps", flush=True)
    lifelong = lifelong_rows(maps, loaded, with_baselines="baselines" in tasks)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    evaluated = {task: stamp if task in tasks else saved["evaluated"][task] for task in TASKS}
    rows = merge_rows(rows, {label: row for label, row in saved.items() if label not in SAVED_EXTRAS}, tasks)
    lifelong = merge_rows(lifelong, saved.get("lifelong", {}), tasks)
    results = out / ("results_quick.md" if quick else "results.md")
    results.write_text(render(rows, maps, quick, time.time() - started, tasks, evaluated)
                       + render_lifelong(lifelong, maps))
    (out / ("results_quick.json" if quick else "results.json")).write_text(
        json.dumps({**rows, "lifelong": lifelong, "evaluated": evaluated}, indent=1))
    print(results.read_text())
    return results


def baseline_rows(n: int, drawn: list[tuple], pool) -> dict[str, dict]:
    """Summaries of the untrained rows at ``n`` agents: random actions, shortest paths, the solvers."""
    local = MapfEnv(n, 5, "soft", "nothing", pool)
    rows = {"random actions": evaluation.summarize(
        evaluation.evaluate_policy(local, pool, evaluation.random_actions(n), jax.random.PRNGKey(n)))}
    whole_map = MapfEnv(n, 5, "soft", "nothing", pool, observation="map")
    rows["shortest path, no coordination"] = evaluation.summarize(
        evaluation.evaluate_policy(whole_map, pool, evaluation.greedy_shortest_path(n), jax.random.PRNGKey(n)))
    for label, solver in (("PIBT", "pibt"), ("PIBT with swap, ties by index", "pibt_swap_by_index"),
                          ("PIBT with swap, ties by index and shown numbers", "pibt_swap_noise"),
                          ("PIBT with swap, shown numbers, deferral at goal pockets (the map policy's teacher)",
                           "pibt_swap_defer"),
                          ("PIBT with swap, shown numbers, deferral at goal pockets, routing round resting agents "
                           "and giving way", "pibt_swap_route"),
                          ("prioritized planning (space-time A*)", "prioritized"),
                          ("LaCAM (ours, Python, PIBT with swap, at most 20,000 configurations)", "lacam")):
        actions = evaluation.solver_actions(drawn, solver, HORIZON, n)
        rows[label] = evaluation.summarize(evaluation.evaluate_actions(local, pool, actions))
    return rows


def render(rows: dict, maps: int, quick: bool, seconds: float, tasks: tuple[str, ...] = TASKS,
           evaluated: dict | None = None) -> str:
    lines = ["# MAPF on unseen POGEMA-style random maps", ""]
    if quick:
        lines += ["QUICK smoke test (tiny budgets, 8 maps): these numbers mean nothing.", ""]
    command = f"python -m rlx.reproduce mapf_random{' --quick' if quick else ''}"
    generated = f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}"
    if set(tasks) == set(TASKS):
        generated += "`"
    else:
        when = ", ".join(f"{task} {stamp}" for task, stamp in (evaluated or {}).items())
        generated += (f" --tasks {','.join(tasks)}`, which re-evaluated those rows and kept the others (rows "
                      f"evaluated: {when})")
    lines += [f"{generated} ({seconds:.0f} s of evaluation). {maps} maps per N, "
              "17-21 cells a side, density 0.1-0.3, horizon 128, soft collisions, `nothing` mode.", "",
              "CSR (all agents on their goals at once) / ISR (share of agents on their goal at the end):", "",
              "| method | " + " | ".join(f"N={n}" for n in AGENT_COUNTS) + " |",
              "|---|" + "---:|" * len(AGENT_COUNTS)]
    for label, per_n in rows.items():
        cells = [f"{per_n[n]['csr']:.2f} / {per_n[n]['isr']:.2f}" if n in per_n else "—" for n in AGENT_COUNTS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Sum of costs / makespan over the solved instances (each method's own: a method that solves fewer, "
              "easier maps looks cheaper, so compare these only between rows of similar CSR):", "",
              "| method | " + " | ".join(f"N={n}" for n in AGENT_COUNTS) + " |",
              "|---|" + "---:|" * len(AGENT_COUNTS)]
    for label, per_n in rows.items():
        cells = [f"{per_n[n]['soc']:.0f} / {per_n[n]['makespan']:.0f}" if n in per_n and per_n[n]["csr"] > 0 else "—"
                 for n in AGENT_COUNTS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    published = ", ".join(f"{name} {value:.2f}" for name, value in PUBLISHED_N64.items())
    lines += ["", f"POGEMA's published CSR at N=64 (its own runs, for reference): {published}; pure MARL "
              "scores 0 from N=16.", "",
              "Learned policies act by sampling from their action distributions (\"sampled\") or by taking the "
              "most likely action (\"greedy\"); greedy agents fall into repeating conflicts (two agents "
              "blocking each other forever), which sampling breaks.", "",
              "Targets: map policy CSR >= 0.9 at N=32 and >= 0.7 at N=64; MAPPO CSR >= 0.5 at N=16.", ""]
    for label, n, target in ((f"{DAGGER_LABEL}, sampled", 32, 0.9), (f"{DAGGER_LABEL}, sampled", 64, 0.7),
                             (f"{MAPPO_LABEL}, sampled", 16, 0.5)):
        value = rows.get(label, {}).get(n, {}).get("csr")
        verdict = "not run" if value is None else ("MET" if value >= target else "MISSED")
        lines.append(f"- {label} at N={n}: {'—' if value is None else f'{value:.2f}'} (target {target}): {verdict}")
    return "\n".join(lines) + "\n"


def render_lifelong(rows: dict, maps: int) -> str:
    lines = ["", f"## Lifelong (`restart` mode): N={LIFELONG_AGENTS}", "",
             f"{maps} unseen maps as above, {LIFELONG_HORIZON} steps, soft collisions; each agent follows a fixed "
             f"sequence of {GOALS_PER_AGENT} goals (each a random free cell of its component other than the "
             "previous goal), the next one handed out on arrival. Throughput: goal arrivals per step (all agents "
             "together), mean ± std over maps.", "",
             "| method | throughput | per agent |", "|---|---:|---:|"]
    for label, value in rows.items():
        lines.append(f"| {label} | {value['mean']:.2f} ± {value['std']:.2f} | "
                     f"{value['mean'] / LIFELONG_AGENTS:.3f} |")
    lines += ["", "The learned policies were trained in `nothing` mode (the map policy at N=32, MAPPO at N=16) and "
              "are applied here unchanged: their inputs show each agent's current goal."]
    return "\n".join(lines) + "\n"


def placement_effect(run_dirs: list[Path], num_agents: int = 64, maps: int = 128, log: Callable = print) -> dict:
    """CSR of the teacher and of finished map-policy runs on the table's maps at ``num_agents``, with agents
    placed as the table places them and as POGEMA does (``instances.placed_as_pogema``): what the difference
    between the two placement rules is worth. ``{(method, rule): summary}``."""
    drawn, table_pool = test_pool(num_agents, maps)
    repositioned = instances.placed_as_pogema(drawn, seed=num_agents)
    placements = {"ours": (drawn, table_pool), "pogema": (repositioned, pool_of(repositioned, num_agents))}
    runs = {str(run_dir): trained_actors(Path(run_dir), DECODE_ROUNDS) for run_dir in run_dirs}
    results = {}
    for rule, (placed, pool) in placements.items():
        teacher = evaluation.solver_actions(placed, "pibt_swap_defer", HORIZON, num_agents)
        results[("teacher", rule)] = evaluation.summarize(
            evaluation.evaluate_actions(MapfEnv(num_agents, 5, "soft", "nothing", pool), pool, teacher))
        for name, loaded in runs.items():
            results[(name, rule)] = sampled_summary(loaded, num_agents, pool)
        for method in ("teacher", *runs):
            summary = results[(method, rule)]
            log(f"{method}, placed as {rule}: CSR {summary['csr']:.3f} ISR {summary['isr']:.3f} "
                f"({maps} test maps, N={num_agents})")
    return results


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Sampled CSR of finished MAPF runs on validation maps "
                                     "(validate), or on the test maps under both placement rules (placement).")
    parser.add_argument("command", choices=["validate", "placement"])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--maps", type=int, default=256, help="validation maps per agent count")
    parser.add_argument("--agents", default="32,64", help="comma-separated agent counts")
    parser.add_argument("--decode-rounds", type=int, default=DECODE_ROUNDS, help="map policies' decoding rounds")
    args = parser.parse_args()
    from rlx.runner import compile_cache

    compile_cache.prepare_command()
    if args.command == "placement":
        placement_effect(args.run_dirs, int(args.agents.split(",")[-1]), args.maps)
    else:
        validate(args.run_dirs, args.maps, tuple(int(n) for n in args.agents.split(",")),
                 decode_rounds=args.decode_rounds)
