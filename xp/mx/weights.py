"""python -m xp.weights: put downloaded weights into MXNet's model cache, list what is there.

    python -m xp.weights add resnet50_v1-cc729d95.params           # a GluonCV zoo file
    python -m xp.weights add ~/dl/resnet-152 --name imagenet11k-resnet-152 --epoch 0   # a checkpoint prefix
    python -m xp.weights list
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

from xp.mx.pretrained import cache_dir


def _sha1(path: Path) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def add(source: str, name: str | None, epoch: int) -> list[Path]:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    src = Path(source).expanduser()
    if src.is_file() and src.suffix == ".params" and not re.search(r"-\d{4}\.params$", src.name):
        base = name or re.sub(r"-[0-9a-f]{8}$", "", src.stem)
        dest = cache / f"{base}-{_sha1(src)[:8]}.params"
        shutil.copyfile(src, dest)
        return [dest]
    prefix = re.sub(r"(-symbol\.json|-\d{4}\.params)$", "", str(src))
    files = [Path(f"{prefix}-symbol.json"), Path(f"{prefix}-{epoch:04d}.params")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"xp.weights: error: {', '.join(missing)}: no such file (a checkpoint is "
                         f"PREFIX-symbol.json + PREFIX-{epoch:04d}.params; a zoo file is NAME-HASH.params)")
    base = name or Path(prefix).name
    dests = [cache / f"{base}-symbol.json", cache / f"{base}-{epoch:04d}.params"]
    for f, d in zip(files, dests):
        shutil.copyfile(f, d)
    return dests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xp.weights", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="copy a .params file or a checkpoint prefix into the cache")
    a.add_argument("source")
    a.add_argument("--name", help="name to use with pretrained=NAME (default: from the file name)")
    a.add_argument("--epoch", type=int, default=0, help="checkpoint epoch (PREFIX-EPOCH.params)")
    sub.add_parser("list", help="list the cache")
    args = p.parse_args(argv)
    if args.cmd == "add":
        for d in add(args.source, args.name, args.epoch):
            print(d)
        return 0
    for f in sorted(cache_dir().glob("*")) if cache_dir().is_dir() else []:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
