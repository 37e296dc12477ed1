"""Optuna studies: spec checks, and end to end with pruning, resume, Pareto fronts, parallel trials."""

import os
import textwrap

import pytest
import yaml

from conftest import mlflow_client, mlflow_runs, run_xp, said, wait_for_line, xp_process
from xp.studies import study
from xp.studies import trial
from xp.studies import studyfile
from xp.errors import ConfigError

KNOWN = {"lr", "batch", "momentum", "wd", "warmup_epochs", "epochs"}


@pytest.fixture
def sweeps(tmp_path, monkeypatch):
    d = tmp_path / "sweeps"
    d.mkdir()
    monkeypatch.setattr(study, "SWEEPS_DIR", d)
    monkeypatch.setattr(studyfile, "SWEEPS_DIR", d)

    def write(name, text):
        (d / f"{name}.yaml").write_text(textwrap.dedent(text))
        return d
    return write


def test_every_shipped_study_is_valid():
    from conftest import compose_config
    from xp.run.plan import flatten

    known = set(flatten(compose_config()))
    assert {"lr_batch", "accuracy_throughput", "grid_lr_batch", "tpe_lr_batch"} <= set(study.names())
    # a recipe's steps (xp.recipes) add its search space to the command line: batch_ladder the batches, pretrain
    # the weights; here the parameter each adds stands in for what it finds (tests/test_recipes.py runs them)
    steps = {"batch_ladder": study.Param("batch", "categorical", choices=(16, 32)),
             "pretrain": study.Param("pretrained", "categorical", choices=("none",))}
    for name in study.names():
        raw = yaml.safe_load((study.SWEEPS_DIR / f"{name}.yaml").read_text())
        extra = tuple(p for key, p in steps.items() if raw.get(key) is not None)
        spec = study.spec_from(raw, name, known, extra=extra)
        assert spec.params and spec.objectives, name


@pytest.mark.parametrize("body, message", [
    ("params: {lrr: {type: float, low: 0.1, high: 1}}", "params.lrr: unknown parameter; did you mean lr?"),
    ("params: {batch: {type: categorical, choices: []}}", "params.batch: choices must be a non-empty list"),
    ("params: {lr: {type: float, low: 0.5, high: 0.1}}", "params.lr: low=0.5 > high=0.1"),
    ("params: {lr: {type: float, low: 0, high: 0.1, log: true}}", "params.lr: a log scale needs low > 0"),
    ("sampler: annealing\nparams: {lr: {type: float, low: 0.1, high: 1}}", "sampler='annealing': unknown; valid: tpe"),
    ("pruner: patient\nparams: {lr: {type: float, low: 0.1, high: 1}}", "pruner='patient': unknown; valid: none"),
    ("objectives: [{metric: val_accuracy, direction: maximize}, {metric: throughput, direction: maximize}]\n"
     "params: {lr: {type: float, low: 0.1, high: 1}}", "pruner=median: Optuna prunes single-objective studies only"),
    ("objectives: [{metric: accuracy, direction: up}]\nparams: {lr: {type: float, low: 0.1, high: 1}}",
     "objectives[0]="),
    ("sampler: grid\nparams: {lr: {type: float, low: 0.1, high: 1}}", "sampler=grid needs every parameter categorical"),
    ("n_trials: 0\nparams: {lr: {type: float, low: 0.1, high: 1}}", "n_trials=0: must be an integer >= 1"),
    ("trials: 5\nparams: {lr: {type: float, low: 0.1, high: 1}}", "unknown field(s) trials"),
    ("settings: epochs\nparams: {lr: {type: float, low: 0.1, high: 1}}", "settings='epochs': must be a list of KEY=VALUE"),
    ("claim: {kind: speed, figure: 1}\nparams: {lr: {type: float, low: 0.1, high: 1}}", "claim: needs kind (one of scaling"),
    ("claim: {kind: scaling}\nparams: {lr: {type: float, low: 0.1, high: 1}}", "claim: needs figure (the published"),
])
def test_bad_study_specs_are_one_line(sweeps, body, message):
    sweeps("bad", body)
    with pytest.raises(ConfigError) as e:
        study.load_spec("bad", KNOWN)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("sweeps/bad.yaml: ")


def test_unknown_study_lists_the_valid_ones(sweeps):
    sweeps("one", "params: {lr: {type: float, low: 0.1, high: 1}}")
    with pytest.raises(ConfigError, match=r"sweep=two: no such study in .*; valid: one"):
        study.load_spec("two", KNOWN)


def test_unreachable_storage_is_refused_before_anything_is_created():
    with pytest.raises(ConfigError, match=r"storage postgresql://xp@127.0.0.1:9/none: "):
        trial.check_storage("postgresql://xp@127.0.0.1:9/none")


