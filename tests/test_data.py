"""Sharded iterators, metrics and the throughput meter."""

import numpy as np
import pytest

from xp.run import callbacks
from xp.data import datasets
from xp.run.callbacks import ThroughputMeter
from xp.mx.data import ArrayIter
from xp.run.metrics import Scores


def _ids(it):
    return [b.data[0].asnumpy()[:, 0].astype(int).tolist() for b in it]


def test_digits_split_is_fixed_and_disjoint():
    spec = datasets.describe("digits", {"val_fraction": 0.2})
    a = datasets.load_arrays(spec)
    b = datasets.load_arrays(spec)
    assert len(a[0]) == spec.train_size == 1438 and len(a[2]) == spec.val_size == 359
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].shape[1:] == (1, 8, 8) and set(np.unique(a[1])) == set(range(10))
    train_rows = {r.tobytes() for r in a[0]}
    assert sum(r.tobytes() in train_rows for r in a[2]) < 5  # digits has a few duplicate images, no more


def test_digits_read_from_sklearns_file_are_what_its_loader_gives():
    from sklearn.datasets import load_digits

    datasets._load_digits.cache_clear()
    images, target = datasets._load_digits()
    ref = load_digits()
    assert images.dtype == ref.images.dtype and target.dtype == ref.target.dtype
    assert np.array_equal(images, ref.images) and np.array_equal(target, ref.target)


def test_workers_read_disjoint_shares_of_the_same_global_batch():
    x = np.arange(103, dtype=np.float32)[:, None]
    y = np.zeros(103)
    single = _ids(ArrayIter(x, y, global_batch=8, workers=1, seed=3))
    shards = [_ids(ArrayIter(x, y, global_batch=8, workers=2, rank=r, seed=3)) for r in (0, 1)]
    assert len(single) == len(shards[0]) == len(shards[1]) == 103 // 8  # equal steps, remainder dropped
    for step, batch in enumerate(single):
        assert shards[0][step] + shards[1][step] == batch


def test_epoch_order_depends_on_seed_and_epoch_only():
    x = np.arange(64, dtype=np.float32)[:, None]
    it = ArrayIter(x, np.zeros(64), global_batch=16, seed=1)
    it.set_epoch(1)
    e1 = _ids(it)
    it.set_epoch(2)
    e2 = _ids(it)
    it.set_epoch(1)
    assert _ids(it) == e1 and e1 != e2
    assert sorted(sum(e1, [])) == list(range(64))


def test_eval_iterator_pads_the_last_batch_and_reports_it():
    x = np.arange(10, dtype=np.float32)[:, None]
    batches = list(ArrayIter(x, np.zeros(10), global_batch=4, shuffle=False, pad_last=True))
    assert [b.pad for b in batches] == [0, 0, 2]
    assert batches[-1].data[0].asnumpy()[:2, 0].tolist() == [8, 9]


def test_scores_match_a_direct_computation_and_skip_padding():
    rng = np.random.RandomState(0)
    logits = rng.randn(12, 10).astype(np.float32)
    labels = rng.randint(0, 10, 12)
    s = Scores(10)
    s.update(logits[:8], labels[:8].astype(np.float32))
    s.update(np.vstack([logits[8:], logits[:2]]), np.concatenate([labels[8:], labels[:2]]).astype(np.float32), pad=2)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    r = s.result("val")
    assert r["val_loss"] == pytest.approx(-np.log(p[np.arange(12), labels]).mean(), rel=1e-5)
    assert r["val_accuracy"] == pytest.approx((logits.argmax(1) == labels).mean())
    top5 = np.argsort(-logits, 1)[:, :5]
    assert r["val_top5_accuracy"] == pytest.approx(np.mean([l in t for l, t in zip(labels, top5)]))
    assert "train_top5_accuracy" not in Scores(5).result("train")  # top-5 only where classes > 5


def test_throughput_excludes_warmup_batches(monkeypatch):
    clock = iter([0.0, 5.0, 6.0, 7.0, 8.0, 9.0])  # epoch begin, 4 batch ends, train end
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    m = ThroughputMeter(warmup_batches=1)
    m.on_epoch_begin(1)
    for i in range(4):
        m.on_batch_end(1, i, 10)
    m.on_train_epoch_end(1)
    metrics = {}
    m.on_epoch_end(1, metrics)
    assert metrics["epoch_time_s"] == 9.0
    # the slow first batch (5 s) is excluded: 30 samples in the 4 s after it
    assert metrics["throughput_samples_per_s"] == pytest.approx(30 / 4)
    assert metrics["batch_time_ms_p50"] == pytest.approx(1000.0)
