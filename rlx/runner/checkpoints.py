"""Checkpoints of the whole runner state with orbax, saved atomically.

A checkpoint holds every seed and sweep point: parameters, optimiser and
normalisation statistics, environment states, PRNG keys and step counters,
plus a small JSON record of progress (updates done, chunk index). orbax writes
each step to a temporary directory and renames it only when complete, so a
crash during a save leaves the previous checkpoint as the latest readable one.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path

from rlx.errors import ConfigError

CHECKPOINT_SUBDIR = "checkpoints"


def preload() -> threading.Thread:
    """Import orbax (about 1 s of CPU) in a background thread; join it before the first use."""
    thread = threading.Thread(target=importlib.import_module, args=("orbax.checkpoint",), daemon=True)
    thread.start()
    return thread


class Checkpointer:
    """Saves ``{"state": pytree, "progress": dict}`` under ``run_dir/checkpoints/<updates>``."""

    def __init__(self, run_dir: Path, keep: int = 2):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = (Path(run_dir) / CHECKPOINT_SUBDIR).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, updates_done: int, state, progress: dict) -> None:
        """Start saving in the background; the previous save is finished first."""
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(state), progress=self._ocp.args.JsonSave(progress)
        )
        self._manager.save(updates_done, args=args)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def restore_latest(run_dir: Path, abstract_state, label: str | None = None) -> tuple[object, dict]:
    """(state, progress) of the newest complete checkpoint in ``run_dir``; ConfigError if none is readable.

    ``label`` starts each error message (default ``run.resume=RUN_DIR``).
    """
    label = label or f"run.resume={run_dir}"
    import orbax.checkpoint as ocp

    directory = (Path(run_dir) / CHECKPOINT_SUBDIR).resolve()
    if not directory.is_dir():
        raise ConfigError(f"{label}: no checkpoint directory {directory}")
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))
    try:
        step = manager.latest_step()
        if step is None:
            raise ConfigError(f"{label}: {directory} holds no complete checkpoint")
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), progress=ocp.args.JsonRestore()))
        except Exception as error:  # orbax raises many types for damaged or mismatched files
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"{label}: checkpoint {directory / str(step)} is unreadable "
                              f"or does not match this configuration ({reason[:200]})") from None
    finally:
        manager.close()
    return restored["state"], dict(restored["progress"])


def load_raw(run_dir: Path, step: int | None = None) -> tuple[dict, dict]:
    """(state as nested dicts of arrays, progress) of a checkpoint, without knowing the state's type.

    Arrays come back whole on this process's first device, however many devices the run that
    saved them split its seeds over (``run.cpu_devices``, GPUs).
    """
    import jax
    import orbax.checkpoint as ocp

    directory = (Path(run_dir) / CHECKPOINT_SUBDIR).resolve()
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))
    try:
        step = manager.latest_step() if step is None else step
        metadata = ocp.StandardCheckpointer().metadata(directory / str(step) / "state").item_metadata
        here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=here), metadata)
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()))
    finally:
        manager.close()
    return restored["state"], dict(restored["progress"])
