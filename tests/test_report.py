"""Reports from MLflow runs created here: tables, scaling arithmetic, files, plots, artifacts."""

import pytest
from mlflow.tracking import MlflowClient

from xp import report


def make_run(client, exp_id, parent=None, *, devices, throughput, acc, batch=16, lr=0.02, cost=0.01,
             hardware="p3.8xlarge", backend="gluon"):
    tags = {"mlflow.parentRunId": parent} if parent else {}
    run = client.create_run(exp_id, run_name=f"devices={devices}", tags=tags)
    rid = run.info.run_id
    for k, v in {"model.name": "resnet18", "backend.name": backend, "dataset.name": "digits", "dtype.name": "float32",
                 "hardware.name": hardware, "batch": batch, "derived.num_devices": devices, "derived.workers": 1,
                 "derived.global_batch": batch * devices, "derived.effective_lr": lr * devices}.items():
        client.log_param(rid, k, v)
    for k, v in {"val_accuracy": acc, "epochs": 2, "summary.epoch_time_s": 10.0 / devices,
                 "summary.throughput": throughput, "cost_usd": cost, "gpu_utilization": 80.0}.items():
        client.log_metric(rid, k, v)
    client.set_terminated(rid, "FINISHED")
    return rid


@pytest.fixture
def runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("xp", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp, run_name="sweep", tags={"xp.sweep": "true"}).info.run_id
    for n, t, a in ((1, 100.0, 0.90), (2, 190.0, 0.91), (4, 360.0, 0.92)):
        make_run(client, exp, parent, devices=n, throughput=t, acc=a)
    make_run(client, exp, devices=1, throughput=50.0, acc=0.5, hardware="p2.xlarge")  # outside the sweep
    client.set_terminated(parent, "FINISHED")
    return uri, client, exp, parent


def test_scaling_efficiency_arithmetic():
    rows = [{"model": "m", "backend": "b", "dataset": "d", "dtype": "f", "batch": 8, "infrastructure": "i",
             "devices": n, "throughput": t} for n, t in ((1, 100.0), (1, 110.0), (2, 190.0), (8, 600.0))]
    eff = {s["devices"]: s for s in report.scaling(rows)}
    assert eff[1]["throughput"] == 105.0 and eff[1]["efficiency"] == pytest.approx(1.0)  # median of two runs
    assert eff[2]["efficiency"] == pytest.approx(190 / 210) and eff[8]["ideal"] == pytest.approx(840)
    assert report.scaling([r for r in rows if r["devices"] != 1]) == []  # no single-device baseline: no claim


def test_report_for_a_sweep_writes_tables_plots_and_artifacts(runs, tmp_path):
    uri, client, exp, parent = runs
    out = tmp_path / "out"
    assert report.main(["--tracking-uri", uri, "--parent", parent, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.count("| p3.8xlarge | resnet18 | gluon |") == 3 and "p2.xlarge" not in md
    for line in ("| resnet18 | gluon | 16 | 2 | 190.0 | 200.0 | 95.0% |", "| resnet18 | gluon | 16 | 4 | 360.0 | 400.0 | 90.0% |"):
        assert line in md
    assert "| 0.9100 | 2 | 5.00 | 190.0 | 80% | $0.0100 |" in md
    from PIL import Image

    for name in ("scaling.png", "accuracy.png", "cost.png"):
        assert f"![{name[:-4]}]({name})" in md
        with Image.open(out / name) as img:
            assert img.size[0] >= 600 and img.size[1] >= 400
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/scaling.png"} <= logged


def test_backends_side_by_side(runs, tmp_path):
    """Runs that differ only in their backend are compared: medians, relative to the fastest."""
    uri, client, exp, parent = runs
    make_run(client, exp, parent, devices=2, throughput=250.0, acc=0.905, backend="torch")
    make_run(client, exp, parent, devices=2, throughput=230.0, acc=0.915, backend="torch")
    make_run(client, exp, parent, devices=8, throughput=900.0, acc=0.9, backend="torch")  # no partner: not compared
    out = tmp_path / "out"
    assert report.main(["--tracking-uri", uri, "--parent", parent, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    section = md.split("## Backends side by side")[1].split("##")[0]
    assert "| resnet18 | float32 | 16 | 2 | gluon | 1 | 190.0 | 79% | 0.9100 | 5.00 |" in section  # 190 / 240
    assert "| resnet18 | float32 | 16 | 2 | torch | 2 | 240.0 | 100% | 0.9100 | 5.00 |" in section  # medians of 2
    assert "| 8 |" not in section and "| 1 | gluon |" not in section and "| 4 | gluon |" not in section
    assert "![backends](backends.png)" in md and (out / "backends.png").stat().st_size > 5000


def test_report_of_an_experiment_logs_a_report_run(runs, tmp_path):
    uri, client, exp, _ = runs
    assert report.main(["--tracking-uri", uri, "--out", str(tmp_path / "all")]) == 0
    assert (tmp_path / "all" / "report.md").read_text().count("| resnet18 |") >= 4
    reports = client.search_runs([exp], "tags.`xp.report` = 'true'")
    assert len(reports) == 1 and reports[0].info.status == "FINISHED"


def test_report_bad_input_is_one_line(runs, tmp_path, capsys):
    uri = runs[0]
    assert report.main(["--tracking-uri", uri, "--experiment", "nope"]) == 2
    assert report.main(["--tracking-uri", uri, "--filter", "params.model.name = 'alexnet'"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xp.report: error: --experiment nope: no such experiment in {uri}",
                   f"xp.report: error: no finished xp runs match in experiment xp ({uri})"]
