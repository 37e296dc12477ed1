#!/usr/bin/env bash
# Everything xp measures on a GPU machine, in one command (one lease of the `device` tool):
#   1. the torch ResNet-50 bf16 benchmark (benchmarks/torch_resnet50.py) with nvidia-smi sampling
#      beside it, so xp's NVML utilization and memory can be set against nvidia-smi's own figures;
#   2. xp's GPM metrics (SM activity, occupancy, tensor activity) from the same run's epochs;
#   3. dataset.decode=gpu against the CPU decode workers (benchmarks/torch_pipeline.py --gpu);
#   3b. ResNet-50 again with torch.compile (backend.compile=$COMPILE, default true; a mode such as max-autotune);
#   4. studies on GPU slots: one trial per GPU, then two packed on each (sweep.trials_per_gpu=2), read back
#      from MLflow (benchmarks/gpu_study_readback.py); a trial asking for more GPUs than there are: one line.
# Needs torch, torchvision, OpenCV, nvidia-ml-py and hydra-core/omegaconf/antlr4, and for step 4 Optuna and
# MLflow with their dependencies (carried as wheels in .whl: see benchmarks/README.md). Writes its logs to
# $OUT (or benchmarks/results/gpu).
#
#   bash benchmarks/gpu_session.sh [--quick | --studies-only]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
# the backends and the models (steps 1 to 4) are found through xp's entry points: xp must be installed (on the
# device's Python 3.12 too)
python3 -c "import importlib.metadata as m; m.distribution('xp')" 2>/dev/null \
    || python3 -m pip install -q --no-deps --no-index --no-build-isolation --ignore-requires-python -e . 2>&1 | tail -2
STEPS=${STEPS:-60}
[[ ${1:-} == --quick ]] && STEPS=20
if [[ ${1:-} != --studies-only ]]; then

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/smi_info.csv"

echo "== 1+2. ResNet-50 bf16, batch 256, channels-last; nvidia-smi sampled every 200 ms beside xp's NVML sampler"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv,noheader,nounits -lms 200 \
    > "$OUT/smi_during_resnet50.csv" &
smi=$!
rm -f "$OUT/torch_resnet50.json"
python3 benchmarks/torch_resnet50.py --steps "$STEPS" --epochs 3 --out "$OUT/torch_resnet50.json" 2>&1 \
    | tee "$OUT/torch_resnet50.log"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
if [[ ! -s "$OUT/torch_resnet50.json" ]]; then  # the rest would fail the same way: the lease is not spent on it
    echo "gpu_session: step 1 gave no result (see $OUT/torch_resnet50.log above); stopping here"
    exit 1
fi
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

echo "== 3b. ResNet-50 bf16, batch 256, channels-last, torch.compile (backend.compile=${COMPILE:=true})"
start=$SECONDS
timeout 300 python3 benchmarks/torch_resnet50.py --steps "$STEPS" --epochs 3 --compile "$COMPILE" \
    --out "$OUT/torch_resnet50_compiled.json" > "$OUT/torch_resnet50_compiled.log" 2>&1
grep -v "^ *\(File\|warn\)" "$OUT/torch_resnet50_compiled.log" | tail -9
echo "(compiled run, compilation included: $((SECONDS - start)) s)"
fi

echo "== 4. studies on GPU slots (LeNet on digits, backend=torch, gpus=1 per trial)"
gs=$(mktemp -d)
export MLFLOW_TRACKING_URI=sqlite:///$gs/mlflow.db XP_OPTUNA_STORAGE=sqlite:///$gs/optuna.db
nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader -lms 250 > "$OUT/smi_study_apps.csv" &
smi=$!
for args in "sweep.study_name=gpu_one sweep.n_trials=4" "sweep.study_name=gpu_packed sweep.trials_per_gpu=2 sweep.n_trials=8"; do
    echo "-- python -m xp -m sweep=lr_batch backend=torch gpus=1 epochs=3 $args"
    log="$OUT/study_$(echo "$args" | cut -d' ' -f1 | cut -d= -f2).log"
    timeout 240 python3 -m xp -m sweep=lr_batch backend=torch gpus=1 epochs=3 $args hydra.sweep.dir="$gs/multirun" \
        > "$log" 2>&1
    echo "exit status $?"
    grep -E "study|trial|slot" "$log" | tail -14
done
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
ngpu=$(nvidia-smi -L | wc -l)
echo "-- gpus=$((ngpu + 1)) per trial on $ngpu GPU(s): one line, exit 2"
timeout 120 python3 -m xp -m sweep=lr_batch backend=torch gpus=$((ngpu + 1)) sweep.n_trials=1 \
    hydra.sweep.dir="$gs/multirun" 2>&1 | tail -3
echo "exit status ${PIPESTATUS[0]}"
timeout 120 python3 benchmarks/gpu_study_readback.py "$OUT/smi_study_apps.csv" gpu_one gpu_packed
rm -rf "$gs"
echo "gpu_session done"
