#!/usr/bin/env bash
# Everything xp measures on a GPU machine, in one command (one lease of the `device` tool):
#   1. the torch ResNet-50 bf16 benchmark (benchmarks/torch_resnet50.py) with nvidia-smi sampling
#      beside it, so xp's NVML utilization and memory can be set against nvidia-smi's own figures;
#   2. xp's GPM metrics (SM activity, occupancy, tensor activity) from the same run's epochs;
#   3. dataset.decode=gpu against the CPU decode workers (benchmarks/torch_pipeline.py --gpu).
# Needs torch, torchvision, OpenCV, nvidia-ml-py and hydra-core/omegaconf/antlr4 (carried as wheels in
# .whl: see benchmarks/README.md). Writes its logs to $OUT (or benchmarks/results/gpu).
#
#   bash benchmarks/gpu_session.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
STEPS=${STEPS:-60}
[[ ${1:-} == --quick ]] && STEPS=20

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/smi_info.csv"

echo "== 1+2. ResNet-50 bf16, batch 256, channels-last; nvidia-smi sampled every 200 ms beside xp's NVML sampler"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv,noheader,nounits -lms 200 \
    > "$OUT/smi_during_resnet50.csv" &
smi=$!
python3 benchmarks/torch_resnet50.py --steps "$STEPS" --epochs 3 --out "$OUT/torch_resnet50.json" 2>&1 \
    | tee "$OUT/torch_resnet50.log"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
python3 - "$OUT" <<'EOF'
import csv, json, statistics, sys
out = sys.argv[1]
res = json.load(open(f"{out}/torch_resnet50.json"))
rows = [r for r in csv.reader(open(f"{out}/smi_during_resnet50.csv")) if len(r) >= 4]
util = [float(r[1]) for r in rows]
busy = [u for u in util if u > 0]  # training part: nvidia-smi also ran before and after the model was on the GPU
mem = [float(r[2]) for r in rows]
print(f"nvidia-smi: {len(rows)} samples; utilization median while busy {statistics.median(busy) if busy else 0:.1f}%, "
      f"memory max {max(mem):.0f} MiB")
for i, e in enumerate(res["epochs"], 1):
    keys = {k: round(v, 1) for k, v in e.items() if k.startswith("gpu_")}
    print(f"xp epoch {i}: {keys}")
EOF

echo "== 3. dataset.decode=gpu against the CPU decode workers (224 px, 8 workers)"
python3 benchmarks/torch_pipeline.py --gpu --images 4000 --sizes 224 --threads 8 --reps 3 --epochs 1 2>&1 \
    | tee "$OUT/torch_pipeline_gpu.log"
cp benchmarks/results/torch_pipeline_gpu_224.json "$OUT/" 2>/dev/null || true
echo "gpu_session done"
