"""backend=torch: PyTorch on the experiments the MXNet backends run, with the same numbers.

Same arithmetic as Gluon (LeNet, SGD with momentum, decay on weights only, the data order), the
same accuracy on digits, DDP processes over gloo on 127.0.0.1 computing what one process computes,
RecordIO decoded in DataLoader workers to the pixels MXNet's reader produces, torchvision weights
from a local file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import compose_config, mlflow_runs, run_xp, said
from xp.run.backend_plan import plan_and_backend
from xp.run.train import fit, train_epoch

EXACT = ["epochs=1", "dataset.val_fraction=0.89", "lr_schedule=constant"]


def trained(backend: str, *overrides: str):
    plan, cls = plan_and_backend(compose_config(f"backend={backend}", *overrides))
    b = cls()
    history = fit(plan, b, [])
    return b, history


def test_torch_learns_digits_within_a_point_of_gluon():
    """Default schedule (10 epochs, steps at 6 and 9), three seeds each: the initial weights differ
    (each framework draws its own), the mean accuracy may not."""
    acc = {}
    for backend in ("gluon", "torch"):
        acc[backend] = [trained(backend, f"seed={s}")[1][-1]["val_accuracy"] for s in (1, 2, 3)]
    assert min(acc["torch"]) > 0.96, acc
    assert abs(np.mean(acc["torch"]) - np.mean(acc["gluon"])) <= 0.01, acc


def test_torch_computes_what_gluon_computes_from_the_same_weights():
    """Gluon's initial LeNet copied into PyTorch's: after an epoch of SGD (momentum, weight decay on
    weights only) on the same batches, the same parameters and validation scores."""
    overrides = ["epochs=1", "lr_schedule=constant", "wd=0.001"]
    pg, cg = plan_and_backend(compose_config("backend=gluon", *overrides))
    pt, ct = plan_and_backend(compose_config("backend=torch", *overrides))
    g, t = cg(), ct()
    g.setup(pg)
    t.setup(pt)
    state = t.net.state_dict()
    assert len(state) == len(g.get_params())
    for (name, value), target in zip(g.get_params().items(), state.values()):
        assert value.shape == tuple(target.shape), name
        target.copy_(torch.from_numpy(value))
    train_epoch(g.plan, g, 1, lambda *a: None)
    train_epoch(t.plan, t, 1, lambda *a: None)
    for (name, want), got in zip(g.get_params().items(), t.get_params().values()):
        # atol 3e-4: on an AMD EPYC without AVX-512 MKL-DNN's kernels sum in another order; 7 of LeNet's 288 first
        # conv weights then differed by up to 2e-4 after the epoch (2e-5 held on an Intel CPU with AVX-512)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=3e-4, err_msg=name)
    gv, tv = g.evaluate(), t.evaluate()
    assert gv["val_accuracy"] == tv["val_accuracy"] and gv["val_loss"] == pytest.approx(tv["val_loss"], rel=1e-4)


def test_dtypes_train_through_autocast_on_the_cpu():
    for dtype in ("bfloat16", "amp"):  # amp on the CPU is bfloat16
        b, history = trained("torch", f"dtype={dtype}", "epochs=2")
        assert b.amp_dtype == torch.bfloat16 and not b.scaler.is_enabled()
        assert history[-1]["val_accuracy"] > 0.85
    b, history = trained("torch", "dtype=float16", "epochs=2")
    assert b.amp_dtype == torch.float16 and b.scaler.is_enabled()  # float16 scales the loss
    assert history[-1]["val_accuracy"] > 0.85


def test_gpu_plans_are_checked_before_anything_starts():
    from xp.errors import ConfigError
    from xp.run.plan import build_plan
    from xp_plugins.torch_ddp import TorchBackend

    plan = build_plan(compose_config("backend=torch", "gpus=1", "workers=2"), visible_gpus=1)
    with pytest.raises(ConfigError, match="workers=2: backend=torch runs one process per GPU on this machine; use gpus=2"):
        TorchBackend.check(plan)
    plan = build_plan(compose_config("backend=torch", "gpus=1", "dtype=bfloat16"), visible_gpus=1)
    if torch.cuda.device_count() == 0:
        TorchBackend.check(plan)  # what the plan asks (the GPUs may be another host's: a launcher's)
        with pytest.raises(ConfigError, match="gpus=1: the installed torch .* sees 0 GPUs"):
            TorchBackend.check_devices(plan)  # what the machine that trains has
    assert TorchBackend.engine_for(plan) is None
    assert TorchBackend.engine_for(build_plan(compose_config("backend=torch", "cpu_devices=2"), visible_gpus=0)).name == "torchrun"


@pytest.mark.slow
def test_ddp_processes_compute_what_one_process_computes(tmp_path, store):
    """2 processes x 16 (torchrun, gloo on 127.0.0.1) == 1 process x 32, and the run is logged once."""
    one, _ = trained("torch", *EXACT, "batch=32")
    want = one.get_params()
    out = tmp_path / "params.npz"
    r = run_xp(tmp_path, store, "backend=torch", *EXACT, "batch=16", "cpu_devices=2", f"save_params={out}",
               timeout=240)
    assert r.returncode == 0, said(r)
    assert "2 PyTorch DDP processes (torchrun) on 127.0.0.1" in r.stdout
    got = dict(np.load(out))
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)
    _, runs = mlflow_runs(store)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.tags["xp.engine"] == "torchrun" and run.data.params["version.torch"] == torch.__version__.split("+")[0]
    m = run.data.metrics
    assert m["throughput_samples_per_s"] == pytest.approx(m["worker0_throughput_samples_per_s"] + m["worker1_throughput_samples_per_s"])


@pytest.mark.slow
def test_records_decode_to_the_pixels_mxnet_reads(tmp_path, monkeypatch):
    """The DataLoader's workers decode a .rec file (no MXNet) to the batches MXNet's C++ reader gives."""
    from images import make_folder
    from xp.mx.data import make_iters
    from xp.run.plan import build_plan
    from xp.pt.data import make_batches

    monkeypatch.setenv("XP_CACHE_DIR", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "imgs", per_class=16, with_photos=False)
    plan = build_plan(compose_config("dataset=folder", f"dataset.root={root}", "dataset.image_shape=[3,24,24]",
                                     "dataset.resize=24", "dataset.store_size=24", "batch=4", "data_nthreads=2"),
                      visible_gpus=0)
    _, mx_val = make_iters(plan)
    _, pt_val = make_batches(plan, 1, 0, pin=False)
    mx_batches = [(b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad) for b in mx_val]
    mx_x = np.concatenate([x[: len(x) - pad] for x, _, pad in mx_batches])
    mx_y = np.concatenate([y[: len(y) - pad] for _, y, pad in mx_batches])
    batches = list(pt_val.epoch(0))
    pt_x = np.concatenate([x.numpy() for x, _ in batches])
    pt_y = np.concatenate([y.numpy() for _, y in batches])
    assert pt_x.shape == mx_x.shape == (plan.dataset.val_size, 3, 24, 24)
    np.testing.assert_array_equal(pt_y, mx_y.astype(np.int64))
    np.testing.assert_allclose(pt_x, mx_x, atol=1e-4)  # the same JPEG decoder, crop and normalisation
    train, _ = make_batches(plan, 2, 1, pin=False)  # rank 1 of 2: its half of each global batch
    steps = list(train.epoch(1))
    assert len(steps) == plan.steps_per_epoch and all(x.shape == (2, 3, 24, 24) for x, _ in steps)


@pytest.mark.slow
def test_torchvision_weights_load_from_the_local_cache(tmp_path, store):
    """pretrained=resnet18 finds NAME-HASH.pth in $TORCH_HOME/hub/checkpoints; with freeze_backbone only the
    new classifier trains."""
    import torchvision

    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    weights = torchvision.models.resnet18(num_classes=1000).state_dict()
    torch.save(weights, cache / "resnet18-f37072fd.pth")
    out = tmp_path / "params.npz"
    r = run_xp(tmp_path, store, "backend=torch", "model=resnet18", "pretrained=resnet18", "freeze_backbone=true",
               "dataset=synthetic", "dataset.num_classes=10", "dataset.image_shape=[3,32,32]", "dataset.train_size=32", "dataset.val_size=16",
               "batch=16", "epochs=1", f"save_params={out}", env={"TORCH_HOME": str(tmp_path / "torch")}, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = dict(np.load(out))
    for name, value in weights.items():
        if name.startswith("fc."):
            assert got[name].shape[0] == 10  # the data set's classifier, not ImageNet's
        elif not name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            np.testing.assert_array_equal(got[name], value.numpy(), err_msg=name)  # frozen: as loaded


def _record_sources(tmp_path, monkeypatch, *overrides: str):
    """A generated folder prepared as RecordIO (cached under tmp_path): the plan and its (train, val) files."""
    from images import make_folder
    from xp.run.plan import build_plan
    from xp.data.recordio import record_files

    monkeypatch.setenv("XP_CACHE_DIR", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "imgs", per_class=16, with_photos=True)
    plan = build_plan(compose_config("dataset=folder", f"dataset.root={root}", "batch=8", "data_nthreads=2",
                                     *overrides), visible_gpus=0)
    return plan, [str(p) for p in record_files(plan)]


def _epoch(source, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    batches = [(x.numpy().copy(), y.numpy().copy()) for x, y in source.epoch(epoch)]
    return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])


@pytest.mark.slow
def test_workers_persist_across_epochs_and_each_epoch_reads_its_own_draws(tmp_path, monkeypatch):
    from xp.pt.data import RecordBatches

    plan, (train_rec, _) = _record_sources(tmp_path, monkeypatch, "dataset.image_shape=[3,24,24]")
    source = RecordBatches(train_rec, plan, 1, 0, train=True, pin=False)
    x1, y1 = _epoch(source, 1)
    workers = [w.pid for w in source.loader._iterator._workers]
    x2, y2 = _epoch(source, 2)
    assert [w.pid for w in source.loader._iterator._workers] == workers  # the same processes
    again = RecordBatches(train_rec, plan, 1, 0, train=True, pin=False)
    x1_again, y1_again = _epoch(again, 1)
    np.testing.assert_array_equal(x1_again, x1)  # epoch 1's order and draws, whoever reads them
    np.testing.assert_array_equal(y1_again, y1)
    assert not np.array_equal(y2, y1) and not np.array_equal(x2, x1)  # epoch 2: its own order and crops
    assert len(x1) == plan.steps_per_epoch * plan.global_batch


@pytest.mark.slow
def test_the_gpu_decoding_path_draws_what_the_cpu_path_draws(tmp_path, monkeypatch):
    """dataset.decode=gpu's pipeline (workers read records; the main process decodes with torchvision and crops,
    resizes, mirrors and normalises with tensor operations) run on the CPU: the same samples in the same order
    with the same crops and mirrors; validation pixels (a centre crop, no resize) identical, augmented ones within
    one 8-bit level of OpenCV's resize. A record nvJPEG cannot decode (a PNG) is decoded by OpenCV instead."""
    from xp.pt.data import RecordBatches
    from xp.data.recordio import RecordFile, pack_image

    plan, (train_rec, val_rec) = _record_sources(tmp_path, monkeypatch, "dataset.image_shape=[3,24,24]",
                                                 "dataset.store_size=24", "dataset.resize=24")
    cpu_val, gpu_val = (RecordBatches(val_rec, plan, 1, 0, train=False, pin=False, gpu=g) for g in (None, "cpu"))
    assert gpu_val.decode.startswith("gpu (nvJPEG on cpu") and cpu_val.decode == "cpu (2 decode workers)"
    (x_val, y_val), (x_gpu, y_gpu) = _epoch(cpu_val, 0), _epoch(gpu_val, 0)
    np.testing.assert_array_equal(y_gpu, y_val)
    np.testing.assert_allclose(x_gpu, x_val, atol=1e-5)
    one_level = 1 / min(plan.dataset.options["std"]) + 1e-5
    for shards, shard in ((1, 0), (2, 1)):
        cpu, gpu = (RecordBatches(train_rec, plan, shards, shard, train=True, pin=False, gpu=g) for g in (None, "cpu"))
        (x_cpu, y_cpu), (x_gpu, y_gpu) = _epoch(cpu, 3), _epoch(gpu, 3)
        np.testing.assert_array_equal(y_gpu, y_cpu)
        diff = np.abs(x_gpu - x_cpu)
        assert diff.max() <= one_level and diff.mean() < 0.25 * one_level, (diff.max(), diff.mean())  # 11% off by one

    # one validation record re-encoded as PNG: decoded on the CPU and copied to the device, the same pixels
    import cv2

    from xp.data.recordio import unpack_image

    png_rec, png_idx = tmp_path / "png.rec", tmp_path / "png.idx"
    source = RecordFile(val_rec[:-4] + ".idx", val_rec)
    out = RecordFile(png_idx, png_rec, "w")
    for n, key in enumerate(source.keys):
        record = source.read(key)
        if n == 0:
            label, jpeg = unpack_image(record)
            img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            record = pack_image(label, key, cv2.imencode(".png", img)[1].tobytes())
        out.write(key, record)
    out.close()
    png = RecordBatches(str(png_rec), plan, 1, 0, train=False, pin=False, gpu="cpu")
    x_png, y_png = _epoch(png, 0)
    assert png.decoder.cpu_decoded == 1
    np.testing.assert_array_equal(y_png, y_val)
    np.testing.assert_allclose(x_png, x_val, atol=1e-5)