def test_trials_of_a_dead_sweeper_are_retried_with_their_parameters_up_to_max_retry(tmp_path, sweeps):
    import time

    import optuna

    sweeps("hb", f"storage: sqlite:///{tmp_path}/hb.db\nheartbeat_s: 1\ngrace_s: 2\nmax_retry: 1\n"
                 "params: {lr: {type: float, low: 0.1, high: 1}}")
    spec = study.load_spec("hb", KNOWN)
    s = trial.open_study(spec)
    lost = s.ask(trial.distributions(spec))
    s._storage.record_heartbeat(lost._trial_id)  # a sweeper beat once, then died
    assert trial.retry_dead_trials(s, spec) == []  # still within grace_s
    time.sleep(3.2)
    assert trial.retry_dead_trials(s, spec) == ["trial 0 lost its sweeper (no heartbeat for 2 s): retried as trial 1 "
                                          "with the same parameters"]
    again = s.ask(trial.distributions(spec))  # the retry comes first
    assert again.number == 1 and again.params == lost.params
    with trial.heartbeat(s, [again]):  # a live sweeper's trial is not taken for a dead one
        time.sleep(3.2)
        assert trial.retry_dead_trials(s, spec) == []
    time.sleep(3.2)
    assert trial.retry_dead_trials(s, spec) == ["trial 1 lost its sweeper (no heartbeat for 2 s): failed, retry limit reached"]
    states = [t.state.name for t in optuna.load_study(study_name="hb", storage=spec.storage).get_trials()]
    assert states == ["FAIL", "FAIL"]
    assert trial._counts(s) == (1, 0)  # the retried trial 0 does not count, its retry does


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_resumed_study_proposes_new_parameters_not_its_first_ones_again(tmp_path, sweeps, sampler):
    """Two trials, then the same study opened again (a rerun with a larger budget): still in the sampler's random
    start-up phase, the next two trials must be new, not the first two replayed from the same seed."""
    from optuna.trial import TrialState

    sweeps("s", f"storage: sqlite:///{tmp_path}/s.db\nsampler: {sampler}\nsampler_seed: 0\n"
                "params: {lr: {type: float, low: 0.001, high: 0.1, log: true}, momentum: {type: float, low: 0.5, "
                "high: 0.95}}")
    spec = study.load_spec("s", KNOWN)

    def run(s, n):
        asked = []
        for _ in range(n):
            t = s.ask(trial.distributions(spec))
            s.tell(t, state=TrialState.COMPLETE, values=[t.params["momentum"]])
            asked.append(t.params)
        return asked

    first = run(trial.open_study(spec), 2)
    again = run(trial.open_study(spec), 2)  # resumed: the storage holds the first two
    assert not any(p in first for p in again)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    sweeps("s", f"storage: sqlite:///{fresh}/s.db\nsampler: {sampler}\nsampler_seed: 0\n"
                "params: {lr: {type: float, low: 0.001, high: 0.1, log: true}, momentum: {type: float, low: 0.5, "
                "high: 0.95}}")
    assert run(trial.open_study(study.load_spec("s", KNOWN)), 2) == first  # a new study: the seed reproduces


def test_heartbeat_settings_are_checked(sweeps):
    sweeps("hb", "heartbeat_s: 10\ngrace_s: 10\nparams: {lr: {type: float, low: 0.1, high: 1}}")
    with pytest.raises(ConfigError, match="grace_s=10 must be longer than heartbeat_s=10"):
        study.load_spec("hb", KNOWN)
    sweeps("hb", "max_retry: -1\nparams: {lr: {type: float, low: 0.1, high: 1}}")
    with pytest.raises(ConfigError, match=r"max_retry=-1: must be an integer >= 0"):
        study.load_spec("hb", KNOWN)


# --- end to end ---------------------------------------------------------------------

SMALL = """
    study_name: small
    n_trials: {n}
    sampler: {sampler}
    sampler_seed: 1
    pruner: {pruner}
    pruner_options: {{n_startup_trials: 2, n_warmup_steps: 1}}
    objectives: {objectives}
    params:
      lr: {{type: float, low: 0.0005, high: 0.3, log: true}}
      batch: {{type: categorical, choices: [16, 32, 128]}}
"""
ONE = "[{metric: val_accuracy, direction: maximize}]"
TWO = "[{metric: val_accuracy, direction: maximize}, {metric: throughput, direction: maximize}]"


def study_env(tmp_path, sweeps_dir):
    return {"XP_SWEEPS_DIR": str(sweeps_dir), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}


def load_trials(tmp_path, name="small"):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/optuna.db").get_trials()




