"""Classical MAPF solvers (NumPy, on the host): PIBT and prioritized planning with space-time A*.

Both return paths ``int[T + 1, n, 2]`` (row, column per step, the start
first) that ``check_paths`` accepts: no vertex conflicts, no swaps, moves of
at most one cell onto free cells, and every agent that the solver reports as
finished ends on its goal. They serve as expert baselines and as the teachers
of the map-based policy (``expert_dataset``).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from rlx.envs.mapf import tie_noise
from rlx.envs.mapf.env import POCKET_INNER, POCKET_WAY, ROUTE_PENALTY  # goal_pocket's codes; routed_distances'

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])  # the environment's actions
MOVE_CODES = {tuple(map(int, move)): code for code, move in enumerate(MOVES)}  # (dr, dc) -> action


@dataclass
class Solution:
    paths: np.ndarray  # int[T + 1, n, 2]
    finished: np.ndarray  # bool[n]: on its goal at the end
    goals_reached: int = 0  # lifelong runs: arrivals on a current goal, each followed by the next goal

    @property
    def actions(self) -> np.ndarray:
        """``int[T, n]``: the environment actions that follow the paths."""
        deltas = np.diff(self.paths, axis=0)
        return np.vectorize(lambda dr, dc: MOVE_CODES[(dr, dc)], otypes=[np.int64])(deltas[..., 0], deltas[..., 1])


def distances_to(blocked: np.ndarray, goal) -> np.ndarray:
    """BFS distance of every cell to ``goal`` (``blocked.size`` where unreachable)."""
    far = blocked.size
    dist = np.full(blocked.shape, far, np.int64)
    dist[tuple(goal)] = 0
    queue = deque([tuple(goal)])
    height, width = blocked.shape
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES[1:]:
            nr, nc = r + dr, c + dc
            if 0 <= nr < height and 0 <= nc < width and not blocked[nr, nc] and dist[nr, nc] == far:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def neighbours(blocked: np.ndarray, cell) -> list[tuple[int, int]]:
    """The cell itself and its free 4-neighbours."""
    height, width = blocked.shape
    out = []
    for dr, dc in MOVES:
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < height and 0 <= c < width and not blocked[r, c]:
            out.append((int(r), int(c)))
    return out


def neighbour_table(blocked: np.ndarray) -> dict[tuple[int, int], tuple[tuple[int, int], ...]]:
    """``neighbours`` of every free cell, computed once: the solvers ask for them on every move they try."""
    return {(int(r), int(c)): tuple(neighbours(blocked, (r, c))) for r, c in np.argwhere(~blocked)}


def check_paths(blocked: np.ndarray, paths: np.ndarray, goals: np.ndarray, finished: np.ndarray | None = None) -> None:
    """Raise ``AssertionError`` naming the step and agents of the first invalid thing in ``paths``."""
    steps, n, _ = paths.shape
    for t in range(steps):
        cells = [tuple(p) for p in paths[t]]
        for i, (r, c) in enumerate(cells):
            assert 0 <= r < blocked.shape[0] and 0 <= c < blocked.shape[1] and not blocked[r, c], \
                f"step {t}: agent {i} on a blocked or outside cell {(r, c)}"
        seen = {}
        for i, cell in enumerate(cells):
            assert cell not in seen, f"step {t}: vertex conflict of agents {seen.get(cell)} and {i} at {cell}"
            seen[cell] = i
        if t == 0:
            continue
        before = {tuple(p): i for i, p in enumerate(paths[t - 1])}
        for i in range(n):
            assert np.abs(paths[t, i] - paths[t - 1, i]).sum() <= 1, f"step {t}: agent {i} jumped"
            j = before.get(cells[i])
            if j is not None and j != i:
                assert tuple(paths[t, j]) != tuple(paths[t - 1, i]), f"step {t}: agents {i} and {j} swapped"
    if finished is not None:
        for i in np.nonzero(finished)[0]:
            assert tuple(paths[-1, i]) == tuple(goals[i]), f"agent {i} reported finished but is not on its goal"


# -- goal pockets: who must keep off their goal for now ----------------------------------------------

def _region(blocked: np.ndarray, start, stop=None, targets=()) -> set:
    """Free cells reachable from ``start`` without entering ``stop``; once every cell of ``targets`` is
    among them the search ends early (callers only ask whether they are connected)."""
    height, width = blocked.shape
    seen, queue, left = {start}, deque([start]), set(targets) - {start}
    while queue and (left or not targets):
        r, c = queue.popleft()
        for dr, dc in MOVES[1:]:
            cell = (int(r + dr), int(c + dc))
            if (0 <= cell[0] < height and 0 <= cell[1] < width and not blocked[cell] and cell != stop
                    and cell not in seen):
                seen.add(cell)
                left.discard(cell)
                queue.append(cell)
    return seen


def goal_pocket(blocked: np.ndarray, goal) -> np.ndarray:
    """``int8[H, W]``: the pocket behind ``goal``, where an agent standing on it would shut others in or out.

    ``POCKET_INNER`` on the free cells that only connect to the rest of the
    map through ``goal`` (every region cut off by removing it except the
    largest one around it; of equal ones, the one holding the first cell in row-major order);
    ``POCKET_WAY`` on the goal itself and on the
    corridor (cells with one way on) that leads to it from outside; 0
    elsewhere, and everywhere when the goal cuts nothing off.
    """
    goal = tuple(map(int, goal))
    pocket = np.zeros(blocked.shape, np.int8)
    around = [cell for cell in neighbours(blocked, goal) if cell != goal]
    regions: list[set] = []
    for cell in around:
        if not any(cell in region for region in regions):
            regions.append(_region(blocked, cell, stop=goal, targets=around))
    if len(regions) < 2:
        return pocket
    regions.sort(key=lambda region: (len(region), [-x for x in min(region)]))  # the main region last
    for region in regions[:-1]:
        pocket[tuple(np.array(sorted(region)).T)] = POCKET_INNER
    pocket[goal] = POCKET_WAY
    entries = [cell for cell in around if cell in regions[-1]]
    behind, front = goal, entries[0] if len(entries) == 1 else None
    while front is not None and pocket[front] == 0:
        ahead = [cell for cell in neighbours(blocked, front) if cell not in (front, behind)]
        if len(ahead) != 1:
            break  # a junction (or a dead end): the corridor ends here
        pocket[front] = POCKET_WAY
        behind, front = front, ahead[0]
    return pocket


def deferred(pockets: np.ndarray, goals: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``bool[n]``: agents that keep off their goals for now (``pockets [n, H, W]``: ``goal_pocket`` of each).

    Agent i defers while some other agent whose goal lies in i's pocket
    (``POCKET_INNER``) has not arrived and is still outside it: standing on its
    goal, i would shut that agent out (the livelock of PIBT at dead ends). A
    deferred agent plans with ``deferred_distances`` and PIBT's lowest priority.
    """
    goals, positions = np.asarray(goals), np.asarray(positions)
    inner_goal = pockets[:, goals[:, 0], goals[:, 1]] == POCKET_INNER  # [i, j]: j's goal in i's pocket
    inner_here = pockets[:, positions[:, 0], positions[:, 1]] == POCKET_INNER
    away = np.any(positions != goals, axis=-1)
    return np.any(inner_goal & away[None, :] & ~inner_here, axis=1)


