"""Grid maps for multi-agent path finding, and start/goal instances on them.

Maps are NumPy ``bool[height, width]`` arrays, True where a cell is blocked.
They are made once on the host (random, maze, warehouse, or read from a
MovingAI ``.map`` file) and then stacked into the environment's parameters,
where everything else happens inside ``jit``. ``sample_instance`` draws the
starts and goals of an instance on the host (distinct starts, distinct goals,
each goal reachable from its start); the environment resets to instances of a
pool made from them.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np

from rlx.errors import ConfigError

# MovingAI's benchmark format: passable and blocked terrain characters.
PASSABLE = set(".GS")
BLOCKED = set("@OTW")


def random_map(size: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """A ``size x size`` map whose cells are blocked independently with probability ``density``."""
    if not 0.0 <= density < 1.0:
        raise ConfigError(f"density={density}: must be in [0, 1)")
    return rng.random((size, size)) < density


def maze_map(size: int, rng: np.random.Generator) -> np.ndarray:
    """A perfect maze (one path between any two cells) carved by a randomised depth-first search.

    Corridors are one cell wide; cells at odd coordinates are rooms, the walls
    between them are knocked down along the search tree. ``size`` is rounded
    down to an odd number so that the maze has a closed border.
    """
    size = size - 1 if size % 2 == 0 else size
    if size < 3:
        raise ConfigError(f"maze size={size}: must be at least 3")
    blocked = np.ones((size, size), bool)
    start = (1, 1)
    blocked[start] = False
    stack = [start]
    while stack:
        r, c = stack[-1]
        neighbours = [(r + dr, c + dc, r + dr // 2, c + dc // 2) for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2))
                      if 0 < r + dr < size and 0 < c + dc < size and blocked[r + dr, c + dc]]
        if not neighbours:
            stack.pop()
            continue
        nr, nc, wr, wc = neighbours[rng.integers(len(neighbours))]
        blocked[wr, wc] = blocked[nr, nc] = False
        stack.append((nr, nc))
    return blocked


def warehouse_map(shelf_rows: int = 4, shelf_columns: int = 4, shelf_length: int = 6, aisle: int = 2,
                  margin: int = 3) -> np.ndarray:
    """A warehouse floor: a grid of 1-cell-deep shelves of ``shelf_length`` cells with aisles between.

    ``margin`` free columns on each side are the loading areas where robots
    typically start and finish.
    """
    height = aisle + shelf_rows * (1 + aisle)
    width = 2 * margin + shelf_columns * shelf_length + (shelf_columns - 1) * aisle
    blocked = np.zeros((height, width), bool)
    for row in range(shelf_rows):
        r = aisle + row * (1 + aisle)
        for column in range(shelf_columns):
            c = margin + column * (shelf_length + aisle)
            blocked[r, c:c + shelf_length] = True
    return blocked


def parse_movingai(path: str | Path) -> np.ndarray:
    """Read a MovingAI ``.map`` file (``type``, ``height``, ``width``, ``map``, then the rows).

    Errors name the file and the line: a missing header field, a row of the
    wrong length, an unknown terrain character, too few rows, text after the
    last row.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such map file")

    def fail(line_number: int, message: str):
        raise ConfigError(f"{path}:{line_number}: {message}")

    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as error:
        fail(path.read_bytes()[:error.start].count(b"\n") + 1, f"not text: byte {error.object[error.start]:#04x}")
    if not lines:
        raise ConfigError(f"{path}: empty file, expected a MovingAI header ('type', 'height', 'width', 'map')")

    header, header_line, index = {}, {}, 0
    while index < len(lines) and lines[index].strip().lower() != "map":
        words = lines[index].split()
        if len(words) != 2 or words[0].lower() not in ("type", "height", "width"):
            fail(index + 1, f"expected 'type', 'height', 'width' or 'map', got {lines[index]!r}")
        header[words[0].lower()], header_line[words[0].lower()] = words[1], index + 1
        index += 1
    if index == len(lines):
        fail(len(lines), "no 'map' line")
    for field in ("height", "width"):
        if field not in header or not header[field].isdigit() or int(header[field]) == 0:
            fail(header_line.get(field, index + 1), f"header needs a positive integer '{field}' before 'map'")
    height, width = int(header["height"]), int(header["width"])
    rows = lines[index + 1:index + 1 + height]
    if len(rows) < height:
        fail(len(lines), f"{len(rows)} map rows, expected height {height}")
    extra = next((k for k in range(index + 1 + height, len(lines)) if lines[k].strip()), None)
    if extra is not None:
        fail(extra + 1, f"text after the {height} map rows the header declares (height {height})")
    blocked = np.zeros((height, width), bool)
    for r, row in enumerate(rows):
        line_number = index + 2 + r
        if len(row) != width:
            fail(line_number, f"row has {len(row)} cells, expected width {width}")
        for c, char in enumerate(row):
            if char in BLOCKED:
                blocked[r, c] = True
            elif char not in PASSABLE:
                fail(line_number, f"unknown terrain {char!r} at column {c + 1} (passable: . G S; blocked: @ O T W)")
    return blocked


