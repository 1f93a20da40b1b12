"""Command line: ``python -m rlx.train +exp=NAME [overrides]``.

Reads the Hydra config, asks ``rlx.envs.registry`` for the environment and
``rlx.algorithms`` for the agent module, and hands both to ``rlx.runner``. Mistakes in
names or values are reported as one line with exit code 2, before compiling.
"""

from __future__ import annotations

import time

_PROCESS_START = time.perf_counter()

import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from rlx.errors import ConfigError, InputError, UnknownNameError  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("exp", "algo", "env", "logger")


def group_choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_choices(argv: list[str]) -> None:
    """Reject unknown preset, algorithm, environment or logger names before Hydra starts."""
    for arg in argv:
        match = re.fullmatch(r"\+{0,2}(\w+)=(.*)", arg)
        if not match or match.group(1) not in GROUPS:
            continue
        group, value = match.groups()
        for choice in value.split(","):
            if choice and choice not in group_choices(group):
                kind = "preset" if group == "exp" else group
                raise UnknownNameError(kind, choice, group_choices(group))


JOBS_STARTED: list[float] = []  # when each job run in this process began


def fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def with_hydra_defaults(argv: list[str]) -> list[str]:
    """Command-line conveniences applied before Hydra parses the arguments.

    ``sweep.algo.lr=[...]`` adds keys to the empty ``sweep`` section, which
    Hydra would otherwise insist be written ``+sweep.algo.lr=[...]``; and
    ``run.resume=DIR`` continues in ``DIR`` without touching its ``.hydra`` record.
    """
    argv = [f"+{arg}" if arg.startswith("sweep.") else arg for arg in argv]
    argv = open_undeclared_keys(argv)
    resume = [arg.split("=", 1)[1] for arg in argv if arg.startswith("run.resume=")]
    if resume and resume[-1] not in ("", "null") and not any(arg.startswith("hydra.run.dir=") for arg in argv):
        argv += [f"hydra.run.dir={resume[-1]}", "hydra.output_subdir=null"]
    return argv


OPEN_SECTIONS = ("algo", "run")  # sections whose every key rlx checks itself, naming the valid ones


def declared_keys(argv: list[str]) -> dict[str, set[str]]:
    """Per open section, the keys that every composition ``argv`` asks for defines: those of the root config and
    the ``+exp=`` presets, and for ``algo`` those of each chosen algorithm file (``algo=``, else the preset's,
    else the root's default)."""
    import yaml

    def load(path: Path) -> dict:
        return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}

    def chosen(group: str) -> list[str]:
        return [name for arg in argv for key, _, value in [arg.lstrip("+").partition("=")] if key == group
                for name in value.split(",")]

    def default_algo(config: dict) -> list[str]:
        return [entry.get("override /algo", entry.get("algo")) for entry in config.get("defaults", [])
                if isinstance(entry, dict) and {"override /algo", "algo"} & set(entry)]

    root = load(CONF_DIR / "config.yaml")
    presets = [load(CONF_DIR / "exp" / f"{name}.yaml") for name in chosen("exp")]
    declared = {section: set(root.get(section) or {}) | {key for preset in presets for key in preset.get(section) or {}}
                for section in OPEN_SECTIONS}
    algos = chosen("algo") or [name for preset in presets for name in default_algo(preset)] or default_algo(root)
    declared["algo"] |= set.intersection(*(set(load(CONF_DIR / "algo" / f"{name}.yaml")) for name in algos))
    return declared


def open_undeclared_keys(argv: list[str]) -> list[str]:
    """``algo.K=V`` or ``run.K=V`` for a key that no chosen config file declares becomes ``++algo.K=V``: Hydra
    would refuse it with a multi-line error of its own, while rlx checks every key of these sections itself (an
    agent ``Config`` field the algo file leaves out is then accepted, a misspelt one is named with the valid
    ones, in one line)."""
    declared = declared_keys(argv)
    out = []
    for arg in argv:
        key, equals, _ = arg.partition("=")
        section, dot, name = key.partition(".")
        if equals and dot and section in declared and "." not in name and name not in declared[section]:
            arg = f"++{arg}"
        out.append(arg)
    return out


# Keys a resumed run may change: where it caches, how it shows progress, which directory it resumes,
# how many CPU devices it splits the seeds over (the checkpoint restores onto any layout).
RESUME_MAY_CHANGE = ("run.resume", "run.compile_cache", "run.cpu_devices", "logger.")


