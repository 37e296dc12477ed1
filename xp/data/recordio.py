"""RecordIO, MXNet's record file format, in plain Python; and image folder -> RecordIO (xp's im2rec).

The format (dmlc-core's recordio): every record is the magic number 0xced7230a, a 32-bit
word holding a continuation flag (top 3 bits) and the length (low 29 bits), the bytes,
and zero padding to 4 bytes. A record whose bytes contain the magic number at a 4-byte
boundary is written in parts (flags 1, 2, 3) with that word left out, and put back on
reading. An image record starts with MXNet's IRHeader (flag, label, id, id2: 'IfQQ').
The .idx file lists "key<TAB>byte offset" per record. MXNet's C++ ImageRecordIter reads
what this writes; PyTorch's DataLoader workers read it here, without MXNet.

Idempotent: a manifest beside the files records a fingerprint of the inputs
(every image's path, size and mtime, and the options); when it matches, the
existing files are reused. Files are written under temporary names and
renamed when complete, the manifest last, so an interrupted preparation is
redone, never half-reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from xp.data.datasets import FolderListing
from xp.errors import XPError

log = logging.getLogger("xp")

MANIFEST_VERSION = 1
MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_IR_FORMAT = "<IfQQ"  # MXNet's IRHeader: flag, label, id, id2
_IR_SIZE = struct.calcsize(_IR_FORMAT)


class DataError(XPError):
    """The data on disk is unusable: names the file and the problem."""

    exit_code = 2


@dataclass(frozen=True)
class Prepared:
    prefix: Path  # <prefix>_train.rec, <prefix>_val.rec, ...
    classes: tuple[str, ...]
    counts: dict[str, int]  # images written, per part
    reused: bool
    skipped: int = 0  # unreadable images left out, listed in skipped_list

    def rec(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.rec")

    def idx(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.idx")

    def lst(self, part: str) -> Path:
        return Path(f"{self.prefix}_{part}.lst")

    @property
    def skipped_list(self) -> Path:
        return Path(f"{self.prefix}_skipped.txt")

    def warning(self) -> str | None:
        """What a user must hear about the images left out, or None."""
        if not self.skipped:
            return None
        total = sum(self.counts.values()) + self.skipped
        return (f"{self.skipped} of {total} images could not be read and were left out (listed in "
                f"{self.skipped_list}); dataset.strict=true (xp.prepare --strict) fails on them instead")


def pack_image(label: float, key: int, image: bytes) -> bytes:
    """An image record: MXNet's IRHeader (one float label) and the encoded image."""
    return struct.pack(_IR_FORMAT, 0, float(label), key, 0) + image


def unpack_image(record: bytes) -> tuple[float, bytes]:
    """(label, encoded image) of an image record; a multi-value label gives its first value."""
    if len(record) < _IR_SIZE:
        raise ValueError(f"record of {len(record)} bytes is shorter than its header")
    flag, label, _, _ = struct.unpack_from(_IR_FORMAT, record)
    if flag > 0:  # a label array of `flag` float32 values precedes the image
        label = struct.unpack_from("<f", record, _IR_SIZE)[0]
        return label, record[_IR_SIZE + 4 * flag:]
    return label, record[_IR_SIZE:]


def _lrec(cflag: int, length: int) -> bytes:
    return _MAGIC_BYTES + struct.pack("<I", (cflag << 29) | length)


def encode_record(data: bytes) -> bytes:
    """One record as it lies in a .rec file (split where the data holds the magic number)."""
    out, start = [], 0
    for i in range(0, len(data) - len(data) % 4, 4):
        if data[i:i + 4] == _MAGIC_BYTES:
            out += [_lrec(1 if start == 0 else 2, i - start), data[start:i]]
            start = i + 4
    out += [_lrec(3 if start else 0, len(data) - start), data[start:], b"\0" * (-len(data) % 4)]
    return b"".join(out)


