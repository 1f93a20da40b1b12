"""The host side of training: compile once, run jitted chunks, log, evaluate, stop on NaN.

``run_training`` is everything between a validated configuration and the files
in the run directory. All seeds train in one compiled program (``vmap`` over
PRNG keys); the host only sees the state every ``chunk_updates`` updates.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlx.errors import ConfigError
from rlx.runner import artifacts, checkpoints, devices, fast_random
from rlx.runner.console import ProgressView
from rlx.runner.evaluation import evaluate_episodes


class NonFiniteError(RuntimeError):
    """A loss or metric became NaN or infinite; the run stopped before saving it."""

    def __init__(self, update: int, metric: str, run_dir: Path):
        super().__init__(
            f"non-finite {metric} at update {update}; stopped. Files up to the last finite chunk are in {run_dir}"
        )
        self.update = update


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The ``run:`` section of the config: how to execute, not what to learn."""

    num_seeds: int = 4
    seed: int = 0
    chunk_updates: int | None = None
    eval_every_chunks: int = 1
    eval_episodes: int = 16
    eval_greedy: bool = True
    stop_at_return: float | None = None
    progress: bool = True
    compile_cache: str | None = None
    checkpoint_every_chunks: int = 5
    cpu_devices: str | int = "auto"  # applied by train.py before JAX starts (compile_cache.set_cpu_devices)

    @classmethod
    def from_dict(cls, values: dict) -> "RunSettings":
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ConfigError(f"run.{unknown[0]}: unknown field; valid: {', '.join(sorted(valid))}")
        kinds = {"num_seeds": (int,), "seed": (int,), "chunk_updates": (int, None), "eval_every_chunks": (int,),
                  "eval_episodes": (int,), "checkpoint_every_chunks": (int,), "eval_greedy": (bool,),
                  "progress": (bool,), "stop_at_return": (float, None), "compile_cache": (str, None)}
        for field, allowed in kinds.items():
            if field in values and not _is_one_of(values[field], allowed):
                names = " or ".join("null" if kind is None else {int: "an integer", float: "a number", bool: "true or false",
                                                                str: "a path"}[kind] for kind in allowed)
                raise ConfigError(f"run.{field}={values[field]!r}: must be {names}")
        settings = cls(**values)
        rules = [
            ("num_seeds", settings.num_seeds >= 1, "must be >= 1"),
            ("chunk_updates", settings.chunk_updates is None or settings.chunk_updates >= 1, "must be >= 1 or null"),
            ("eval_every_chunks", settings.eval_every_chunks >= 1, "must be >= 1"),
            ("eval_episodes", settings.eval_episodes >= 1, "must be >= 1"),
            ("checkpoint_every_chunks", settings.checkpoint_every_chunks >= 0, "must be >= 0 (0 = no checkpoints)"),
        ]
        for field, ok, rule in rules:
            if not ok:
                raise ConfigError(f"run.{field}={getattr(settings, field)!r}: {rule}")
        return settings


