"""Reports from MLflow runs created here: tables, scaling arithmetic, files, plots, artifacts."""

import pytest
from mlflow.tracking import MlflowClient

from xp.report import build as report


def make_run(client, exp_id, parent=None, *, devices, throughput, acc, batch=16, lr=0.02, cost=0.01,
             hardware="p3.8xlarge", backend="gluon", kind="gpu", price=12.24, seed=42, tags=None, old=False):
    """A run as xp logs it: settings and summary as params, val_accuracy per epoch (three epochs ending at
    `acc`). old=True: as xp logged before summary params (one-point metrics), which reports still read."""
    tags = {**({"mlflow.parentRunId": parent} if parent else {}), **(tags or {})}
    run = client.create_run(exp_id, run_name=f"devices={devices}", tags=tags)
    rid = run.info.run_id
    params = {"model.name": "resnet18", "backend.name": backend, "dataset.name": "digits", "dtype.name": "float32",
              "hardware.name": hardware, "batch": batch, "seed": seed, "derived.num_devices": devices,
              "derived.workers": 1, "derived.devices": ",".join(f"{kind}({i})" for i in range(devices)),
              "derived.global_batch": batch * devices, "derived.effective_lr": lr * devices,
              "derived.cost_per_hour": price}
    summary = {"epochs_completed": 3, "epoch_time_s": 10.0 / devices, "throughput_samples_per_s": throughput,
               "gpu_utilization_pct": 80.0, "best_val_accuracy": acc + 0.005}
    if cost is not None:
        summary["cost_usd"] = cost
    if old:
        for k, v in {"epochs": 3, "summary.epoch_time_s": 10.0 / devices, "summary.throughput": throughput,
                     "cost_usd": cost, "gpu_utilization": 80.0}.items():
            client.log_metric(rid, k, v)
    else:
        params.update({f"summary.{k}": v for k, v in summary.items()})
    for k, v in params.items():
        client.log_param(rid, k, v)
    for step, a in enumerate((acc - 0.01, acc + 0.005, acc), start=1):
        client.log_metric(rid, "val_accuracy", a, step=step)
    client.set_terminated(rid, "FINISHED")
    return rid


@pytest.fixture
def runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("xp", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp, run_name="sweep", tags={"xp.sweep": "true"}).info.run_id
    for n, t, a in ((1, 100.0, 0.90), (2, 190.0, 0.91), (4, 360.0, 0.92)):
        make_run(client, exp, parent, devices=n, throughput=t, acc=a, old=n == 4)  # one logged by an older xp
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
    assert "| GPUs | val acc (last epoch) | val acc (best epoch) |" in md
    two = [ln for ln in md.splitlines() if ln.startswith("| p3.8xlarge | resnet18 | gluon | 16 | 32 | 2 |")]
    assert len(two) == 1 and "| 0.9100 | 0.9150 | 3 | 5.00 | 190.0 | 80% | $0.0100 |" in two[0]
    assert "| 0.9200 | - | 3 | 2.50 | 360.0 | 80% | $0.0100 |" in md  # the older run: its metrics, read back
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
    assert "| resnet18 | float32 | 16 | 2 | - | 0.04 | gluon | 1 | 190.0 | 79% | 0.9100 | 5.00 |" in section  # 190/240
    assert "| resnet18 | float32 | 16 | 2 | - | 0.04 | torch | 2 | 240.0 | 100% | 0.9100 | 5.00 |" in section  # medians
    assert "| 8 |" not in section and "| 1 | gluon |" not in section and "| 4 | gluon |" not in section
    assert "![backends](backends.png)" in md and (out / "backends.png").stat().st_size > 5000


