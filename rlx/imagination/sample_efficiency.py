"""Sample efficiency of imagination: ``python -m rlx.reproduce imagination_efficiency [--quick] [--seeds 5]``.

For CartPole-v1 (target 475) and Acrobot-v1 (target -100), trains the ``dyna_ppo_*`` preset and the
model-free ``ppo_*`` preset of the same task (both with 64x64 policy and value networks), 5 seeds
vmapped in one program per preset, and evaluates the greedy policy (32 episodes per seed) every
``EVAL_EVERY`` real environment steps, rounded up to whole updates (a preset whose update is longer, as
``ppo_acrobot``'s, is evaluated after every update; the table gives each preset's interval). Reports, per
seed, the real environment steps at which the evaluation return first reaches the target ("first"), the
first step from which it holds the target for ``HOLD_EVALUATIONS`` evaluations in a row ("held": a window
cut short by the end of the budget counts when every evaluation left in it is on target, so a seed near
the end of a short budget may hold on fewer evaluations; the issue's target is judged on it), and the
step after which it stays there until the end of
the budget ("stays": a longer budget gives more chances to dip, so it favours the shorter run); the
medians and the ratio dyna_ppo / PPO; and the wall-clock seconds of each run (compile time apart).
Writes ``experiments/imagination/sample_efficiency.md`` and ``.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from rlx.imagination import measured_on, read_saved, save_json, seed_count, today

EXPERIMENT_DIR = "imagination"
EVAL_EPISODES = 32
EVAL_EVERY = 1024  # real env steps between evaluations (rounded up to whole updates)
HOLD_EVALUATIONS = 5  # "held": this many evaluations in a row at or above the target (~5k real steps)
SEEDS = 5  # without --seeds (2 with --quick)
# task -> (target return, {row label: preset})
TASKS = {
    "CartPole-v1": (475.0, {"dyna_ppo": "dyna_ppo_cartpole", "PPO (model-free)": "ppo_cartpole"}),
    "Acrobot-v1": (-100.0, {"dyna_ppo": "dyna_ppo_acrobot", "PPO (model-free)": "ppo_acrobot"}),
}


def preset_parts(preset: str, overrides: tuple[str, ...] = ()):
    """The agent module, its Config, environment and parameters of ``+exp=preset`` (as ``rlx.train`` reads it)."""
    from hydra import compose, initialize_config_dir

    from rlx.reproduce import ROOT
    from rlx.runner import components

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"+exp={preset}", *overrides])
    parts = components.build(cfg)
    return parts.agent_module, parts.grid.configs[0], parts.env, parts.env_params


def evaluation_curve(preset: str, seeds: int, overrides: tuple[str, ...] = ()) -> dict:
    """Greedy evaluation returns ``[evaluations, seeds]`` at the real env steps of each evaluation, and timings."""
    import jax

    from rlx.runner.evaluation import evaluate

    module, config, env, params = preset_parts(preset, overrides)
    agent = module.make(config, env, params)
    steps_per_update = config.num_envs * config.num_steps
    updates_per_eval = max(1, -(-EVAL_EVERY // steps_per_update))
    evaluations = config.total_timesteps // (steps_per_update * updates_per_eval)

    def chunk(state):
        return jax.lax.scan(lambda s, _: (agent.update(s)[0], None), state, None, updates_per_eval)[0]

    def score(state, key):
        return jax.vmap(lambda policy, k: evaluate(agent, env, params, policy, k, EVAL_EPISODES, True).mean())(
            state.policy, jax.random.split(key, seeds))

    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    started = time.time()
    init, chunk, score = (jax.jit(jax.vmap(agent.init)).lower(keys).compile(),
                          jax.jit(jax.vmap(chunk)), jax.jit(score))
    state = init(keys)
    chunk = chunk.lower(state).compile()
    score = score.lower(state, keys[0]).compile()
    compile_seconds = time.time() - started
    returns, train_seconds, eval_key = [], 0.0, jax.random.PRNGKey(1)
    for _ in range(evaluations):
        started = time.time()
        state = jax.block_until_ready(chunk(state))
        train_seconds += time.time() - started
        eval_key, key = jax.random.split(eval_key)
        returns.append(np.asarray(score(state, key), np.float64))
    steps = [(i + 1) * updates_per_eval * steps_per_update for i in range(evaluations)]
    return {"steps": steps, "returns": np.stack(returns).tolist(), "compile_seconds": compile_seconds,
            "train_seconds": train_seconds, "budget": steps[-1]}


def steps_to_target(steps, returns, target: float, hold: int = HOLD_EVALUATIONS) -> dict:
    """Per seed (None: never): ``first`` evaluation step at or above ``target``, the first from which ``hold``
    evaluations in a row are, or all the remaining ones if fewer (``held``), and the first after which all
    are (``settled``)."""
    returns = np.asarray(returns)
    step_of = lambda flags: steps[int(np.argmax(flags))] if flags.any() else None  # noqa: E731
    first, held, settled = [], [], []
    for seed in range(returns.shape[1]):
        above = returns[:, seed] >= target
        # the window starting at each evaluation; one cut short by the end of the budget counts if all of it is above
        padded = np.concatenate([above, np.ones(hold - 1, bool)]).astype(int)
        runs = np.convolve(padded, np.ones(hold, int), mode="valid") == hold
        first.append(step_of(above))
        held.append(step_of(runs))
        settled.append(step_of(np.flip(np.cumprod(np.flip(above))).astype(bool)))  # above from here to the end
    return {"first": first, "held": held, "settled": settled}


def median_steps(values: list) -> float:
    """Median over seeds, counting a seed that never reached the target as infinitely many steps."""
    return float(np.median([np.inf if v is None else v for v in values]))


def ratio_of_medians(model_based: list, model_free: list) -> float:
    """dyna_ppo's median steps over PPO's (nan when PPO never got there)."""
    free = median_steps(model_free)
    return median_steps(model_based) / free if np.isfinite(free) else float("nan")


def evaluation_interval(steps: list) -> int:
    """Real env steps between a row's evaluations: ``EVAL_EVERY`` rounded up to the preset's whole updates."""
    return int(steps[0])


def markdown(results: dict, seeds: int, quick: bool, measured: str) -> str:
    fmt = lambda v: "never" if v is None or not np.isfinite(v) else f"{v / 1000:.1f}k"  # noqa: E731
    lines = [f"Measured {measured} on this machine's CPU"
             f"{' (--quick: tiny budgets, the numbers mean nothing)' if quick else ''}: real env steps until the "
             f"greedy evaluation return ({EVAL_EPISODES} episodes per seed, every {EVAL_EVERY} steps rounded up to "
             "whole updates: 'evaluated every' per preset) reaches the target, "
             f"{seeds} seeds per row: 'first' touch, 'held' = first step from which {HOLD_EVALUATIONS} "
             "evaluations in a row are at or above it (the target is judged on this; the real steps they span in "
             "brackets), 'stays' = the step after which every later evaluation is (favours the shorter budget). "
             "Wall-clock: all seeds of a row trained together (vmapped), compile excluded.", ""]
    for task, rows in results.items():
        target = TASKS[task][0]
        lines += [f"### {task} (target {target:g})", "",
                  f"| agent | preset | budget | evaluated every ({HOLD_EVALUATIONS} evaluations) | median steps to "
                  "target (first / held / stays) | per seed (held) | final return (mean) | train s | compile s |",
                  "|---|---|---:|---:|---:|---|---:|---:|---:|"]
        for label, row in rows.items():
            interval = evaluation_interval(row["steps"])
            lines.append(
                f"| {label} | `{row['preset']}` | {row['budget'] / 1000:.1f}k | "
                f"{fmt(interval)} ({fmt(HOLD_EVALUATIONS * interval)}) | {fmt(median_steps(row['first']))} / "
                f"{fmt(median_steps(row['held']))} / {fmt(median_steps(row['settled']))} | "
                f"{', '.join(fmt(v) for v in row['held'])} | "
                f"{np.mean(row['returns'][-1]):.1f} | {row['train_seconds']:.0f} | {row['compile_seconds']:.0f} |")
        ratios = {name: ratio_of_medians(rows["dyna_ppo"][name], rows["PPO (model-free)"][name])
                  for name in ("first", "held", "settled")}
        verdict = "HOLDS" if ratios["held"] <= 0.25 else "DOES NOT HOLD"
        lines += ["", f"dyna_ppo / PPO env steps (medians): first {ratios['first']:.2f}, held {ratios['held']:.2f}, "
                  f"stays {ratios['settled']:.2f}"
                  + (f". Target <= 0.25 (held): {verdict}" if task == "CartPole-v1" else ""), ""]
    return "\n".join(lines)


def reproduce(out: Path, quick: bool, skip_training: bool, seeds: int | None = None) -> Path:
    """Train every row (``skip_training``: re-render the saved json), write ``sample_efficiency{_quick}.md`` /
    ``.json`` into ``out``; the path of the table. ``seeds``: ``--seeds`` (None: ``SEEDS``, 2 with ``quick``)."""
    seeds = seed_count(seeds, quick, SEEDS)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""
    saved = out / f"sample_efficiency{suffix}.json"
    if skip_training:  # re-render the table from the saved curves
        return write_table(out / f"sample_efficiency{suffix}.md", read_saved(saved, __name__, quick), quick)
    results = {}
    for task, (target, presets) in TASKS.items():
        results[task] = {}
        for label, preset in presets.items():
            overrides = ("algo.total_timesteps=4096",) if quick else ()
            curve = evaluation_curve(preset, seeds, overrides)
            results[task][label] = {"preset": preset, **curve}
            print(f"{task} {label}: {steps_to_target(curve['steps'], curve['returns'], target)} "
                  f"({curve['train_seconds']:.0f} s)", flush=True)
    results["measured"] = today()
    save_json(saved, results)
    return write_table(out / f"sample_efficiency{suffix}.md", results, quick)


def write_table(path: Path, results: dict, quick: bool) -> Path:
    """Render the saved curves: the steps to target are computed here, so a re-render uses the current rules."""
    measured = measured_on(results.get("measured"))
    results = {task: {label: {**row, **steps_to_target(row["steps"], row["returns"], TASKS[task][0])}
                      for label, row in rows.items()} for task, rows in results.items() if task != "measured"}
    seeds = len(next(iter(next(iter(results.values())).values()))["first"])
    path.write_text(markdown(results, seeds, quick, measured))
    print(path.read_text())
    return path