def deferred_distances(distances: np.ndarray, pocket: np.ndarray) -> np.ndarray:
    """What a deferred agent plans by (``distances``: to its goal; ``pocket``: ``goal_pocket`` of it): outside
    the pocket its distance to goal, so it waits as close as it can; on the goal and its corridor, more than
    anywhere outside and falling towards the corridor's outer end; in the region behind, more still and
    falling towards the goal. Every cell of the pocket thus leads out of it."""
    size, way = pocket.size, pocket == POCKET_WAY
    exit_distance = distances[way].max() + 1 if way.any() else 0
    return np.where(pocket == POCKET_INNER, 2 * size + distances,
                    np.where(way, size + exit_distance - distances, distances))


def routed_distances(blocked: np.ndarray, goal, distances: np.ndarray, resting: np.ndarray) -> np.ndarray:
    """What an agent off its goal plans by under ``route``: its distance to ``goal`` around the cells where
    other agents rest on their goals (``resting``), or through them at ``ROUTE_PENALTY`` extra steps
    (``distances``: the plain distance to ``goal``), whichever is shorter. Two agents whose goals share a
    corridor then no longer push each other off them in turn: one walks round instead."""
    return np.minimum(distances_to(blocked | resting, goal), distances + ROUTE_PENALTY)


def planning_fields(blocked: np.ndarray, goals, position, plain, away=None, keep_off=None, route: bool = False,
                    cache: dict | None = None) -> list[np.ndarray]:
    """Each agent's cost-to-go field for one PIBT step: ``away[i]`` while it is ``deferred`` (``keep_off``),
    with ``route`` ``routed_distances`` while it is off its goal and someone rests, else its ``plain``
    distance. ``cache`` (one per instance) keeps routed fields while the resting agents stay."""
    n = len(position)
    on_goal = [tuple(map(int, position[i])) == tuple(map(int, goals[i])) for i in range(n)]
    resting = frozenset(tuple(map(int, position[i])) for i in range(n) if on_goal[i]) if route else frozenset()
    cache = {} if cache is None else cache
    if resting:
        occupied = np.zeros(blocked.shape, bool)
        occupied[tuple(np.array(sorted(resting)).T)] = True
    fields = []
    for i in range(n):
        if keep_off is not None and keep_off[i]:
            fields.append(away[i])
        elif resting and not on_goal[i]:
            if (i, resting) not in cache:
                cache[(i, resting)] = routed_distances(blocked, goals[i], plain[i], occupied)
            fields.append(cache[(i, resting)])
        else:
            fields.append(plain[i])
    return fields


