"""End to end: `python -m xp` in a subprocess, asserting on what MLflow recorded."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, mlflow_runs, run_xp, wait_for_line, xp_args, xp_env
from plugin_fixtures import install_test_plugins

pytestmark = pytest.mark.slow

EPOCH_METRICS = ["train_loss", "train_accuracy", "val_accuracy", "val_top5_accuracy", "throughput_samples_per_s", "epoch_time_s"]


def assert_one_line_error(proc, *fragments):
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("xp: error: "), err
    assert "Traceback" not in proc.stdout + proc.stderr
    for f in fragments:
        assert f in err, err


def test_default_run_reaches_095_and_logs_everything(tmp_path, store):
    proc = run_xp(tmp_path, store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for shown in ("devices          cpu(0)", "32 global", "0.02 effective", "samples/epoch    1408",
                  "| val acc (last) | best   |", "logged to " + store):
        assert shown in out, out

    client, runs = mlflow_runs(store)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["val_accuracy"] >= 0.95
    p = run.data.params
    assert (p["backend.name"], p["model.name"], p["dataset.name"], p["batch"], p["lr"]) == \
        ("gluon", "lenet", "digits", "32", "0.02")
    assert (p["derived.global_batch"], p["derived.effective_lr"], p["derived.devices"]) == ("32", "0.02", "cpu(0)")
    assert p["version.mxnet"] == "1.9.1" and p["version.python"].startswith("3.11")
    for name in EPOCH_METRICS:
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == list(range(1, 11)), name
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "throughput_samples_per_s"))
    # one number per run: the summary's params, not one-point metric charts; epochs is a param only
    assert p["epochs"] == "10" and p["summary.epochs_completed"] == "10" and "epochs" not in run.data.metrics
    accs = [m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
    assert float(p["summary.best_val_accuracy"]) == pytest.approx(max(accs), abs=1e-6)  # the best epoch's
    assert int(p["summary.best_epoch"]) == accs.index(max(accs)) + 1
    assert float(p["summary.throughput_samples_per_s"]) > 0 and "cost_usd" not in run.data.metrics  # no price
    assert not [k for k in run.data.metrics if k.startswith("summary.") or k in ("best_val_accuracy", "train_time_s")]
    # what ran and who ran it: MLflow's Source and User columns, the command as typed, git, dtype, hardware
    t = run.data.tags
    assert t["mlflow.source.name"] == "python -m xp" and t["mlflow.source.type"] == "LOCAL"
    assert t["xp.command"].startswith("python -m xp hydra.run.dir=") and t["mlflow.user"]
    assert len(t["mlflow.source.git.commit"]) == 40 and t["xp.git.dirty"] in ("true", "false")
    assert (t["xp.dtype"], t["xp.hardware"]) == ("float32", "local")
    # system metrics on a run shorter than their interval: sampled at its end at least
    assert client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert client.get_metric_history(run.info.run_id, "system/system_memory_usage_megabytes")[0].value > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    hydra = {a.path for a in client.list_artifacts(run.info.run_id, "hydra")}
    assert "xp.log" in artifacts and hydra == {"hydra/config.yaml", "hydra/overrides.yaml"}
    log_text = open(client.download_artifacts(run.info.run_id, "xp.log", str(tmp_path))).read()
    assert "epoch 10/10" in log_text


def test_module_and_gluon_backends_agree_within_one_point(tmp_path, store):
    """The same experiment on both backends: accuracy within 1 point, the same metric names."""
    for backend in ("gluon", "module"):
        proc = run_xp(tmp_path, store, f"backend={backend}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = mlflow_runs(store)
    gluon, module = runs
    assert (gluon.data.params["backend.name"], module.data.params["backend.name"]) == ("gluon", "module")
    assert module.data.metrics["val_accuracy"] >= 0.95
    assert abs(gluon.data.metrics["val_accuracy"] - module.data.metrics["val_accuracy"]) <= 0.01
    assert set(gluon.data.metrics) == set(module.data.metrics)


@pytest.mark.parametrize("backend", ["gluon", "module"])
def test_amp_trains_in_bfloat16_on_cpu(tmp_path, store, backend):
    """MXNet's AMP patches operators process-wide: tested in its own process. On a CPU without AVX-512 (an AMD
    EPYC of these machines) MKL-DNN has no bfloat16 kernels: one line before anything starts, not a failure in
    the first convolution."""
    from xp.mx.cpu import cpu_bfloat16

    proc = run_xp(tmp_path, store, "dtype=amp", f"backend={backend}", "epochs=5")
    if not cpu_bfloat16():
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        assert "dtype=amp on the CPU" in lines[0] and "need AVX-512" in lines[0] and mlflow_runs(store)[1] == []
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = mlflow_runs(store)[1][0]
    assert run.data.params["dtype.name"] == "amp" and run.data.metrics["val_accuracy"] > 0.93


def test_multirun_groups_children_under_one_parent(tmp_path, store):
    proc = run_xp(tmp_path, store, "epochs=2", "-m", "batch=16,32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = mlflow_runs(store)
    parents = [r for r in runs if r.data.tags.get("xp.sweep") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2 and len(runs) == 3
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.info.run_name for c in children) == ["batch=16", "batch=32"]  # named by what the sweep varies
    assert sorted(c.data.params["batch"] for c in children) == ["16", "32"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert "sweep: 2 runs under MLflow parent run " + parent.info.run_id in proc.stdout
    # its last lines say how to compare them: the report's command and the parent's page in the UI
    # with the environment's own python, as typed where the command ran (its checkout: .venv/bin/python)
    compare = next(line for line in proc.stdout.splitlines() if line.startswith("compare: "))
    program = compare.split()[1]
    assert (ROOT / program).resolve() == Path(sys.executable).resolve() and not Path(program).is_absolute(), compare
    assert f" -m xp.report --parent {parent.info.run_id} --tracking-uri '{store}'" in compare
    assert proc.stdout.splitlines()[-1].endswith(f"/#/experiments/{parent.info.experiment_id}/runs/"
                                                 f"{parent.info.run_id}?workflowType=machine_learning")
    # the UI link before it opens the view xp shared (an experiment tag MLflow's UI reads) as a table: the sweep's
    # runs only, the objective and what it varied as columns, best first
    import json

    key = f"xp-{parent.info.run_id}"
    assert f"#/experiments/{parent.info.experiment_id}/runs?viewStateShareKey={key}&compareRunsMode=TABLE&" \
           "workflowType=machine_learning" in proc.stdout.splitlines()[-2]
    client = mlflow_runs(store)[0]
    shared = json.loads(client.get_experiment(parent.info.experiment_id).tags[f"mlflow.sharedViewState.{key}"])
    assert shared["searchFilter"] == f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    assert shared["selectedColumns"] == ["metrics.`val_accuracy`", "params.`batch`"]
    assert shared["orderByKey"] == "metrics.`val_accuracy`" and shared["orderByAsc"] is False
    assert "compareRunCharts" not in shared  # (MLflow's parallel coordinates are unreadable: the report draws them)
    # the parent says what its children trained, and its best_val_accuracy means what a child's does
    assert (parent.data.tags["xp.backend"], parent.data.tags["xp.model"], parent.data.tags["xp.dataset"]) == \
        ("gluon", "lenet", "digits")
    bests = {c.info.run_id: float(c.data.params["summary.best_val_accuracy"]) for c in children}
    assert float(parent.data.params["summary.best_val_accuracy"]) == max(bests.values())
    assert parent.data.params["summary.best_run_id"] == max(bests, key=bests.get)
    assert parent.data.params["summary.runs"] == "2" and not parent.data.metrics


def test_more_gpus_than_visible_is_one_line_and_exit_2(tmp_path, store):
    proc = run_xp(tmp_path, store, "model=resnet152", "gpus=4", "-m", "batch=16,32")
    assert proc.returncode == 2
    assert_one_line_error(proc, "gpus=4", "4 GPUs asked for, 0 visible")
    _, runs = mlflow_runs(store)
    assert runs == []  # nothing started, so nothing left RUNNING


@pytest.mark.parametrize("args, fragments", [
    (["model=alexnet"], ["model=alexnet: no such model; did you mean model=lenet? valid: lenet, resnet152, resnet18, resnet50"]),
    (["dataset=imagenet"], ["dataset=imagenet: no such dataset; valid: caltech256, digits, digits_jpeg, folder, rec, "
                            "shapes, synthetic"]),  # shapes: the example package's (examples/xp-example)
    (["backend=nope"], ["backend=nope: no such backend"]),
    (["bach=3"], ["unknown key 'bach'; did you mean batch?"]),
    (["batch=0"], ["batch=0: must be an integer from 1"]),
    (["-m", "batch=16,-1"], ["batch=-1: must be an integer from 1"]),
    (["epochs=ten"], ["epochs='ten': must be an integer"]),
    (["batch=16,32"], ["add -m to run one experiment per value"]),
    (["lr=[1"], ["cannot parse the command line"]),
    (["dtype=float16"], ["dtype=float16: MXNet 1.9.1 has no float16 CPU kernels", "dtype=amp"]),
    (["kvstore=nccl"], ["kvstore=nccl: NCCL aggregates gradients between GPUs"]),
    (["kvstore=dist_sync", "workers=2", "launcher=ssh"], ["launcher=ssh: needs launcher.hosts_file=PATH"]),
    (["workers=2"], ["workers=2: several worker processes need a distributed kvstore"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, store, args, fragments):
    proc = run_xp(tmp_path, store, *args, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_line_error(proc, *fragments)
    assert mlflow_runs(store)[1] == []


def test_help_is_fast_and_imports_no_framework(tmp_path):
    code = ("import sys, xp.cli; rc = xp.cli.main(['--help']); "
            "heavy = [m for m in ('mxnet', 'gluoncv', 'mlflow') if m in sys.modules]; "
            "print('HEAVY', heavy); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "model: lenet, resnet152, resnet18, resnet50" in proc.stdout
    # what each group and key means, from conf/'s comments, and an example of each way to use xp
    from xp.confkeys import keys

    for k in keys(ROOT / "conf" / "config.yaml"):
        assert f"  {k.key + ('=' + k.default if k.default else ''):<30} {k.comment}".rstrip() in proc.stdout, k
    assert "  model      network architecture (default lenet)" in proc.stdout
    for example in ("python -m xp -m batch=16,32", "python -m xp -m sweep=lr_batch", "python -m xp.report --parent",
                    "make ui PORT="):
        assert example in proc.stdout
    assert "$MLFLOW_TRACKING_URI" in proc.stdout and "optuna.trial_id" not in proc.stdout  # (not a user's key)
    assert any(line.startswith("sweep: ") and "lr_batch" in line for line in proc.stdout.splitlines())
    # with a study chosen, the help's config shows the study itself, not only its name
    chosen = subprocess.run([sys.executable, "-m", "xp", "sweep=lr_batch", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert chosen.returncode == 0 and "study_name: lr_batch" in chosen.stdout, chosen.stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_ends_killed(tmp_path, store, sig, code):
    proc = subprocess.Popen(xp_args(tmp_path, "epochs=2000"), cwd=ROOT, env=xp_env(store),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "epoch    2/2000", timeout=120)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().startswith("xp: error: ")
    client, runs = mlflow_runs(store)
    assert [r.info.status for r in runs] == ["KILLED"]
    assert "xp.log" in {a.path for a in client.list_artifacts(runs[0].info.run_id)}


def test_failing_backend_ends_run_failed_with_one_line(tmp_path, store):
    plugins = install_test_plugins(tmp_path / "site")
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    proc = run_xp(tmp_path, store, "backend.name=failing", "epochs=1", env=env)
    assert proc.returncode == 1
    assert_one_line_error(proc, "training failed: RuntimeError: injected failure in step 2", "traceback in")
    client, runs = mlflow_runs(store)
    assert [r.info.status for r in runs] == ["FAILED"]
    log_text = open(client.download_artifacts(runs[0].info.run_id, "xp.log", str(tmp_path))).read()
    assert "Traceback" in log_text and "injected failure" in log_text


def test_broken_plugin_only_fails_when_selected(tmp_path, store):
    plugins = install_test_plugins(tmp_path / "site")
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    ok = run_xp(tmp_path, store, "epochs=1", env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = run_xp(tmp_path, store, "backend.name=broken", env=env)
    assert bad.returncode == 2
    assert_one_line_error(bad, "backend='broken': plugin xp_testplugins.broken:BrokenBackend failed to import")
    assert [r.info.status for r in mlflow_runs(store)[1]] == ["FINISHED"]


def test_failed_job_in_a_sweep_fails_the_parent(tmp_path, store):
    plugins = install_test_plugins(tmp_path / "site")
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    proc = run_xp(tmp_path, store, "epochs=1", "-m", "backend.name=gluon,failing", env=env)
    assert proc.returncode == 1
    assert "injected failure" in proc.stderr and "Traceback" not in proc.stderr
    _, runs = mlflow_runs(store)
    parent = [r for r in runs if r.data.tags.get("xp.sweep") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.status for r in parent] == ["FAILED"]
    assert [r.info.status for r in children] == ["FINISHED", "FAILED"]


def test_sweep_children_are_named_by_what_the_sweep_varies():
    from xp.multirun import swept_keys
    from xp.results import table

    assert swept_keys(["batch=16,32", "lr=0.1", "lr_steps=[6,9]", "x='a,b'", "momentum=range(0.5,0.9,0.1)",
                       "+wd=interval(0,1)", "epochs=3", "lr_decay=choice(0.1,0.5)"]) == \
        ["batch", "momentum", "wd", "lr_decay"]
    name = "trial 12: lr=0.018 batch=128 momentum=0.88 wd=0.0001 warmup_epochs=0.5 epochs=10"
    first = table([{"run": name}]).splitlines()[2]
    assert "trial 12: lr=0.018" in first and "epochs=10" in first  # a long name keeps its start and its end