class RecordFile:
    """A .rec file with its .idx: read records by key (mode "r"), or append them (mode "w").

    Opened lazily in the process that reads, so a DataLoader worker gets its own file handle."""

    def __init__(self, idx: str | Path, rec: str | Path, mode: str = "r"):
        self.idx_path, self.rec_path, self.mode = str(idx), str(rec), mode
        self.offsets: dict[int, int] = {}
        self.keys: list[int] = []
        self._f: BinaryIO | None = None
        if mode == "r":
            with open(self.idx_path) as f:
                for n, line in enumerate(f, 1):
                    parts = line.split()
                    if not parts:
                        continue
                    try:
                        key, offset = int(parts[0]), int(parts[1])
                    except (ValueError, IndexError):
                        raise DataError(f"{self.idx_path}: line {n} is not 'key<TAB>offset'") from None
                    self.offsets[key] = offset
                    self.keys.append(key)
        elif mode == "w":
            self._f = open(self.rec_path, "wb")
            self._fidx = open(self.idx_path, "w")
        else:
            raise ValueError(f"mode {mode!r}: r or w")

    def write(self, key: int, record: bytes) -> None:
        if self._f is None or self.mode != "w":
            raise ValueError(f"{self.rec_path}: opened to read, not to write")
        self.offsets[key] = self._f.tell()
        self._fidx.write(f"{key}\t{self.offsets[key]}\n")
        self.keys.append(key)
        self._f.write(encode_record(record))

    def read(self, key: int) -> bytes:
        if self._f is None:
            self._f = open(self.rec_path, "rb")
        self._f.seek(self.offsets[key])
        parts = []
        while True:
            head = self._f.read(8)
            if len(head) < 8:
                raise ValueError(f"record {key} is cut short")
            magic, lrec = struct.unpack("<II", head)
            if magic != MAGIC:
                raise ValueError(f"record {key} does not start with RecordIO's magic number")
            cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
            data = self._f.read(length)
            if len(data) < length:
                raise ValueError(f"record {key} is cut short")
            self._f.seek(-length % 4, os.SEEK_CUR)
            parts.append(data)
            if cflag in (0, 3):
                return _MAGIC_BYTES.join(parts)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if self.mode == "w":
            self._fidx.close()

    def __getstate__(self) -> dict:  # pickled into DataLoader workers: without the open file
        return {**self.__dict__, "_f": None}


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


def _try_encode(path: str, resize: int, quality: int, strict: bool) -> bytes | str:
    """The image re-encoded, or (strict=False) why it could not be read."""
    try:
        return encode(path, resize, quality)
    except DataError as e:
        if strict:
            raise DataError(f"{e} (dataset.strict=true: an unreadable image fails the data set; "
                            "strict=false leaves it out and lists it)") from None
        return str(e).split(": ", 1)[-1]


