"""Two CPU processes joined by jax.distributed (gloo) train one run, seeds split across them: each process
gets every seed's metrics and evaluation (gathered across processes), as README's multi-host section says."""

import json
import socket
import subprocess
import sys
import textwrap

from conftest import ROOT

PROCESS = textwrap.dedent("""
    import json, pathlib, sys
    sys.path[:0] = [{tests!r}, {root!r}]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address="127.0.0.1:{port}", num_processes=2, process_id=int(sys.argv[1]))
    import test_runner
    from rlx.envs import registry
    from rlx.runner import loop, sweep
    env, env_params = registry.make("Probe-ConstantReward")
    grid = sweep.build_grid({{}}, {{"nan_from_update": 1e9}}, test_runner.CountingAgent, loop.build_agent_config)
    settings = loop.RunSettings(num_seeds=2, chunk_updates=3, eval_episodes=1, progress=False,
                                checkpoint_every_chunks=0)
    run_dir = pathlib.Path(sys.argv[2])
    run_dir.mkdir()
    result = loop.run_training(test_runner.CountingAgent, grid, env, env_params, settings, run_dir, "counting")
    print(json.dumps({{"devices": result["devices"], "returns": result["final_eval"]["return_per_seed"]}}))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_seeds_split_over_two_processes_report_every_seed(tmp_path):
    script = tmp_path / "process.py"
    script.write_text(PROCESS.format(tests=str(ROOT / "tests"), root=str(ROOT), port=free_port()))
    processes = [subprocess.Popen([sys.executable, str(script), str(i), str(tmp_path / f"run{i}")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
                 for i in range(2)]
    outputs = [process.communicate(timeout=240) for process in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-2000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["devices"] == "2 devices: 2 seeds, 1 on each" and result["returns"] == [1.0, 1.0], result
