"""backend=torch on one GPU: ResNet-50, synthetic data, bf16 autocast, channels-last (issue 10's GPU figure).

Runs xp's own training path (plan -> TorchBackend -> fit) with xp's ThroughputMeter and NVML
GPUSampler, so the samples/s and GPU utilization are the figures a run logs. Needs only torch,
torchvision, numpy, hydra-core/omegaconf and nvidia-ml-py: no mxnet, no MLflow (the device
machine of the `device` tool has torch; the rest travels as wheels, see benchmarks/README.md).

    python benchmarks/torch_resnet50.py [--batch 256] [--dtype bfloat16] [--steps 50] [--epochs 3] [--compile]

Prints per-epoch figures and a summary: samples/s (median of the epochs after the first), the gap to
2,500 images/s (NVIDIA's published PyTorch ResNet-50 AMP figure on an A100 is about 2,470), and the
arithmetic rate it implies (about 24.5 GFLOP per training image: 3 x 8.2 GFLOP forward at 224x224)
against the chip's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GFLOP_PER_IMAGE = 24.5  # forward (8.2 GFLOP at 224x224, multiply-adds counted as 2) + backward (2x forward)
TARGET = 2500.0
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peak (SXM), spec sheets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--steps", type=int, default=50, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10, help="batches per epoch not timed")
    ap.add_argument("--compile", nargs="?", const="true", default="false",
                    help="torch.compile the model (optionally a mode: max-autotune, reduce-overhead...)")
    ap.add_argument("--no-channels-last", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "torch_resnet50.json"))
    args = ap.parse_args()

    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from plugins.torch_ddp import TorchBackend
    from xp.run.callbacks import ThroughputMeter
    from xp.run.plan import build_plan
    from xp.run.telemetry import GPUSampler, nvml_indices
    from xp.run.train import fit

    gpus = torch.cuda.device_count()
    overrides = ["backend=torch", f"model={args.model}", "dataset=synthetic", "dataset.num_classes=1000",
                 f"dataset.image_shape=[3,{args.image},{args.image}]", f"dataset.train_size={args.steps * args.batch}",
                 f"dataset.val_size={args.batch}", f"batch={args.batch}", f"gpus={1 if gpus else 0}",
                 f"dtype={args.dtype}", f"epochs={args.epochs}", "lr_schedule=constant", "lr=0.1", "lr_ref_batch=256",
                 f"timing_warmup_batches={args.warmup}", f"backend.compile={args.compile}",
                 f"backend.channels_last={str(not args.no_channels_last).lower()}"]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3", job_name="bench"):
        cfg = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    plan = build_plan(cfg, visible_gpus=gpus)
    TorchBackend.check(plan)
    backend = TorchBackend()
    meter = ThroughputMeter(plan.timing_warmup_batches, "throughput")
    sampler = GPUSampler(nvml_indices(len(plan.devices)), 0.5) if gpus else None
    name = torch.cuda.get_device_name(0) if gpus else "CPU"
    print(f"{args.model} batch {args.batch} {args.dtype} {args.image}x{args.image} on {name}; torch {torch.__version__}; "
          f"{args.steps} steps x {args.epochs} epochs, compile={args.compile}", flush=True)
    t0 = time.time()
    history = fit(plan, backend, [meter, *([sampler] if sampler else [])])
    for i, m in enumerate(history, 1):
        print(f"  epoch {i}: {m['throughput']:8.1f} samples/s  GPU util {m.get('gpu_utilization_pct', float('nan')):5.1f}%  "
              f"memory {m.get('gpu_memory_mb', float('nan')):8.0f} MB  loss {m['train_loss']:.3f}", flush=True)
    timed = history[1:] or history
    rate = statistics.median(m["throughput"] for m in timed)
    util = statistics.median(m.get("gpu_utilization_pct", float("nan")) for m in timed)
    tflops = rate * GFLOP_PER_IMAGE / 1000
    chip = next((k for k in PEAK_TFLOPS if k in name), None)
    print(f"\nsamples/s {rate:.1f} (median of epochs 2..{len(history)}), GPU utilization {util:.1f}%")
    print(f"target {TARGET:.0f} images/s per GPU: {'met' if rate >= TARGET else 'NOT met'} ({rate / TARGET:.2f}x)")
    print(f"arithmetic: {tflops:.1f} TFLOP/s at {GFLOP_PER_IMAGE} GFLOP per image"
          + (f" = {tflops / PEAK_TFLOPS[chip]:.1%} of the {chip}'s {PEAK_TFLOPS[chip]:.0f} TFLOP/s dense bf16 peak; "
             f"that peak would be {PEAK_TFLOPS[chip] * 1000 / GFLOP_PER_IMAGE:,.0f} images/s" if chip else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": name, "torch": torch.__version__, "args": vars(args), "samples_per_s": rate,
                               "gpu_utilization": util, "tflops": tflops, "epochs": history,
                               "seconds": time.time() - t0, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "cpus": os.cpu_count()}, indent=1))
    print(f"saved {out}")
    return 0 if rate >= TARGET or not gpus else 1


if __name__ == "__main__":
    sys.exit(main())
