#!/bin/bash
# The accelerator checks of issues 4 and 7 in one command, for a GPU machine whose Python has JAX with
# CUDA but maybe none of rlx's other packages and no package index. Each step has a deadline, so the
# command ends on time; the runs' logs and metrics are re-packed into OUT/runs.tgz every 30 s.
#   1. scripts/bench_marl.py alone: MAPPO training vs raw stepping and vs JaxMARL's MAPPO (the baseline
#      is read from .bench/JaxMARL, a JaxMARL checkout kept outside git).
#   2. The GPU presets side by side: pref_ppo_brax_hopper, its true-reward reference ppo_brax_hopper,
#      and mappo_smax_3m.
#
# Usage: bash scripts/gpu_checks.sh OUT [SITE] [tiny]
#   OUT   a folder for the results (bench_marl.txt, runs.tgz, env.txt, gpu_util.txt)
#   SITE  a folder put first on PYTHONPATH with the packages the machine lacks, e.g. made there from
#         wheels carried along: pip install --no-index --no-deps --target SITE wheels/*.whl. On an
#         image with JAX 0.11 (CUDA 13), flax, optax, chex, orbax, numpy, scipy, matplotlib, seaborn and
#         rich, the missing ones were: brax mujoco mujoco-core mujoco-studio mujoco-mjx trimesh glfw
#         jaxmarl jaxopt gymnax gymnasium farama-notifications distrax tfp-nightly dm-tree decorator
#         hydra-core omegaconf antlr4-python3-runtime (at pyproject.toml's versions; 40 MB of wheels).
#   tiny  smoke sizes, to rehearse the command on a CPU
# T_BENCH and T_TRAIN (seconds) set the deadlines; PY the interpreter.
OUT=$1; SITE=${2:-}; TINY=${3:-}
PY=${PY:-python3}
export PYTHONPATH=${SITE:+$SITE:}$PWD:$PWD/scripts PYTHONUNBUFFERED=1
start=$(date +%s)
mkdir -p "$OUT"
nvidia-smi -L 2>/dev/null | tee "$OUT/env.txt"
$PY -c "import jax, flax, brax, jaxmarl, gymnax, distrax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__)" \
  2>&1 | tail -3 | tee -a "$OUT/env.txt"
if [ -n "$TINY" ]; then
  BENCH="--quick"; T_BENCH=${T_BENCH:-300}; T_TRAIN=${T_TRAIN:-400}
  PPO_SMALL="algo.num_envs=8 algo.num_steps=32 algo.num_minibatches=4 algo.total_timesteps=512 run.num_seeds=1 run.eval_episodes=2 env.params.max_steps_in_episode=64"
  PREF="$PPO_SMALL algo.pool_segments=16 algo.num_candidates=16 algo.queries_per_feedback=8 algo.budget=16 algo.reward_batch_size=8 algo.eval_pairs=8"
  SMAX="algo.total_timesteps=1024 algo.num_envs=8 algo.num_steps=64 algo.num_minibatches=2 run.num_seeds=1 run.eval_episodes=2"
else
  BENCH="--repeats 3"; T_BENCH=${T_BENCH:-180}; T_TRAIN=${T_TRAIN:-360}
  PPO_SMALL=""; PREF=""; SMAX="run.chunk_updates=26 run.eval_every_chunks=2"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout -k 15 "$T_BENCH" $PY scripts/bench_marl.py $BENCH --jaxmarl-repo .bench/JaxMARL > "$OUT/bench_marl.txt" 2>&1
  echo "bench rc=$? at $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
fi
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.25   # three programs share the GPU
RUNS=$(mktemp -d)/runs && mkdir -p "$RUNS"
snapshot() { tar czf "$OUT/.runs.tgz" --exclude=checkpoints -C "$(dirname "$RUNS")" runs 2>/dev/null && mv "$OUT/.runs.tgz" "$OUT/runs.tgz"; }
train() {  # NAME PRESET OVERRIDES...; timeout -k: a run still compiling ignores the first signal
  local name=$1 preset=$2; shift 2
  timeout -k 15 "$T_TRAIN" $PY -m rlx.train +exp="$preset" "$@" hydra.run.dir="$RUNS/$name" > "$RUNS/$name.log" 2>&1
}
train pref_hopper pref_ppo_brax_hopper $PREF &
train ppo_hopper ppo_brax_hopper $PPO_SMALL &
train smax mappo_smax_3m $SMAX &
( while sleep 30; do snapshot; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$OUT/gpu_util.txt" 2>/dev/null; done ) &
SNAPSHOTS=$!
wait %1 %2 %3
kill $SNAPSHOTS 2>/dev/null
echo "trainings done at $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
snapshot
for name in pref_hopper ppo_hopper smax; do echo "== $name"; tail -c 1200 "$RUNS/$name.log"; done
grep "^|" "$OUT/bench_marl.txt" 2>/dev/null | tail -4