# -- PIBT ----------------------------------------------------------------------------------------------


def raise_priorities(priority: np.ndarray, position, goals) -> np.ndarray:
    """PIBT's priorities after a step: back to the tie-breaker (below 1) on the goal, else one higher."""
    on_goal = np.array([tuple(cell) == tuple(goal) for cell, goal in zip(position, goals)])
    return np.where(on_goal, priority % 1, priority + 1)


def tiebreakers(n: int, kind: str, rng) -> np.ndarray:
    """PIBT's initial priorities: distinct tie-breakers below 1, ``random`` or by ``index`` (``(n - 1 - i) / n``)."""
    if kind == "random":
        return rng.random(n) / n
    if kind == "index":
        return (n - 1 - np.arange(n)) / n
    raise ValueError(f"tiebreak {kind!r}: valid: random, index")


def ways_on(moves: dict, front: tuple, behind: tuple) -> int:
    """Free cells beyond ``front`` (not ``behind``) at the end of the corridor that starts there: 0 at a dead
    end, 2 or more at a junction (``moves``: ``neighbour_table``). ``env.dead_end_planes`` shows it per move."""
    for _ in range(len(moves)):
        ahead = [cell for cell in moves[front] if cell not in (front, behind)]
        if len(ahead) != 1:
            return len(ahead)
        behind, front = front, ahead[0]
    return 0  # a ring of corridor cells: no junction either


def pibt_step(moves: dict, position: list[tuple], distance, priority: np.ndarray, rng,
              constraints: tuple = (), swap: bool = False, tie_noise_grid=None,
              give_way: bool = False) -> tuple | None:
    """One joint PIBT step: each agent's next cell, or None when no conflict-free step exists.

    ``moves``: ``neighbour_table``; ``distance(i, cell)``: agent i's cost-to-go;
    agents plan in decreasing ``priority``. ``constraints`` ((agent, cell)
    pairs, LaCAM's) fix those agents' next cells first; plain PIBT has none
    and always succeeds.

    ``swap``: the swap operation of LaCAM* (Okumura, AAMAS 2024) for two agents
    meeting head-on where the one in front cannot be pushed back (a dead-end
    corridor behind it): the planning agent backs away instead, pulling the
    other after it, until they reach a junction where they can pass.

    ``tie_noise_grid`` (``[H, W]``, ``tie_noise.noise_grid``): among equally good cells an agent prefers the one
    with the larger number, instead of a random one (``rng``).

    ``give_way``: an agent pushed aside prefers, among equally good cells, one that is not further along
    its pusher's way (a cell nearer the pusher's goal than the cell it takes over); otherwise it would walk
    ahead of the pusher down a corridor and be pushed off its own goal there, time and again.
    """
    n = len(position)
    nxt: list[tuple | None] = [None] * n
    reserved: dict[tuple, int] = {}
    for i, cell in constraints:
        if cell in reserved:
            return None
        nxt[i], reserved[cell] = cell, i
    occupant = {cell: i for i, cell in enumerate(position)}

    def head_on_in_dead_end(i, j):
        """``j`` stands on ``i``'s best cell, wants ``i``'s cell, only a dead end lies behind it, and ``i``
        can back away to a junction: pushing fails, pulling works."""
        return (distance(j, position[i]) < distance(j, position[j])
                and ways_on(moves, position[j], position[i]) == 0 and ways_on(moves, position[i], position[j]) >= 2)

    def plan(i, parent):
        options = list(moves[position[i]])
        if tie_noise_grid is None:
            rng.shuffle(options)
        ahead_of_pusher = (lambda cell: distance(parent, cell) < distance(parent, position[i])) \
            if give_way and parent is not None else (lambda cell: False)
        options.sort(key=lambda cell: (distance(i, cell), ahead_of_pusher(cell),
                                       0 if tie_noise_grid is None else -tie_noise_grid[cell]))
        pulled = occupant.get(options[0]) if swap else None
        if pulled is not None and (pulled == i or nxt[pulled] is not None or not head_on_in_dead_end(i, pulled)):
            pulled = None
        if pulled is not None:
            options.reverse()
        for cell in options:
            if cell in reserved or (parent is not None and cell == position[parent]):
                continue
            j = occupant.get(cell)
            if j is not None and j != i and nxt[j] == position[i]:
                continue  # j is already bound for i's cell: a swap
            reserved[cell], nxt[i] = i, cell
            if j is not None and j != i and nxt[j] is None and not plan(j, i):
                continue
            if pulled is not None and nxt[pulled] is None and position[i] not in reserved:
                nxt[pulled], reserved[position[i]] = position[i], pulled
            return True
        nxt[i], reserved[position[i]] = position[i], i
        return False

    for i in np.argsort(-priority):
        if nxt[i] is None:
            plan(int(i), None)
    if len(set(nxt)) < n:
        return None
    if any(nxt[j] == position[i] for i in range(n) if (j := occupant.get(nxt[i])) is not None and j != i):
        return None
    return tuple(nxt)