@pytest.mark.slow
def test_gpu_decoding_falls_back_to_the_cpu_workers_where_the_device_cannot_decode(tmp_path, monkeypatch, caplog):
    """No CUDA decoder for the device (here: no GPU at all): one warning, and the CPU workers decode the batches."""
    from xp.pt.data import make_batches

    plan, _ = _record_sources(tmp_path, monkeypatch, "dataset.image_shape=[3,24,24]", "dataset.decode=gpu")
    with caplog.at_level("WARNING", logger="xp"):
        train, val = make_batches(plan, 1, 0, pin=False, device=torch.device("cuda", 0))
    assert train.decode.startswith("cpu (2 decode workers); dataset.decode=gpu fell back: ")
    assert train.decoder is None and val.decoder is None
    assert any("dataset.decode=gpu: this torchvision cannot decode JPEGs on cuda:0" in r.message for r in caplog.records)
    x, y = next(iter(train.epoch(1)))
    assert x.device.type == "cpu" and x.shape == (plan.global_batch, 3, 24, 24)


def test_torch_threads_fit_the_cores_other_processes_leave(monkeypatch):
    """The arithmetic of xp.pt.threads: from /proc/stat's busy ticks of this process's cores, less its own, the
    threads for the next epoch (between 1 and what torch started with). Beside a process using one of two cores:
    one thread; alone: both; a count never above the cap."""
    import torch

    from xp.pt import threads

    ticks = {"busy": 0, "own": 0}
    monkeypatch.setattr(threads, "_busy_ticks", lambda cores: ticks["busy"])
    monkeypatch.setattr(threads, "_own_ticks", lambda: ticks["own"])
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fit = threads.FitThreads(torch)
        fit.cores, fit.hz = {0, 1}, 100

        def epoch(seconds: float, others: float, own: float) -> int:
            clock[0] += seconds
            ticks["busy"] += int((others + own) * 100 * seconds)
            ticks["own"] += int(own * 100 * seconds)
            return fit.fit()

        assert epoch(1.0, others=1.0, own=1.0) == 1 and torch.get_num_threads() == 1  # a busy loop beside it
        assert epoch(1.0, others=0.05, own=1.0) == 2 and torch.get_num_threads() == 2  # alone again
        assert epoch(0.01, others=2.0, own=0.0) == 2  # too short to tell: unchanged
        assert epoch(1.0, others=2.0, own=0.0) == 1  # both cores taken: still one thread, never none
        fit.cap = 1
        assert epoch(1.0, others=0.0, own=1.0) == 1  # OMP_NUM_THREADS=1 (a slot of one core): never more
    finally:
        torch.set_num_threads(before)