def _write_part(listing: FolderListing, items, prefix: Path, part: str, resize: int, quality: int,
                threads: int, strict: bool) -> list[tuple[str, str]]:
    """Write one part's .rec/.idx/.lst; returns the images left out as unreadable: (path, why)."""
    rec, idx, lst = (Path(f"{prefix}_{part}{ext}") for ext in (".rec", ".idx", ".lst"))
    tmp = {p: p.with_name(p.name + ".tmp") for p in (rec, idx, lst)}
    writer = RecordFile(tmp[idx], tmp[rec], "w")
    kept: list[tuple[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    try:
        paths = [os.path.join(listing.root, rel) for rel, _ in items]
        # cv2 releases the GIL while decoding and encoding: threads run in parallel.
        # map() keeps the input order; records are numbered as written, so record i is line i of the .lst.
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for (rel, label), out in zip(items, pool.map(lambda p: _try_encode(p, resize, quality, strict), paths)):
                if isinstance(out, str):
                    skipped.append((os.path.join(listing.root, rel), out))
                    continue
                writer.write(len(kept), pack_image(label, len(kept), out))
                kept.append((rel, label))
    finally:
        writer.close()
    with open(tmp[lst], "w") as f:
        for i, (rel, label) in enumerate(kept):
            f.write(f"{i}\t{label}\t{rel}\n")
    for final, t in tmp.items():
        os.replace(t, final)
    return skipped


def prepare(listing: FolderListing, out_dir: str | Path, name: str, *, resize: int = 0, quality: int = 95,
            threads: int = 4, strict: bool = False) -> Prepared:
    """Write <out_dir>/<name>_{train,val}.{lst,rec,idx}, or reuse them if the inputs did not change.
    Unreadable images are left out and listed in <name>_skipped.txt (strict: the first one fails)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / name
    manifest = out / f"{name}.json"
    fp = fingerprint(listing, resize, quality)
    try:
        old = json.loads(manifest.read_text())
    except (OSError, ValueError):
        old = {}
    result = Prepared(prefix, listing.classes, old.get("counts", {}), reused=True, skipped=old.get("skipped", 0))
    files = [p for part in ("train", "val") for p in (result.rec(part), result.idx(part), result.lst(part))]
    if old.get("fingerprint") == fp and all(p.exists() for p in files):
        if strict and result.skipped:
            raise DataError(f"{result.skipped} images of {listing.root} are unreadable (listed in "
                            f"{result.skipped_list}); dataset.strict=true fails on them")
        return result
    manifest.unlink(missing_ok=True)
    skipped = {part: _write_part(listing, items, prefix, part, resize, quality, threads, strict)
               for part, items in (("train", listing.train), ("val", listing.val))}
    counts = {"train": len(listing.train) - len(skipped["train"]), "val": len(listing.val) - len(skipped["val"])}
    done = Prepared(prefix, listing.classes, counts, reused=False, skipped=sum(map(len, skipped.values())))
    done.skipped_list.unlink(missing_ok=True)
    if done.skipped:
        done.skipped_list.write_text("".join(f"{part}\t{path}\t{why}\n" for part, rows in skipped.items()
                                             for path, why in rows))
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps({"fingerprint": fp, "root": str(listing.root), "classes": list(listing.classes),
                               "counts": counts, "skipped": done.skipped, "resize": resize, "quality": quality},
                              indent=1))
    os.replace(tmp, manifest)
    return done


def check_records(rec: str | Path, idx: str | Path, num_classes: int, limit: int | None = None,
                  min_size: tuple[int, int] | None = None) -> int:
    """Read records back: each must unpack, decode and carry a label < num_classes, and with
    min_size (height, width) be at least that large.

    Returns the number of records checked. Raises DataError naming the file, record and problem.
    """
    import cv2
    import numpy as np

    try:
        reader = RecordFile(idx, rec, "r")
    except OSError as e:
        raise DataError(f"{rec}: cannot read it or its index {idx} ({e.strerror})") from e
    try:
        keys = reader.keys if limit is None else reader.keys[:limit]
        for key in keys:
            try:
                label, jpeg = unpack_image(reader.read(key))
            except (OSError, ValueError, KeyError) as e:
                raise DataError(f"{rec}: record {key} is corrupt ({type(e).__name__}: {e})") from e
            img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR) if jpeg else None
            if img is None or getattr(img, "size", 0) == 0:
                raise DataError(f"{rec}: record {key} holds no decodable image")
            if min_size and (img.shape[0] < min_size[0] or img.shape[1] < min_size[1]):
                raise DataError(f"dataset.image_shape asks for {min_size[0]}x{min_size[1]} but record {key} of {rec} "
                                f"is {img.shape[0]}x{img.shape[1]} and nothing resizes it; set dataset.resize "
                                "or dataset.random_resized_crop=true, or a smaller dataset.image_shape")
            label = int(label)
            if not 0 <= label < num_classes:
                raise DataError(f"{rec}: record {key} has label {label}, outside 0..{num_classes - 1}")
        return len(keys)
    finally:
        reader.close()


def record_files(plan: Any) -> tuple[str, str]:
    """The (train, val) .rec files of a rec or folder data set; folders are prepared on first use."""
    o = plan.dataset.options
    listing = plan.dataset.listing  # the folder as the plan listed and split it
    if listing is None:
        train, val = o["train_rec"], o["val_rec"]
    else:
        root = listing.root
        cache = o.get("cache_dir") or os.environ.get("XP_CACHE_DIR") or os.path.expanduser("~/.cache/xp")
        name = f"{os.path.basename(root)}-{hashlib.sha1(root.encode()).hexdigest()[:8]}"
        done = prepare(listing, os.path.join(cache, "recordio"), name, resize=int(o.get("store_size") or 0),
                       threads=max(1, plan.data_nthreads), strict=bool(o.get("strict", False)))
        if done.warning() and plan.rank == 0:
            log.warning(done.warning())
        train, val = str(done.rec("train")), str(done.rec("val"))
        # A corrupt or mislabelled file fails here with its name, not deep inside the C++ reader.
        for rec in (train, val):
            check_records(rec, rec[:-4] + ".idx", plan.dataset.num_classes, limit=8)
    return train, val


def with_kept_images(plan: Any) -> Any:
    """A folder data set's plan with the sizes of what was prepared: images that cannot be read are left out when
    it is prepared (on first use, here; cached afterwards), and the plan counts only what trains."""
    from dataclasses import replace

    from xp.data.datasets import count_lines
    from xp.errors import ConfigError

    if plan.dataset.listing is None:
        return plan
    train, val = record_files(plan)
    sizes = [count_lines(rec[:-4] + ".idx") for rec in (train, val)]
    if sizes == [plan.dataset.train_size, plan.dataset.val_size]:
        return plan
    steps = sizes[0] // plan.global_batch
    if steps < 1:
        raise ConfigError(f"batch={plan.batch}: the global batch ({plan.global_batch}) exceeds the {sizes[0]} "
                          f"readable training images of dataset={plan.dataset.name}")
    return replace(plan, dataset=replace(plan.dataset, train_size=sizes[0], val_size=sizes[1]),
                   steps_per_epoch=steps, samples_per_epoch=steps * plan.global_batch)