@pytest.mark.mlflow_paths
@pytest.mark.slow
def test_study_prunes_tracks_and_resumes(tmp_path, store, sweeps):
    d = sweeps("small", SMALL.format(n=8, sampler="random", pruner="median", objectives=ONE))
    env = study_env(tmp_path, d)
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=5", env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
                  timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # neither the command nor its workers import MLflow: the tracking service does their MLflow work
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "mxnet" in imported and "optuna" in imported and not [m for m in imported if m.startswith("mlflow")]
    trials = load_trials(tmp_path)
    states = [t.state.name for t in trials]
    assert len(trials) == 8 and "PRUNED" in states and "COMPLETE" in states
    for t in trials:
        if t.state.name == "PRUNED":
            assert max(t.intermediate_values) < 5  # stopped before the last epoch
        assert "reused_from_trial" in t.user_attrs or t.user_attrs.get("mlflow_run_id")

    client, runs = mlflow_runs(store)
    parent = [r for r in runs if r.data.tags.get("xp.sweep") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and parent[0].data.tags["optuna.study"] == "small"
    assert {"best.lr", "best.batch"} <= set(parent[0].data.params)
    assert "best_trial.json" in {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    ran = [t for t in trials if "mlflow_run_id" in t.user_attrs]
    assert len(children) == len(ran)
    by_id = {c.info.run_id: c for c in children}
    for t in ran:
        c = by_id[t.user_attrs["mlflow_run_id"]]
        assert c.data.tags["optuna.trial_number"] == str(t.number)
        assert c.data.tags["optuna.trial_state"] == t.state.name and c.info.status == "FINISHED"
        assert int(c.data.params["summary.epochs_completed"]) == len(t.intermediate_values)  # the epochs it ran
        assert c.info.run_name == f"trial {t.number}: lr={t.params['lr']:.3g} batch={t.params['batch']}"

    # the same command continues the same study, up to a raised budget
    sweeps("small", SMALL.format(n=10, sampler="random", pruner="median", objectives=ONE))
    again = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=5", env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "8 trials done, 0 running elsewhere, 2 to run" in again.stdout
    assert len(load_trials(tmp_path)) == 10


@pytest.mark.slow
def test_a_study_on_a_journal_file_runs_on_slots_and_in_batches(tmp_path, store, sweeps):
    """sweep.storage=journal:///FILE (Optuna's JournalStorage, no database): the study's trials on slots, then
    the same study continued in batches (whose trials open the journal themselves)."""
    d = sweeps("small", SMALL.format(n=2, sampler="random", pruner="none", objectives=ONE))
    env = {"XP_SWEEPS_DIR": str(d), "XP_OPTUNA_STORAGE": f"journal:///{tmp_path}/optuna.log"}
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "sweep.n_trials=3", "sweep.scheduler=hydra",
                   env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 trials done, 0 running elsewhere, 1 to run" in again.stdout
    storage = trial.storage_of(env["XP_OPTUNA_STORAGE"])
    import optuna

    trials = optuna.load_study(study_name="small", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3 and all(len(t.intermediate_values) == 2 for t in trials)
    assert len([r for r in mlflow_runs(store)[1] if "optuna.trial_number" in r.data.tags]) == 3


@pytest.mark.slow
def test_a_study_in_batches_through_joblib_ends_its_process(tmp_path, store, sweeps):
    """sweep.scheduler=hydra with Hydra's joblib launcher: the process ends when the study does (xp's quick exit
    lets joblib end its executor before it waits for threads: it hung there once)."""
    d = sweeps("small", SMALL.format(n=2, sampler="random", pruner="none", objectives=ONE))
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=1", "sweep.scheduler=hydra", "hydra/launcher=joblib",
                  "hydra.launcher.n_jobs=2", env=study_env(tmp_path, d), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [t.state.name for t in load_trials(tmp_path)] == ["COMPLETE", "COMPLETE"]


@pytest.mark.slow
def test_multi_objective_study_in_parallel_saves_the_pareto_front(tmp_path, store, sweeps):
    d = sweeps("small", SMALL.format(n=4, sampler="nsga2", pruner="none", objectives=TWO))
    # tracking_uri= must win over $MLFLOW_TRACKING_URI everywhere, the study's summary included
    decoy = f"sqlite:///{tmp_path}/decoy.db"
    env = {**study_env(tmp_path, d), "MLFLOW_TRACKING_URI": decoy}
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "hydra/launcher=joblib",
                  "hydra.launcher.n_jobs=2", f"tracking_uri='{store}'", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = load_trials(tmp_path)
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" and len(t.values) == 2 for t in trials)
    assert "Pareto front: trial" in proc.stdout
    client, runs = mlflow_runs(store)
    parent = [r for r in runs if r.data.tags.get("xp.sweep") == "true"][0]
    import json

    front = json.load(open(client.download_artifacts(parent.info.run_id, "pareto_front.json", str(tmp_path))))
    assert front["best"] and set(front["best"][0]["values"]) == {"val_accuracy", "throughput"}
    assert parent.data.tags["optuna.study"] == "small"
    assert mlflow_runs(decoy)[1] == []
    # each Pareto member's model is registered and tagged so (no alias: there is no one best)
    versions = client.search_model_versions("name = 'small'")
    assert sorted(int(v.tags["trial"]) for v in versions) == sorted(f["trial"] for f in front["best"])
    assert all(v.tags["pareto"] == "true" and not v.aliases for v in versions)


@pytest.mark.slow
@pytest.mark.parametrize("body, args, message", [
    ("sampler: annealing\nparams: {lr: {type: float, low: 0.1, high: 1}}", [], "sampler='annealing': unknown"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["sweep.sampler=annealing"], "sampler='annealing': unknown"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["sweep.pruner=quartile"], "pruner='quartile': unknown"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["sweep.n_trials=many"],
     "sweep.n_trials=many: Value 'many' of type 'str' could not be converted to Integer"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["hydra.sweeper.n_trial=3"], "xp's studies have no field 'n_trial'"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["momentum=interval(0.9,0.5)"], "low 0.9 > high 0.5"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["batch=choice()"], "empty choice is not legal"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["wd=tag(log, interval(0,1))"], "a log scale needs low > 0"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["lrr=interval(0.1,1)"], "not a parameter xp knows; did you mean lr?"),
    ("storage: postgresql://xp@127.0.0.1:9/none\nparams: {lr: {type: float, low: 0.1, high: 1}}", [],
     "storage postgresql://xp@127.0.0.1:9/none"),
    ("params: {batch: {type: categorical, choices: [16, 4096]}}", [], "batch=4096: the global batch"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}", ["sweep.pruner=pareto"],
     "pruner=pareto compares two or more objectives; this study has one (val_accuracy)"),
    ("pruner: pareto\nobjectives: [{metric: val_accuracy, direction: maximize}, {metric: train_time_s, direction: "
     "minimize}]\nparams: {lr: {type: float, low: 0.1, high: 1}}", [],
     "pruner=pareto needs each objective every epoch; train_time_s is known only at a run's end"),
    ("params: {lr: {type: float, low: 0.1, high: 1}}\nobjectives: " + TWO, ["sweep.pruner=median"],
     "Optuna prunes single-objective studies only; with 2 objectives use pruner: pareto"),
])
def test_bad_study_on_the_command_line(tmp_path, store, sweeps, body, args, message):
    d = sweeps("bad", body)
    env = study_env(tmp_path, d)
    env.pop("XP_OPTUNA_STORAGE") if "storage:" in body else None
    proc = run_xp(tmp_path, store, "-m", "sweep=bad", *args, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and message in err and "Traceback" not in proc.stdout + err
    assert mlflow_runs(store)[1] == []
    if os.path.exists(tmp_path / "optuna.db"):
        import optuna

        assert optuna.study.get_all_study_summaries(f"sqlite:///{tmp_path}/optuna.db") == []


@pytest.mark.slow
def test_a_study_takes_its_settings_and_search_space_from_the_command_line(tmp_path, store, sweeps):
    d = sweeps("small", "n_trials: 20\nparams: {batch: {type: categorical, choices: [16, 32]}}")
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "sweep.n_trials=3", "sweep.sampler=random",
                  "sweep.pruner=none", "hydra.sweeper.max_retry=1", "lr=tag(log, interval(0.001,0.1))",
                  "momentum=0.5,0.9", env=study_env(tmp_path, d), timeout=600)  # (lr 0.29, momentum 0.9: LeNet diverged)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hydra.sweeper.max_retry=1: xp's studies are the config group sweep: taken as sweep.max_retry=1" in \
        proc.stdout + proc.stderr
    trials = load_trials(tmp_path)
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)  # sweep.n_trials, not the file's 20
    for t in trials:  # the file's space and the command line's, mixed
        assert set(t.params) == {"batch", "lr", "momentum"}
        assert t.params["batch"] in (16, 32) and 0.001 <= t.params["lr"] <= 0.1 and t.params["momentum"] in (0.5, 0.9)
        assert t.distributions["lr"].log
    _, runs = mlflow_runs(store)
    names = sorted(r.info.run_name for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert names == sorted(f"trial {t.number}: batch={t.params['batch']} lr={t.params['lr']:.3g} "
                           f"momentum={t.params['momentum']}" for t in trials)


@pytest.mark.mlflow_paths
@pytest.mark.slow
def test_a_killed_sweep_is_continued_by_the_next_one_retrying_the_lost_trial(tmp_path, store, sweeps):
    import time

    d = sweeps("small", SMALL.format(n=2, sampler="random", pruner="none", objectives=ONE)
               + "    heartbeat_s: 1\n    grace_s: 3\n    parallel: 1\n")  # one slot: the trial killed, and its next
    env = study_env(tmp_path, d)
    with xp_process(tmp_path, store, "-m", "sweep=small", "epochs=400", env=env) as proc:
        wait_for_line(proc, "epoch   2/400", timeout=180)  # trial 0 is training
        proc.kill()  # SIGKILL: the sweeper and its in-process trial die without a word
        proc.wait(timeout=30)
    lost = load_trials(tmp_path)
    assert [t.state.name for t in lost] == ["RUNNING", "RUNNING"]  # trial 0, and trial 1 its worker held next
    time.sleep(4)
    again = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "sweep.continue_changed=true", env=env,
                   timeout=600)  # (its lost trials retried in 2 epochs, on the user's word)
    assert again.returncode == 0, again.stderr[-3000:]
    for n, retry in ((0, 2), (1, 3)):
        assert (f"trial {n} lost its sweeper (no heartbeat for 3 s): retried as trial {retry} with the same "
                "parameters") in again.stdout + again.stderr
    trials = load_trials(tmp_path)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    for n, retry in ((0, 2), (1, 3)):
        assert trials[retry].params == lost[n].params and trials[retry].system_attrs["failed_trial"] == n
    client, runs = mlflow_runs(store)
    status = {r.info.run_id: r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert status[trials[0].user_attrs["mlflow_run_id"]] == "FAILED"  # the killed trial's run was ended
    assert "mlflow_run_id" not in trials[1].user_attrs  # held, never started: no run
    assert [status[trials[n].user_attrs["mlflow_run_id"]] for n in (2, 3)] == ["FINISHED", "FINISHED"]
    assert "RUNNING" not in status.values()


@pytest.mark.slow
def test_a_users_own_config_directory_adds_models_hardware_and_studies(tmp_path, store):
    """--config-dir (and hydra.searchpath) put a user's options beside xp's: listed by --help, validated like
    xp's own, and a study there runs as a study."""
    mine = tmp_path / "myconf"
    for group, name, text in (("model", "mynet", "name: mynet\nzoo: xp\narch: lenet\ndropout: 0.0\n"),
                              ("hardware", "myhw", "name: myhw\ngpus: null\nprice_per_hour: 1.5\n"),
                              ("dataset", "fives", "name: digits\nval_fraction: 0.2\nclasses: [5, 6]\n"),
                              ("sweep", "mystudy", "n_trials: 2\nsampler: random\npruner: none\n"
                                                   "params: {lr: {type: float, low: 0.01, high: 0.1}}\n")):
        (mine / group).mkdir(parents=True)
        (mine / group / f"{name}.yaml").write_text(text)
    env = {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}
    help_text = run_xp(tmp_path, store, "--config-dir", str(mine), "--help", env=env).stdout
    assert "mynet" in help_text and "myhw" in help_text and "fives" in help_text and "mystudy" in help_text
    bad = run_xp(tmp_path, store, "--config-dir", str(mine), "model=mynett", env=env)
    assert bad.returncode == 2 and "model=mynett: no such model; did you mean model=mynet? valid: lenet, mynet," in bad.stderr
    proc = run_xp(tmp_path, store, f"hydra.searchpath=[file://{mine}]", "model=mynet", "hardware=myhw",
                  "dataset=fives", "epochs=1", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = mlflow_runs(store)[1][0]
    assert run.data.params["model.name"] == "mynet" and run.data.params["hardware.name"] == "myhw"
    assert run.data.params["dataset.classes"] == "[5, 6]" and run.data.params["derived.num_classes"] == "2"
    proc = run_xp(tmp_path, store, "--config-dir", str(mine), "-m", "sweep=mystudy", "epochs=1", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = load_trials(tmp_path, "mystudy")
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" and 0.01 <= t.params["lr"] <= 0.1 for t in trials)


@pytest.mark.parametrize("overrides, arguments, composed_again", [
    (["sweep=lr_batch", "epochs=2", "model=lenet", "sweep.n_trials=3"], None, False),
    (["sweep=lr_batch", "epochs=2", "lr=interval(0.01,0.1)"], ["sweep=lr_batch", "epochs=2"], True),
])
def test_the_config_shipped_to_a_studys_workers_is_the_trials_composed_base(monkeypatch, overrides, arguments,
                                                                          composed_again):
    """Without a search space on the command line the workers get the config Hydra composed for the sweep (no
    second composition); with one, a composition of the other overrides. Either way: what compose() gives."""
    import hydra
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from xp import shipped
    from xp.studies.sweeper import _base_config

    studyfile.register()
    arguments = overrides if arguments is None else arguments
    with initialize_config_dir(str(shipped("conf")), version_base="1.3", job_name="xp"):
        swept = GlobalHydra.instance().hydra.compose_config("config", overrides, run_mode=RunMode.MULTIRUN)
        expected = OmegaConf.to_container(compose("config", overrides=arguments))
        calls = []
        monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(a) or compose(*a, **k))
        got = _base_config(swept, arguments, [])
    assert got == expected and "hydra" not in got
    assert bool(calls) == composed_again


def test_new_sqlite_stores_start_as_copies_of_an_empty_schema_and_work_as_the_libraries_own(tmp_path, monkeypatch):
    """A new Optuna or MLflow SQLite file is a copy of a template made once per library version in xp's cache;
    the copy works as a store the library made itself (a study created and told, a run logged), holds nothing of
    another store, and a template that cannot be made leaves the library to create the schema."""
    import optuna
    from xp import storefiles
    from xp.tracking import stores

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for n in (1, 2):  # the first makes the templates, the second copies them
        optuna_db, mlflow_db = tmp_path / f"optuna{n}.db", tmp_path / f"mlflow{n}.db"
        storefiles.optuna_schema(optuna_db)
        stores._mlflow_schema(mlflow_db)
        study = optuna.create_study(study_name=f"s{n}", storage=f"sqlite:///{optuna_db}")
        study.tell(study.ask(), 1.0)
        assert [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{optuna_db}")] == [f"s{n}"]
        client = mlflow_client(f"sqlite:///{mlflow_db}")
        run = client.create_run(client.create_experiment(f"e{n}"))
        client.log_metric(run.info.run_id, "m", 1.0)
        assert [e.name for e in client.search_experiments()] == [f"e{n}", "Default"]
    assert sorted(p.name for p in (tmp_path / "cache" / "xp").iterdir()) == [
        f"mlflow-{__import__('mlflow').__version__}-wal-schema.db", f"optuna-{optuna.__version__}-schema.db"]
    broken = tmp_path / "broken.db"
    storefiles.schema_from_template(broken, "nothing", lambda url: 1 / 0)
    assert not broken.exists() and not list((tmp_path / "cache" / "xp").glob("nothing*"))


def test_a_proposal_is_checked_against_one_read_of_the_study_so_a_trial_ending_meanwhile_is_not_missed():
    """Another sweeper's trial with the same parameters ends while this sweeper checks its proposal: it is seen
    running (the proposal is dropped) or ended (its result reused), never missed in between (run twice)."""
    import optuna

    from xp.studies.proposals import propose

    dists = {"batch": optuna.distributions.CategoricalDistribution([16, 32])}
    s = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    s.enqueue_trial({"batch": 16})
    elsewhere = s.ask(dists)  # running in another sweeper
    s.enqueue_trial({"batch": 16})  # ... and proposed here too
    reads = s.get_trials

    def read_then_it_ends(*args, **kwargs):
        got = reads(*args, **kwargs)
        if elsewhere.number in [t.number for t in reads(deepcopy=False, states=[optuna.trial.TrialState.RUNNING])]:
            s.tell(elsewhere, 0.9)  # it ends just after this sweeper's read
        return got

    s.get_trials = read_then_it_ends
    trials, reused = propose(s, dists, 1)
    assert all(t.params != {"batch": 16} for t in trials), [t.params for t in trials]
    assert s.trials[1].user_attrs.get("duplicate_of") == 0 or s.trials[1].user_attrs.get("reused_from_trial") == 0


@pytest.mark.slow
def test_the_scale_benchmark_in_small(tmp_path):
    """benchmarks/study_scale.py as CI runs it (its figures are a quiet machine's, in benchmarks/README.md): 24
    sleeping trials on 4 slots, every one a complete xp run with its MLflow child run, beside Optuna's own loop;
    the finished study resumed with 2 more trials (the first new one's run found) and reported; and its PBT way:
    4 members of a third party's backend, 4 intervals each, every interval an xp run from its commit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "figures.json"
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "study_scale.py"), "--trials", "24", "--slots", "4",
                        "--storage", "journal", "--resume-more", "2", "--ways", "xp,bare,xp-pbt", "--interval", "1",
                        "--out", str(out)],
                       cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, said(r)
    xp_way, bare, pbt = json.loads(out.read_text())
    assert xp_way["way"] == "xp" and xp_way["runs"] == 24 and 0 < xp_way["wall_s"] and xp_way["peak_workers"] == 4
    assert 0 <= xp_way["pruned"] < 24 and xp_way["resume_first_trial_s"] > 0 and xp_way["report_s"] > 0
    assert bare["way"] == "bare" and bare["runs"] == 24
    assert pbt["way"] == "xp-pbt" and pbt["runs"] == 16 and 0 <= pbt["exploits"] <= 12, pbt


# --- a study is one question ------------------------------------------------------

def test_the_command_line_wins_over_the_search_space():
    """batch=32 on the command line takes batch out of the search (Hydra's rule); a sweep of it (batch=16,32) and
    the study's own fields do not; every searched key fixed is one line."""
    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
                                       "batch": {"type": "categorical", "choices": [16, 32]}}}, "q", KNOWN,
                           overrides=["epochs=2", "batch=32", "sweep.n_trials=3", "+hydra.x=1"])
    assert [p.name for p in spec.params] == ["lr"] and spec.fixed == ("batch=32",)
    swept = study.spec_from({"params": {"batch": {"type": "categorical", "choices": [16, 32]}}}, "q", KNOWN,
                            overrides=["batch=16,32", "lr=interval(0.1,1)"])
    assert [p.name for p in swept.params] == ["batch"] and swept.fixed == ()
    with pytest.raises(ConfigError, match=r"every parameter it searches is fixed on the command line \(batch=32\)"):
        study.spec_from({"params": {"batch": {"type": "categorical", "choices": [16, 32]}}}, "q", KNOWN,
                        overrides=["batch=32"])


def test_every_key_of_conf_declares_whether_it_is_part_of_a_studys_question():
    """Each key of conf/ says, where it is defined, whether it can change a trial's result (xp.confkeys.QUESTION):
    a key added without it fails here; a condition names a key that exists."""
    from xp.confkeys import TAG, questions
    from xp.preflight import CONF_DIR

    declared = questions(CONF_DIR)
    assert len(declared) > 100
    unclassified = sorted(k for k, v in declared.items() if not v or not TAG.fullmatch(f"[{v}]"))
    assert not unclassified, f"keys of conf/ that do not say whether they are part of a study's question: " \
                             f"{unclassified} (end the comment with [result], [measured], [how] or [result if KEY])"
    named = {v.split(" if ", 1)[1].partition("=")[0] for v in declared.values() if " if " in v}
    assert named and named <= set(declared), named - set(declared)


@pytest.mark.parametrize("setting", ["target_accuracy=0.9", "diagnose_steps=10", "auto_batch_memory_mb=100",
                                     "timing_warmup_batches=5", "pricing=spot", "data_nthreads=2",
                                     "model.log=none", "checkpoint.keep_last=1"])
def test_a_setting_that_cannot_change_a_result_is_not_the_question(setting):
    """Each of these, on a study made without it, was refused as 'its answer would mix both' (diagnose off, batch
    searched, local hardware's price 0, the digits in memory): none changes what a trial trains or measures."""
    from conftest import compose_config
    from xp.studies import question

    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
                                       "batch": {"type": "categorical", "choices": [16, 32]}}}, "q", KNOWN)
    assert question.differences(question.question_of(compose_config(), spec),
                                question.question_of(compose_config(setting), spec)) == {}