def pibt(blocked: np.ndarray, starts: np.ndarray, goals: np.ndarray, max_steps: int, seed: int = 0,
         stop_when_all_arrived: bool = True, lifelong: bool = False, tiebreak: str = "random",
         swap: bool = False, move_noise: bool = False, defer: bool = False, give_way: bool = False,
         route: bool = False) -> Solution:
    """Priority Inheritance with Backtracking (Okumura et al., 2019), one joint step at a time.

    Each step, agents in priority order (those longest away from their goal
    first) choose their next cell by distance to goal; an agent wanting an
    occupied cell lends its priority to the occupant, which must move away or
    the requester tries its next choice. Never produces a vertex conflict or a
    swap; complete for reachability on biconnected graphs, not optimal.

    ``lifelong``: ``goals`` are sequences ``[n, K, 2]``. An agent standing on
    its goal after a step takes the next goal of its sequence (cyclically, as
    ``MapfEnv``'s ``restart`` mode does) and drops back to the lowest
    priority; the run lasts all ``max_steps`` and counts the arrivals (a next
    goal on the agent's own cell, as the environment does, only after it has
    left that cell and come back).

    ``tiebreak``: how agents equally long away from their goals are ordered:
    ``random`` (a random order per run, as the paper does) or ``index`` (lower
    indices first, the order ``soft`` collisions award contested cells in, so
    that ``MapfEnv``'s ``map_priority`` planes show the whole priority).
    ``move_noise``: equally good moves are chosen by the shared ``tie_noise`` numbers of each step (what
    ``map_noise`` observations show) instead of at random.
    ``defer``: agents whose goals would shut another agent out of a pocket keep off them until that agent
    is in (``deferred``; classical runs only).
    ``give_way``: pushed agents step out of their pusher's way when they can (``pibt_step``).
    ``route``: agents off their goals plan around agents resting on theirs (``routed_distances``; classical
    runs only).
    """
    if (defer or route) and lifelong:
        raise ValueError("pibt: defer and route are for classical (one-shot) runs, not lifelong ones")
    rng = np.random.default_rng(seed)
    n = len(starts)
    sequences = np.asarray(goals).reshape(n, -1, 2) if lifelong else np.asarray(goals).reshape(n, 1, 2)
    fields: dict[tuple, np.ndarray] = {}
    routed: dict = {}  # planning_fields' cache

    def field(goal):
        if goal not in fields:
            fields[goal] = distances_to(blocked, goal)
        return fields[goal]

    moves = neighbour_table(blocked)
    index = np.zeros(n, np.int64)
    goal = [tuple(map(int, sequences[i, 0])) for i in range(n)]
    # Lifelong: a next goal handed out on the agent's own cell counts only once the agent has left it and come
    # back, as ``MapfEnv``'s ``restart`` mode counts it (no arrival for waiting on it).
    under_foot = [False] * n
    position = [tuple(map(int, s)) for s in starts]
    priority = tiebreakers(n, tiebreak, rng)
    paths, reached = [list(position)], 0
    noise_seed = tie_noise.instance_seed(np.asarray(starts), np.ones(n, bool)) if move_noise else None
    if defer:
        pockets = np.stack([goal_pocket(blocked, cell) for cell in goal])
        away = [deferred_distances(field(goal[i]), pockets[i]) for i in range(n)]
    for t in range(max_steps):
        if stop_when_all_arrived and not lifelong and all(position[i] == goal[i] for i in range(n)):
            break
        priority = raise_priorities(priority, position, goal)
        waiting_out = deferred(pockets, np.array(goal), np.array(position)) if defer else np.zeros(n, bool)
        priority = np.where(waiting_out, priority % 1, priority)
        noise = tie_noise.noise_grid(noise_seed, t, *blocked.shape) if move_noise else None
        plans = planning_fields(blocked, goal, position, [field(g) for g in goal], away if defer else None,
                                waiting_out, route, routed)
        step = pibt_step(moves, position, lambda i, cell: plans[i][cell], priority, rng, swap=swap,
                         tie_noise_grid=noise, give_way=give_way)
        assert step is not None, "unconstrained PIBT always finds a conflict-free step"
        position = list(step)
        paths.append(list(position))
        if lifelong:
            for i in range(n):
                arriving = position[i] == goal[i] and not under_foot[i]
                under_foot[i] = position[i] == goal[i]  # still standing on a goal handed out under foot
                if arriving:
                    index[i] = (index[i] + 1) % sequences.shape[1]
                    goal[i] = tuple(map(int, sequences[i, index[i]]))
                    under_foot[i] = goal[i] == position[i]
                    priority[i] %= 1
                    reached += 1
    paths = np.array(paths, np.int64)
    return Solution(paths, np.all(paths[-1] == np.array(goal), axis=-1), reached)


