"""Benchmark: MAPPO training throughput on MPE simple_spread, rlx vs JaxMARL, next to raw env stepping.

Usage::

    .venv/bin/python scripts/bench_marl.py [--envs 16,128,1024] [--quick]
                                           [--jaxmarl-repo PATH] [--skip-jaxmarl-mappo]
    .venv/bin/python scripts/bench_marl.py --breakdown 1024 [--unroll 1,8]   # where one update's time goes
    .venv/bin/python scripts/bench_marl.py --phases 1024   # rollout vs one learning epoch, rlx and JaxMARL

For each number of parallel environments E (16, 128, 1024), in ONE process on the same machine:

* **raw stepping**: JaxMARL's own ``MPE_simple_spread_v3`` (the jaxmarl package), 128 steps of
  ``vmap(env.step)`` with uniformly random actions under ``lax.scan``, jitted;
* **rlx MAPPO**: ``rlx/agents/mappo.py`` on ``env=mpe_spread`` (the adapter over the same JaxMARL
  environment), U updates of E envs x 128 steps, each update = rollout + GAE + 4 epochs x 4
  minibatches, in one jitted ``lax.scan``;
* **JaxMARL MAPPO** (optional): JaxMARL's ``baselines/MAPPO/mappo_rnn_mpe.py`` from a JaxMARL
  checkout OUTSIDE this repository (``--jaxmarl-repo``; its ``make_train`` with its MPE config,
  ``TOTAL_TIMESTEPS`` set to the same U updates). Without a checkout its column says it was not run.

The two recurrent MAPPOs have the same network (since 2026-12-06): actor and critic Dense(128)+ReLU,
GRU(128), Dense(128)+ReLU, output layer, as JaxMARL's ``mappo_rnn_mpe.py`` (whose config's
``ACTIVATION: tanh`` is never read); rlx's ``recurrent=true gru_size=128 hidden_sizes=[128]
post_gru_sizes=[128] activation=relu``, value normalisation and input LayerNorm off. The footer prints
both parameter counts (rlx's 1,280 more: agent ids in the actor's and the critic's inputs, 2 x 384, and
a bias on each of the GRU's hidden-side gates, where flax's GRUCell has one, 512).
Both timed programs initialise the agent; JaxMARL's also resets its envs outside its update loop and
makes one host ``io_callback`` (its wandb logging, disabled here) per update.

Every program is compiled first (compile seconds reported separately), run once untimed, and then
timed over ``--repeats`` runs (median). Every timed program returns a checksum of all its outputs
(``bench_common.checksum``), so the compiler cannot drop any of the work. Throughput = joint env
steps per second (x3 for agent-steps). Prints a markdown table and writes it to
``.bench/bench_marl.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rlx.runner import compile_cache  # noqa: E402

compile_cache.set_xla_flags()  # before JAX starts: the jaxlib 0.10 scheduler workaround

import jax  # noqa: E402
from bench_common import checksum, save_table, timed  # noqa: E402

NUM_STEPS = 128
NUM_AGENTS = 3
# Parameters of JaxMARL's mappo_rnn_mpe.py actor + critic on simple_spread: Dense 128, GRU 128, Dense 128, output
JAXMARL_PARAMETERS = 240_902


def raw_stepping(num_envs: int, repeats: int) -> tuple[float, float, int]:
    """JaxMARL's MPE spread with random actions: (compile s, run s, joint steps)."""
    from rlx.envs.jaxmarl import import_jaxmarl_module

    env = import_jaxmarl_module("jaxmarl.environments.mpe.simple_spread").SimpleSpreadMPE()

    def rollout(key):
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

        def step(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            actions = jax.random.randint(action_key, (len(env.agents), num_envs), 0, 5)
            action_dict = {agent: actions[i] for i, agent in enumerate(env.agents)}
            outputs = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state, action_dict)
            # every output (observations, state, rewards, dones, info): none of the stepping may be dropped
            return (outputs[1], key), checksum(outputs)

        (state, _), sums = jax.lax.scan(step, (state, key), None, NUM_STEPS)
        return sums.sum() + checksum(state)

    compile_s, run_s, _ = timed(rollout, jax.random.PRNGKey(0), repeats=repeats)
    return compile_s, run_s, num_envs * NUM_STEPS


