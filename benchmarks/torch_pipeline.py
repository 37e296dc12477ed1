"""The PyTorch input pipeline against MXNet's: `test_io=true` with backend=torch and backend=gluon on one file.

One generated RecordIO file (1,080 training JPEGs stored with their shorter side at 256 px),
read into batches of 64 with random-resized crops (area 0.08-1, aspect 3/4-4/3), random
mirroring and mean/std normalisation, by the same number of decode workers (MXNet's
ImageRecordIter threads; the DataLoader's worker processes), at each crop size; measured
side by side, interleaved. Target: torch / gluon >= 0.9 at every size.

    .venv/bin/python benchmarks/torch_pipeline.py [--sizes 64 224] [--threads 2] [--reps 3]

On a GPU machine, `--gpu` measures the torch backend's CPU path against its GPU path
(dataset.decode=gpu: nvJPEG decode and augmentation on the GPU), one epoch of the input
pipeline alone each (warm-up batches excluded), through xp's plan, TorchBackend and
xp.run.diagnose.measure: it needs neither MXNet nor MLflow (torch, torchvision, OpenCV,
hydra-core, omegaconf):

    python benchmarks/torch_pipeline.py --gpu [--images 4000] [--sizes 224] [--threads 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, compose, interleave, report, temp_store

sys.path.insert(0, str(ROOT))  # xp and its plugins from this checkout, also where xp is not installed

STORED = 256


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1080, help="training images in the generated file")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 224], help="crop sizes (height = width)")
    ap.add_argument("--threads", type=int, default=2, help="decode workers (data_nthreads)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measurement; the median counts")
    ap.add_argument("--gpu", action="store_true", help="torch's CPU path against its GPU path (needs CUDA)")
    args = ap.parse_args()
    temp_store()

    from images import make_folder
    from xp.data.datasets import list_folder
    from xp.data.recordio import prepare

    work = Path(tempfile.mkdtemp(prefix="xp-bench-torch-io-"))
    per_class = -(-args.images * 10 // 9) // 3  # a tenth goes to the validation part
    t0 = time.perf_counter()
    folder = make_folder(work / "images", per_class=per_class, size=(STORED * 5 // 4, STORED * 5 // 3),
                         with_photos=False)
    done = prepare(list_folder(str(folder), val_fraction=0.1), work / "rec", "bench", resize=STORED,
                   threads=args.threads)
    print(f"prepared {done.counts} images (shorter side {STORED} px) in {time.perf_counter() - t0:.1f}s: "
          f"{done.rec('train')}", flush=True)

    def config(backend: str, size: int, *extra: str) -> dict:
        return compose(f"backend={backend}", "dataset=rec", f"dataset.train_rec={done.rec('train')}",
                       f"dataset.val_rec={done.rec('val')}", f"dataset.num_classes={len(done.classes)}",
                       f"dataset.image_shape=[3,{size},{size}]", f"dataset.resize={STORED}", f"batch={args.batch}",
                       f"data_nthreads={args.threads}", "test_io=true", f"epochs={args.epochs}", *extra)

    def test_io(backend: str, size: int, *extra: str):
        from xp.run.experiment import run

        cfg = config(backend, size, *extra)
        return lambda: run(cfg).objective  # a test_io run's images/s: the median over its epochs

    def on_gpu(size: int, *extra: str):
        from dataclasses import replace

        import torch

        from plugins.torch_ddp import TorchBackend
        from xp.run.diagnose import measure
        from xp.run.plan import build_plan

        plan = build_plan(config("torch", size, "gpus=1", *extra), visible_gpus=torch.cuda.device_count())
        TorchBackend.check(plan)

        def one() -> float:
            rate, path = measure(replace(plan, epochs=1), TorchBackend)
            print(f"    {path}", flush=True)
            return rate
        return one

    ok = True
    for size in args.sizes:
        if args.gpu:
            candidates = {"torch cpu decode": on_gpu(size), "torch gpu decode": on_gpu(size, "dataset.decode=gpu")}
            pairs = [("torch gpu decode", "torch cpu decode", 1.0)]
        else:
            candidates = {"gluon (ImageRecordIter)": test_io("gluon", size),
                          "torch (DataLoader)": test_io("torch", size)}
            pairs = [("torch (DataLoader)", "gluon (ImageRecordIter)", 0.9)]
        results = interleave(candidates, args.reps)
        ok &= report(f"test_io, {done.counts['train']} JPEGs stored at {STORED} px -> 3x{size}x{size}, batch "
                     f"{args.batch}, {args.threads} decode workers", results, pairs,
                     f"torch_pipeline_{'gpu_' if args.gpu else ''}{size}.json")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