@pytest.mark.parametrize("setting, objective", [
    ("epochs=2", "val_accuracy"), ("backend=torch", "val_accuracy"), ("model=resnet18", "val_accuracy"),
    ("dataset=synthetic", "val_accuracy"), ("dtype=float16", "val_accuracy"), ("momentum=0.5", "val_accuracy"),
    ("timing_warmup_batches=5", "throughput"), ("data_nthreads=2 dataset=digits_jpeg", "val_accuracy"),
    ("diagnose=true diagnose_steps=10", "val_accuracy"), ("batch=auto auto_batch_memory_mb=100", "val_accuracy")])
def test_a_setting_that_can_change_a_result_still_asks_another_question(setting, objective):
    """The refusals that are right stay: what a trial trains, and what is measured where an objective is
    measured; a conditional key counts while its condition holds."""
    from conftest import compose_config
    from xp.studies import question

    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
                            "objectives": [{"metric": objective, "direction": "maximize"}]}, "q", KNOWN)
    *before, last = setting.split()
    assert question.differences(question.question_of(compose_config(*before), spec),
                                question.question_of(compose_config(*before, last), spec)), setting


def test_a_studys_question_holds_what_changes_a_result_and_names_each_difference():
    from xp.studies import question

    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}}, "q", KNOWN)
    config = {"epochs": 1, "batch": 32, "lr": 0.02, "model": {"name": "lenet"}, "launcher": {"name": "local"},
              "tracking_uri": "sqlite:///a.db", "sweep": {"n_trials": 3}, "checkpoint": {"keep_last": 2}}
    q = question.question_of(config, spec)
    assert q["epochs"] == "1" and q["model.name"] == '"lenet"' and q["space.lr"] == "float[0.001, 0.1] log"
    assert "lr" not in q and not [k for k in q if k.startswith(("launcher", "tracking_uri", "sweep", "checkpoint"))]
    where = {**config, "launcher": {"name": "ssh"}, "tracking_uri": "http://h:5000", "sweep": {"n_trials": 30}}
    assert question.differences(q, question.question_of(where, spec)) == {}  # where it runs is not the question
    other = question.question_of({**config, "epochs": 2, "model": {"name": "resnet18"}}, spec)
    assert question.differences(q, other) == {"epochs": ("1", "2"), "model.name": ('"lenet"', '"resnet18"')}
    # a key only one side has (a newer xp's) is no change; one searched on one side and fixed on the other is
    assert question.differences(q, {**q, "new_key": "1"}) == {}
    fixed = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
                                        "batch": {"type": "categorical", "choices": [16, 32]}}}, "q", KNOWN)
    assert question.differences(question.question_of(config, fixed), q) == {"batch": (None, "32")}
    line = str(question.refusal(spec, question.differences(q, other), 3))
    assert "epochs: 1 in the study, 2 in this command" in line and "sweep.study_name=" in line
    assert "sweep.continue_changed=true" in line and "\n" not in line