def test_backends_are_compared_like_with_like_or_the_report_says_what_differs(tmp_path):
    """A torch run beside gluon runs of other epochs or learning rates (a study's trials among them) is not
    their comparison: no side by side; a line names what differs."""
    uri, client, exp = _store(tmp_path)
    for lr, epochs in ((0.02, 3), (0.05, 10)):
        rid = make_run(client, exp, devices=1, throughput=100.0, acc=0.9, lr=lr)
        client.log_param(rid, "epochs", epochs)
    rid = make_run(client, exp, devices=1, throughput=120.0, acc=0.9, lr=0.02, backend="torch")
    client.log_param(rid, "epochs", 5)
    md = build(tmp_path, client, exp)
    assert "## Backends side by side" not in md
    assert "Backends side by side: not compared. The runs of gluon, torch differ in more than their backend " \
           "(epochs)" in md


def test_report_of_an_experiment_creates_no_run_and_logs_where_it_is_told(runs, tmp_path, capsys):
    """A whole experiment's report stays on disk (no top-level `report` run above the studies); --run logs it on
    the run it names; a run that is not there is one line."""
    uri, client, exp, _ = runs
    before = len(client.search_runs([exp]))
    assert report.main(["--tracking-uri", uri, "--out", str(tmp_path / "all")]) == 0
    assert (tmp_path / "all" / "report.md").read_text().count("| resnet18 |") >= 4
    assert len(client.search_runs([exp])) == before and "not logged to MLflow" in capsys.readouterr().out
    target = client.search_runs([exp])[0].info.run_id
    assert report.main(["--tracking-uri", uri, "--out", str(tmp_path / "all"), "--run", target]) == 0
    assert "report/report.md" in [f.path for f in client.list_artifacts(target, "report")]
    assert report.main(["--tracking-uri", uri, "--out", str(tmp_path / "all"), "--run", "f" * 32]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_report_bad_input_is_one_line(runs, tmp_path, capsys):
    uri = runs[0]
    assert report.main(["--tracking-uri", uri, "--experiment", "nope"]) == 2
    assert report.main(["--tracking-uri", uri, "--filter", "params.model.name = 'alexnet'"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xp.report: error: --experiment nope: no such experiment in {uri}",
                   f"xp.report: error: no finished xp runs match in experiment xp ({uri})"]


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("xp", artifact_location=(tmp_path / "art").as_uri())


def test_cpu_runs_without_a_price_say_so_and_draw_no_cost(tmp_path):
    """On CPU the devices column is not "GPUs"; without a price cost is "-" and there is no cost plot, but a note."""
    uri, client, exp = _store(tmp_path)
    for batch, t in ((16, 900.0), (64, 2500.0)):
        make_run(client, exp, devices=1, throughput=t, acc=0.9, batch=batch, kind="cpu", price=0.0, cost=None,
                 hardware="local")
    out = tmp_path / "out"
    assert report.main(["--tracking-uri", uri, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| CPU devices |" in md and "GPUs" not in md
    assert all(line.split("|")[13].strip() == "-" for line in md.splitlines() if line.startswith("| local |"))
    assert not (out / "cost.png").exists() and "Cost: no plot" in md
    assert "![throughput](throughput.png)" in md  # a batch sweep: throughput against batch


def test_repeated_seeds_show_median_and_spread(tmp_path):
    uri, client, exp = _store(tmp_path)
    for seed, acc, t in ((1, 0.90, 100.0), (2, 0.94, 120.0), (3, 0.92, 110.0)):
        make_run(client, exp, devices=1, throughput=t, acc=acc, seed=seed)
    make_run(client, exp, devices=1, throughput=200.0, acc=0.80, batch=64)  # another setting: no repeats
    md = build(tmp_path, client, exp)
    section = md.split("## Repeated settings")[1].split("##")[0]
    assert "| 3 | 1 2 3 | 0.9200 | 0.9000 - 0.9400 | 110.0 | 100.0 - 120.0 |" in section
    assert "| 64 |" not in section


def build(tmp_path, client, exp):
    runs = client.search_runs([exp])
    return report.build_report(runs, tmp_path / "out", "t", history=client.get_metric_history).read_text()


def test_a_study_report_shows_searched_params_states_optunas_plots_and_keeps_pruned_trials_apart(tmp_path):
    from xp.report import study

    uri, client, exp = _store(tmp_path)
    for n, (lr, state, acc) in enumerate(((0.1, "COMPLETE", 0.93), (0.01, "PRUNED", 0.41), (0.05, "COMPLETE", 0.95),
                                          (0.0123456, "COMPLETE", 0.90))):
        rid = make_run(client, exp, devices=1, throughput=100.0, acc=acc, lr=lr,
                       tags={"optuna.trial_number": str(n), "optuna.trial_state": state})
        client.log_param(rid, "lr", lr)
    parent = {"sweep.params.lr.type": "float", "sweep.params.lr.low": "0.001", "sweep.params.lr.high": "0.5",
              "sweep.params.lr.log": "True", "sweep.objectives": "[{'metric': 'val_accuracy', 'direction': 'maximize'}]"}
    md = report.build_report(client.search_runs([exp]), tmp_path / "out", "t", history=client.get_metric_history,
                             studies={None: study.StudyParent(params=parent)}).read_text()
    first = md.split("## Trials")[0]  # the runs table: the trial and what it searched, as columns
    assert "| trial | infrastructure |" in first and "| global batch | lr | GPUs |" in first
    assert "| 3 | p3.8xlarge | resnet18 | gluon | 16 | 16 | 0.01235 | 1 |" in first
    trials = md.split("## Trials")[1].split("### Pruned trials")[0]
    assert "Searched: lr. 3 complete, 1 pruned." in trials
    assert "| trial | state | lr |" in trials and "| 0 | COMPLETE | 0.1 | 0.9300 |" in trials
    assert "PRUNED" not in trials and "0.4100" not in first  # not in the main table either
    assert "| 1 | PRUNED | 0.01 | 0.4100 |" in md.split("### Pruned trials")[1]
    for name in ("optimization_history", "parallel_coordinate", "slice"):
        assert f"![study_{name}](study_{name}.png)" in md and (tmp_path / "out" / f"study_{name}.png").stat().st_size
    # importances of 3 trials would be noise (of 1: 1/3 each for 3 parameters): said, not drawn
    assert "- Optuna's param importances: not drawn (3 complete trial(s); it needs 5 to mean something)." in md
    assert not (tmp_path / "out" / "study_param_importances.png").exists()

    rows = [report.report_row(r) for r in client.search_runs([exp])]
    assert study.space(parent, rows, ["lr"])["lr"].log  # as the study file declared it
    inferred = study.space({}, rows, ["lr"])["lr"]  # given on the command line: from the values taken
    assert (inferred.low, inferred.high, inferred.log) == (0.01, 0.1, False)
    rebuilt = study.rebuild(parent, rows, ["lr"])
    assert [t.state.name for t in rebuilt.trials] == ["COMPLETE", "PRUNED", "COMPLETE", "COMPLETE"]
    assert rebuilt.best_trial.number == 2 and rebuilt.best_trial.params == {"lr": 0.05}


def test_the_accuracy_plots_median_of_repeats_takes_only_equal_settings():
    from xp.report.plots import _medians

    rows = [{"global_batch": 32, "val_accuracy": a, "settings": {"lr": lr, "seed": seed}}
            for lr, seed, a in ((0.1, 1, 0.9), (0.1, 2, 0.8), (0.2, 1, 0.1))]
    assert _medians(rows, "global_batch") == [(32, pytest.approx(0.85))]  # lr=0.2's run is not a repeat


def test_accuracy_axis_is_never_tighter_than_the_epoch_noise(tmp_path):
    from xp.report import plots

    rows = [{"model": "m", "global_batch": b, "lr": 0.1, "val_accuracy": a, "noise": 0.01, "settings": {"batch": b}}
            for b, a in ((16, 0.900), (32, 0.902))]
    files = []
    note = plots.accuracy_plot(rows, tmp_path, files)
    assert "widened" in note and files == [tmp_path / "accuracy.png"]
    rows[1]["val_accuracy"] = 0.99  # a difference larger than the noise: the axis is the data's
    assert "widened" not in plots.accuracy_plot(rows, tmp_path, [])


def test_logged_report_shows_its_plots_in_the_mlflow_ui_it_is_given(runs, tmp_path, monkeypatch):
    """MLflow's Markdown preview shows only images with absolute URLs: the logged report.md points at the UI
    given; without one, its links stay beside it (no port assumed); report.html holds its plots either way."""
    uri, client, exp, parent = runs
    out = tmp_path / "out"
    monkeypatch.delenv("XP_UI_URL", raising=False)
    assert report.main(["--tracking-uri", uri, "--parent", parent, "--out", str(out),
                        "--ui-url", "http://127.0.0.1:5055/"]) == 0
    logged = client.download_artifacts(parent, "report/report.md", str(tmp_path / "dl"))
    text = open(logged).read()
    assert f"![scaling](http://127.0.0.1:5055/get-artifact?path=report%2Fscaling.png&run_uuid={parent})" in text
    assert "![scaling](scaling.png)" in (out / "report.md").read_text()  # on disk: beside it
    assert report.main(["--tracking-uri", uri, "--parent", parent, "--out", str(out)]) == 0
    text = open(client.download_artifacts(parent, "report/report.md", str(tmp_path / "dl2"))).read()
    assert "![scaling](scaling.png)" in text and "http://" not in text
    assert "report.html shows them in MLflow's UI" in text.split("\n")[2]
    page = open(client.download_artifacts(parent, "report/report.html", str(tmp_path / "dl3"))).read()
    import base64

    inlined = base64.b64encode((out / "scaling.png").read_bytes()).decode()
    assert f'<img alt="scaling" src="data:image/png;base64,{inlined}"' in page and "<table>" in page


def test_a_sweeps_children_are_all_found_past_a_page_and_its_table_shows_the_best(store):
    """search_all pages through every run (search_runs answers at most max_results: a study of more trials than
    that was counted short); the table at a large sweep's end shows the best rows, best first."""
    from xp.readback.work import search_all
    from xp.tracking.stores import open_client
    from xp.results import best

    client = open_client(store)
    exp = client.create_experiment("paged")
    parent = client.create_run(exp).info.run_id
    for i in range(5):
        client.create_run(exp, tags={"mlflow.parentRunId": parent, "i": str(i)}, start_time=1000 + i)
    runs = search_all(client, [exp], f"tags.mlflow.parentRunId = '{parent}'", order_by=["attributes.start_time ASC"],
                      page=2)
    assert [r.data.tags["i"] for r in runs] == ["0", "1", "2", "3", "4"]
    rows = [{"run": "a", "best_val_accuracy": 0.5}, {"run": "b"}, {"run": "c", "best_val_accuracy": 0.9},
            {"run": "d", "best_val_accuracy": 0.7}]
    assert [r["run"] for r in best(rows, 3)] == ["c", "d", "a"]


def test_a_sweeps_table_counts_the_epochs_a_stopped_run_logged(tmp_path):
    """A run stopped (Ctrl-C) before its summary: the sweep's table shows the epochs it logged, not "-"."""
    from xp.readback.work import sweep_result

    uri, client, exp = _store(tmp_path)
    parent = client.create_run(exp, tags={"xp.sweep": "true"}).info.run_id
    rid = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    for step, acc in enumerate((0.5, 0.6, 0.7), start=1):
        client.log_metric(rid, "val_accuracy", acc, step=step)
    client.set_terminated(rid, "KILLED")
    [row] = sweep_result(uri=uri, experiment_id=exp, parent=parent, kind="sweep", params=[], metrics=["val_accuracy"])[
        "rows"]
    assert (row["epochs"], row["val_accuracy"], row["state"]) == (3, 0.7, "KILLED")
