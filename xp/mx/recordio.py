"""Image folder -> RecordIO (.lst, .rec, .idx): xp's im2rec, written on mxnet.recordio.

Idempotent: a manifest beside the files records a fingerprint of the inputs
(every image's path, size and mtime, and the options); when it matches, the
existing files are reused. Files are written under temporary names and
renamed when complete, the manifest last, so an interrupted preparation is
redone, never half-reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from xp.datasets import FolderListing
from xp.errors import XPError

MANIFEST_VERSION = 1


class DataError(XPError):
    """The data on disk is unusable: names the file and the problem."""

    exit_code = 2


@dataclass(frozen=True)
class Prepared:
    prefix: Path  # <prefix>_train.rec, <prefix>_val.rec, ...
    classes: tuple[str, ...]
    counts: dict[str, int]
    reused: bool

    def rec(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.rec")

    def idx(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.idx")

    def lst(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.lst")


def fingerprint(listing: FolderListing, resize: int, quality: int) -> str:
    h = hashlib.sha256(json.dumps({"v": MANIFEST_VERSION, "resize": resize, "quality": quality,
                                   "classes": listing.classes}).encode())
    for part, items in (("train", listing.train), ("val", listing.val)):
        for rel, label in items:
            st = os.stat(os.path.join(listing.root, rel))
            h.update(f"{part}\t{rel}\t{label}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def encode(path: str, resize: int, quality: int) -> bytes:
    """Decode an image, resize its shorter side to `resize` (0 = keep), re-encode as JPEG."""
    import cv2
    import numpy as np

    data = np.fromfile(path, dtype=np.uint8)
    img = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if img is None:
        raise DataError(f"{path}: not a readable JPEG/PNG image")
    if resize:
        h, w = img.shape[:2]
        scale = resize / min(h, w)
        if scale != 1:
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            img = cv2.resize(img, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise DataError(f"{path}: could not encode as JPEG")
    return buf.tobytes()


def _write_part(listing: FolderListing, items, prefix: Path, part: str, resize: int, quality: int,
                threads: int) -> None:
    import mxnet as mx

    rec, idx, lst = (Path(f"{prefix}_{part}{ext}") for ext in (".rec", ".idx", ".lst"))
    tmp = {p: p.with_name(p.name + ".tmp") for p in (rec, idx, lst)}
    with open(tmp[lst], "w") as f:
        for i, (rel, label) in enumerate(items):
            f.write(f"{i}\t{label}\t{rel}\n")
    writer = mx.recordio.MXIndexedRecordIO(str(tmp[idx]), str(tmp[rec]), "w")
    try:
        paths = [os.path.join(listing.root, rel) for rel, _ in items]
        # cv2 releases the GIL while decoding and encoding: threads run in parallel.
        # map() keeps the input order, so record i is image i of the .lst.
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for i, ((_, label), jpeg) in enumerate(zip(items, pool.map(lambda p: encode(p, resize, quality), paths))):
                writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), i, 0), jpeg))
    finally:
        writer.close()
    for final, t in tmp.items():
        os.replace(t, final)


def prepare(listing: FolderListing, out_dir: str | Path, name: str, *, resize: int = 0, quality: int = 95,
            threads: int = 4) -> Prepared:
    """Write <out_dir>/<name>_{train,val}.{lst,rec,idx}, or reuse them if the inputs did not change."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / name
    manifest = out / f"{name}.json"
    fp = fingerprint(listing, resize, quality)
    counts = {"train": len(listing.train), "val": len(listing.val)}
    result = Prepared(prefix, listing.classes, counts, reused=True)
    try:
        old = json.loads(manifest.read_text())
    except (OSError, ValueError):
        old = {}
    files = [p for part in counts for p in (result.rec(part), result.idx(part), result.lst(part))]
    if old.get("fingerprint") == fp and all(p.exists() for p in files):
        return result
    manifest.unlink(missing_ok=True)
    for part, items in (("train", listing.train), ("val", listing.val)):
        _write_part(listing, items, prefix, part, resize, quality, threads)
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps({"fingerprint": fp, "root": str(listing.root), "classes": list(listing.classes),
                               "counts": counts, "resize": resize, "quality": quality}, indent=1))
    os.replace(tmp, manifest)
    return Prepared(prefix, listing.classes, counts, reused=False)


def check_records(rec: str | Path, idx: str | Path, num_classes: int, limit: int | None = None,
                  min_size: tuple[int, int] | None = None) -> int:
    """Read records back: each must unpack, decode and carry a label < num_classes, and with
    min_size (height, width) be at least that large.

    Returns the number of records checked. Raises DataError naming the file, record and problem.
    """
    import mxnet as mx

    reader = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "r")
    try:
        keys = reader.keys if limit is None else reader.keys[:limit]
        for key in keys:
            try:
                header, img = mx.recordio.unpack_img(reader.read_idx(key))
            except Exception as e:
                raise DataError(f"{rec}: record {key} is corrupt ({type(e).__name__})") from e
            if img is None or getattr(img, "size", 0) == 0:
                raise DataError(f"{rec}: record {key} holds no decodable image")
            if min_size and (img.shape[0] < min_size[0] or img.shape[1] < min_size[1]):
                raise DataError(f"dataset.image_shape asks for {min_size[0]}x{min_size[1]} but record {key} of {rec} "
                                f"is {img.shape[0]}x{img.shape[1]} and nothing resizes it; set dataset.resize "
                                "or dataset.random_resized_crop=true, or a smaller dataset.image_shape")
            label = int(header.label if not hasattr(header.label, "__len__") else header.label[0])
            if not 0 <= label < num_classes:
                raise DataError(f"{rec}: record {key} has label {label}, outside 0..{num_classes - 1}")
        return len(keys)
    finally:
        reader.close()
