"""python -m xp.prepare IMAGE_FOLDER OUT_DIR: turn an image folder into RecordIO files.

IMAGE_FOLDER holds one sub-folder per class with JPEG/PNG images. Writes
OUT_DIR/NAME_{train,val}.{lst,rec,idx} (the split is stratified and fixed by
--split-seed), reusing existing files when neither the images nor the options
changed. Prints the xp command line that trains on the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from xp.errors import XPError, one_line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m xp.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="image folder, one sub-folder per class")
    p.add_argument("out_dir", help="where the .lst/.rec/.idx files go")
    p.add_argument("--name", default=None, help="file name prefix (default: the folder's name)")
    p.add_argument("--resize", type=int, default=0, help="resize the shorter side to this many pixels (0: keep)")
    p.add_argument("--val-fraction", type=float, default=0.2, help="share of each class held out for validation")
    p.add_argument("--train-per-class", type=int, default=None,
                   help="images of each class for training, the rest for validation (overrides --val-fraction)")
    p.add_argument("--exclude", nargs="*", default=[], help="class sub-folders to leave out")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the train/val split")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="encoding threads")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality of the stored images")
    p.add_argument("--strict", action="store_true",
                   help="fail on an unreadable image (default: leave it out, list it in NAME_skipped.txt, warn)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from xp.data.datasets import list_folder

        for key, value, ok in (("--resize", args.resize, args.resize >= 0), ("--threads", args.threads, args.threads >= 1),
                               ("--quality", args.quality, 1 <= args.quality <= 100),
                               ("--val-fraction", args.val_fraction, 0 < args.val_fraction < 1)):
            if not ok:
                raise XPError(f"{key}={value}: out of range")
        listing = list_folder(os.path.abspath(args.folder), val_fraction=args.val_fraction,
                              train_per_class=args.train_per_class, exclude=tuple(args.exclude), seed=args.split_seed,
                              key="IMAGE_FOLDER")
        from xp.data.recordio import prepare

        t0 = time.perf_counter()
        name = args.name or os.path.basename(os.path.abspath(args.folder).rstrip(os.sep))
        done = prepare(listing, args.out_dir, name, resize=args.resize, quality=args.quality, threads=args.threads,
                       strict=args.strict)
    except XPError as e:
        print(f"xp.prepare: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xp.prepare: interrupted; nothing half-written is reused", file=sys.stderr)
        return 130
    verb = "reused" if done.reused else f"wrote in {time.perf_counter() - t0:.1f}s"
    print(f"{len(done.classes)} classes, {done.counts['train']} train / {done.counts['val']} val images: {verb}")
    if done.warning():
        print(f"xp.prepare: warning: {done.warning()}", file=sys.stderr)
    for part in ("train", "val"):
        print(f"  {done.rec(part)}  {done.idx(part)}  {done.lst(part)}")
    print(f"train on it: python -m xp dataset=rec dataset.train_rec={done.rec('train')} "
          f"dataset.val_rec={done.rec('val')} dataset.num_classes={len(done.classes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