def pibt_shield(moves: dict, position: list[tuple], goals, scores: np.ndarray, priority: np.ndarray,
                rng, swap: bool = True) -> np.ndarray:
    """Conflict-free joint actions ``int[n]`` that follow a policy's preferences (collision shielding,
    as in CS-PIBT: Veerapaneni et al., ICAPS 2024).

    ``scores [n, 5]``: each agent's preference for each action (e.g. logits
    plus Gumbel noise, which makes the ranking a sample of the policy). PIBT
    then takes each agent's options in that order instead of by distance to
    goal, with ``priority`` (raised here in place, as ``raise_priorities`` says)
    deciding who yields. Never a vertex conflict or swap. ``swap``: PIBT's swap
    operation (``pibt_step``), where "wants ``i``'s cell" reads the policy's
    scores instead of distances.
    """
    priority[:] = raise_priorities(priority, position, goals)
    rank = lambda i, cell: -scores[i, MOVE_CODES[(cell[0] - position[i][0], cell[1] - position[i][1])]]  # noqa: E731
    step = pibt_step(moves, position, rank, priority, rng, swap=swap)
    assert step is not None, "unconstrained PIBT always finds a conflict-free step"
    return np.array([MOVE_CODES[(r - position[i][0], c - position[i][1])] for i, (r, c) in enumerate(step)])


# -- LaCAM ----------------------------------------------------------------------------------------------