def resume_config(cfg, overrides: list[str]):
    """The configuration a ``run.resume=DIR`` run continues with.

    Given only ``run.resume`` (and logger choices), the saved ``config.yaml``
    of DIR is used. Given a full command line, it must agree with the saved
    one: a resumed run that trained something else would not be a resume.
    """
    from omegaconf import OmegaConf

    from rlx.runner.artifacts import flatten_dict, read_metrics

    resume_dir = Path(cfg.run.resume)
    check_resumable(resume_dir)
    saved = OmegaConf.load(resume_dir / "config.yaml")
    read_metrics(resume_dir / "metrics.jsonl")  # a malformed line fails here, before anything compiles
    if all(o.lstrip("+~").startswith(RESUME_MAY_CHANGE + ("logger=", "hydra.")) for o in overrides):
        given = {key: cfg.run[key] for key in ("compile_cache", "cpu_devices")
                 if any(o.lstrip("+~").startswith(f"run.{key}=") for o in overrides)}
        return OmegaConf.merge(saved, {"run": {"resume": str(resume_dir), **given}, "logger": cfg.logger})
    current = flatten_dict(OmegaConf.to_container(cfg, resolve=True))
    previous = flatten_dict(OmegaConf.to_container(saved, resolve=True))
    differing = sorted(key for key in current.keys() | previous.keys()
                       if not key.startswith(RESUME_MAY_CHANGE) and current.get(key) != previous.get(key))
    if differing:
        changes = "; ".join(f"{key}: {previous.get(key)!r} -> {current.get(key)!r}" for key in differing)
        raise ConfigError(f"run.resume={resume_dir}: the config differs from the checkpointed run's ({changes})")
    return cfg


RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints")


def check_fresh_run_dir(run_dir: Path) -> None:
    """ConfigError if ``run_dir`` already holds a run: a second one would mix its metrics into the first's and
    leave the first's checkpoints under the second's config."""
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    if found:
        raise ConfigError(f"hydra.run.dir={run_dir}: already holds a run ({', '.join(found)}); train into a new "
                          f"directory, or continue that run with run.resume={run_dir}")


def check_resumable(resume_dir: Path) -> None:
    """ConfigError unless ``resume_dir`` is a run directory (it holds the run's ``config.yaml``)."""
    if not (resume_dir / "config.yaml").is_file():
        raise ConfigError(f"run.resume={resume_dir}: no config.yaml there; not an rlx run directory")


def check_named_run_dir(argv: list[str]) -> None:
    """The directory checks of a single run, before Hydra starts: Hydra creates the run directory and writes its
    ``.hydra/`` record there before the task runs. A fresh run's ``hydra.run.dir=DIR`` must not hold a run (its
    record would be overwritten), and ``run.resume=DIR`` must be a run directory (it would be created empty)."""
    if any(arg in ("-m", "--multirun") for arg in argv):
        return
    values = {key.lstrip("+"): value for key, _, value in (arg.partition("=") for arg in argv)}
    resume = values.get("run.resume", "null")
    if resume not in ("", "null"):
        check_resumable(Path(resume))
    elif values.get("hydra.run.dir"):
        check_fresh_run_dir(Path(values["hydra.run.dir"]))


def make_loggers(cfg, run_dir: Path) -> tuple:
    """Loggers besides the console and metrics.jsonl: wandb when ``logger=wandb``."""
    if "wandb" not in cfg.logger:
        return ()
    from omegaconf import OmegaConf

    from rlx.runner.wandb_logger import WandbLogger

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    return (WandbLogger(OmegaConf.to_container(cfg.logger.wandb, resolve=True),
                        OmegaConf.to_container(cfg, resolve=True), run_dir, f"{cfg.exp_name}-{run_dir.name}", warn),)


