"""Where a dataset.decode=gpu batch's time goes, on a GPU machine: nvJPEG's decode of the batch (one call, in
chunks from several threads, one image a call), the per-sample draws (geometry, on the CPU), and the batched
crop/resize/mirror/normalise (xp.pt.gpu_decode.crop_resize), each timed alone over the same batches, in
microseconds an image. Needs torch, torchvision, OpenCV, hydra-core and omegaconf (no MXNet, no MLflow).

    python benchmarks/gpu_decode_parts.py [--images 1024] [--batch 64] [--size 224]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import ROOT, compose

sys.path.insert(0, str(ROOT))
STORED = 256


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    import torch

    from images import make_folder
    from xp.data.datasets import list_folder
    from xp.data.recordio import prepare
    from xp.pt.data import EncodedRecords
    from xp.pt.gpu_decode import GpuDecoder, crop_resize
    from xp.run.plan import build_plan

    work = Path(tempfile.mkdtemp(prefix="xp-bench-gpu-decode-"))
    folder = make_folder(work / "images", per_class=-(-args.images * 10 // 9) // 3,
                         size=(STORED * 5 // 4, STORED * 5 // 3), with_photos=False)
    done = prepare(list_folder(str(folder), val_fraction=0.1), work / "rec", "bench", resize=STORED, threads=8)
    plan = build_plan(compose("backend=torch", "dataset=rec", f"dataset.train_rec={done.rec('train')}",
                              f"dataset.val_rec={done.rec('val')}", f"dataset.num_classes={len(done.classes)}",
                              f"dataset.image_shape=[3,{args.size},{args.size}]", f"dataset.resize={STORED}",
                              f"batch={args.batch}", "gpus=1"), visible_gpus=1)
    d = plan.dataset
    images = EncodedRecords(str(done.rec("train")), d.options, d.image_shape, True, plan.seed)
    decoder = GpuDecoder(images, "cuda")
    n = len(images) // args.batch * args.batch
    batches = [images[[(i, 1) for i in range(b, b + args.batch)]] for b in range(0, n, args.batch)]
    parts = [list(torch.split(blob, sizes.tolist())) for blob, sizes, *_ in batches]
    numbers = [nums.tolist() for _, _, _, nums, _ in batches]
    pool = ThreadPoolExecutor(8)

    def timed(name: str, fn) -> None:
        fn(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(len(batches)):
            fn(b)
        torch.cuda.synchronize()
        print(f"  {name:44} {(time.perf_counter() - t0) / n * 1e6:8.1f} us an image", flush=True)

    def chunked(b: int, k: int) -> list:
        step = -(-args.batch // k)
        chunks = [parts[b][i:i + step] for i in range(0, args.batch, step)]
        return [img for out in pool.map(lambda c: decoder.decode(c, []), chunks) for img in out]

    decoded = [decoder.decode(p, nums) for p, nums in zip(parts, numbers)]
    draws = [[images.geometry(tuple(img.shape[1:]), i, 1) for img, i in zip(dec, nums)]
             for dec, nums in zip(decoded, numbers)]
    print(f"{n} JPEGs stored at {STORED} px -> {args.size}, batch {args.batch}, {torch.cuda.get_device_name(0)}")
    timed("whole batch (GpuDecoder.__call__)", lambda b: decoder(batches[b][0], batches[b][1], batches[b][3], 1))
    timed("decode: the batch in one call", lambda b: decoder.decode(parts[b], numbers[b]))
    for k in (2, 4, 8):
        timed(f"decode: {k} chunks from {k} threads", lambda b, k=k: chunked(b, k))
    timed("decode: one image a call", lambda b: [decoder.decode([p], [0]) for p in parts[b]])
    timed("draws (geometry, CPU)", lambda b: [images.geometry(tuple(img.shape[1:]), i, 1)
                                             for img, i in zip(decoded[b], numbers[b])])
    timed("crop_resize (batched)", lambda b: crop_resize(decoded[b], [g.box for g in draws[b]],
                                                         [g.mirror for g in draws[b]], (args.size, args.size)))
    timed("read the records (CPU, one worker's part)", lambda b: images[[(i, 1) for i in range(b, b + args.batch)]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
