"""End to end on image files: folder and rec data sets, test_io, and bad data on the command line."""

import pytest

from conftest import mlflow_runs, run_xp
from images import make_folder, write_digits_folder

pytestmark = pytest.mark.slow

DIGITS = ["dataset.image_shape=[1,32,32]", "dataset.mean=[30,30,30]", "dataset.std=[60,60,60]",
          "dataset.resize=32", "dataset.store_size=32", "dataset.rand_mirror=false", "dataset.min_random_area=0.8"]


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits_png"), per_class=80)


@pytest.mark.parametrize("backend", ["gluon", "module", "torch"])
def test_training_on_an_image_folder(tmp_path, store, digits_folder, backend):
    env = {"XP_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_xp(tmp_path, store, f"backend={backend}", "dataset=folder", f"dataset.root={digits_folder}", *DIGITS,
                  "epochs=6", "lr_steps=[5]", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "640 training, 160 validation, 10 classes, 1x32x32 images" in proc.stdout
    run = mlflow_runs(store)[1][0]
    assert run.data.metrics["val_accuracy"] > 0.85
    assert len(list((tmp_path / "cache" / "recordio").glob("*_train.rec"))) == 1
    if backend == "torch":  # where its batches were decoded
        assert run.data.tags["xp.input"] == f"cpu ({run.data.params['data_nthreads']} decode workers)"


def test_test_io_sweep_logs_io_throughput_per_thread_count(tmp_path, store, digits_folder):
    env = {"XP_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_xp(tmp_path, store, "dataset=folder", f"dataset.root={digits_folder}", *DIGITS, "test_io=true",
                  "epochs=2", "-m", "data_nthreads=1,2", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = mlflow_runs(store)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["data_nthreads"] for r in children) == ["1", "2"]
    for r in children:
        assert r.info.status == "FINISHED"
        assert r.data.metrics["io_throughput_samples_per_s"] > 0 and "val_accuracy" not in r.data.metrics
        assert [m.step for m in client.get_metric_history(r.info.run_id, "io_throughput_samples_per_s")] == [1, 2]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from xp.data.datasets import list_folder
    from xp.data.recordio import prepare

    root = make_folder(tmp_path_factory.mktemp("imgs"), per_class=6)
    return prepare(list_folder(str(root)), tmp_path_factory.mktemp("rec"), "set", resize=24, threads=2)


def rec_args(train, val, classes=4):
    return ["dataset=rec", f"dataset.train_rec={train}", f"dataset.val_rec={val}", f"dataset.num_classes={classes}",
            "dataset.image_shape=[3,24,24]", "dataset.resize=24", "batch=4", "epochs=1"]


def test_rec_dataset_trains(tmp_path, store, prepared):
    proc = run_xp(tmp_path, store, *rec_args(prepared.rec("train"), prepared.rec("val")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert mlflow_runs(store)[1][0].info.status == "FINISHED"


def corrupt_copy(prepared, tmp_path):
    import shutil

    for ext in (".rec", ".idx"):
        shutil.copy(f"{prepared.prefix}_train{ext}", tmp_path / f"bad{ext}")
    data = bytearray((tmp_path / "bad.rec").read_bytes())
    data[:8] = b"\0" * 8
    (tmp_path / "bad.rec").write_bytes(bytes(data))
    return tmp_path / "bad.rec"


@pytest.mark.parametrize("case, fragments", [
    ("missing_rec", ["dataset.train_rec", "missing.rec: no such file", "python -m xp.prepare"]),
    ("missing_idx", ["dataset.val_rec", "set_val.idx: no such file"]),
    ("corrupt", ["bad.rec: record 0 is corrupt"]),
    ("classes", ["dataset.num_classes=3", "has label 3", "at least 4 classes"]),
    ("shape", ["dataset.image_shape=[2, 24, 24]: must be [channels (1 or 3), height, width]"]),
    ("empty_folder", ["no images (.jpg, .jpeg, .png) in any class sub-folder"]),
    ("too_small", ["dataset.image_shape asks for 64x64", "set_train.rec", "is 24x", "nothing resizes it"]),
])
def test_bad_data_is_one_line_exit_2_and_nothing_running(tmp_path, store, prepared, case, fragments):
    train, val = prepared.rec("train"), prepared.rec("val")
    args = rec_args(train, val)
    if case == "missing_rec":
        args = rec_args(tmp_path / "missing.rec", val)
    elif case == "missing_idx":
        import shutil

        shutil.copy(val, tmp_path / "set_val.rec")
        args = rec_args(train, tmp_path / "set_val.rec")
    elif case == "corrupt":
        args = rec_args(corrupt_copy(prepared, tmp_path), val)
    elif case == "classes":
        args = rec_args(train, val, classes=3)
    elif case == "shape":
        args = rec_args(train, val) + ["dataset.image_shape=[2,24,24]"]
    elif case == "too_small":
        args = rec_args(train, val) + ["dataset.image_shape=[3,64,64]", "dataset.resize=0",
                                       "dataset.random_resized_crop=false"]
    elif case == "empty_folder":
        (tmp_path / "empty" / "a").mkdir(parents=True)
        args = ["dataset=folder", f"dataset.root={tmp_path / 'empty'}"]
    proc = run_xp(tmp_path, store, *args, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("xp: error: ") and "Traceback" not in proc.stdout + err
    for f in fragments:
        assert f in err, err
    assert mlflow_runs(store)[1] == []


@pytest.mark.parametrize("backend", ["gluon", "torch"])
def test_an_unreadable_image_is_left_out_with_a_warning_or_fails_with_strict(tmp_path, store, backend):
    """One broken file in the training part: the run trains on the rest (its last batch wraps around), warns
    naming the list; dataset.strict=true makes it one line and exit 2, no run left RUNNING."""
    from xp.data.datasets import list_folder

    root = make_folder(tmp_path / "imgs", per_class=20, size=(32, 40), with_photos=False)
    broken = root / list_folder(str(root)).train[0][0]  # 48 training images: batch 12 fills 4 steps exactly
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    args = [f"backend={backend}", "dataset=folder", f"dataset.root={root}", "dataset.image_shape=[3,16,16]",
            "dataset.resize=16", "dataset.store_size=16", "batch=12", "epochs=2"]
    env = {"XP_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_xp(tmp_path, store, *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = next((tmp_path / "cache" / "recordio").glob("*_skipped.txt"))
    assert f"1 of 60 images could not be read and were left out (listed in {listed})" in proc.stdout + proc.stderr
    assert listed.read_text().split("\t")[1] == str(broken)
    assert "3 steps of 12; 47 training, 12 validation" in proc.stdout  # the plan counts the images that train
    run = mlflow_runs(store)[1][0]
    assert run.info.status == "FINISHED" and run.data.params["summary.epochs_completed"] == "2"
    strict = run_xp(tmp_path, store, *args, "dataset.strict=true", env=env)
    assert strict.returncode == 2 and strict.stderr.strip().count("\n") == 0, strict.stderr
    assert "1 images of" in strict.stderr and "strict=true fails on them" in strict.stderr
    assert all(r.info.status != "RUNNING" for r in mlflow_runs(store)[1])