def test_a_study_records_its_question_refuses_another_and_records_a_change_the_user_asked_for():
    import optuna

    from xp.studies import question

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1}}}, "q", KNOWN)
    s = optuna.create_study(direction="maximize")
    s.add_trial(optuna.trial.create_trial(params={"lr": 0.01}, distributions=trial.distributions(spec), value=0.5))
    q1, q2 = {"epochs": "1", "space.lr": "x"}, {"epochs": "2", "space.lr": "x"}
    # a study made before xp recorded its question: recorded now, said once
    assert "recorded now" in question.settle(s, spec, q1)[0] and s.user_attrs[question.QUESTION] == q1
    assert question.settle(s, spec, q1) == []  # the same question: nothing to say
    with pytest.raises(ConfigError, match="epochs: 1 in the study, 2 in this command"):
        question.settle(s, spec, q2)
    assert s.user_attrs[question.QUESTION] == q1 and question.CHANGES not in s.user_attrs
    import dataclasses

    said = question.settle(s, dataclasses.replace(spec, continue_changed=True), q2)
    assert "continued under changed settings, as asked" in said[0] and "epochs: 1 before, 2 now" in said[0]
    assert s.user_attrs[question.QUESTION] == q2
    [change] = s.user_attrs[question.CHANGES]
    assert change["changed"] == {"epochs": ["1", "2"]} and change["trials_before"] == 1
    assert "after 1 trials under changed settings (epochs: 1 before, 2 now)" in question.changes_said(s)[0]


