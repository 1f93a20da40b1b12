"""rlx.evaluate and the Gymnasium adapter on a briefly trained CartPole run."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TEST_CACHE


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A partly trained CartPole run: returns vary across start states, so comparisons are not trivial."""
    run_dir = tmp_path_factory.mktemp("trained")
    done = subprocess.run(
        [sys.executable, "-m", "rlx.train", "+exp=ppo_cartpole", "algo.total_timesteps=12288", "run.num_seeds=2",
         "run.eval_episodes=4", "logger=none", f"hydra.run.dir={run_dir}", f"run.compile_cache={TEST_CACHE}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return run_dir


def evaluate(*args):
    return subprocess.run([sys.executable, "-m", "rlx.evaluate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_evaluate_reports_every_seed_and_writes_json(trained):
    done = evaluate(f"run_dir={trained}", "episodes=6", "seed=3")
    assert done.returncode == 0, done.stderr
    result = json.loads((trained / "evaluation.json").read_text())
    (point,) = result["points"]
    assert result["episodes_per_seed"] == 6 and result["greedy"] is True and len(point["per_seed"]) == 2
    for seed, figures in enumerate(point["per_seed"]):
        assert f"seed {seed}: {figures['mean']:.1f} ± {figures['std']:.1f} over 6 episodes" in done.stdout
        assert 8 <= figures["mean"] <= 500
    means = [f["mean"] for f in point["per_seed"]]
    assert point["mean_over_seeds"] == pytest.approx(np.mean(means))
    again = evaluate(f"run_dir={trained}", "episodes=6", "seed=3")
    assert json.loads((trained / "evaluation.json").read_text())["points"] == result["points"], again.stderr


def test_policy_in_gymnasium_matches_gymnax_evaluation(trained):
    from rlx.export import GymnasiumPolicy, gymnasium_returns
    from rlx.runner import components

    import jax

    run = components.load_trained(trained, eval_episodes=64)
    gymnax_returns = run.programs.evaluation(run.state, jax.random.split(jax.random.PRNGKey(7), 2)).returns[0, 0]
    gym_returns = gymnasium_returns(GymnasiumPolicy(trained, seed=0), "CartPole-v1", episodes=64, seed=100)
    noise = 3 * np.sqrt(gymnax_returns.var() / 64 + gym_returns.var() / 64) + 5.0
    assert abs(gym_returns.mean() - gymnax_returns.mean()) <= noise, (gym_returns.mean(), gymnax_returns.mean())
    assert gym_returns.mean() > 30  # trained: far above a random policy's ~22


def test_sampled_gymnasium_policy_draws_a_fresh_key_each_step_and_repeats_with_its_seed(trained):
    """``greedy=False``: in the upright start state the partly trained policy is near 50/50, so 100 calls on the
    same observation give both actions only if every step draws a new key; the same ``key_seed`` repeats the
    draws, another one changes them."""
    from rlx.export import GymnasiumPolicy

    upright = np.zeros(4, np.float32)
    policy = GymnasiumPolicy(trained, greedy=False, key_seed=3)
    actions = [policy(upright) for _ in range(100)]
    assert set(actions) == {0, 1}, actions
    again = GymnasiumPolicy(trained, greedy=False, key_seed=3)
    assert [again(upright) for _ in range(100)] == actions
    other = GymnasiumPolicy(trained, greedy=False, key_seed=4)
    assert [other(upright) for _ in range(100)] != actions


def test_gymnasium_figures_are_saved_and_an_unknown_id_fails_in_one_line(trained):
    done = evaluate(f"run_dir={trained}", "episodes=2", "gymnasium=CartPole-v1")
    assert done.returncode == 0, done.stderr
    saved = json.loads((trained / "evaluation.json").read_text())["gymnasium"]
    assert saved["env_id"] == "CartPole-v1" and len(saved["returns"]) == 2 and min(saved["returns"]) >= 8
    done = evaluate(f"run_dir={trained}", "episodes=2", "gymnasium=NoSuchEnv-v0")
    assert done.returncode == 2 and "gymnasium=NoSuchEnv-v0: Gymnasium cannot make it" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_render_writes_a_gif_of_one_episode(trained):
    from PIL import Image

    done = evaluate(f"run_dir={trained}", "episodes=1", "render=true", "render_steps=12")
    assert done.returncode == 0, done.stderr
    frames = int(done.stdout.split("episode.gif (")[1].split(" frames")[0])
    assert 2 <= frames <= 13
    with Image.open(trained / "episode.gif") as gif:
        assert gif.n_frames == frames


@pytest.mark.parametrize("args, message", [
    ([], "run_dir: missing"),
    (["run_dir=/nonexistent/run"], "run_dir=/nonexistent/run: no config.yaml there"),
    (["run_dir=x", "episode=3"], "'episode=3': expected key=value with key one of run_dir, episodes"),
    (["run_dir=x", "greedy=maybe"], "greedy=maybe: must be true or false"),
])
def test_bad_arguments_fail_in_one_line(args, message):
    done = evaluate(*args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_run_without_checkpoints_fails_in_one_line(tmp_path, trained):
    (tmp_path / "config.yaml").write_text((trained / "config.yaml").read_text())
    done = evaluate(f"run_dir={tmp_path}")
    assert done.returncode == 2 and f"run_dir={tmp_path}: no checkpoint directory" in done.stderr


@pytest.mark.parametrize("name, message", [
    ("maze", "render=true: gymnax cannot draw maze; it draws Acrobot-v1, CartPole-v1"),  # gymnax drew a blank GIF
    ("Probe-ActionReward", "gymnax cannot draw Probe-ActionReward"),
    ("Coop", "render=true: Coop is a multi-agent environment"),  # a traceback on its per-agent rewards
])
def test_render_refuses_environments_gymnax_cannot_draw(name, message):
    from rlx.envs import registry
    from rlx.errors import ConfigError
    from rlx.evaluate import check_drawable

    env, _ = registry.make(name)
    with pytest.raises(ConfigError, match=message):
        check_drawable(env, name)
    check_drawable(*registry.make("CartPole-v1")[:1], "CartPole-v1")


def test_gymnasium_false_is_off_and_a_failed_gymnasium_play_keeps_the_fresh_evaluation(trained):
    (trained / "evaluation.json").unlink(missing_ok=True)
    done = evaluate(f"run_dir={trained}", "episodes=2", "gymnasium=False")  # used to be taken as the id "False"
    assert done.returncode == 0, done.stderr
    assert "gymnasium" not in json.loads((trained / "evaluation.json").read_text())
    (trained / "evaluation.json").unlink()
    done = evaluate(f"run_dir={trained}", "episodes=3", "gymnasium=NoSuchEnv-v0")
    assert done.returncode == 2 and "NoSuchEnv-v0" in done.stderr
    assert json.loads((trained / "evaluation.json").read_text())["episodes_per_seed"] == 3


def test_gymnasium_policy_refuses_a_sweep_point_the_run_lacks(trained):
    from rlx.export import GymnasiumPolicy

    with pytest.raises(ValueError, match=r"point=1: the run has sweep points 0..0"):
        GymnasiumPolicy(trained, point=1)