def lacam(blocked: np.ndarray, starts: np.ndarray, goals: np.ndarray, max_steps: int, seed: int = 0,
          node_limit: int = 20_000, swap: bool = True, priorities: np.ndarray | None = None,
          first_tie_noise: np.ndarray | None = None) -> Solution:
    """LaCAM (Okumura, AAAI 2023): depth-first search over joint configurations, PIBT generating successors.

    Each search node is a joint configuration with a lazily grown tree of
    constraints ("agent i moves to cell v"); expanding a node takes its next
    constraint set, adds one more constrained agent's options to the tree, and
    asks PIBT for a configuration that respects the set. Revisited
    configurations are not duplicated, so the search is complete on a finite
    graph: it returns a solution whenever one exists, given enough nodes.
    Within ``node_limit`` nodes it returns the first solution found (not
    optimal); without one, the path to the explored configuration closest to
    the goals (``finished`` then tells who arrived). Paths are cut at ``max_steps``.
    ``swap``: PIBT generates successors with its swap operation, as LaCAM*
    (Okumura, AAMAS 2024) does (on 32 unseen N=64 maps: 0.81 solved, against
    0.75 without). ``priorities``: the start's PIBT priorities (default: the
    distance to goal plus a random tie-breaker); DAgger passes PIBT's own, so
    that the search's first try is PIBT's step. ``first_tie_noise``: the start's successors choose among
    equally good moves by these numbers (``pibt_step``'s ``tie_noise_grid``), as the ``pibt_swap_noise``
    teacher would there.
    """
    rng = np.random.default_rng(seed)
    n = len(starts)
    goal = tuple(tuple(map(int, g)) for g in goals)
    fields = [distances_to(blocked, g) for g in goal]
    moves = neighbour_table(blocked)
    dist_of = lambda i, cell: fields[i][cell]  # noqa: E731
    h = lambda config: sum(int(fields[i][config[i]]) for i in range(n))  # noqa: E731

    start = tuple(tuple(map(int, s)) for s in starts)
    # per configuration: parent configuration, agent order, pending constraint sets, priorities
    parent: dict[tuple, tuple | None] = {start: None}
    pending: dict[tuple, deque] = {start: deque([()])}
    if priorities is None:
        priorities = rng.random(n) / n + np.array([fields[i][start[i]] for i in range(n)])
    priority: dict[tuple, np.ndarray] = {start: np.asarray(priorities, np.float64)}
    open_stack, best, best_h, expansions = [start], start, h(start), 0
    while open_stack and len(parent) <= node_limit and expansions < 4 * node_limit:
        expansions += 1
        config = open_stack[-1]
        if config == goal:
            best = config
            break
        if not pending[config]:
            open_stack.pop()
            continue
        constraints = pending[config].popleft()
        if len(constraints) < n:  # the next agent in priority order gets its options as constraints
            i = int(np.argsort(-priority[config])[len(constraints)])
            options = list(moves[config[i]])
            rng.shuffle(options)
            pending[config].extend(constraints + ((i, cell),) for cell in options)
        successor = pibt_step(moves, config, dist_of, priority[config], rng, constraints, swap,
                              first_tie_noise if config == start else None)
        if successor is None:
            continue
        if successor in parent:
            open_stack.append(successor)  # known: search on from it again rather than duplicating it
            continue
        parent[successor] = config
        pending[successor] = deque([()])
        priority[successor] = raise_priorities(priority[config], successor, goal)
        open_stack.append(successor)
        if (cost := h(successor)) < best_h:
            best, best_h = successor, cost
    path = [best]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    paths = np.array(path[::-1][:max_steps + 1], np.int64)
    return Solution(paths, np.all(paths[-1] == np.array(goal), axis=-1))


# -- prioritized planning with space-time A* ---------------------------------------------------------


def space_time_astar(blocked, start, goal, dist, vertex_reserved, edge_reserved, goal_reserved_from, last_visit,
                     max_steps):
    """Shortest path ``[(r, c), ...]`` from ``start`` (time 0) to ``goal`` avoiding reserved cells and edges,
    ending at a time after which nobody passes the goal; None if there is none within ``max_steps``."""
    last_pass = last_visit.get(tuple(map(int, goal)), -1)
    start = tuple(map(int, start))
    frontier = [(int(dist[start]), 0, start)]
    parent = {(start, 0): None}
    while frontier:
        _, t, cell = heapq.heappop(frontier)
        if cell == tuple(goal) and t > last_pass:
            path = [(cell, t)]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            return [c for c, _ in reversed(path)]
        if t == max_steps:
            continue
        for nxt in neighbours(blocked, cell):
            if (nxt, t + 1) in vertex_reserved or (cell, nxt, t + 1) in edge_reserved \
                    or goal_reserved_from.get(nxt, max_steps + 1) <= t + 1:
                continue
            if (nxt, t + 1) not in parent:
                parent[(nxt, t + 1)] = (cell, t)
                heapq.heappush(frontier, (t + 1 + int(dist[nxt]), t + 1, nxt))
    return None


def prioritized_planning(blocked: np.ndarray, starts: np.ndarray, goals: np.ndarray, max_steps: int,
                         seed: int = 0) -> Solution:
    """Agents plan one after another (a random order) with space-time A*, each avoiding the paths of those
    before it and their goals once reached.

    Incomplete: an agent that finds no path stays at its start (``finished``
    False), where an earlier agent's path may run into it; the environment's
    collision rules then decide. Complete solutions pass ``check_paths``.
    """
    n = len(starts)
    order = np.random.default_rng(seed).permutation(n)
    vertex_reserved: set = set()
    edge_reserved: set = set()
    goal_reserved_from: dict = {}  # cell -> time from which an agent rests there
    last_visit: dict = {}  # cell -> last time a planned path is on it
    paths: list[list | None] = [None] * n
    stuck_agents: list[int] = []
    for i in order:
        dist = distances_to(blocked, goals[i])
        path = space_time_astar(blocked, starts[i], goals[i], dist, vertex_reserved, edge_reserved,
                                goal_reserved_from, last_visit, max_steps)
        if path is None or goal_reserved_from.get(tuple(map(int, starts[i])), max_steps + 1) <= 0:
            path = [tuple(map(int, starts[i]))]
            stuck = True
            stuck_agents.append(i)
        else:
            stuck = False
        for t, cell in enumerate(path):
            vertex_reserved.add((cell, t))
            last_visit[cell] = max(last_visit.get(cell, -1), t)
            if t:
                edge_reserved.add((cell, path[t - 1], t))
        end = path[-1]
        if stuck:  # it never leaves: its start is blocked for everyone after it
            goal_reserved_from[end] = 0
        else:
            goal_reserved_from[end] = len(path) - 1
        paths[i] = path
    horizon = max(len(p) for p in paths)
    full = np.array([[p[min(t, len(p) - 1)] for p in paths] for t in range(horizon)], np.int64)
    finished = np.all(full[-1] == goals, axis=-1)
    finished[stuck_agents] = False  # even one stuck on its own goal: earlier paths may run through it
    return Solution(full, finished)