def test_the_preflights_question_is_the_one_the_sweeper_would_compute_from_hydras_config():
    """The preflight records the question from its own composition; a command whose config tree xp does not
    compose (--config-path) computes it from Hydra's: the two must agree, or such a command would be refused."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from xp import shipped
    from xp.studies import question
    from xp.studies.compose import plain
    from xp.studies.compose import job_config

    studyfile.register()
    overrides = ["sweep=lr_batch", "epochs=2", "model=resnet18", "batch=32"]
    with initialize_config_dir(str(shipped("conf")), version_base="1.3", job_name="xp"):
        swept = GlobalHydra.instance().hydra.compose_config("config", overrides, run_mode=RunMode.MULTIRUN)
        composed = plain(compose("config", overrides=overrides))
    spec = study.spec_from(composed["sweep"], "lr_batch", overrides=overrides)
    assert question.question_of(composed, spec) == question.question_of(job_config(swept), spec)


@pytest.mark.slow
def test_a_study_reached_with_other_settings_is_refused_in_one_line_and_continued_only_on_the_users_word(
        tmp_path, store, sweeps):
    import optuna

    from xp.studies import question

    d = sweeps("small", SMALL.format(n=2, sampler="random", pruner="none", objectives=ONE))
    env = study_env(tmp_path, d)
    first = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=1", env=env, timeout=300)
    assert first.returncode == 0, said(first)
    parents = lambda: [r for r in mlflow_runs(store)[1] if r.data.tags.get("xp.sweep") == "true"]  # noqa: E731
    # the parent run names the best trial and links its model; the model links its registered version
    [parent] = parents()
    s = optuna.load_study(study_name="small", storage=env["XP_OPTUNA_STORAGE"])
    best = s.best_trial
    tags = parent.data.tags
    assert tags["xp.best_trial"] == str(best.number) and tags["xp.best_run_id"] == best.user_attrs["mlflow_run_id"]
    client = mlflow_runs(store)[0]
    version = client.get_model_version_by_alias("small", "best")  # (its number: in the order the trials ended)
    assert version.tags["trial"] == str(best.number) and version.run_id == best.user_attrs["mlflow_run_id"]
    assert f"**trial {best.number}**" in tags["mlflow.note.content"]
    assert f"models:/small/{version.version}" in tags["mlflow.note.content"]
    assert tags["xp.best_model"] == f"models:/small/{version.version}"
    model_id = version.model_id or version.source.split("/", 1)[1].lstrip("/")
    assert json_of(client.get_logged_model(model_id).tags["mlflow.modelVersions"]) == [
        {"name": "small", "version": int(version.version)}]

    refused = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "sweep.n_trials=3", env=env, timeout=300)
    assert refused.returncode == 2, said(refused)
    err = refused.stderr.strip()
    assert "\n" not in err and "epochs: 1 in the study, 2 in this command" in err and "Traceback" not in err
    assert "sweep.study_name=" in err and "sweep.continue_changed=true" in err
    assert len(load_trials(tmp_path)) == 2 and len(parents()) == 1  # nothing ran, no parent run was made

    again = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=2", "sweep.n_trials=3", "sweep.continue_changed=true",
                   env=env, timeout=300)
    assert again.returncode == 0, said(again)
    assert "continued under changed settings, as asked" in again.stdout + again.stderr
    s = optuna.load_study(study_name="small", storage=env["XP_OPTUNA_STORAGE"])
    assert [c["changed"] for c in s.user_attrs[question.CHANGES]] == [{"epochs": ["1", "2"]}]
    assert len(s.trials) == 3 and len(s.trials[2].intermediate_values) == 2
    latest = max(parents(), key=lambda r: r.info.start_time)
    assert "under changed settings (epochs: 1 before, 2 now)" in latest.data.tags["mlflow.note.content"]
    # the report of the second command's parent covers the whole study, and says it is not one question
    from xp.report import build

    assert build.main(["--tracking-uri", store, "--parent", latest.info.run_id, "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Searched: batch, lr. 3 complete, 0 pruned." in md and "Its trials were run by 2 commands" in md
    assert "**Not one question**: the study was continued at" in md and "(epochs: 1 before, 2 now)" in md


@pytest.mark.slow
def test_a_searched_key_fixed_on_the_command_line_is_fixed_in_every_trial(tmp_path, store, sweeps):
    d = sweeps("small", SMALL.format(n=3, sampler="random", pruner="none", objectives=ONE))
    proc = run_xp(tmp_path, store, "-m", "sweep=small", "epochs=1", "batch=32", env=study_env(tmp_path, d),
                  timeout=300)
    assert proc.returncode == 0, said(proc)
    assert "study small: batch=32 fixed on the command line: not searched; it searches lr" in proc.stdout
    trials = load_trials(tmp_path)
    assert len(trials) == 3 and all(set(t.params) == {"lr"} for t in trials)
    runs = [r for r in mlflow_runs(store)[1] if "optuna.trial_number" in r.data.tags]
    assert len(runs) == 3 and {r.data.params["batch"] for r in runs} == {"32"}


def json_of(text):
    import json

    return json.loads(text)


def test_a_confirmed_best_says_its_spread_and_whether_the_top_two_are_within_noise():
    from xp.answers import Answer
    from xp.studies.confirm import Confirmed, verdict, within_noise

    def said(confirmed, metric):
        return Answer("s", "", [{"metric": metric, "direction": "maximize"}], [], verdict=verdict(confirmed),
                      confirmed=[{"trial": c.trial, "values": c.values, "mean": c.mean,
                                  "std": c.std if len(c.values) > 1 else None} for c in confirmed]
                      ).confirmation_lines()

    a, b = Confirmed(3, {}, [0.90, 0.92, 0.91]), Confirmed(5, {}, [0.89, 0.93, 0.90])
    close, diff, bar = within_noise(a, b)
    assert close and diff == pytest.approx(0.0033, abs=1e-4) and bar > diff
    far = Confirmed(7, {}, [0.70, 0.71, 0.69])
    assert not within_noise(a, far)[0]
    lines = said([a, far], "val_accuracy")
    assert lines[0] == "confirmed across seeds: best by mean is trial 3: val_accuracy 0.9100 +- 0.0100 (std), " \
                       "0.9000 - 0.9200 over 3 seeds"
    assert "the top two (trials 3 and 7) are apart" in lines[-1]
    assert "within each other's noise" in said([a, b], "val_accuracy")[-1]


@pytest.mark.slow
def test_sweep_confirm_retrains_the_best_trials_with_other_seeds_and_answers_by_the_mean(tmp_path, store, sweeps):
    import json

    import optuna

    d = sweeps("small", SMALL.format(n=3, sampler="random", pruner="none", objectives=ONE))
    env = study_env(tmp_path, d)
    args = ("-m", "sweep=small", "epochs=1", "sweep.confirm=2", "sweep.confirm_top=2")
    proc = run_xp(tmp_path, store, *args, env=env, timeout=600)
    assert proc.returncode == 0, said(proc)
    out = proc.stdout + proc.stderr
    assert "its 2 best trials retrained with 2 other seeds each (small.confirm: 4 runs to go)" in out
    confirming = optuna.load_study(study_name="small.confirm", storage=env["XP_OPTUNA_STORAGE"])
    assert sorted(t.params["seed"] for t in confirming.trials) == [43, 43, 44, 44]
    assert all(t.state.name == "COMPLETE" for t in confirming.trials)
    assert "confirmed across seeds: best by mean is trial" in out and "over 3 seeds" in out
    client, runs = mlflow_runs(store)
    parent = next(r for r in runs if r.data.tags.get("xp.sweep") == "true")
    summary = json.load(open(client.download_artifacts(parent.info.run_id, "best_trial.json", str(tmp_path))))
    best = summary["confirmed"][0]
    assert len(best["values"]) == 3 and best["mean"] == pytest.approx(sum(best["values"]) / 3)
    assert summary["best"][0]["trial"] == best["trial"]  # the study's answer: the best by mean
    assert parent.data.tags["xp.best_trial"] == str(best["trial"])
    assert "confirmed across seeds" in parent.data.tags["mlflow.note.content"]
    seeds = sorted(r.data.params["seed"] for r in runs if r.data.tags.get("optuna.study") == "small.confirm")
    assert seeds == ["43", "43", "44", "44"]
    from xp.report import build

    assert build.main(["--tracking-uri", store, "--parent", parent.info.run_id, "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    section = md.split("### The best, confirmed across seeds")[1].split("## ")[0]
    assert f"| {best['trial']} |" in section and "| 42 43 44 | 3 |" in section and "top two by mean" in section

    again = run_xp(tmp_path, store, *args, env=env, timeout=600)  # done: nothing runs again
    assert again.returncode == 0, said(again)
    assert "runs to go" not in again.stdout + again.stderr and len(confirming.trials) == 4
    assert len([r for r in mlflow_runs(store)[1] if "optuna.trial_number" in r.data.tags]) == 3 + 4


def test_sweepers_asking_the_same_parameters_at_once_run_them_once(tmp_path, monkeypatch):
    """The claim on a parameter set is the trial's number, which the storage gives once and in order: 4 sweepers
    (each its own Optuna study object and connection on one SQLite file) ask at the same moment (a barrier), 50
    rounds, each round's space one parameter set: exactly one of the 4 proposals runs, every other is dropped as
    a duplicate of a lower-numbered one. (The rule before: drop if another is running, and after 10 drops in a row
    run anyway; two that checked at once both ran, or neither.)"""
    import threading

    import optuna
    from optuna.distributions import CategoricalDistribution

    from xp.studies import proposals
    from xp.studies.proposals import propose

    monkeypatch.setattr(proposals, "MAX_DUPLICATES", 1)  # (a loser asks once: the claim is what is tested here)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="race", storage=storage, direction="maximize")
    studies = [optuna.load_study(study_name="race", storage=optuna.storages.RDBStorage(storage),
                                 sampler=optuna.samplers.RandomSampler(seed=i)) for i in range(4)]
    for r in range(50):
        barrier, got = threading.Barrier(4), [None] * 4

        def sweeper(i: int, dists=({f"x{r}": CategoricalDistribution([0])})) -> None:  # (a new space a round)
            barrier.wait(timeout=60)
            try:
                got[i] = propose(studies[i], dists, 1)
            except Exception as e:  # (said below)
                got[i] = e

        threads = [threading.Thread(target=sweeper, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not [g for g in got if not isinstance(g, tuple)], got
        running = [t for trials, _ in got for t in trials]
        assert len(running) == 1, (r, [[t.number for t in trials] for trials, _ in got])
        studies[0].tell(running[0].number, 1.0)
    trials = studies[0].get_trials(deepcopy=False)
    assert sum(t.state.name == "COMPLETE" for t in trials) == 50
    assert sum("duplicate_of" in t.user_attrs for t in trials) == 150


def test_a_confirming_study_takes_more_seeds_later(tmp_path):
    """sweep.confirm=1 then sweep.confirm=2 on the same study: the confirming study's seed parameter keeps one
    distribution (Optuna refuses a categorical that changes), and only the new seed's retraining is queued."""
    import dataclasses

    import optuna

    from xp.studies import confirm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = study.spec_from({"params": {"lr": {"type": "float", "low": 0.001, "high": 0.1}},
                            "storage": f"sqlite:///{tmp_path}/optuna.db", "confirm": 1, "confirm_top": 1}, "q", KNOWN)
    s = trial.open_study(spec)
    s.add_trial(optuna.trial.create_trial(params={"lr": 0.01}, distributions=trial.distributions(spec), value=0.5))
    c1, cspec1 = confirm.prepared(s, spec, 42)
    t = c1.ask(trial.distributions(cspec1))
    assert t.params == {"lr": 0.01, "seed": 43} and cspec1.n_trials == 1
    c1.tell(t, 0.4)
    c2, cspec2 = confirm.prepared(s, dataclasses.replace(spec, confirm=2), 42)
    t = c2.ask(trial.distributions(cspec2))  # (no "dynamic value space" refusal)
    assert t.params == {"lr": 0.01, "seed": 44} and cspec2.n_trials == 2