def from_strings(rows: list[str] | str) -> np.ndarray:
    """A map from rows of ``.`` (free) and ``#`` (blocked), POGEMA's notation for custom maps."""
    if isinstance(rows, str):
        rows = [row.strip() for row in rows.strip().splitlines()]
    widths = {len(row) for row in rows}
    if len(widths) != 1:
        raise ConfigError(f"map rows have different lengths: {sorted(widths)}")
    unknown = {char for row in rows for char in row} - set(".#")
    if unknown:
        raise ConfigError(f"map characters {sorted(unknown)}: use '.' for free and '#' for blocked")
    return np.array([[char == "#" for char in row] for row in rows], bool)


def to_strings(blocked: np.ndarray) -> list[str]:
    return ["".join("#" if cell else "." for cell in row) for row in blocked]


def connected_components(blocked: np.ndarray) -> np.ndarray:
    """Labels ``int[h, w]`` of the 4-connected free regions (0, 1, ...), -1 on blocked cells."""
    labels = np.full(blocked.shape, -1, np.int64)
    height, width = blocked.shape
    label = 0
    for start in zip(*np.nonzero(~blocked)):
        if labels[start] >= 0:
            continue
        labels[start] = label
        queue = deque([start])
        while queue:
            r, c = queue.popleft()
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= nr < height and 0 <= nc < width and not blocked[nr, nc] and labels[nr, nc] < 0:
                    labels[nr, nc] = label
                    queue.append((nr, nc))
        label += 1
    return labels


def sample_instance(blocked: np.ndarray, num_agents: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, goals)``, each ``int[num_agents, 2]`` (row, column): distinct starts, distinct goals,
    every goal in its start's connected component (so reachable, ignoring other agents).

    Starts are drawn uniformly among free cells; goals one agent at a time among
    the free cells of the start's component not yet taken as a goal. A start
    whose component has no goal left is redrawn.
    """
    labels = connected_components(blocked)
    free = np.argwhere(~blocked)
    if len(free) < num_agents:
        raise ConfigError(f"{num_agents} agents but only {len(free)} free cells")
    for _ in range(100):
        starts = free[rng.choice(len(free), num_agents, replace=False)]
        goals, taken = [], np.zeros(blocked.shape, bool)
        for start in starts:
            options = np.argwhere((labels == labels[tuple(start)]) & ~taken)
            if len(options) == 0:
                break
            goal = options[rng.integers(len(options))]
            taken[tuple(goal)] = True
            goals.append(goal)
        else:
            return starts.astype(np.int32), np.array(goals, np.int32)
    raise ConfigError(f"could not place {num_agents} agents with reachable distinct goals on this map")


def pogema_placement(blocked: np.ndarray, num_agents: int, rng: np.random.Generator):
    """``(starts, goals)`` placed by POGEMA's rule, or None where the map cannot hold the agents: 2N distinct
    free cells, each start in a component with room left for it and its goal, so no goal lies on any start.

    Free cells are visited in a random order; a cell becomes the goal of the latest agent still waiting for
    one in its component, else (while agents are missing) a start, if its component has two cells left.
    ``sample_instance`` (what the tables use) differs: goals may lie on starts, an agent's own included.
    """
    labels = connected_components(blocked)
    free = np.argwhere(~blocked)
    room = np.bincount(labels[~blocked], minlength=labels.max() + 1)
    waiting = [[] for _ in room]
    starts, goals, placed = [], [None] * num_agents, 0
    for cell in free[rng.permutation(len(free))]:
        label = labels[tuple(cell)]
        if waiting[label]:
            goals[waiting[label].pop()] = cell
            placed += 1
        elif len(starts) < num_agents and room[label] >= 2:
            room[label] -= 2
            waiting[label].append(len(starts))
            starts.append(cell)
        if placed == num_agents:
            return np.array(starts, np.int32), np.array(goals, np.int32)
    return None
