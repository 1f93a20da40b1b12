"""The labelling page end to end in headless Chromium (Debian's /usr/bin/chromium, driven by Playwright)."""

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from rlx.label import make_server
from rlx.pbrl.queries import make_queries, save_queries

CHROMIUM = Path("/usr/bin/chromium")


def unavailable(reason: str):
    """Skip on a developer machine; fail in CI, which installs Chromium and Playwright."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the CI machine must provide it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e .[dev])")
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses to start its sandbox as root (containers, CI).
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def serve():
    """``serve(run_dir) -> server``: a label server in a background thread, stopped after the test."""
    running = []

    def start(run_dir):
        server = make_server(run_dir, port=0)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        running.append(server)
        return server

    yield start
    for server in running:
        server.shutdown()
        server.server_close()


def open_page(browser, url):
    """A page at ``url`` whose uncaught JavaScript errors are collected in ``page.errors``."""
    page = browser.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(url)
    return page


def test_three_answers_by_click_and_keys_reach_the_label_file(browser, serve, tmp_path):
    queries = make_queries("CartPole-v1", num_pairs=3, segment_length=10, key_seed=0, num_envs=2, num_steps=20)
    save_queries(tmp_path / "queries.npz", queries)
    server = serve(tmp_path)
    page = open_page(browser, server.url)
    progress = page.locator("#progress")
    progress.filter(has_text="answered 0 of 3").wait_for(timeout=10_000)
    assert "left: e" in page.locator("#left-id").inner_text()
    page.click("#answer-left")
    progress.filter(has_text="answered 1 of 3").wait_for(timeout=10_000)
    page.keyboard.press("ArrowRight")
    progress.filter(has_text="answered 2 of 3").wait_for(timeout=10_000)
    page.keyboard.press("w")  # equal
    progress.filter(has_text="answered 3 of 3").wait_for(timeout=10_000)
    page.locator("#done").filter(has_text="All done").wait_for(state="visible", timeout=10_000)
    written = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    ids = queries["segment_ids"]
    expected = [{"query": q, "left": str(ids[queries["pairs"][q, 0]]), "right": str(ids[queries["pairs"][q, 1]]),
                 "answer": answer, "env": str(queries["env"])} for q, answer in enumerate(["left", "right", "equal"])]
    assert written == expected
    assert page.errors == []
    page.close()


def synthetic_queries(env: str, obs_size: int) -> dict:
    """Two random segments (no rollout) for an environment name, to draw its scene."""
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 8, obs_size)).astype(np.float32)
    return {"segment_ids": np.array(["a", "b"]), "obs": obs, "action": np.zeros((2, 8), np.int32),
            "reward": np.zeros((2, 8), np.float32), "pairs": np.array([[0, 1]], np.int32), "env": np.array(env)}


def test_steps_after_the_episode_ended_are_drawn_as_episode_over(browser, serve, tmp_path):
    queries = synthetic_queries("CartPole-v1", 4)
    queries["absorbing"] = np.stack([np.ones(8, np.float32), np.zeros(8, np.float32)])  # left: over from step 1
    save_queries(tmp_path / "queries.npz", queries)
    page = open_page(browser, serve(tmp_path).url)
    page.locator("#progress").filter(has_text="answered 0 of 1").wait_for(timeout=10_000)
    page.wait_for_timeout(200)
    inked = page.evaluate("""() => ["left", "right"].map(side => {
        const canvas = document.getElementById(side);
        const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        let inked = 0;
        for (let i = 3; i < pixels.length; i += 4) inked += pixels[i] > 0;
        return inked / (canvas.width * canvas.height);
    })""")
    assert inked[0] == 1.0 and inked[1] < 0.5, inked  # the grey "episode over" card fills the left canvas
    assert page.errors == []
    page.close()


@pytest.mark.parametrize("env, obs_size", [("CartPole-v1", 4), ("Pendulum-v1", 3), ("Acrobot-v1", 6),
                                           ("MountainCar-v0", 2), ("Probe-ObservationReward", 20)])
def test_every_scene_draws_without_errors(browser, serve, tmp_path, env, obs_size):
    save_queries(tmp_path / "queries.npz", synthetic_queries(env, obs_size))
    page = open_page(browser, serve(tmp_path).url)
    page.locator("#progress").filter(has_text="answered 0 of 1").wait_for(timeout=10_000)
    page.wait_for_timeout(200)  # a few animation frames
    drawn = page.evaluate("""() => {
        const canvas = document.getElementById("left");
        const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        let inked = 0;
        for (let i = 3; i < pixels.length; i += 4) inked += pixels[i] > 0;
        return inked;
    }""")
    assert drawn > 200 and page.errors == []
    page.close()