def rlx_mappo(num_envs: int, updates: int, repeats: int, recurrent: bool, epochs: int = 4) -> tuple[float, float, int, int]:
    """rlx MAPPO: (compile s, run s for ``updates`` updates, joint steps, parameters of actor and critic).

    ``recurrent``: JaxMARL's baseline network (Dense 128 + ReLU, GRU 128, Dense 128 + ReLU, output layer, in
    actor and critic; no value or input normalisation); otherwise MAPPO's default feed-forward 64x64 ReLU
    network. The timed program includes the agent's initialisation, as JaxMARL's ``train`` does.
    """
    from rlx.agents import mappo
    from rlx.envs import registry

    env, params = registry.make("mpe_spread")
    shape = (dict(recurrent=True, gru_size=128, hidden_sizes=(128,), post_gru_sizes=(128,), activation="relu",
                  input_norm=False, normalize_values=False) if recurrent else {})
    config = mappo.Config(lr=2e-3, num_envs=num_envs, num_steps=NUM_STEPS, num_epochs=epochs, num_minibatches=4,
                          total_timesteps=num_envs * NUM_STEPS * updates, **shape)
    mappo.validate(config)
    agent = mappo.make(config, env, params)

    def train(key):
        return checksum(jax.lax.scan(lambda s, _: agent.update(s), agent.init(key), None, updates))

    compile_s, run_s, _ = timed(train, jax.random.PRNGKey(0), repeats=repeats)
    parameters = count_parameters(jax.eval_shape(agent.init, jax.random.PRNGKey(0)).params)
    return compile_s, run_s, num_envs * NUM_STEPS * updates, parameters


def count_parameters(tree) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(tree))


def disable_wandb() -> None:
    """Turn wandb's logging off for JaxMARL's baseline; where wandb is not installed (an accelerator
    machine with no package index), a stand-in whose calls do nothing, which is what disabled wandb does."""
    try:
        import wandb
    except ImportError:
        import types

        wandb = types.ModuleType("wandb")
        wandb.init = wandb.log = wandb.finish = lambda *args, **kwargs: None
        sys.modules["wandb"] = wandb
    wandb.init(mode="disabled")


def jaxmarl_mappo(repo: Path, num_envs: int, updates: int, repeats: int,
                  epochs: int = 4) -> tuple[float, float, int, int | None]:
    """JaxMARL's own MAPPO baseline, at the same sizes: (compile s, run s, joint steps, parameters or None).

    Its timed ``train`` includes its initialisation, env reset and one io_callback per update."""
    from omegaconf import OmegaConf

    disable_wandb()  # the baseline logs through wandb.log in an io_callback
    source = repo / "baselines" / "MAPPO" / "mappo_rnn_mpe.py"
    spec = importlib.util.spec_from_file_location("jaxmarl_mappo_rnn_mpe", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # OmegaConf, as the baseline's own Hydra entry point: it reads 2e-3 and 1e7 as numbers, plain YAML as strings
    config = OmegaConf.to_container(OmegaConf.load(repo / "baselines" / "MAPPO" / "config" / "mappo_homogenous_rnn_mpe.yaml"))
    config.update(NUM_ENVS=num_envs, NUM_STEPS=NUM_STEPS, TOTAL_TIMESTEPS=num_envs * NUM_STEPS * updates,
                  UPDATE_EPOCHS=epochs)
    train = module.make_train(config)
    compile_s, run_s, output = timed(train, jax.random.PRNGKey(0), repeats=repeats)
    try:  # {"runner_state": ((train_states, env_state, ...), update_steps)}; train_states: (actor, critic)
        parameters = count_parameters([ts.params for ts in output["runner_state"][0][0]])
    except (KeyError, IndexError, TypeError, AttributeError):
        parameters = None
    return compile_s, run_s, num_envs * NUM_STEPS * updates, parameters


def breakdown(num_envs: int, repeats: int, unrolls: list[int]) -> list[str]:
    """Where a feed-forward MAPPO update's time goes: markdown rows of env steps/s for stepping alone
    (JaxMARL's, then our adapter's with the world states the critic reads), MAPPO's rollout with its
    networks, and the whole update (rollout, GAE, 4 epochs x 4 minibatches); the last two once for each
    number of rollout steps per loop iteration in ``unrolls`` (``rollout_unroll``)."""
    from rlx.agents import mappo
    from rlx.envs import registry

    env, params = registry.make("mpe_spread")
    steps = num_envs * NUM_STEPS

    def adapter_stepping(key):
        _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, num_envs), params)

        def step(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            actions = jax.random.randint(action_key, (num_envs, NUM_AGENTS), 0, 5)
            outputs = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, actions, params)
            state = outputs[1]
            world = jax.vmap(env.world_state, in_axes=(0, None))(state, params)
            return (state, key), checksum((outputs, world))

        (state, _), sums = jax.lax.scan(step, (state, key), None, NUM_STEPS)
        return sums.sum() + checksum(state)

    parts = [("JaxMARL's stepping, random actions, observations included", raw_stepping(num_envs, repeats)[1]),
             ("rlx adapter's stepping with world states", timed(adapter_stepping, jax.random.PRNGKey(0), repeats=repeats)[1])]
    for rollout_unroll in unrolls:
        config = mappo.Config(lr=2e-3, num_envs=num_envs, num_steps=NUM_STEPS, num_epochs=4, num_minibatches=4,
                              total_timesteps=steps, rollout_unroll=rollout_unroll)
        agent = mappo.make(config, env, params)
        state = jax.jit(agent.init)(jax.random.PRNGKey(0))
        suffix = f", {rollout_unroll} steps per loop iteration" if unrolls != [1] else ""
        # checksum: every leaf of the transitions and of the final state, so the compiler keeps the
        # critic, the world states and the log-probabilities (summing only the rewards let it drop them)
        parts += [(f"MAPPO rollout (networks included){suffix}",
                   timed(lambda s: checksum(agent.collect(s)), state, repeats=repeats)[1]),
                  (f"MAPPO update (rollout + learning){suffix}",
                   timed(lambda s: checksum(agent.update(s)), state, repeats=repeats)[1])]
    return [f"| {label} | {rate(steps, seconds)} |" for label, seconds in parts]