def execute(cfg, run_dir: Path, imported_seconds: float, started: float = _PROCESS_START) -> dict:
    """Train one configuration and write every file of its run directory; return the summary.

    ``started``: when this job began (``time.perf_counter``), for its ``total_seconds``.
    """
    from omegaconf import OmegaConf

    from rlx.runner import compile_cache

    tick = time.perf_counter()
    cache_setting = cfg.run.get("compile_cache")
    cache_dir = compile_cache.default_cache_dir() if cache_setting == "default" else cache_setting
    compile_cache.set_cpu_devices(cfg.run.get("cpu_devices", "auto"))
    import jax  # noqa: F401  (timed as part of the imports)

    from rlx.runner import artifacts, components, loop

    parts = components.build(cfg)
    import_seconds = imported_seconds + time.perf_counter() - tick
    settings, resume_dir = parts.settings, parts.resume
    counter = compile_cache.enable(cache_dir)

    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    if resume_dir is None:
        check_fresh_run_dir(run_dir)
        (run_dir / "config.yaml").write_text(config_yaml)
    summary = {
        "experiment": cfg.exp_name,
        "algo": cfg.algo.name,
        "env": parts.env_name,
        "num_seeds": settings.num_seeds,
        "seed": settings.seed,
        "config_hash": artifacts.config_hash(config_yaml),
        "git_commit": artifacts.git_commit(),
        "versions": artifacts.package_versions(),
        "run_dir": str(run_dir),
    }
    if resume_dir is not None:
        summary["resumed"] = True
    title = f"{cfg.exp_name}"
    loggers = make_loggers(cfg, run_dir)
    try:
        result = loop.run_training(parts.agent_module, parts.grid, parts.env, parts.env_params, settings, run_dir, title,
                                   resume_from=Path(resume_dir) if resume_dir else None, loggers=loggers)
    except loop.NonFiniteError as error:
        summary.update(status="diverged", diverged_at_update=error.update, error=str(error))
        artifacts.write_json_atomic(run_dir / "summary.json", summary)
        for logger in loggers:
            logger.finish(summary, [run_dir / "learning_curve.png"])
        raise
    except BaseException:
        for logger in loggers:
            logger.finish(None, [])
        raise
    result.pop("state")
    summary.update(result)
    summary["import_seconds"] = import_seconds
    summary["total_seconds"] = time.perf_counter() - started
    summary["compile_cache"] = {"dir": str(cache_dir) if cache_dir else None, "hits": counter.hits,
                                "misses": counter.misses}
    artifacts.write_json_atomic(run_dir / "summary.json", summary)
    for logger in loggers:
        logger.finish(summary, [run_dir / "learning_curve.png"])
    if settings.progress:
        final = summary["final_eval"]
        outcomes = "".join(f", {name.removesuffix('_mean')} {share:.0%}" for name, share in final.items()
                           if name.endswith("_mean") and name != "return_mean")  # e.g. ", won 85%"
        print(
            f"{title}: eval return {final['return_mean']:.1f} ± {final['return_std']:.1f}{outcomes} over "
            f"{settings.num_seeds} seed{'s' if settings.num_seeds != 1 else ''} after "
            f"{summary['env_steps_per_seed']:,} steps per seed "
            f"(import {import_seconds:.1f}s, compile {summary['compile_seconds']:.1f}s, "
            f"run {summary['run_seconds']:.1f}s) -> {run_dir}",
            file=sys.stderr,
        )
    return summary


def main() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except UnknownNameError as error:
        fail(str(error), 2)
    sys.argv[1:] = with_hydra_defaults(sys.argv[1:])
    try:
        check_named_run_dir(sys.argv[1:])
    except ConfigError as error:
        fail(str(error), 2)
    from rlx.runner import compile_cache

    compile_cache.set_xla_flags()
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlx.runner import multirun

    hydra_seconds = time.perf_counter() - _PROCESS_START

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def hydra_entry(cfg) -> None:
        tick = time.perf_counter()
        first_job = not JOBS_STARTED  # a sweep's later jobs in this process start when they are called
        JOBS_STARTED.append(tick)
        from rlx.runner.loop import NonFiniteError  # imports jax: counted with the imports
        imported_seconds = hydra_seconds * first_job + time.perf_counter() - tick

        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        multirun.clear_failure(run_dir)
        try:
            if cfg.run.get("resume"):
                cfg = resume_config(cfg, list(hydra_cfg.overrides.task))
                run_dir = Path(cfg.run.resume)
            execute(cfg, run_dir, imported_seconds, _PROCESS_START if first_job else tick)
        except (InputError, NonFiniteError) as error:
            code = 2 if isinstance(error, InputError) else 1
            if hydra_cfg.mode != RunMode.MULTIRUN:
                fail(str(error), code)
            # one job's failure must not end the sweep: report it, go on, and exit non-zero at the end
            print(f"error: job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): {error}", file=sys.stderr)
            multirun.record_failure(run_dir, code, str(error))

    hydra_entry()
    failed = multirun.EXIT_CODES  # set by the FailedJobs callback (conf/config.yaml) at the end of a multirun
    if failed:
        fail(f"{len(failed)} job{'s' if len(failed) > 1 else ''} of the sweep failed (above; each job's "
             f"{multirun.MARKER} says why)", max(failed))


if __name__ == "__main__":
    main()
