"""The RecordIO pipeline: folder -> .lst/.rec/.idx -> ImageRecordIter, and what goes wrong with bad files."""

import os
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from conftest import ROOT, compose_config
from images import make_folder, sample_photos
from xp.data.datasets import list_folder
from xp.errors import ConfigError
from xp.data.recordio import DataError, check_records, prepare
from xp.run.plan import build_plan


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images"))


def read_all(rec):
    r = mx.recordio.MXIndexedRecordIO(str(rec)[:-4] + ".idx", str(rec), "r")
    try:
        return [mx.recordio.unpack_img(r.read_idx(k)) for k in r.keys]
    finally:
        r.close()


def test_recordio_files_are_byte_identical_to_mxnets(tmp_path):
    """xp's plain-Python writer and reader against MXNet's: records holding the magic number at a 4-byte
    boundary are split into parts (and joined on reading); image headers pack as IRHeader does."""
    import struct

    from xp.data.recordio import MAGIC, RecordFile, pack_image, unpack_image

    magic = struct.pack("<I", MAGIC)
    records = [b"abc", b"", magic, b"1234" + magic + b"xy", magic + magic + b"z", b"12" + magic + b"345",
               os.urandom(1001), pack_image(3, 7, b"\xff\xd8jpeg")]
    theirs = mx.recordio.MXIndexedRecordIO(str(tmp_path / "m.idx"), str(tmp_path / "m.rec"), "w")
    ours = RecordFile(tmp_path / "o.idx", tmp_path / "o.rec", "w")
    for i, r in enumerate(records):
        theirs.write_idx(i, r)
        ours.write(i, r)
    theirs.close()
    ours.close()
    for ext in (".rec", ".idx"):
        assert (tmp_path / f"o{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()
    mine = RecordFile(tmp_path / "m.idx", tmp_path / "m.rec")
    assert [mine.read(k) for k in mine.keys] == records
    assert records[-1] == mx.recordio.pack(mx.recordio.IRHeader(0, 3.0, 7, 0), b"\xff\xd8jpeg")
    assert unpack_image(records[-1]) == (3.0, b"\xff\xd8jpeg")
    multi = mx.recordio.pack(mx.recordio.IRHeader(0, [5.0, 2.0], 7, 0), b"img")  # a label array: its first value
    assert unpack_image(multi) == (5.0, b"img")


def test_listing_is_stratified_and_fixed(folder):
    a = list_folder(str(folder), val_fraction=0.25)
    assert a.classes == ("bars", "columns", "disc", "photos")
    assert len(a.train) + len(a.val) == 3 * 12 + 2
    for label in range(3):  # 3 of 12 per class held out
        assert sum(1 for _, y in a.val if y == label) == 3
    assert a == list_folder(str(folder), val_fraction=0.25)
    assert a.train != list_folder(str(folder), val_fraction=0.25, seed=1).train
    fixed = list_folder(str(folder), train_per_class=5, exclude=("photos",))
    assert fixed.classes == ("bars", "columns", "disc") and len(fixed.train) == 15 and len(fixed.val) == 21


def test_prepare_writes_what_it_read(folder, tmp_path):
    listing = list_folder(str(folder), val_fraction=0.25)
    done = prepare(listing, tmp_path, "set", resize=32, threads=2)
    assert not done.reused and done.counts == {"train": len(listing.train), "val": len(listing.val)}
    for part, items in (("train", listing.train), ("val", listing.val)):
        lst = [line.split("\t") for line in done.lst(part).read_text().splitlines()]
        assert [(p.strip(), int(y)) for _, y, p in lst] == list(items)
        assert len(done.idx(part).read_text().splitlines()) == len(items)
        records = read_all(done.rec(part))
        assert len(records) == len(items)
        for (header, img), (rel, label) in zip(records, items):
            assert int(header.label) == label
            assert min(img.shape[:2]) == 32 and img.shape[2] == 3
            src = cv2.imread(str(folder / rel), cv2.IMREAD_COLOR)
            h, w = src.shape[:2]
            s = 32 / min(h, w)
            expect = cv2.resize(src, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
            assert img.shape == expect.shape
            assert np.abs(img.astype(float) - expect).mean() < 12  # JPEG is lossy; another image is not close
    photos = [img for (h, img), (rel, _) in zip(read_all(done.rec("train")), listing.train) if rel.startswith("photos")]
    assert len(photos) + sum(r.startswith("photos") for r, _ in listing.val) == len(sample_photos()) == 2


def test_prepare_is_idempotent_and_notices_changes(folder, tmp_path):
    listing = list_folder(str(folder))
    first = prepare(listing, tmp_path, "set", resize=24, threads=2)
    mtime = first.rec("train").stat().st_mtime_ns
    again = prepare(list_folder(str(folder)), tmp_path, "set", resize=24, threads=2)
    assert again.reused and again.rec("train").stat().st_mtime_ns == mtime
    assert not prepare(listing, tmp_path, "set", resize=28, threads=2).reused  # options are inputs too
    victim = folder / listing.train[0][0]
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    assert not prepare(list_folder(str(folder)), tmp_path, "set", resize=28, threads=2).reused
    assert not list(tmp_path.glob("*.tmp"))


def test_prepare_command_line(folder, tmp_path):
    cmd = [sys.executable, "-m", "xp.prepare", str(folder), str(tmp_path), "--resize", "20", "--threads", "2"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "4 classes" in first.stdout and "wrote" in first.stdout and "dataset.num_classes=4" in first.stdout
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "reused" in second.stdout
    bad = subprocess.run([sys.executable, "-m", "xp.prepare", str(tmp_path / "nothing"), str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such directory" in bad.stderr


def test_unreadable_images_are_left_out_counted_and_listed(tmp_path):
    """Real collections hold a few unreadable files: they are skipped and listed, the rest is prepared."""
    root = make_folder(tmp_path / "imgs", per_class=3, with_photos=False)
    (root / "disc" / "broken.jpg").write_bytes(b"not a jpeg at all")
    (root / "bars" / "empty.png").write_bytes(b"")
    listing = list_folder(str(root))
    done = prepare(listing, tmp_path / "out", "x", threads=2)
    assert done.skipped == 2 and sum(done.counts.values()) == len(listing.train) + len(listing.val) - 2
    listed = done.skipped_list.read_text().splitlines()
    assert sorted(line.split("\t")[1].rsplit("/", 1)[1] for line in listed) == ["broken.jpg", "empty.png"]
    for part in ("train", "val"):  # records, .lst and counts agree; no record of a skipped file
        assert check_records(done.rec(part), done.idx(part), 3) == done.counts[part]
        lst = done.lst(part).read_text()
        assert len(lst.splitlines()) == done.counts[part] and "broken.jpg" not in lst and "empty.png" not in lst
    assert "2 of 11 images could not be read" in done.warning() and str(done.skipped_list) in done.warning()
    again = prepare(list_folder(str(root)), tmp_path / "out", "x", threads=2)
    assert again.reused and again.skipped == 2  # the warning comes back with the reused files
    with pytest.raises(DataError, match=r"2 images of .* are unreadable .*strict=true fails on them"):
        prepare(list_folder(str(root)), tmp_path / "out", "x", threads=2, strict=True)


def test_strict_fails_on_the_first_unreadable_image(tmp_path):
    root = make_folder(tmp_path / "imgs", per_class=3, with_photos=False)
    (root / "disc" / "broken.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(DataError, match=r"broken.jpg: not a readable JPEG/PNG image \(dataset.strict=true"):
        prepare(list_folder(str(root)), tmp_path / "out", "x", threads=2, strict=True)


def test_corrupt_record_is_named(folder, tmp_path):
    done = prepare(list_folder(str(folder)), tmp_path, "set", resize=24, threads=2)
    assert check_records(done.rec("train"), done.idx("train"), 4) == done.counts["train"]
    data = bytearray(done.rec("train").read_bytes())
    data[:8] = b"\x00" * 8  # the first record's magic number and length
    done.rec("train").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"set_train.rec: record 0 is corrupt"):
        check_records(done.rec("train"), done.idx("train"), 4)


def test_mislabelled_records_are_refused(folder, tmp_path):
    done = prepare(list_folder(str(folder)), tmp_path, "set", resize=24, threads=2)
    with pytest.raises(DataError, match=r"has label 3, outside 0..2"):
        check_records(done.rec("train"), done.idx("train"), 3)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "no images"),
    (lambda p: make_folder(p, per_class=4, with_photos=False) and [
        os.remove(f) for c in ("columns", "disc") for f in (p / c).iterdir()], "only one class (bars)"),
])
def test_bad_folders_are_one_line_config_errors(tmp_path, make, message):
    root = tmp_path / "imgs"
    make(root)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_plan(compose_config("dataset=folder", f"dataset.root={root}"), visible_gpus=0)


def test_record_iterator_shapes_labels_and_equal_steps_per_worker(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("XP_CACHE_DIR", str(tmp_path))
    from xp.mx.data import make_iters

    overrides = ["dataset=folder", f"dataset.root={folder}", "dataset.image_shape=[3,24,24]", "dataset.resize=28",
                 "batch=4", "data_nthreads=2", "kvstore=dist_sync"]
    steps = {}
    for rank in (0, 1):
        plan = build_plan(compose_config(*overrides), visible_gpus=0, workers=2, rank=rank)
        train, val = make_iters(plan)
        for epoch in (1, 2):
            train.set_epoch(epoch)
            batches = list(train)
            steps[rank, epoch] = len(batches)
            for b in batches:
                assert b.data[0].shape == (4, 3, 24, 24)
                labels = b.label[0].asnumpy()
                assert labels.min() >= 0 and labels.max() <= 3 and np.all(labels == labels.astype(int))
    assert set(steps.values()) == {plan.steps_per_epoch} and plan.steps_per_epoch == plan.dataset.train_size // 8
    vb = list(val)
    assert sum(b.data[0].shape[0] - b.pad for b in vb) == plan.dataset.val_size


def test_folder_root_with_tilde_is_expanded_and_the_plan_carries_its_listing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    make_folder(tmp_path / "imgs", per_class=6, with_photos=False)
    # quoted: Hydra's grammar refuses a bare ~, and the shell does not expand it after "dataset.root="
    plan = build_plan(compose_config("dataset=folder", "dataset.root='~/imgs'", "batch=4"), visible_gpus=0)
    listing = plan.dataset.listing
    assert listing.root == str(tmp_path / "imgs") and listing.classes == ("bars", "columns", "disc")
    assert (len(listing.train), len(listing.val)) == (plan.dataset.train_size, plan.dataset.val_size)


def test_test_io_times_its_first_epoch_from_a_reset_reader():
    """A reader decodes ahead from its creation: test_io resets it before epoch 1 (else epoch 1 reads from a
    full buffer at a figure no later epoch reaches) and times every batch, none excluded as warm-up."""
    from types import SimpleNamespace

    from xp.run.experiment import build_callbacks
    from xp.mx.data import EpochIter
    from xp.run.record import NullTracker

    resets = []
    for keep_ahead in (True, False):
        inner = mx.io.NDArrayIter(np.zeros((8, 1)), np.zeros(8), batch_size=4)
        inner.reset = lambda k=keep_ahead: resets.append(k)
        EpochIter(inner, 2, keep_ahead=keep_ahead).set_epoch(1)
    assert resets == [False]  # only the test_io reader starts over
    plan = build_plan(compose_config("test_io=true", "timing_warmup_batches=3"), visible_gpus=0)
    cbs = build_callbacks(plan, SimpleNamespace(gather=lambda v: [v]), NullTracker(), None, None)
    assert (cbs.meter.warmup, cbs.meter.name) == (0, "io_throughput_samples_per_s")
