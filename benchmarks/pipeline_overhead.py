"""Input-pipeline overhead: xp's test_io images/s against a bare mx.io.ImageRecordIter loop.

Same .rec file, decode threads, augmentation, batch and number of batches;
measured side by side, interleaved. Target: xp / bare >= 0.98.

    .venv/bin/python benchmarks/pipeline_overhead.py [--images 3000] [--threads 2] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import compose, interleave, report, temp_store

SHAPE = (3, 128, 128)
MEAN, STD = [123.68, 116.28, 103.53], [58.395, 57.12, 57.375]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4500, help="images in the generated folder")
    ap.add_argument("--threads", type=int, default=2, help="decode threads (data_nthreads)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measurement; the median counts")
    args = ap.parse_args()
    temp_store()

    import mxnet as mx

    from images import make_folder
    from xp.data.datasets import list_folder
    from xp.run.experiment import run
    from xp.data.recordio import prepare

    work = Path(tempfile.mkdtemp(prefix="xp-bench-io-"))
    per_class = args.images // 3
    t0 = time.perf_counter()
    folder = make_folder(work / "images", per_class=per_class, size=(240, 320), with_photos=False)
    done = prepare(list_folder(str(folder), val_fraction=0.1), work / "rec", "bench", resize=160, threads=args.threads)
    print(f"prepared {done.counts} images in {time.perf_counter() - t0:.1f}s: {done.rec('train')}")
    steps = done.counts["train"] // args.batch
    warmup = 2

    def bare() -> float:
        """What a user writes by hand: the iterator, a loop, a wait per batch; median of the epochs."""
        it = mx.io.ImageRecordIter(
            path_imgrec=str(done.rec("train")), path_imgidx=str(done.idx("train")), data_shape=SHAPE,
            batch_size=args.batch, preprocess_threads=args.threads, shuffle=True, round_batch=True, seed=0,
            random_resized_crop=True, min_random_area=0.25, max_random_area=1.0, min_aspect_ratio=3 / 4,
            max_aspect_ratio=4 / 3, resize=-1, rand_mirror=True, label_width=1,
            mean_r=MEAN[0], mean_g=MEAN[1], mean_b=MEAN[2], std_r=STD[0], std_g=STD[1], std_b=STD[2])
        rates = []
        for epoch in range(args.epochs):
            if epoch:
                it.reset()
            n, start = 0, None
            for i, batch in enumerate(it):
                if i == steps:
                    break
                batch.data[0].wait_to_read()
                if i == warmup - 1:
                    start = time.perf_counter()
                elif i >= warmup:
                    n += batch.data[0].shape[0]
            rates.append(n / (time.perf_counter() - start))
        return statistics.median(rates)

    config = compose("dataset=rec", f"dataset.train_rec={done.rec('train')}", f"dataset.val_rec={done.rec('val')}",
                     f"dataset.num_classes={len(done.classes)}", f"dataset.image_shape={list(SHAPE)}",
                     "dataset.resize=0", "dataset.min_random_area=0.25", f"batch={args.batch}",
                     f"data_nthreads={args.threads}", "test_io=true", f"epochs={args.epochs}", f"timing_warmup_batches={warmup}")

    def xp_test_io() -> float:
        return run(config).objective  # a test_io run: its io_throughput, the median over its epochs

    results = interleave({"bare ImageRecordIter": bare, "xp test_io": xp_test_io}, args.reps)
    ok = report(f"Input pipeline, {done.counts['train']} JPEGs -> {SHAPE}, batch {args.batch}, "
                f"{args.threads} decode threads", results, [("xp test_io", "bare ImageRecordIter", 0.98)],
                "pipeline_overhead.json")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