# -- expert data in bulk ---------------------------------------------------------------------------------

# The teachers of the map policy: PIBT with ties broken by agent index (the order ``soft`` collisions award
# contested cells in) and these ``pibt`` options. Each is a whole-instance solver in ``SOLVERS`` and, one
# joint step at a time, the labeller DAgger asks (``dagger.pibt_labels``): one table serves both.
STEPWISE_TEACHERS = {
    "pibt_by_index": dict(),
    "pibt_swap_by_index": dict(swap=True),
    "pibt_swap_noise": dict(swap=True, move_noise=True),
    "pibt_swap_defer": dict(swap=True, move_noise=True, defer=True),
    "pibt_swap_detour": dict(swap=True, move_noise=True, defer=True, route=True),
    "pibt_swap_route": dict(swap=True, move_noise=True, defer=True, give_way=True, route=True),
}


def _index_teacher(name: str, doc: str):
    """The whole-instance solver of teacher ``name``: ``pibt`` with index tie-breaks and its table options."""
    options = STEPWISE_TEACHERS[name]

    def solve(blocked, starts, goals, max_steps: int, seed: int = 0) -> Solution:
        return pibt(blocked, starts, goals, max_steps, seed, tiebreak="index", **options)

    solve.__name__ = solve.__qualname__ = name
    solve.__doc__ = doc
    return solve


def pibt_swap(blocked, starts, goals, max_steps: int, seed: int = 0) -> Solution:
    """PIBT with the swap operation (``pibt_step``'s ``swap``): agents meeting head-on in a dead end pass."""
    return pibt(blocked, starts, goals, max_steps, seed, swap=True)


pibt_by_index = _index_teacher(
    "pibt_by_index", "PIBT with ties broken by agent index: the teacher whose priorities ``map_priority`` "
    "planes show.")
pibt_swap_by_index = _index_teacher(
    "pibt_swap_by_index", "``pibt_swap`` with ties broken by agent index (as ``pibt_by_index``).")
pibt_swap_noise = _index_teacher(
    "pibt_swap_noise", "``pibt_swap_by_index`` choosing among equally good moves by the shared ``tie_noise`` "
    "numbers, which ``map_noise`` observations show: random moves the policy can still predict.")
pibt_swap_defer = _index_teacher(
    "pibt_swap_defer", "``pibt_swap_noise`` in which agents keep off goals that would shut others out of a "
    "pocket until those are in (``deferred``), with the lowest priority meanwhile: far fewer livelocks at dead "
    "ends. The map policy's teacher.")
pibt_swap_detour = _index_teacher(
    "pibt_swap_detour", "``pibt_swap_defer`` in which agents off their goals plan around agents resting on "
    "theirs (``routed_distances``): ``pibt_swap_route`` without its give-way rule, so that everything it "
    "decides by is on ``map_route``'s planes.")
pibt_swap_route = _index_teacher(
    "pibt_swap_route", "``pibt_swap_defer`` in which agents off their goals plan around agents resting on "
    "theirs (``routed_distances``) and pushed agents step out of their pusher's way (``pibt_step``'s "
    "``give_way``): far fewer livelocks in corridors open at both ends, where ``deferred`` does not reach.")

SOLVERS = {"pibt": pibt, "pibt_swap": pibt_swap,
           **{teacher.__name__: teacher for teacher in (pibt_by_index, pibt_swap_by_index, pibt_swap_noise,
                                                        pibt_swap_defer, pibt_swap_detour, pibt_swap_route)},
           "prioritized": prioritized_planning, "lacam": lacam}


def _solve(args):
    solver, grid, starts, goals, max_steps, seed, lifelong = args
    if lifelong:
        return pibt(grid, starts, goals, max_steps, seed, lifelong=True)
    return SOLVERS[solver](grid, starts, goals, max_steps, seed)


