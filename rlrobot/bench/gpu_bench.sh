#!/usr/bin/env bash
# One device call (about 8-10 minutes on an H100/H200): GPU env steps/s of raw physics, VecEnv and a real PPO
# training run at 1k-8k envs, MuJoCo Warp and ManiSkill3, JSON files under $OUT.
#   from the repository root: bash rlrobot/bench/gpu_bench.sh   (device tool: run(command=..., timeout_s=600))
set -euo pipefail
OUT=${OUT:-/tmp/gpu_bench}; mkdir -p "$OUT"
python3 -m venv /tmp/gv && . /tmp/gv/bin/activate
pip install -q torch==2.13.0                       # PyPI's Linux wheel is the CUDA build
pip install -q -e '.[warp,maniskill]'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
# MuJoCo Warp: (a) native CPU mj_step, (b) Warp raw step, (c) VecEnv on Warp, (d) PPO training run on Warp
timeout 300 rlrobot bench --backend mjwarp --device cuda --task so101-reach --num-envs 1024 4096 8192 \
  --seconds 5 --ppo-iterations 3 --ppo-steps 16 --json-out "$OUT/mjwarp.json" 2>&1 | tee "$OUT/mjwarp.log" || true
# ManiSkill3 (GPU sim; needs a Vulkan driver on the machine): its vector env vs our adapter vs a PPO run
timeout 200 rlrobot bench --backend maniskill --device cuda --num-envs 1024 4096 \
  --seconds 5 --ppo-iterations 3 --ppo-steps 16 --json-out "$OUT/maniskill.json" 2>&1 | tee "$OUT/maniskill.log" || true
