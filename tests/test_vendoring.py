"""Each agent file runs alone: copied into an empty folder, it imports no rlx module and trains."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

AGENT_FILES = sorted((ROOT / "rlx" / "agents").glob("[!_]*.py"))
ALLOWED = {"jax", "flax", "optax", "distrax", "chex", "numpy", "__future__", "dataclasses", "typing", "functools",
           "argparse", "time", "math", "os"}


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda p: p.name)
def test_agent_imports_only_allowed_modules(path):
    imported = set(re.findall(r"^\s*(?:from|import)\s+([\w]+)", path.read_text(), flags=re.M))
    # gymnax appears only inside the file's own command-line demo, as the environment to train on.
    assert imported - ALLOWED - {"gymnax"} == set(), imported - ALLOWED


def test_ppo_file_trains_alone(tmp_path):
    shutil.copy(ROOT / "rlx" / "agents" / "ppo.py", tmp_path / "ppo.py")
    done = subprocess.run(
        [sys.executable, "ppo.py", "--timesteps", "40960"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    final = float(re.search(r"final train return\s+([\d.]+)", done.stdout).group(1))
    assert final > 150, done.stdout  # a random policy averages about 22