def phases(repo: Path, num_envs: int, updates: int, repeats: int) -> list[str]:
    """Both recurrent MAPPOs split into the rest of an update (rollout, GAE, initialisation) and one learning
    epoch, from their times with 1 and with 4 epochs: markdown rows of seconds per update."""
    rows = []
    for name, run in [("rlx", lambda e: rlx_mappo(num_envs, updates, repeats, recurrent=True, epochs=e)),
                      ("JaxMARL", lambda e: jaxmarl_mappo(repo, num_envs, updates, repeats, epochs=e))]:
        one, four = (run(epochs)[1] / updates for epochs in (1, 4))
        epoch = (four - one) / 3
        rows.append(f"| {name} | {one - epoch:.3f} | {epoch:.3f} | {four:.3f} |")
    return rows


def rate(steps: int, seconds: float) -> str:
    return f"{steps / seconds:,.0f}"


def table_row(num_envs: int, raw, ours, theirs, feed_forward) -> str:
    """One markdown row from the (compile s, run s, joint steps) triples of one env count."""
    raw_rate = raw[2] / raw[1]
    ours_rate = ours[2] / ours[1]
    ff_rate = feed_forward[2] / feed_forward[1]
    theirs_cell = rate(theirs[2], theirs[1]) if theirs else "—"
    ratio = f"{ours_rate / (theirs[2] / theirs[1]):.2f}x" if theirs else "—"
    compile_cells = f"{raw[0]:.1f} / {ours[0]:.1f} / {f'{theirs[0]:.1f}' if theirs else '—'} / {feed_forward[0]:.1f}"
    return (f"| {num_envs} | {rate(raw[2], raw[1])} | {ours_rate:,.0f} ({NUM_AGENTS * ours_rate:,.0f}) | {theirs_cell} "
            f"| {ratio} | {ours_rate / raw_rate:.0%} | {ff_rate:,.0f}, {ff_rate / raw_rate:.0%} | {compile_cells} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="16,128,1024", help="comma-separated numbers of parallel environments")
    parser.add_argument("--updates", default="4,2,1", help="MAPPO updates timed per env count (same order)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--jaxmarl-repo", type=Path, default=ROOT / ".bench" / "JaxMARL",
                        help="a JaxMARL checkout (outside the package) holding baselines/MAPPO")
    parser.add_argument("--skip-jaxmarl-mappo", action="store_true")
    parser.add_argument("--quick", action="store_true", help="16 and 128 envs, 1 update, 1 repeat: plumbing only")
    parser.add_argument("--breakdown", type=int, default=None, metavar="ENVS",
                        help="only time the parts of a feed-forward MAPPO update at ENVS parallel envs")
    parser.add_argument("--unroll", default="1",
                        help="with --breakdown: comma-separated rollout steps per loop iteration to time, e.g. 1,8")
    parser.add_argument("--phases", type=int, default=None, metavar="ENVS",
                        help="only time both recurrent MAPPOs at ENVS envs with 1 and 4 epochs: rollout vs learning")
    args = parser.parse_args(argv)
    envs = [int(e) for e in args.envs.split(",")]
    updates = [int(u) for u in args.updates.split(",")]
    if args.phases:
        timed_updates = dict(zip(envs, updates)).get(args.phases, 1)
        print(f"| {args.phases} envs, seconds per update | rollout, GAE, set-up | one learning epoch | update with 4 epochs |"
              "\n|---|---:|---:|---:|")
        print("\n".join(phases(args.jaxmarl_repo, args.phases, timed_updates, args.repeats)))
        return
    if args.breakdown:
        print(f"| {args.breakdown} envs x {NUM_STEPS} steps, MAPPO 64x64 | env steps/s |\n|---|---:|")
        print("\n".join(breakdown(args.breakdown, args.repeats, [int(u) for u in args.unroll.split(',')])))
        return
    if args.quick:
        envs, updates, args.repeats = envs[:2], [1] * 2, 1
    if args.skip_jaxmarl_mappo:
        jaxmarl_absent = "JaxMARL MAPPO: not run (--skip-jaxmarl-mappo)"
    elif not (args.jaxmarl_repo / "baselines" / "MAPPO").is_dir():
        jaxmarl_absent = f"JaxMARL MAPPO: not run (no checkout at {args.jaxmarl_repo})"
    else:
        jaxmarl_absent = None
    if jaxmarl_absent:
        print(f"[bench_marl] {jaxmarl_absent}", flush=True)
    load = os.getloadavg()
    rows = []
    for num_envs, num_updates in zip(envs, updates):
        print(f"[bench_marl] {num_envs} envs: raw stepping", flush=True)
        raw = raw_stepping(num_envs, args.repeats)
        print(f"[bench_marl] {num_envs} envs: rlx MAPPO, {num_updates} updates", flush=True)
        ours = rlx_mappo(num_envs, num_updates, args.repeats, recurrent=True)
        print(f"[bench_marl] {num_envs} envs: rlx MAPPO feed-forward, {num_updates} updates", flush=True)
        feed_forward = rlx_mappo(num_envs, num_updates, args.repeats, recurrent=False)
        theirs = None
        if jaxmarl_absent is None:
            print(f"[bench_marl] {num_envs} envs: JaxMARL MAPPO, {num_updates} updates", flush=True)
            theirs = jaxmarl_mappo(args.jaxmarl_repo, num_envs, num_updates, args.repeats)
        rows.append((num_envs, num_updates, raw, ours, theirs, feed_forward))
        print(table_row(num_envs, raw, ours, theirs, feed_forward), flush=True)  # kept if a later row is cut off

    lines = [
        "# MAPPO on MPE simple_spread (3 agents): training throughput, rlx vs JaxMARL, and raw stepping",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, jax {jax.__version__}, "
        f"backend {jax.default_backend()}; load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}"
        + ("; QUICK (numbers meaningless)" if args.quick else ""),
        f"command: `python scripts/bench_marl.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "| envs | raw random stepping: env steps/s | rlx MAPPO training: env steps/s (agent-steps/s) "
        "| JaxMARL MAPPO training: env steps/s | rlx / JaxMARL | rlx training / raw stepping "
        "| rlx feed-forward MAPPO (default 64x64 network): env steps/s, / raw | compile s (raw / rlx / JaxMARL / ff) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [table_row(num_envs, raw, ours, theirs, feed_forward) for num_envs, _, raw, ours, theirs, feed_forward in rows]
    ours_parameters = rows[0][3][3] if rows else 0
    # JaxMARL's count when measured, else that of its mappo_rnn_mpe.py on MPE spread (18-wide observations)
    theirs_parameters = next((theirs[3] for *_, theirs, _ in rows if theirs and theirs[3]), JAXMARL_PARAMETERS)
    if jaxmarl_absent:
        peer_text = f"{jaxmarl_absent}; its columns are empty. "
    else:
        peer_text = ""
    lines += [
        "",
        f"Each update: E envs x {NUM_STEPS} steps, GAE, 4 epochs x 4 minibatches; timed updates per env count: "
        f"{', '.join(f'{e} envs: {u}' for e, u, *_ in rows)}. {peer_text}"
        "Both recurrent MAPPOs: actor and critic Dense 128 + ReLU, GRU 128, Dense 128 + ReLU, output layer "
        "(JaxMARL's config's ACTIVATION: tanh is never read by its code), centralized critic, lr 2e-3, no value "
        f"normalisation or input LayerNorm; rlx {ours_parameters:,} parameters, JaxMARL's mappo_rnn_mpe.py"
        + ("" if jaxmarl_absent else " (measured here)") + f" {theirs_parameters:,}. Both timed programs "
        "include the agent's initialisation; JaxMARL's also makes one host io_callback per update (wandb "
        "logging, disabled). "
        "The feed-forward column is MAPPO's default network (64x64 ReLU, "
        "input LayerNorm, value normalisation, agent ids). One seed, one device "
        f"({jax.devices()[0].device_kind}). Times are medians of the repeats after compilation and one untimed "
        f"run; each timed program returns a checksum of all its outputs, so nothing is compiled away; raw "
        f"stepping = {NUM_STEPS} steps of JaxMARL's vmapped env.step with random actions, observations, states, "
        "rewards and dones all kept, nothing learned.",
    ]
    table = "\n".join(lines) + "\n"
    save_table("bench_marl", table)
    print(table)


if __name__ == "__main__":
    main()
