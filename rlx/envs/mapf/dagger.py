"""DAgger for the map policy: the learner's own episodes, each state labelled by one step of PIBT.

Behaviour cloning trains the map policy (``rlx/agents/map_policy.py``) on the
states PIBT visits; sampling each agent's move on its own, the learner soon
reaches states PIBT never shows it (agents facing each other in a corridor,
crowds around a goal) and does not know how to leave them. DAgger (Ross,
Gordon and Bagnell, AISTATS 2011) closes the gap: run the learner, ask the
expert what it would do in every state the learner visited, add those states
and labels to the training data, train again, repeat.

The expert here is one joint step of PIBT from the learner's configuration
(``experts.pibt_step``) with the priorities that PIBT would have at that point
of the learner's episode: the steps since each agent last stood on its goal
(``MapfEnv.waiting_steps``) plus the index tie-breaker (``experts.tiebreakers(n,
"index")``), which are what ``map_priority`` observations show. The learner's
episodes enter the pool as new entries whose ``behaviour_actions`` are the
learner's joint actions (replayed to reach the states) and whose
``expert_actions`` are PIBT's labels (``map_policy`` imitates those).

Host side: the labels come from PIBT in NumPy, one joint step per visited
state, so this module lives with the environment, not in the agent file.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlx.envs.mapf import evaluation, experts, tie_noise
from rlx.envs.mapf.env import NOISE_OBSERVATIONS, PRIORITY_OBSERVATIONS, MapfEnv, MapfParams


def rollouts(env: MapfEnv, pool: MapfParams, act: Callable, key, instances=None, params=()) -> dict[str, np.ndarray]:
    """The learner's episode on each pool entry in ``instances`` (default: all): ``actions [M, T, n]`` (waits
    once the episode is over), the ``positions [M, T, n, 2]`` and ``waiting [M, T, n]`` steps in which it chose
    them, and ``solved [M]``. ``act(params, obs [n, ...], key) -> actions [n]``, or ``-> (actions [n], decided
    [n])`` with the decoding round in which each agent chose (``map_policy``'s ``decode``), which is then
    returned too (``decided [M, T, n]``, zeros otherwise). Played by ``evaluation.run_episodes``, so the pool
    and ``params`` are arguments of one compiled program that DAgger's rounds share."""
    def choose(params, obs, state, t, key):
        chosen = act(params, obs, key)
        return chosen if isinstance(chosen, tuple) else (chosen, jnp.zeros_like(chosen))

    def record(state, actions, decided):
        return actions, state.positions, env.waiting_steps(state), decided

    _, (actions, positions, waiting, decided), solved = evaluation.run_episodes(
        env, pool, choose, key, params, instances, record)
    return {"actions": actions, "positions": positions, "waiting": waiting, "solved": solved, "decided": decided}


def earlier_commitments(actions: np.ndarray, decided: np.ndarray, rounds: int, share: float, rng) -> np.ndarray:
    """``int8[M, T, n]``: for a ``share`` of the learner's steps, drawn at random, the actions its agents had
    committed to before a decoding round drawn from 1 .. ``rounds`` - 1 (``decided``: each agent's round),
    -1 for the others and for every agent of the remaining steps."""
    cut = rng.integers(1, max(rounds, 2), actions.shape[:2])[..., None]
    drawn = rng.random(actions.shape[:2])[..., None] < share
    return np.where(drawn & (decided >= 0) & (decided < cut), actions, -1).astype(np.int8)


def shown_tie_noise(pool: MapfParams, instance: int, move_noise: bool = True) -> Callable:
    """``t -> float32[H, W]``: the tie-break numbers that ``map_noise`` observations show at step ``t`` of pool
    entry ``instance`` (computed from the same starts and agent mask as ``MapfEnv.tie_noise_plane``), or
    ``t -> None`` without ``move_noise`` (random ties)."""
    if not move_noise:
        return lambda t: None
    seed = tie_noise.instance_seed(np.asarray(pool.starts[instance]), np.asarray(pool.agent_mask[instance]))
    return lambda t: tie_noise.noise_grid(seed, t, *pool.blocked.shape[1:])


def pibt_labels(pool: MapfParams, instances, positions: np.ndarray, waiting: np.ndarray, seed: int = 0,
                **teacher) -> np.ndarray:
    """``int8[M, T, n]``: PIBT's joint action in each visited state (``positions [M, T, n, 2]``,
    ``waiting [M, T, n]`` of pool entries ``instances``), with PIBT's priorities at that point;
    ``swap``: with PIBT's swap operation (the teacher ``pibt_swap_by_index``); ``move_noise``: ties between
    moves by the step's shared ``tie_noise`` numbers (``pibt_swap_noise``); ``defer``: agents whose goals would
    shut others out of a pocket keep off them (``experts.deferred``: ``pibt_swap_defer``; ``waiting`` then counts
    from the last step on the goal or deferred, as ``map_defer``'s ``MapfEnv.waiting_steps`` does); ``give_way``
    and ``route``: pushed agents step aside, agents plan around resting ones (``pibt_swap_route``).

    Unused agent slots get waits. Needs the pool's ``goal_distances`` (``make_mapf`` adds them for
    map observations)."""
    return answered_commitments(pool, instances, positions, waiting, None, seed, **teacher)[0]


def answered_commitments(pool: MapfParams, instances, positions: np.ndarray, waiting: np.ndarray,
                         committed: np.ndarray | None, seed: int = 0, swap: bool = False, move_noise: bool = False,
                         defer: bool = False, give_way: bool = False,
                         route: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """``pibt_labels`` in which some agents' moves are already fixed: ``committed [M, T, n]`` holds the action
    each agent had committed to in an earlier decoding round of the learner (-1: none), and PIBT plans the
    others around those moves (``pibt_step``'s constraints: the committed agents' next cells are taken and
    they cannot be pushed). A move into a wall counts as a wait, as the environment makes it.

    Returns the labels and the commitments they answer: a step whose commitments leave PIBT no conflict-free
    joint move (two committed agents bound for one cell, say) gets the plain label and no commitments.
    With ``committed`` None: the plain labels and None."""
    if pool.goal_distances is None:
        raise ValueError("pibt_labels needs pool.goal_distances (mapf.first_goal_distances)")
    rng = np.random.default_rng(seed)
    blocked, mask = np.asarray(pool.blocked), np.asarray(pool.agent_mask)
    distances, all_goals = np.asarray(pool.goal_distances), np.asarray(pool.goals)
    labels = np.zeros(positions.shape[:3], np.int8)
    answered = None if committed is None else np.array(committed, np.int8)
    for row, m in enumerate(np.asarray(instances)):
        present = np.nonzero(mask[m])[0]
        n = len(present)
        moves = experts.neighbour_table(blocked[m])
        fields = distances[m, present].astype(np.int64)
        tiebreak = experts.tiebreakers(n, "index", rng)
        noise_at = shown_tie_noise(pool, m, move_noise)
        goals = all_goals[m, present, 0]
        away, routed = None, {}
        if defer:
            pockets = np.stack([experts.goal_pocket(blocked[m], goal) for goal in goals])
            away = np.stack([experts.deferred_distances(field, pocket) for field, pocket in zip(fields, pockets)])
        for t in range(positions.shape[1]):
            cells = positions[row, t, present]
            here = [tuple(map(int, cell)) for cell in cells]
            keep_off = experts.deferred(pockets, goals, cells) if defer else np.zeros(n, bool)
            plans = experts.planning_fields(blocked[m], goals, here, fields, away, keep_off, route, routed)
            plan_step = lambda constraints=(): experts.pibt_step(  # noqa: E731
                moves, here, lambda i, cell: plans[i][cell], waiting[row, t, present] + tiebreak, rng,
                constraints, swap=swap, tie_noise_grid=noise_at(t), give_way=give_way)
            fixed = () if answered is None else committed_cells(moves, here, answered[row, t, present])
            step = plan_step(fixed) if fixed else None
            if step is None:
                step = plan_step()
                if answered is not None:
                    answered[row, t] = -1
            labels[row, t, present] = [experts.MOVE_CODES[(r - a, c - b)] for (r, c), (a, b) in zip(step, here)]
            if all(fields[i][here[i]] == 0 for i in range(n)) and not labels[row, t].any():
                if answered is not None:
                    answered[row, t:] = -1
                break  # all on their goals: PIBT waits from here on (labels are already 0)
    return labels, answered


def committed_cells(moves: dict, here: list[tuple], actions: np.ndarray) -> tuple:
    """``pibt_step`` constraints ``((agent, next cell), ...)`` for the agents with an action (``actions [n]``,
    -1: none); a move into a wall or off the map keeps the agent where it is."""
    fixed = []
    for i in np.nonzero(actions >= 0)[0]:
        (r, c), (dr, dc) = here[i], experts.MOVES[actions[i]]
        cell = (int(r + dr), int(c + dc))
        fixed.append((int(i), cell if cell in moves[here[i]] else here[i]))
    return tuple(fixed)


def _lacam_first_move(job) -> list[int]:
    """LaCAM's first joint move (action codes) from one configuration; PIBT's step if it finds no better one."""
    blocked, here, goals, priority, seed, node_limit, noise = job
    solution = experts.lacam(blocked, here, goals, 1, seed, node_limit, priorities=priority, first_tie_noise=noise)
    if len(solution.paths) > 1:
        step = solution.paths[1]
    else:
        fields = [experts.distances_to(blocked, goal) for goal in goals]
        cells = [tuple(map(int, cell)) for cell in here]
        step = experts.pibt_step(experts.neighbour_table(blocked), cells, lambda i, cell: fields[i][cell],
                                 np.array(priority, np.float64), np.random.default_rng(seed), swap=True,
                                 tie_noise_grid=noise)
    return [experts.MOVE_CODES[(int(r - a), int(c - b))] for (r, c), (a, b) in zip(step, here)]


def lacam_labels(pool: MapfParams, instances, positions: np.ndarray, waiting: np.ndarray,
                 steps_per_episode: int = 16, node_limit: int = 2000, seed: int = 0,
                 processes: int | None = None, move_noise: bool = False) -> np.ndarray:
    """``int8[M, T, n]``: LaCAM's first joint move from ``steps_per_episode`` visited states of each episode
    (drawn among the steps before all agents stood on their goals), -1 (not asked) at the other steps.

    Each search starts from PIBT's priorities at that point of the episode (``waiting`` plus the index
    tie-breaker, what ``map_priority`` shows), so its first try is PIBT-with-swap's step, and it departs from
    it only where the search finds that step leads nowhere within ``node_limit`` configurations. Searches
    that find nothing better than the start fall back to that PIBT step. Unused agent slots get waits.
    ``move_noise``: the first step chooses among equally good moves by the step's shared ``tie_noise``
    numbers, as the ``pibt_swap_noise`` teacher does.
    """
    rng = np.random.default_rng(seed)
    blocked, mask, goals = np.asarray(pool.blocked), np.asarray(pool.agent_mask), np.asarray(pool.goals)
    labels = np.full(positions.shape[:3], -1, np.int8)
    jobs, where = [], []
    for row, m in enumerate(np.asarray(instances)):
        present = np.nonzero(mask[m])[0]
        goal = goals[m, present, 0] if goals.ndim == 4 else goals[m, present]
        arrived = np.all(positions[row][:, present] == goal[None], axis=(-1, -2))
        end = int(np.argmax(arrived)) if arrived.any() else positions.shape[1]
        if end == 0:
            continue
        tiebreak = experts.tiebreakers(len(present), "index", rng)
        noise_at = shown_tie_noise(pool, m, move_noise)
        for t in np.sort(rng.choice(end, min(steps_per_episode, end), replace=False)):
            jobs.append((blocked[m], positions[row, t, present], goal, waiting[row, t, present] + tiebreak,
                         int(rng.integers(1 << 30)), node_limit, noise_at(t)))
            where.append((row, t, present))
    moves = experts.map_in_processes(_lacam_first_move, jobs, processes)
    for (row, t, present), move in zip(where, moves):
        labels[row, t] = 0
        labels[row, t, present] = move
    return labels


def endgame_only(labels: np.ndarray, positions: np.ndarray, goals: np.ndarray, present: np.ndarray,
                 most_off: int = 8, reach: int = 2) -> np.ndarray:
    """``labels [M, T, n]`` kept only for the endgame, -1 (not asked) elsewhere: at the steps where at most
    ``most_off`` agents (and at least one) stand off their goals, the labels of those agents and of every
    agent within ``reach`` cells (Manhattan) of one of them; ``positions [M, T, n, 2]``, ``goals [M, n, 2]``,
    ``present [M, n]`` (used agent slots).

    Where the learner still fails at N=64 it is mostly two or three agents that must pass each other in a
    corridor or a dead end while the rest stand on their goals; the teacher's moves there (its swap: one
    backs away to a junction, pulling the other after it) are a few agent-steps among thousands of easy
    ones. Keeping only those agents' labels lets a round train on them alone."""
    off = np.any(positions != goals[:, None], -1) & present[:, None]  # [M, T, n]
    apart = np.abs(positions[:, :, :, None] - positions[:, :, None, :]).sum(-1)  # [M, T, n, n]
    near_off = np.any((apart <= reach) & off[:, :, None, :], -1) & present[:, None]
    count = off.sum(-1, keepdims=True)
    return np.where(near_off & (count >= 1) & (count <= most_off), labels, -1).astype(labels.dtype)


def best_attempts(solved: np.ndarray, positions: np.ndarray, goals: np.ndarray, present: np.ndarray,
                  attempts: int) -> tuple[np.ndarray, np.ndarray]:
    """Self-imitation's pick among ``attempts`` consecutive rollouts of each map: ``(chosen [maps], own
    [maps])``, the index of the map's fastest solved attempt (``own`` True), or of its first attempt when none
    solved it (``own`` False: the teacher labels that one). ``solved [M]``, ``positions [M, T, n, 2]``,
    ``goals [M, n, 2]``, ``present [M, n]``, M = maps x ``attempts``; an attempt's length is the first step at
    which every used agent stands on its goal (T for one solved by its last step, whose end state ``positions``,
    the states actions were chosen in, does not hold)."""
    done = np.all(np.all(positions == goals[:, None], -1) | ~present[:, None], -1)  # [M, T]
    length = np.where(done.any(1), done.argmax(1), positions.shape[1])
    length = np.where(solved, length, np.iinfo(np.int32).max).reshape(-1, attempts)
    fastest = length.argmin(1)
    own = solved.reshape(-1, attempts).any(1)
    chosen = np.arange(len(own)) * attempts + np.where(own, fastest, 0)
    return chosen, own


def aggregate(pool: MapfParams, instances, behaviour: np.ndarray, labels: np.ndarray,
              committed: np.ndarray | None = None) -> MapfParams:
    """``pool`` with the learner's episodes appended: entries that copy pool entries ``instances`` and
    replay ``behaviour [M, T, n]``, labelled ``labels``. The original entries replay their expert actions.
    ``committed [M, T, n]``: the earlier decoding rounds' commitments that the labels answer
    (``answered_commitments``; -1 where none, as for every entry without them)."""
    index = jnp.asarray(instances)
    current = pool.expert_actions if pool.behaviour_actions is None else pool.behaviour_actions
    recorded = pool.committed_actions
    if committed is not None or recorded is not None:
        recorded = jnp.full(pool.expert_actions.shape, -1, jnp.int8) if recorded is None else recorded
        committed = np.full(np.shape(labels), -1, np.int8) if committed is None else committed

    def extend(field, new=None):
        if field is None:
            return None
        added = field[index] if new is None else jnp.asarray(new, field.dtype)
        return jnp.concatenate([field, added])

    return pool.replace(
        blocked=extend(pool.blocked), sizes=extend(pool.sizes), starts=extend(pool.starts), goals=extend(pool.goals),
        agent_mask=extend(pool.agent_mask), components=extend(pool.components),
        goal_distances=extend(pool.goal_distances),
        expert_actions=extend(pool.expert_actions, labels),
        behaviour_actions=extend(jnp.asarray(current), behaviour),
        committed_actions=extend(recorded, committed))


LABELLERS = ("teacher", "lacam")
ENDGAME_SEED = 5000  # endgame maps: neither the training pools' (0) nor the study's test or validation maps


def refine(run_dir, iterations: int = 3, updates: int = 256, rollout_maps: int = 256, extra_agents: tuple = (),
           samples_per_episode: int | None = None, seed: int = 0, log: Callable = print, labeller: str = "teacher",
           lacam_steps: int = 16, node_limit: int = 2000, rollout_rounds: int = 4, rollout_agents: int | None = None,
           endgame_repeat: int = 0, augment: bool | None = None, endgame_maps: int = 0,
           endgame_agents: int = 64, commitments: float = 0.0, attempts: int = 1) -> None:
    """DAgger on a finished map-policy run (``+exp=mapf_map_policy``, seed 0): ``iterations`` rounds of
    (roll the policy out on ``rollout_maps`` training instances, label each state by PIBT, add the episodes to
    the pool, ``updates`` more imitation updates from the current parameters), then a new checkpoint in
    ``run_dir``, which ``rlx.evaluate`` and ``study.trained_actors`` then load.

    ``extra_agents``: further agent counts whose training pools (the run's options otherwise) join the
    pool, padded to the most slots, so that the rollouts also visit more crowded states.
    ``samples_per_episode``: steps of each replayed episode in the loss (default: the run's).
    ``labeller``: ``teacher`` (one step of the run's PIBT teacher in every visited state) or ``lacam``
    (``lacam_labels``: LaCAM's first move in ``lacam_steps`` states per episode, searching at most
    ``node_limit`` configurations each).
    ``rollout_rounds``: a policy that decodes in rounds (``decode_rounds`` > 1) decodes its rollouts in this
    many, whatever its config says (evaluation uses more, ``study.DECODE_ROUNDS``; 4 costs a quarter of 16,
    and the weaker rollouts reach more of the states that need the teacher's labels).
    ``rollout_agents``: roll out only on the pool entries with this many agents (default: any).
    ``endgame_repeat``: each failed episode also enters the pool this many more times labelled only in its
    endgame, for the stuck agents and their neighbours (``endgame_only``), so that those few decisions are
    drawn often; the episodes still enter once with every label, which keeps what earlier rounds taught.
    ``augment``: train on turned and mirrored samples (``map_policy``'s ``augment``; default: as the run did).
    ``endgame_maps``: that many generated endgames on further maps (``make_mapf(layout="endgame")``: all
    ``endgame_agents`` agents on their goals but a few pairs that must pass each other in a corridor), those
    the teacher solves, join the pool with its solutions and as rollout starts: the deadlocks in which the
    policy's N=64 episodes end, drawn on many maps instead of the few of a round's failed rollouts.
    ``commitments``: the share of visited steps labelled as answers to the learner's own earlier decoding
    rounds (``answered_commitments``): the agents it had committed before a round drawn at random keep their
    moves, in the training input too, and the teacher plans the others around them. Behaviour cloning only
    ever shows the teacher's own moves as commitments; the learner's rounds commit its own, and this shows
    how the teacher would go on from them.
    ``attempts``: self-imitation (expert iteration with DAgger's fallback). Each picked map is rolled out this
    many times; a map that some attempt solved enters the pool once, as its fastest solved attempt labelled
    by the learner's own moves, and a map that none solved enters as its first attempt labelled by the
    teacher (``best_attempts``). The pool then rewards the joint moves that actually finished an episode
    under the learner's own decoding, where DAgger only asks for the teacher's.
    """
    if attempts < 1:
        raise ValueError(f"attempts={attempts!r}: must be at least 1")
    if attempts > 1 and (commitments or endgame_repeat or labeller != "teacher"):
        raise ValueError(f"attempts={attempts!r}: self-imitation takes neither commitments, endgame_repeat nor "
                         "LaCAM labels")
    if labeller not in LABELLERS:
        raise ValueError(f"labeller={labeller!r}: valid: {', '.join(LABELLERS)}")
    if not 0.0 <= commitments <= 1.0:
        raise ValueError(f"commitments={commitments!r}: must be in [0, 1]")
    if commitments and labeller != "teacher":
        raise ValueError(f"commitments={commitments!r}: needs labeller='teacher' (LaCAM does not take commitments)")
    from pathlib import Path

    from omegaconf import OmegaConf

    from rlx.envs.mapf import instances, make_mapf
    from rlx.runner import checkpoints
    from rlx.runner.components import load_trained

    run_dir = Path(run_dir)
    run = load_trained(run_dir)
    module, config = run.parts.agent_module, run.parts.grid.configs[0]
    env, pool = run.parts.env, run.parts.env_params
    if env.observation not in PRIORITY_OBSERVATIONS:
        raise ValueError(f"DAgger's PIBT labels need observation={' | '.join(PRIORITY_OBSERVATIONS)} (their "
                         "priorities are PIBT's)")
    options = dict(OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml").env.options))
    teacher = options.get("expert")
    if labeller == "teacher" and teacher not in experts.STEPWISE_TEACHERS:
        raise ValueError(f"env.options.expert={teacher!r}: DAgger asks the run's teacher for single steps; "
                         f"valid: {', '.join(experts.STEPWISE_TEACHERS)}")
    if extra_agents or endgame_maps:
        pools = [pool] + [make_mapf(**{**options, "num_agents": int(n)}).default_params for n in extra_agents]
        if endgame_maps:
            endgames = make_mapf(**{**options, "num_agents": endgame_agents, "layout": "endgame",
                                    "pool_size": endgame_maps, "seed": ENDGAME_SEED}).default_params
            log(f"[dagger] {endgames.blocked.shape[0]} of {endgame_maps} endgames solved by the teacher join the pool")
            pools.append(endgames)
        pool = instances.merge_pools(pools)
        env = MapfEnv(pool.agent_mask.shape[1], env.obs_radius, env.collision_system, env.on_target, pool,
                      env.observation, env.progress_reward)
    base = pool
    present = np.asarray(base.agent_mask)
    agents = present.sum(1)
    candidates = np.arange(len(agents)) if rollout_agents is None else np.nonzero(agents == rollout_agents)[0]
    if len(candidates) == 0:
        raise ValueError(f"rollout_agents={rollout_agents}: the pool holds {sorted(set(agents.tolist()))} agents")
    config = config.replace(total_timesteps=updates * config.batch_size,
                            samples_per_episode=samples_per_episode or config.samples_per_episode,
                            augment=config.augment if augment is None else augment)
    params = run.policy(0, 0).params
    rollout_agent = module.make(module.with_decode_rounds(config, rollout_rounds), env, base)
    if commitments and config.decode_rounds == 1:
        raise ValueError(f"commitments={commitments!r}: the run's policy decides in one round (decode_rounds=1)")
    decide = rollout_agent.decode if commitments else rollout_agent.act
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    for iteration in range(1, iterations + 1):
        key, pick_key, rollout_key, train_key = jax.random.split(key, 4)
        picks = candidates[np.asarray(jax.random.choice(pick_key, len(candidates),
                                                        (min(rollout_maps, len(candidates)),), replace=False))]
        repeated = np.repeat(picks, attempts)
        episodes = rollouts(env, base, lambda p, obs, k: decide(module.Policy(p), obs, k), rollout_key,
                            repeated, params)
        attempted = episodes["solved"].mean()
        if attempts > 1:
            chosen, own = best_attempts(episodes["solved"], episodes["positions"],
                                        np.asarray(base.goals)[repeated, :, 0], present[repeated], attempts)
            episodes = {name: values[chosen] for name, values in episodes.items()}
        if labeller == "lacam":
            labels = lacam_labels(base, picks, episodes["positions"], episodes["waiting"], lacam_steps, node_limit,
                                  seed=seed + iteration, move_noise=env.observation in NOISE_OBSERVATIONS)
            committed = None
        elif attempts > 1:  # solved maps keep the learner's own moves: the teacher labels only the others
            committed, asked = None, ~own
            labels = np.asarray(episodes["actions"], np.int8).copy()
            labels[asked] = pibt_labels(base, picks[asked], episodes["positions"][asked], episodes["waiting"][asked],
                                        seed=seed + iteration, **experts.STEPWISE_TEACHERS[teacher])
        else:
            committed = earlier_commitments(episodes["actions"], episodes["decided"], rollout_rounds, commitments,
                                            rng) if commitments else None
            labels, committed = answered_commitments(base, picks, episodes["positions"], episodes["waiting"],
                                                     committed, seed=seed + iteration,
                                                     **experts.STEPWISE_TEACHERS[teacher])
        pool = aggregate(pool, picks, episodes["actions"], labels, committed)
        failed = ~episodes["solved"]
        if endgame_repeat and failed.any():
            goals = np.asarray(base.goals)[picks[failed], :, 0]
            endgame = endgame_only(labels[failed], episodes["positions"][failed], goals, present[picks[failed]])
            pool = aggregate(pool, np.repeat(picks[failed], endgame_repeat),
                             np.repeat(episodes["actions"][failed], endgame_repeat, 0),
                             np.repeat(endgame, endgame_repeat, 0),
                             None if committed is None else np.repeat(committed[failed], endgame_repeat, 0))
        agent = module.make(config, env, pool)
        state = agent.init(train_key).replace(params=params)
        state, metrics = jax.jit(lambda s: jax.lax.scan(lambda s, _: agent.update(s), s, None, updates))(state)
        params = state.params
        tried = f" ({episodes['solved'].mean():.2f} of the maps in {attempts} attempts)" if attempts > 1 else ""
        log(f"[dagger] iteration {iteration}: {attempted:.2f} of the rollouts solved{tried}; "
            f"pool {pool.blocked.shape[0]}; loss {float(metrics['loss'][-16:].mean()):.3f}")
    state = run.state.replace(params=jax.tree.map(lambda old, new: old.at[0].set(new), run.state.params, params))
    step = int(run.progress.get("updates_done", 0)) + iterations * updates  # the newest checkpoint: loaded next
    saver = checkpoints.Checkpointer(run_dir)
    saver.save(step, state, {**run.progress, "updates_done": step})
    saver.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="DAgger refinement of a trained map-policy run (in place).")
    parser.add_argument("run_dir")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--updates", type=int, default=256)
    parser.add_argument("--rollout-maps", type=int, default=256)
    parser.add_argument("--extra-agents", default="", help="comma-separated agent counts, e.g. 64")
    parser.add_argument("--samples-per-episode", type=int, default=None)
    parser.add_argument("--labeller", choices=LABELLERS, default="teacher")
    parser.add_argument("--lacam-steps", type=int, default=16, help="states labelled per episode by LaCAM")
    parser.add_argument("--node-limit", type=int, default=2000, help="configurations per LaCAM search")
    parser.add_argument("--rollout-rounds", type=int, default=4, help="decoding rounds of the learner's rollouts")
    parser.add_argument("--rollout-agents", type=int, default=None,
                        help="roll out only on entries with this many agents")
    parser.add_argument("--endgame-repeat", type=int, default=0,
                        help="extra copies of each failed episode, labelled only for its stuck agents")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                        help="train on turned and mirrored samples (default: as the run did)")
    parser.add_argument("--endgame-maps", type=int, default=0,
                        help="generated endgames (pairs to pass each other in corridors) added to the pool")
    parser.add_argument("--commitments", type=float, default=0.0,
                        help="share of visited steps labelled around the learner's earlier decoding rounds")
    parser.add_argument("--attempts", type=int, default=1,
                        help="self-imitation: rollouts per map; a solved map enters as its fastest solved attempt")
    args = parser.parse_args()
    from rlx.runner import compile_cache

    compile_cache.prepare_command()
    extra = tuple(int(n) for n in args.extra_agents.split(",") if n)
    refine(args.run_dir, args.iterations, args.updates, args.rollout_maps, extra, args.samples_per_episode,
           labeller=args.labeller, lacam_steps=args.lacam_steps, node_limit=args.node_limit,
           rollout_rounds=args.rollout_rounds, rollout_agents=args.rollout_agents,
           endgame_repeat=args.endgame_repeat, augment=args.augment, endgame_maps=args.endgame_maps,
           commitments=args.commitments, attempts=args.attempts)