def solve_all(instances: list[tuple], solver: str = "pibt", max_steps: int = 128, seed: int = 0,
              processes: int | None = None, lifelong: bool = False) -> list[Solution]:
    """Solve ``(blocked, starts, goals)`` instances in parallel processes (the solvers are NumPy).

    ``lifelong``: PIBT only, following each agent's goal sequence ``goals [n, K, 2]`` for ``max_steps``.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver {solver!r}: valid: {', '.join(SOLVERS)}")
    if lifelong and solver != "pibt":
        raise ValueError(f"solver {solver!r} plans for fixed goals; lifelong runs: pibt")
    jobs = [(solver, g, s, goals if lifelong or goals.ndim == 2 else goals[:, 0], max_steps, seed + i, lifelong)
            for i, (g, s, goals) in enumerate(instances)]
    return map_in_processes(_solve, jobs, processes)


def map_in_processes(function, jobs: list, processes: int | None = None) -> list:
    """``[function(job) for job in jobs]`` in parallel processes (all cores by default; in this process
    for one core or fewer than 4 jobs). ``function`` must be importable at module level.

    Spawn, not fork (JAX's threads do not survive a fork). As with any spawn pool, a script that gets
    here must keep its top-level code under ``if __name__ == "__main__":``.
    """
    import multiprocessing

    processes = processes or multiprocessing.cpu_count()
    if processes == 1 or len(jobs) < 4:
        return [function(job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(function, jobs, chunksize=max(1, len(jobs) // (4 * processes)))


def joint_actions(solutions: list[Solution], max_steps: int, num_agents: int) -> np.ndarray:
    """``int8[M, max_steps, num_agents]``: each solution's actions, waits after it ends and for unused slots."""
    actions = np.zeros((len(solutions), max_steps, num_agents), np.int8)
    for i, solution in enumerate(solutions):
        steps = solution.actions[:max_steps]
        actions[i, :len(steps), :steps.shape[1]] = steps
    return actions


def save_dataset(path, instances: list[tuple], solutions: list[Solution], solver: str, max_steps: int) -> None:
    """Expert trajectories as one ``.npz`` (the format ``load_dataset`` reads).

    Keys: ``maps`` bool[M, H, W] (True: blocked; maps smaller than the largest are
    padded with blocked cells), ``sizes`` int16[M, 2], ``starts`` and ``goals``
    int16[M, N, 2] (row, column), ``agent_mask`` bool[M, N] (slots in use),
    ``actions`` int8[M, T, N] (0 wait, 1 up, 2 down, 3 left, 4 right; waits
    after a solution ends), ``lengths`` int32[M] (steps of each solution),
    ``finished`` bool[M, N] (on its goal at the end), ``solver`` and ``max_steps``.
    """
    count, slots = len(instances), max(len(s) for _, s, _ in instances)
    height = max(g.shape[0] for g, _, _ in instances)
    width = max(g.shape[1] for g, _, _ in instances)
    maps_ = np.ones((count, height, width), bool)
    sizes = np.zeros((count, 2), np.int16)
    starts = np.zeros((count, slots, 2), np.int16)
    goals = np.zeros((count, slots, 2), np.int16)
    mask = np.zeros((count, slots), bool)
    finished = np.zeros((count, slots), bool)
    for i, ((grid, s, g), solution) in enumerate(zip(instances, solutions)):
        maps_[i, :grid.shape[0], :grid.shape[1]] = grid
        sizes[i] = grid.shape
        starts[i, :len(s)], goals[i, :len(s)] = s, (g[:, 0] if g.ndim == 3 else g)
        mask[i, :len(s)] = True
        finished[i, :len(s)] = solution.finished
    lengths = np.array([len(solution.actions) for solution in solutions], np.int32)
    np.savez_compressed(path, maps=maps_, sizes=sizes, starts=starts, goals=goals, agent_mask=mask,
                        actions=joint_actions(solutions, max_steps, slots), lengths=lengths, finished=finished,
                        solver=np.array(solver), max_steps=np.array(max_steps))


def load_dataset(path) -> tuple[list[tuple], np.ndarray, np.ndarray]:
    """``(instances, actions [M, T, N], finished [M, N])`` from a ``save_dataset`` file."""
    data = np.load(path)
    instances = []
    for grid, (h, w), s, g, m in zip(data["maps"], data["sizes"], data["starts"], data["goals"], data["agent_mask"]):
        instances.append((grid[:h, :w], s[m].astype(np.int32), g[m].astype(np.int32)))
    return instances, data["actions"], data["finished"]
