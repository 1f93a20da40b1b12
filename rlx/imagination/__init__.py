"""Host-side studies of imagination-based RL (world models, dream augmentations); the agents are in ``rlx/agents``.

Also the two things every study's ``reproduce`` does alike: count its seeds and read its saved json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def seed_count(seeds: int | None, quick: bool, default: int) -> int:
    """The seeds a study runs: ``--seeds`` when given (also with ``--quick``), else 2 under ``--quick`` and
    ``default`` otherwise. ``rlx.reproduce`` passes None when ``--seeds`` was not given."""
    from rlx.errors import ConfigError

    if seeds is None:
        return 2 if quick else default
    if seeds < 1:
        raise ConfigError(f"--seeds={seeds}: must be >= 1 (a study needs at least one seed)")
    return seeds


def read_saved(path: Path, module: str, quick: bool) -> dict:
    """The json that ``module``'s study saved at ``path``, for ``--skip-training``, which re-renders it.

    A missing file is a ConfigError naming it and the command that trains and writes it, rather than a bare
    FileNotFoundError.
    """
    from rlx.errors import ConfigError

    if not path.is_file():
        command = study_command(module, quick)
        raise ConfigError(f"--skip-training: {path} does not exist, so there is nothing to re-render; "
                          f"`{command}` trains and writes it")
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"--skip-training: {path} is not valid JSON ({error}); `{study_command(module, quick)}` "
                          "trains and writes it again") from None
    if not isinstance(saved, dict) or not set(saved) - {"measured"}:
        raise ConfigError(f"--skip-training: {path} holds no saved results; `{study_command(module, quick)}` "
                          "trains and writes it again")
    return saved


def study_command(module: str, quick: bool) -> str:
    """The ``rlx.reproduce`` command line that runs the study in ``module``."""
    from rlx.reproduce import CUSTOM

    name = next((name for name, study in CUSTOM.items() if study == module), module)
    return f"python -m rlx.reproduce {name}" + (" --quick" if quick else "")


def save_json(path: Path, results: dict) -> None:
    """``results`` to ``path`` through a ``.partial`` file renamed at the end: an interrupted write leaves the
    previous file whole, never half of one for ``--skip-training`` to trip over."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(results, indent=1))
    partial.replace(path)


def today() -> str:
    """The date a study's measurements are saved with (UTC)."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def measured_on(saved_date: str | None) -> str:
    """A table header's date: the one saved with the measurements, not the day a ``--skip-training`` re-render
    runs (a json saved before dates were kept says so)."""
    return saved_date or f"on an unrecorded date (re-rendered {today()} from the saved json)"
