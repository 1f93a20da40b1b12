"""The runner with a stand-in agent whose numbers are known: NaN handling and checkpoints."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from rlx.envs import registry
from rlx.runner import checkpoints, loop, sweep


@struct.dataclass
class Config:
    nan_from_update: float = 8.0
    total_timesteps: int = struct.field(pytree_node=False, default=12)
    num_envs: int = struct.field(pytree_node=False, default=1)
    num_steps: int = struct.field(pytree_node=False, default=1)

    @property
    def num_updates(self):
        return self.total_timesteps // (self.num_envs * self.num_steps)


class State(struct.PyTreeNode):
    counter: jax.Array
    update_step: jax.Array

    @property
    def policy(self):
        return self.counter


class Agent(NamedTuple):
    init: Any
    update: Any
    act: Any
    value: Any


class CountingAgent:
    """An 'agent' that counts updates and reports a NaN loss from update ``nan_from_update`` on."""

    Config = Config

    @staticmethod
    def validate(config):
        pass

    @staticmethod
    def make(config, env, env_params):
        def init(key):
            return State(jnp.float32(0), jnp.int32(0))

        def update(state):
            step = state.update_step + 1
            loss = jnp.where(step >= config.nan_from_update, jnp.nan, step.astype(jnp.float32))
            return State(state.counter + 1, step), {"loss": loss, "train_return": state.counter}

        def act(policy, obs, key, greedy=False):
            return jnp.zeros(obs.shape[0], jnp.int32)

        return Agent(init, update, act, lambda policy, obs: jnp.zeros(obs.shape[0]))


def train(tmp_path, **values):
    env, env_params = registry.make("Probe-ConstantReward")
    grid = sweep.build_grid({}, values, CountingAgent, loop.build_agent_config)
    settings = loop.RunSettings(num_seeds=2, chunk_updates=3, eval_episodes=1, progress=False,
                                checkpoint_every_chunks=1)
    return loop.run_training(CountingAgent, grid, env, env_params, settings, tmp_path, "counting")


def test_nan_stops_at_its_update_and_the_last_good_checkpoint_loads(tmp_path):
    with pytest.raises(loop.NonFiniteError, match="non-finite loss at update 8;"):
        train(tmp_path)
    state, progress = checkpoints.load_raw(tmp_path)
    assert progress == {"updates_done": 6, "chunks_done": 2, "stopped": False}  # chunk 3 (updates 7-9): the NaN
    assert state["counter"].tolist() == [6.0, 6.0]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2


def test_finished_run_checkpoints_its_last_update(tmp_path):
    result = train(tmp_path, nan_from_update=1e9)
    assert result["status"] == "completed" and result["updates"] == 12
    state, progress = checkpoints.load_raw(tmp_path)
    assert progress["updates_done"] == 12 and state["counter"].tolist() == [12.0, 12.0]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [9, 12]  # keeps the last two


def test_progress_in_a_log_file_is_plain_full_lines_at_most_every_log_every_seconds(monkeypatch):
    """Not on a terminal (a job's log, CI), the progress view prints whole lines, never cut to the console's
    width: the first update at once, later ones only after ``log_every`` seconds, and the last on close."""
    import io

    from rich.console import Console

    from rlx.runner import console as console_module

    clock = iter([0.0, 0.0, 5.0, 11.0, 12.0, 13.0])
    monkeypatch.setattr(console_module.time, "monotonic", lambda: next(clock))
    written = io.StringIO()
    view = console_module.ProgressView("a_long_experiment_name", 4096, console=Console(file=written, width=30),
                                       log_every=10.0)
    view.update(1024, 1500.0, "train", [1.0, 3.0])  # t=0: printed
    view.update(2048, 1600.0, "train", [2.0, 4.0])  # t=5: held back
    view.update(3072, 1700.0, "eval", [3.0, 5.0])  # t=11: printed
    view.update(4096, 1800.0, "eval", [6.0, 8.0])  # t=12: held back until close
    view.close()  # t=13
    lines = written.getvalue().splitlines()
    assert lines == ["a_long_experiment_name 1,024/4,096 steps  1,500 steps/s  train 2.0 [1.0, 3.0]  0:00:00",
                     "a_long_experiment_name 3,072/4,096 steps  1,700 steps/s  eval 4.0 [3.0, 5.0]  0:00:11",
                     "a_long_experiment_name 4,096/4,096 steps  1,800 steps/s  eval 7.0 [6.0, 8.0]  0:00:13"]
    monkeypatch.setattr(console_module.time, "monotonic", lambda: 0.0)
    on_terminal = console_module.ProgressView("run", 10, console=Console(file=io.StringIO(), force_terminal=True))
    assert on_terminal.live and not view.live  # a terminal gets the bar that redraws in place
    on_terminal.close()



def test_nan_guard_allows_a_flagged_metric_only_where_its_flag_says_undefined():
    """``{name: flag}``: NaN passes only in the (update, run) cells whose flag is 0, seed by seed."""
    from rlx.runner.loop import first_non_finite

    ready = np.array([[[0, 0]], [[0, 1]], [[1, 1]]], dtype=np.float32)  # [update, grid point, seed]
    loss = np.where(ready > 0, 1.0, np.nan)
    metrics = {"ready": ready, "loss": loss.copy()}
    assert first_non_finite(metrics, {"loss": "ready"}) is None
    assert first_non_finite(metrics, ("loss",)) is None
    assert first_non_finite(metrics) == (0, "loss")
    metrics["loss"][1, 0, 1] = np.nan  # seed 1 is ready at update 1, seed 0 is not
    assert first_non_finite(metrics, {"loss": "ready"}) == (1, "loss")
    assert first_non_finite(metrics, ("loss",)) is None