def fetch(tree):
    """``tree``'s arrays on the host, whole: across processes (multi-host), gathered from all of them first."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)


def _is_one_of(value, kinds: tuple) -> bool:
    """Whether ``value`` is of one of ``kinds`` (``None`` for null); a bool is not an integer here."""
    if value is None:
        return None in kinds
    if isinstance(value, bool):
        return bool in kinds
    return any(kind is not None and isinstance(value, (int, float) if kind is float else kind) for kind in kinds)


def build_agent_config(agent_module, values: dict):
    """The agent's ``Config`` from the ``algo:`` section, checked before anything is traced."""
    fields = {f.name: f for f in dataclasses.fields(agent_module.Config)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"algo.{unknown[0]}: unknown field; valid: {', '.join(sorted(fields))}")
    defaults = agent_module.Config()
    converted = {}
    for name, value in values.items():
        default = getattr(defaults, name)
        try:
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise TypeError
            elif isinstance(default, int):
                if isinstance(value, float) and not value.is_integer():
                    raise TypeError
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
            elif isinstance(default, tuple):
                value = tuple(value)
        except (TypeError, ValueError):
            raise ConfigError(f"algo.{name}={value!r}: must be a {type(default).__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"algo.{name}={value!r}: must be finite")
        converted[name] = value
    config = dataclasses.replace(defaults, **converted)
    try:
        agent_module.validate(config)
    except ValueError as error:
        raise ConfigError(f"algo.{error}") from None
    return config


# XLA options for programs that run once per run (init, key derivations): at level 0 with the
# older loop emitters their compilation takes about half the CPU, and their run time is negligible.
RUN_ONCE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def compile_lowered(lowered, options: dict | None):
    """Compile a lowered program with XLA ``options``, or with XLA's defaults where this XLA lacks one.

    The run-once options name a CPU emitter switch that newer XLA releases (jax 0.11) dropped;
    without it a run still works, only its run-once programs compile a little slower.
    """
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(options)
    except jax.errors.JaxRuntimeError as error:
        if "No such compile option" not in str(error):
            raise
        return lowered.compile()


def run_keys(seed, num_seeds: int):
    """(training keys ``[seed]``, evaluation root key) of a run from its integer seed."""
    train_key, eval_root = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.split(train_key, num_seeds), eval_root


def eval_keys(eval_root, updates_done, num_seeds: int):
    """Evaluation keys ``[seed]`` after ``updates_done`` updates: fresh per evaluation, shared by grid points."""
    return jax.random.split(jax.random.fold_in(eval_root, updates_done), num_seeds)


class Programs:
    """The compiled programs of one run: init, a chunk of updates, evaluation.

    The agent config is an argument, not a constant, so its numeric fields stay
    traced: a changed learning rate reuses the compiled (and cached) programs.
    With a sweep, the config's leaves carry a leading grid axis and every
    program is vmapped over it too; all grid points share the seeds' keys, so
    points differ only by their hyper-parameters.
    """

    def __init__(self, agent_module, config, env, env_params, settings: RunSettings, swept: bool,
                 training: bool = True, layout: devices.Layout | None = None, chunk_lengths: tuple = ()):
        fast_random.use_straight_line_threefry()  # same random bits, ~1.4x PPO's steps/s on a CPU
        self.agent_module, self.config, self.env, self.env_params = agent_module, config, env, env_params
        self.swept = swept
        self.layout = layout or devices.Layout(None, False, swept)
        self.num_seeds = settings.num_seeds
        self.run_seeds = self.layout.run_seeds or settings.num_seeds  # programs compute this many (devices.plan)
        self.compile_seconds = 0.0
        self._chunks = {}
        self._selections = {}

        def init(config, keys, config_axis):
            # lax.map, not vmap: the same stacked states, but the batched PRNG and
            # QR kernels that vmap creates more than double this program's compile time.
            if config_axis is None:
                return jax.lax.map(self._agent(config).init, keys)
            return jax.lax.map(lambda ck: self._agent(ck[0]).init(ck[1]), (config, keys))

        def run_evaluation(config, policy, keys, config_axis):
            return jax.vmap(lambda c, p, k: evaluate_episodes(
                self._agent(c), env, env_params, p, k, settings.eval_episodes, settings.eval_greedy),
                in_axes=(config_axis, 0, 0))(config, policy, keys)

        # Where the seed axis sits: state [grid?, seed, ...], chunk metrics [grid?, update, seed],
        # evaluation returns [grid?, seed, episode]; keys [seed] are shared by every grid point.
        state_spec = self._spec(1 if swept else 0)
        keys_spec = self._spec(0) if not self.layout.split_grid else self._replicated()
        keys = jax.eval_shape(lambda: jax.random.split(jax.random.PRNGKey(0), self.run_seeds))
        init = self._program(self._per_run(init, batched=(), shared=(0,)),
                             (self._config_spec(), keys_spec), state_spec)
        self.state_shape = init.eval_shape(config, keys)  # traced once: lowering below reuses it
        self.state_sharding = state_spec and jax.tree.map(lambda _: self.layout.sharding(state_spec), self.state_shape)
        evaluation = self._program(self._per_run(run_evaluation, batched=(0,), shared=(1,)),
                                   (self._config_spec(), state_spec, keys_spec), state_spec)
        # slowest compilation first: chunks, init, evaluation
        first_update = jax.ShapeDtypeStruct((), jnp.int32)
        jobs = {("chunk", n): (self._chunk_program(n), config, self.state_shape, first_update)
                for n in sorted(set(chunk_lengths))}
        self._evaluation_job = (evaluation, config, self.state_shape.policy, keys)
        if training:  # a reloaded run (``load_trained``) compiles its evaluation only if it evaluates
            jobs["init"] = (init, config, keys)
            jobs["evaluate"] = self._evaluation_job
        if chunk_lengths:  # a training run: tiny, but compiled alongside rather than op by op afterwards
            jobs["run_keys"] = (jax.jit(partial(run_keys, num_seeds=settings.num_seeds)), 0)
            jobs["eval_keys"] = (jax.jit(partial(eval_keys, num_seeds=settings.num_seeds)),
                                 jax.ShapeDtypeStruct((2,), jnp.uint32), 0)
        compiled = self._compile_together(jobs, run_once={"init", "run_keys", "eval_keys"}) if jobs else {}
        self._init = compiled.get("init")
        self._evaluate = compiled.get("evaluate")
        self.run_keys, self.eval_keys = compiled.get("run_keys"), compiled.get("eval_keys")
        self._chunks.update({key[1]: program for key, program in compiled.items() if isinstance(key, tuple)})

    @property
    def evaluate(self):
        """The evaluation program: compiled with the training programs, or on first use for a reloaded run."""
        if self._evaluate is None:
            self._evaluate = self._compile(*self._evaluation_job)
        return self._evaluate

    def _per_run(self, fn, batched: tuple, shared: tuple, out_run_axes: tuple | None = None):
        """A program from ``fn(config, *args, config_axis)``, written for a batch of runs.

        ``fn`` maps over a leading run axis of its arguments, and over the config's leaves when
        ``config_axis`` is 0. Without a sweep the runs are the seeds and share one config
        (``config_axis`` None). With one, the grid and seed axes merge into one run axis: the
        config's leaves ``[grid]`` are repeated for each seed, argument positions in ``batched``
        (``[grid, seed, ...]``) are reshaped, those in ``shared`` (``[seed, ...]``: keys, which
        every grid point shares) are tiled, and the run axis of the outputs (axis 0, or
        ``out_run_axes[i]`` for output ``i`` of a tuple) is split back into ``grid, seed``. One
        flat run axis instead of a vmap over the grid of a vmap over seeds: the same arithmetic,
        but XLA compiles it in about half the time.
        """
        if not self.swept:
            return lambda config, *args: fn(config, *args, config_axis=None)

        def swept(config, *args):
            grid = jax.tree.leaves(config)[0].shape[0]
            seeds = (jax.tree.leaves(args[batched[0]])[0].shape[1] if batched
                     else jax.tree.leaves(args[shared[0]])[0].shape[0])
            args = list(args)
            for i in batched:
                args[i] = jax.tree.map(lambda x: x.reshape((grid * seeds,) + x.shape[2:]), args[i])
            for i in shared:
                args[i] = jax.tree.map(lambda x: jnp.tile(x, (grid,) + (1,) * (x.ndim - 1)), args[i])
            runs_config = jax.tree.map(lambda c: jnp.repeat(c, seeds, axis=0), config)
            out = fn(runs_config, *args, config_axis=0)

            def split(tree, axis):
                return jax.tree.map(lambda x: x.reshape(x.shape[:axis] + (grid, seeds) + x.shape[axis + 1:]), tree)

            if out_run_axes is None:
                return split(out, 0)
            return tuple(split(part, axis) for part, axis in zip(out, out_run_axes))

        return swept

    def _agent(self, config):
        return self.agent_module.make(config, self.env, self.env_params)

    def abstract_state(self):
        """Shapes, dtypes and (with several devices) shardings of the state: the target of a restore."""
        if self.padded:  # the seeds the run asked for, whole on every device (``unpad_seeds``)
            everywhere = self.layout.sharding(self.layout.replicated())
            return jax.tree.map(lambda s: jax.ShapeDtypeStruct(self._seed_shape(s.shape), s.dtype,
                                                               sharding=everywhere), self.state_shape)
        if self.state_sharding is None:  # whole on the first device, however the saving run was split
            here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=here), self.state_shape)
        return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                            self.state_shape, self.state_sharding)

    # -- seed padding: programs compute ``run_seeds``, callers see ``num_seeds`` ---------------------------
    @property
    def padded(self) -> bool:
        return self.run_seeds != self.num_seeds

    @property
    def _state_seed_axis(self) -> int:
        return 1 if self.swept else 0

    def _seed_shape(self, shape: tuple) -> tuple:
        axis = self._state_seed_axis
        return shape[:axis] + (self.num_seeds,) + shape[axis + 1:]

    def _seed_selection(self, name: str, count: int, axis: int, out_shardings=None):
        """A jitted function taking seeds ``arange(count) % num_seeds`` along ``axis`` of every leaf (built once)."""
        if name not in self._selections:
            index = np.arange(count) % self.num_seeds
            self._selections[name] = jax.jit(lambda tree: jax.tree.map(lambda x: jnp.take(x, index, axis=axis), tree),
                                             out_shardings=out_shardings)
        return self._selections[name]

    def pad_seeds(self, tree, axis: int | None = None):
        """A state (or keys, ``axis=0``) of ``num_seeds`` seeds, extended to ``run_seeds`` with copies of the first."""
        if not self.padded:
            return tree
        axis = self._state_seed_axis if axis is None else axis
        split = self.layout.sharding(self._spec(axis))  # as the programs take it: seeds split over the devices
        return self._seed_selection(f"pad{axis}", self.run_seeds, axis, split)(tree)

    def _real_seeds(self, tree, axis: int):
        """Host arrays of ``tree`` without the padding seeds along ``axis`` (views, not copies)."""
        if not self.padded:
            return tree
        return jax.tree.map(lambda x: x[(slice(None),) * axis + (slice(self.num_seeds),)], tree)

    def unpad_seeds(self, state):
        """The state of the ``num_seeds`` real seeds, replicated on every device."""
        if not self.padded:
            return state
        everywhere = self.layout.sharding(self.layout.replicated())
        return self._seed_selection("unpad", self.num_seeds, self._state_seed_axis, everywhere)(state)

    def init(self, config, keys):
        """Initial state of every seed (and sweep point) from keys ``[num_seeds]``."""
        return self.unpad_seeds(self._init(config, self.pad_seeds(keys, axis=0)))

    def _spec(self, seed_axis: int, grid_axis: int = 0):
        return self.layout.spec(seed_axis, grid_axis) if self.layout.active else None

    def _replicated(self):
        return self.layout.replicated() if self.layout.active else None

    def _config_spec(self):
        return self._spec(0) if self.layout.split_grid else self._replicated()

    def _program(self, fn, in_specs: tuple, out_specs):
        """``jit(fn)``; with several devices, each runs ``fn`` on its slice of the batch (``shard_map``)."""
        if not self.layout.active:
            return jax.jit(fn)
        mapped = jax.shard_map(fn, mesh=self.layout.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        shardings = jax.tree.map(self.layout.sharding, (in_specs, out_specs),
                                 is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
        return jax.jit(mapped, in_shardings=shardings[0], out_shardings=shardings[1])

    def _compile(self, program, *args):
        return self._compile_together({"program": (program, *args)})["program"]

    def _compile_together(self, jobs: dict, run_once: set = frozenset()) -> dict:
        """``{name: (program, *args)}`` -> ``{name: compiled}``, each compiled while the next is lowered.

        Lowering (tracing to MLIR) is Python; XLA's compilation runs outside the
        GIL. Handing each lowered program to a compiler thread overlaps the two and
        the programs' compilations with each other on a multi-core CPU. Put the
        slowest-compiling program first. On a CPU, the programs named in ``run_once``
        compile with ``RUN_ONCE_COMPILER_OPTIONS``: quicker to build, slower to run.
        """
        quick = RUN_ONCE_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            futures = {name: pool.submit(compile_lowered, program.lower(*args), quick if name in run_once else None)
                       for name, (program, *args) in jobs.items()}
            compiled = {name: future.result() for name, future in futures.items()}
        self.compile_seconds += time.perf_counter() - start
        return compiled

    def chunk_program(self, num_updates: int):
        """The program running ``num_updates`` updates for every seed, compiled on first use.

        Runs use one length (``chunk_updates`` divides the updates, or the
        last chunk is shorter and gets a program of its own). A single program
        that masks the extra updates of a short chunk was tried: selecting
        between old and new state on every update cost a quarter of the speed.
        """
        if num_updates not in self._chunks:
            self._chunks[num_updates] = self._compile(self._chunk_program(num_updates), self.config, self.state_shape,
                                                      jax.ShapeDtypeStruct((), jnp.int32))
        return self._chunks[num_updates]

    def _chunk_program(self, num_updates: int):
        """The uncompiled program of ``chunk_program``."""

        # An agent whose update takes the update number (``UPDATE_TAKES_INDEX``) gets it unbatched, the
        # same for every run, so its schedules stay real branches under vmap instead of selects.
        with_index = getattr(self.agent_module, "UPDATE_TAKES_INDEX", False)

        def run_chunk(config, state, first_update, config_axis):
            def one_update(c, s, index):
                agent = self._agent(c)
                return agent.update(s, index) if with_index else agent.update(s)

            update = jax.vmap(one_update, in_axes=(config_axis, 0, None))
            indices = first_update + jnp.arange(num_updates, dtype=jnp.int32)
            return jax.lax.scan(lambda s, index: update(config, s, index), state, indices)

        # state [grid?, seed, ...]; metrics [update, grid?, seed]
        state_spec = self._spec(1 if self.swept else 0)
        metrics_spec = self._spec(2 if self.swept else 1, grid_axis=1)
        return self._program(self._per_run(run_chunk, batched=(0,), shared=(), out_run_axes=(0, 1)),
                             (self._config_spec(), state_spec, self._replicated()), (state_spec, metrics_spec))

    def chunk(self, state, num_updates: int, first_update: int):
        """Run updates ``first_update`` to ``first_update + num_updates - 1``; metrics ``[update, grid point, seed]``."""
        state, metrics = self.chunk_program(num_updates)(self.config, self.pad_seeds(state), jnp.int32(first_update))
        metrics = self._real_seeds(fetch(metrics), axis=2 if self.swept else 1)  # [update, grid?, seed, ...]
        return self.unpad_seeds(state), metrics if self.swept else {name: v[:, None] for name, v in metrics.items()}

    def evaluation(self, state, keys) -> Evaluation:
        """Evaluation returns and episode outcomes, each ``[grid point, seed, episode]``."""
        result = fetch(self.evaluate(self.config, self.pad_seeds(state.policy), self.pad_seeds(keys, axis=0)))
        returns, outcomes = self._real_seeds(result if self.swept else jax.tree.map(lambda x: x[None], result), axis=1)
        return Evaluation(returns, outcomes)


class Evaluation(NamedTuple):
    """One evaluation of every run: returns ``[grid point, seed, episode]`` and, keyed by the
    environment's ``episode_outcomes`` (e.g. ``won``), 1.0 or 0.0 per episode of the same shape."""

    returns: np.ndarray
    outcomes: dict


def default_chunk_updates(num_updates: int, target_chunks: int = 20) -> int:
    """A chunk length near ``num_updates / target_chunks`` that divides ``num_updates`` when one is close."""
    target = max(1, round(num_updates / target_chunks))
    for length in sorted(range(1, num_updates + 1), key=lambda n: abs(n - target)):
        if num_updates % length == 0 and target / 2 <= length <= target * 2:
            return length
    return target


def first_non_finite(metrics: dict, undefined_allowed=()) -> tuple[int, str] | None:
    """(index along the update axis, metric name) of the first NaN/inf, or None.

    ``undefined_allowed``: metrics an agent reports as NaN when they are undefined for an update (its
    module's ``METRICS_MAY_BE_NAN``, e.g. a reward-model loss before any label). A tuple of names allows
    NaN at any update; a mapping ``{name: flag}`` allows it only where the metric ``flag`` is 0 (e.g. the
    figures of a learner that had too little data to train), so a NaN once it is defined still stops the run.
    """
    allowed = undefined_allowed if isinstance(undefined_allowed, dict) else dict.fromkeys(undefined_allowed)
    first = None
    for name, values in metrics.items():
        if name in allowed and allowed[name] is None:
            continue
        bad = ~np.isfinite(values)
        if name in allowed:
            bad &= np.asarray(metrics[allowed[name]]) != 0
        bad = bad.reshape(values.shape[0], -1).any(axis=1)
        if bad.any():
            index = int(np.argmax(bad))
            if first is None or index < first[0]:
                first = (index, name)
    return first


def nested(values: np.ndarray, swept: bool):
    """JSON lists of a ``[grid point, seed]`` array: ``[[...]]`` per point when swept, else one list per seed."""
    values = np.asarray(values, dtype=float)
    return values.tolist() if swept else values[0].tolist()


def chunk_record(chunk, update, env_steps, metrics, start_time, swept: bool) -> dict:
    """One metrics.jsonl line: per-seed values (mean over the chunk's updates) of every metric."""
    now = time.time()
    record = {"chunk": chunk, "update": update, "env_steps": env_steps, "time": now,
              "elapsed_seconds": now - start_time}
    for name, values in metrics.items():
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN (undefined) metric stays NaN
            per_seed = np.nanmean(values, axis=0) if name != "train_return" else values[-1]
        record[name] = nested(per_seed.reshape(per_seed.shape[:2]), swept)
    return record


def final_evaluation(returns: np.ndarray, settings: RunSettings, outcomes: dict | None = None) -> dict:
    """Summary figures of one grid point's ``[seed, episode]`` evaluation returns and outcomes.

    Each outcome (``won``: a win rate) gets its share of episodes per seed and the mean over seeds.
    """
    per_seed = returns.mean(axis=1)
    figures = {
        "return_per_seed": [float(r) for r in per_seed],
        "return_mean": float(per_seed.mean()),
        "return_std": float(per_seed.std()),
        "episodes_per_seed": settings.eval_episodes,
        "greedy": settings.eval_greedy,
    }
    for name, values in (outcomes or {}).items():
        share = values.mean(axis=1)
        figures[f"{name}_per_seed"] = [float(v) for v in share]
        figures[f"{name}_mean"] = float(share.mean())
    return figures


def sweep_summary(grid, returns: np.ndarray, settings: RunSettings, outcomes: dict | None = None) -> dict:
    """Per-point final figures and the best point by final mean return."""
    outcomes = outcomes or {}
    points = [{"point": point, **final_evaluation(r, settings, {n: v[i] for n, v in outcomes.items()})}
              for i, (point, r) in enumerate(zip(grid.points, returns))]
    best = max(range(len(points)), key=lambda i: points[i]["return_mean"])
    return {"fields": list(grid.fields), "points": points,
            "best": {"index": best, "point": grid.points[best], "return_mean": points[best]["return_mean"]}}


@dataclasses.dataclass
class Progress:
    """Where a run stands: what a checkpoint records besides the state."""

    updates_done: int = 0
    chunks_done: int = 0
    stopped: bool = False  # reached ``stop_at_return``: a resume has nothing left to train

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_training(agent_module, grid, env, env_params, settings: RunSettings, run_dir: Path, title: str,
                 resume_from: Path | None = None, loggers: tuple = ()) -> dict:
    """Train every grid point and seed, writing metrics.jsonl as it goes; returns the summary's training part.

    With ``resume_from`` the state and progress come from that run's latest
    checkpoint and the run continues as if it had never stopped. Each of
    ``loggers`` (e.g. wandb) gets every metrics record through ``chunk(record)``.
    """
    config = grid.stacked_config()
    base = grid.configs[0]
    steps_per_update = base.num_envs * base.num_steps
    num_updates = base.num_updates
    chunk_updates = min(settings.chunk_updates or default_chunk_updates(num_updates), num_updates)
    num_chunks = math.ceil(num_updates / chunk_updates)
    runs = grid.size * settings.num_seeds
    checkpointing = settings.checkpoint_every_chunks > 0
    # orbax takes ~1 s of CPU to import: at once when resuming, else after the first chunk's results are out
    orbax_import = checkpoints.preload() if resume_from else None

    view = ProgressView(title, num_updates * steps_per_update * runs, settings.progress)
    metrics_path = run_dir / "metrics.jsonl"
    records: list[dict] = []
    status, final_eval, final_outcomes, checkpointer, writer = "completed", None, {}, None, None
    try:
        layout = devices.plan(settings.num_seeds, grid.size, grid.swept)
        if jax.device_count() > 1:
            view.message(devices.explain(layout, settings.num_seeds, grid.size))
        # every program compiled before the clock starts: all chunk lengths, init (unless resuming), evaluation
        lengths = {chunk_updates, num_updates % chunk_updates} - {0}
        programs = Programs(agent_module, config, env, env_params, settings, grid.swept,
                            training=resume_from is None, layout=layout, chunk_lengths=tuple(lengths))
        train_keys, eval_root = programs.run_keys(settings.seed)
        if resume_from is not None:
            orbax_import.join()
            state, progress = checkpoints.restore_latest(resume_from, programs.abstract_state())
            progress = Progress(**progress)
            records = artifacts.truncate_metrics(metrics_path, progress.updates_done)
        else:
            state, progress = programs.init(config, train_keys), Progress()
        writer = artifacts.MetricsWriter(metrics_path)
        run_start, run_seconds, steps_this_process = time.time(), 0.0, 0
        if progress.stopped:
            status = "reached_stop_at_return"
        for chunk in range(num_chunks if progress.stopped else progress.chunks_done, num_chunks):
            n = min(chunk_updates, num_updates - progress.updates_done)
            tick = time.perf_counter()
            new_state, metrics = programs.chunk(state, n, progress.updates_done)
            run_seconds += time.perf_counter() - tick
            bad = first_non_finite(metrics, getattr(agent_module, "METRICS_MAY_BE_NAN", ()))
            if bad is not None:
                status = "diverged"
                raise NonFiniteError(progress.updates_done + bad[0] + 1, bad[1], run_dir)
            state = new_state
            progress = Progress(progress.updates_done + n, chunk + 1)
            steps_this_process += n * steps_per_update * runs
            env_steps = progress.updates_done * steps_per_update
            record = chunk_record(chunk, progress.updates_done, env_steps, metrics, run_start, grid.swept)
            last = chunk == num_chunks - 1
            if (chunk + 1) % settings.eval_every_chunks == 0 or last:
                tick = time.perf_counter()
                keys = programs.eval_keys(eval_root, progress.updates_done)
                final_eval, final_outcomes = programs.evaluation(state, keys)
                run_seconds += time.perf_counter() - tick
                record["eval_return"] = nested(final_eval.mean(axis=2), grid.swept)
                for name, values in final_outcomes.items():
                    record[f"eval_{name}"] = nested(values.mean(axis=2), grid.swept)
                record["time"] = time.time()
            record["steps_per_second"] = steps_this_process / max(run_seconds, 1e-9)
            writer.write(record)
            records.append(record)
            for logger in loggers:
                logger.chunk(record)
            reached = (settings.stop_at_return is not None and final_eval is not None and "eval_return" in record
                       and final_eval.mean(axis=2).mean(axis=1).max() >= settings.stop_at_return)
            progress = dataclasses.replace(progress, stopped=bool(reached))
            if checkpointing and orbax_import is None:
                orbax_import = checkpoints.preload()
            if checkpointing and ((chunk + 1) % settings.checkpoint_every_chunks == 0 or last or reached):
                if checkpointer is None:
                    orbax_import.join()
                    checkpointer = checkpoints.Checkpointer(run_dir)
                checkpointer.save(progress.updates_done, state, progress.as_dict())
            shown = final_eval.mean(axis=2) if "eval_return" in record else metrics["train_return"][-1]
            view.update(env_steps * runs, record["steps_per_second"], "eval" if "eval_return" in record else "train",
                        np.ravel(shown).tolist())
            if reached:
                status = "reached_stop_at_return"
                break
    finally:
        view.close()
        if writer is not None:
            writer.close()
        if checkpointer is not None:
            checkpointer.close()
        if records:
            labels = [grid.label(i) for i in range(grid.size)] if grid.swept else None
            artifacts.plot_learning_curve(records, run_dir / "learning_curve.png", title, labels)

    if final_eval is None:  # resumed from a checkpoint of a finished run
        final_eval, final_outcomes = programs.evaluation(state, programs.eval_keys(eval_root, progress.updates_done))
    result = {
        "status": status,
        "final_eval": final_evaluation(final_eval[0], settings, {n: v[0] for n, v in final_outcomes.items()}),
        "updates": progress.updates_done,
        "env_steps_per_seed": progress.updates_done * steps_per_update,
        "env_steps_total": progress.updates_done * steps_per_update * runs,
        "chunks": progress.chunks_done,
        "chunk_updates": chunk_updates,
        "compile_seconds": programs.compile_seconds,
        "devices": devices.explain(layout, settings.num_seeds, grid.size),
        "run_seconds": run_seconds,
        "steps_per_second": steps_this_process / max(run_seconds, 1e-9),
        "state": state,
    }
    if grid.swept:
        result["sweep"] = sweep_summary(grid, final_eval, settings, final_outcomes)
        result["final_eval"] = result["sweep"]["points"][result["sweep"]["best"]["index"]]
    return result
