"""Several devices (4 forced CPU devices): seeds or sweep points split with shard_map, same results as one device."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TEST_CACHE, env_without_xla_flags

TINY = ["+exp=ppo_cartpole", "algo.total_timesteps=2048", "algo.num_envs=4", "algo.num_steps=64",
        "run.chunk_updates=4", "run.eval_episodes=4", "logger=none", f"run.compile_cache={TEST_CACHE}"]
FOUR_DEVICES = "--xla_force_host_platform_device_count=4"


def train(run_dir, *args, devices: int):
    # XLA's default fusion emitters, as users compile with: the older ones the suite uses elsewhere to
    # compile faster round a 4-device program differently enough to change an evaluation return.
    env = env_without_xla_flags("--xla_cpu_use_fusion_emitters")
    env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} {FOUR_DEVICES if devices == 4 else ''}".strip()
    one_device = ["run.cpu_devices=1"] if devices == 1 else []
    done = subprocess.run([sys.executable, "-m", "rlx.train", *TINY, *one_device, *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, records, env


def assert_same_training(one, four):
    (summary1, records1, _), (summary4, records4, _) = one, four
    # Evaluation returns are equal; losses agree to float32 rounding (XLA vectorises a
    # device's 1 seed differently from 4 seeds together, which moves the last bit).
    assert summary4["final_eval"] == summary1["final_eval"]
    for r1, r4 in zip(records1, records4, strict=True):
        for key in ("loss", "entropy", "train_return", "eval_return"):
            if key in r1:
                np.testing.assert_allclose(r4[key], r1[key], rtol=1e-4, atol=1e-5)


def test_four_devices_split_padded_seeds_like_one_device_and_the_checkpoint_reloads_on_one(tmp_path):
    # 6 seeds on 4 devices: padded to 8 with copies of seeds 0 and 1, two per device, the copies dropped
    one = train(tmp_path / "one", "run.num_seeds=6", devices=1)
    four = train(tmp_path / "four", "run.num_seeds=6", devices=4)
    assert one[0]["devices"] == "1 device (cpu)"
    assert four[0]["devices"] == ("4 devices: 6 seeds padded to 8 with copies of the first 2 "
                                  "(their results are dropped), 2 on each")
    assert len(four[0]["final_eval"]["return_per_seed"]) == 6 and all(len(r["loss"]) == 6 for r in four[1])
    assert_same_training(one, four)
    from rlx.evaluate import evaluate_run

    reloaded = evaluate_run(tmp_path / "four", episodes=2, greedy=True, seed=0)  # in this one-device process
    assert len(reloaded["points"][0]["per_seed"]) == 6


@pytest.mark.slow  # ~40 s on a cold cache; the fast suite splits seeds over the same 4 devices (the test above)
def test_four_devices_split_sweep_points_like_one_device(tmp_path):
    args = ["run.num_seeds=2", "sweep.algo.lr=[1e-3,2e-3,3e-3,4e-3]"]
    one = train(tmp_path / "one", *args, devices=1)
    four = train(tmp_path / "four", *args, devices=4)
    assert one[0]["devices"] == "1 device (cpu)" and four[0]["devices"] == "4 devices: 4 sweep points, 1 on each"
    assert_same_training(one, four)


def test_seeds_that_do_not_split_evenly_are_padded_and_a_lone_seed_stays_on_one_device(monkeypatch):
    """Even seeds split as they are; odd ones are padded up to a multiple of the devices (unless the sweep
    points split evenly); one seed with an uneven sweep runs on one device, and the console says why."""
    import jax

    from rlx.runner import devices

    four = [jax.devices()[0]] * 4
    assert devices.plan(8, 1, False, four).active and devices.plan(8, 1, False, four).run_seeds is None
    odd_seeds = devices.plan(5, 1, False, four)
    assert odd_seeds.active and not odd_seeds.split_grid and odd_seeds.run_seeds == 8
    grid_split = devices.plan(5, 4, True, four)
    assert grid_split.split_grid and grid_split.run_seeds is None
    lone = devices.plan(1, 3, True, four)
    assert not lone.active and devices.plan(3, 1, False, four[:1]).run_seeds is None
    monkeypatch.setattr(devices.jax, "device_count", lambda: 4)
    assert devices.explain(lone, 1, 3) == (
        "4 devices, but num_seeds=1 and the 3 sweep point(s) do not split evenly: running on one device")
    alone = devices.plan(1, 1, False, four)
    assert not alone.active
    assert devices.explain(alone, 1, 1) == "4 devices, one seed and no sweep: running on one device"


def test_cpu_devices_default_uses_every_core(tmp_path, monkeypatch):
    """run.cpu_devices=auto shows each core the process may use as a device (its affinity, as taskset or SLURM
    set it; the machine's count where the platform has no affinity)."""
    from rlx.runner import compile_cache

    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(compile_cache.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(compile_cache.os, "cpu_count", lambda: 64)
    compile_cache.set_cpu_devices("auto")
    assert "--xla_force_host_platform_device_count=3" in os.environ["XLA_FLAGS"]
    monkeypatch.delattr(compile_cache.os, "sched_getaffinity")
    assert compile_cache.cpu_device_count("auto") == 64
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=5")
    compile_cache.set_cpu_devices(2)  # the user's own flag wins
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=5"
    monkeypatch.setenv("XLA_FLAGS", "")
    compile_cache.set_cpu_devices(1)
    assert os.environ["XLA_FLAGS"] == ""


@pytest.mark.parametrize("value", ["0", "many", "true"])
def test_bad_cpu_devices_fail_in_one_line(train_in_process, value):
    code, stderr = train_in_process(*TINY, f"run.cpu_devices={value}")
    assert code == 2
    assert "run.cpu_devices=" in stderr and "must be 'auto' or an integer >= 1" in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_ynn_reduce_flag_only_for_the_jaxlib_that_knows_it(monkeypatch):
    """XLA aborts on a flag it does not know, so the YNNPACK reduction switch is added for jaxlib 0.10 only;
    a value the user set wins; and the pinned jaxlib is the one the switch was measured on (a bump that
    fails here needs the slowdown it works around measured again: rlx/runner/compile_cache.py)."""
    from rlx.runner import compile_cache

    scheduler = compile_cache.WORKAROUND_XLA_FLAGS
    for version, expected in (("0.10.2", f"{scheduler} {compile_cache.YNN_REDUCE_FLAG}"), ("0.11.0", scheduler)):
        monkeypatch.setenv("XLA_FLAGS", "")
        monkeypatch.setattr(compile_cache, "jaxlib_version", lambda: version)
        compile_cache.set_xla_flags()
        assert os.environ["XLA_FLAGS"] == expected
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
    monkeypatch.setattr(compile_cache, "jaxlib_version", lambda: "0.10.2")
    compile_cache.set_xla_flags()
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_experimental_ynn_fusion_type=dot {scheduler}"
    monkeypatch.undo()
    assert compile_cache.jaxlib_version().startswith(compile_cache.YNN_REDUCE_JAXLIB)
