"""Population-based training (sweep.search=pbt): members on fewer slots than members hand each other their exact
weights, each interval's run logs its schedule and lineage, a killed member is replaced from the population,
Ctrl-C and the same command again finish the population, and the report draws it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conformance import conformance
from conftest import ROOT, mlflow_runs, run_xp, xp_args, xp_env
from test_scheduler import default_sigint, workers_of

POP = """\
study_name: pop
search: pbt
pbt:
  population: 4
  interval: {interval}
  quantile: 0.5
  explore:
    lr: {{factors: [0.8, 1.2], resample: 0.25}}
n_trials: {n}
sampler_seed: 1
objectives:
  - {{metric: val_accuracy, direction: maximize}}
params:
  lr: {{type: float, low: 0.002, high: 0.2, log: true}}
  momentum: {{type: float, low: 0.5, high: 0.99}}
"""


def pop_env(tmp_path, interval: int, n: int) -> dict:
    d = tmp_path / "sweeps"
    d.mkdir(exist_ok=True)
    (d / "pop.yaml").write_text(POP.format(interval=interval, n=n))
    return {"XP_SWEEPS_DIR": str(d), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}


def study_trials(tmp_path):
    import optuna

    try:
        return optuna.load_study(study_name="pop", storage=f"sqlite:///{tmp_path}/optuna.db").get_trials()
    except KeyError:  # (not made yet)
        return []


def intervals(store, experiment: str = "xp") -> dict[int, object]:
    _, runs = mlflow_runs(store, experiment)
    return {int(r.data.tags["optuna.trial_number"]): r for r in runs if "xp.pbt.member" in r.data.tags
            and r.info.status == "FINISHED"}  # (a lost interval's run FAILED, a stopped one's KILLED)


def check_lineage(store, epochs: int, experiment: str = "xp") -> dict[int, object]:
    """Every interval that started from a commit started from exactly the weights that commit's interval ended
    with; each logged its hyperparameters at each of its epochs; every member reached the last epoch."""
    client, _ = mlflow_runs(store, experiment)
    runs = intervals(store, experiment)
    for n, r in runs.items():
        t = r.data.tags
        assert t["xp.pbt.weights_out"], (n, t)
        first, last = map(int, t["xp.pbt.epochs"].split("-"))
        if "xp.pbt.from_trial" in t:
            source = runs[int(t["xp.pbt.from_trial"])].data.tags
            assert t["xp.pbt.weights_in"] == source["xp.pbt.weights_out"], (n, t["xp.pbt.from_trial"])
            assert int(source["xp.pbt.epochs"].split("-")[1]) == first - 1
        lr = [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "hp.lr")]
        assert sorted(lr) == [(e, pytest.approx(float(r.data.params["lr"]))) for e in range(first, last + 1)], (n, lr)
    ends = {}
    for r in runs.values():
        member, last = r.data.tags["xp.pbt.member"], int(r.data.tags["xp.pbt.epochs"].split("-")[1])
        ends[member] = max(ends.get(member, 0), last)
    assert ends == {str(m): epochs for m in range(4)}, ends
    return runs


@pytest.mark.slow
@conformance("population", "launcher", ["local"])
def test_four_members_on_two_slots_hand_on_exact_weights_log_their_schedule_and_the_report_draws_them(tmp_path,
                                                                                                       store, launcher):
    """4 members, an interval of 1 epoch, 3 epochs, 2 slots: each interval resumes a commit through resume='s path
    (the exploiting member's first epoch starts from the donor's bit-equal weights, its lr explored), the best
    final member's model is registered, the commits of superseded intervals are gone, and the report has the
    population's section with its two plots drawn."""
    from matplotlib.image import imread

    env = pop_env(tmp_path, 1, 12)
    r = run_xp(tmp_path, store, "-m", "sweep=pop", f"launcher={launcher}", "epochs=3", "sweep.parallel=2",
               f"checkpoint_dir={tmp_path}/ckpt", env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    runs = check_lineage(store, 3)
    trials = study_trials(tmp_path)
    assert len(runs) == len([t for t in trials if t.state.name == "COMPLETE"]) >= 9
    exploits = [r for r in runs.values() if "xp.pbt.donor_member" in r.data.tags]
    assert exploits, "no member exploited"  # (quantile 0.5: the worse half copies the better half)
    for x in exploits:
        donor = runs[int(x.data.tags["xp.pbt.from_trial"])]
        assert x.data.tags["xp.pbt.donor_member"] == donor.data.tags["xp.pbt.member"] != x.data.tags["xp.pbt.member"]
        assert float(x.data.params["lr"]) != float(donor.data.params["lr"])  # explored
    assert "takes member" in r.stdout + r.stderr and "its weights' schedule: epochs 1-" in r.stdout + r.stderr
    client, _ = mlflow_runs(store)
    best = client.get_model_version_by_alias("pop", "best")
    finals = {x.info.run_id: x for x in runs.values() if x.data.tags["xp.pbt.epochs"].endswith("-3")}
    assert best.run_id in finals
    assert finals[best.run_id].data.metrics["val_accuracy"] == max(f.data.metrics["val_accuracy"]
                                                                    for f in finals.values())
    kept = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(kept) == 4 and {f"trial-{n}" for n, x in runs.items() if x.info.run_id in finals} == set(kept), kept
    parent_run = next(x for x in mlflow_runs(store)[1] if x.data.tags.get("xp.sweep") == "true")
    parent = parent_run.info.run_id
    assert "The best member's weights' schedule: epochs 1-" in parent_run.data.tags["mlflow.note.content"]
    import json  # the UI's view of the study: the final intervals only (the answer's candidates), best first
    view = json.loads(client.get_experiment(parent_run.info.experiment_id).tags[f"mlflow.sharedViewState.xp-{parent}"])
    shown = client.search_runs([parent_run.info.experiment_id], view["searchFilter"])
    assert {x.info.run_id for x in shown} == set(finals) and "tags.`xp.pbt.member`" in view["selectedColumns"]
    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "xp.report", "--parent", parent, "--out", str(out), "--tracking-uri",
                          store], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = (out / "report.md").read_text()
    assert "## Population of pop" in md and "The winner's weights went through" in md
    for name in ("pbt_pop_population.png", "pbt_pop_schedule.png"):
        image = imread(out / name)[..., :3]
        drawn = (image.min(axis=-1) < 0.9).mean()  # not white: axes, text and the lines
        coloured = ((image.max(axis=-1) - image.min(axis=-1)) > 0.3).mean()  # the members' lines, in colour
        assert drawn > 0.02 and coloured > 0.002, (name, drawn, coloured)


@pytest.mark.slow
def test_a_population_on_the_torch_backend_hands_on_exact_weights(tmp_path, store):
    """backend=torch: every interval starts from its source's bit-equal weights (through the backend's own
    save_state / load_state), every member reaches the last epoch."""
    env = pop_env(tmp_path, 1, 8)
    r = run_xp(tmp_path, store, "-m", "sweep=pop", "backend=torch", "epochs=2", "sweep.parallel=2",
               "sweep.pbt.quantile=0.5", f"checkpoint_dir={tmp_path}/ckpt", env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = check_lineage(store, 2)
    assert len(runs) == 8 and {x.data.tags["xp.backend"] for x in runs.values()} == {"torch"}


@pytest.mark.slow
def test_a_killed_member_is_replaced_and_ctrl_c_then_the_same_command_finishes_the_population(tmp_path, store):
    """A member's worker SIGKILLed while both slots train a member's second interval: that interval is lost and
    replaced from the population; Ctrl-C then stops the study (no interval or run left RUNNING); the same command
    finishes every member, each interval still starting from its source's exact weights."""
    env = pop_env(tmp_path, 20, 8)
    args = ("-m", "sweep=pop", "epochs=40", "sweep.parallel=2", f"checkpoint_dir={tmp_path}/ckpt")
    output = tmp_path / "output.txt"
    with open(output, "w") as sink:
        proc = subprocess.Popen(xp_args(tmp_path, *args), cwd=ROOT, env=xp_env(store, env), stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=default_sigint)

    def until(what, check, timeout=300):
        deadline = time.monotonic() + timeout
        while not check():
            assert proc.poll() is None and time.monotonic() < deadline, f"{what}: " + output.read_text()[-3000:]
            time.sleep(0.2)

    def training_later_intervals():  # both slots in a member's second interval, whose run the study knows
        running = [t for t in study_trials(tmp_path) if t.state.name == "RUNNING"]
        return len(running) == 2 and all(t.user_attrs.get("xp.pbt", {}).get("generation", 0) >= 1
                                         and "mlflow_run_id" in t.user_attrs for t in running)

    try:
        until("both slots in a second interval", training_later_intervals)
        os.kill(workers_of(proc)[0].pid, signal.SIGKILL)
        until("the lost interval replaced", lambda: "was lost: it is replaced from member" in output.read_text())
        member = next(t for t in study_trials(tmp_path) if t.state.name == "FAIL").user_attrs["xp.pbt"]["member"]
        until("the replacement training", lambda: any(
            t.state.name == "RUNNING" and "mlflow_run_id" in t.user_attrs and t.user_attrs["xp.pbt"]["member"] == member
            for t in study_trials(tmp_path)))
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    said = output.read_text()
    assert proc.returncode == 130 and "Traceback" not in said, said[-3000:]
    trials = study_trials(tmp_path)
    assert "RUNNING" not in {t.state.name for t in trials}
    lost = [t for t in trials if t.state.name == "FAIL" and not t.user_attrs.get("xp.interrupted")]
    assert len(lost) == 1 and lost[0].user_attrs["xp.pbt"]["generation"] == 1, [(t.number, t.user_attrs) for t in lost]
    assert "RUNNING" not in {x.info.status for x in mlflow_runs(store)[1]}
    again = run_xp(tmp_path, store, *args, env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    runs = check_lineage(store, 40)
    replaced = [x for x in runs.values() if x.data.tags["xp.pbt.member"] == str(lost[0].user_attrs["xp.pbt"]["member"])
                and x.data.tags["xp.pbt.generation"] == "1"]
    assert ["xp.pbt.donor_member" in x.data.tags for x in replaced] == [True], replaced
    trials = study_trials(tmp_path)
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]


@pytest.mark.parametrize("args, message", [
    (("sweep.n_trials=3",), "pbt.population=4 is larger than the budget of n_trials=3 intervals"),
    (("sweep.pbt.interval=5", "epochs=4"), "pbt.interval=5 is longer than the experiment's epochs=4"),
    (("lr=0.1",), "pbt.explore.lr: lr=0.1 on the command line fixed it: a fixed key is not explored"),
    (("sweep.pbt.quantile=0.9",), "pbt.quantile=0.9: must be a fraction in (0, 0.5]"),
    (("sweep.confirm=2",), "search=pbt: one objective, no confirm and no grid"),
])
def test_a_population_it_cannot_train_is_one_line_and_exit_2(tmp_path, store, args, message):
    env = pop_env(tmp_path, 2, 16)
    r = run_xp(tmp_path, store, "-m", "sweep=pop", "epochs=4", *args, env=env, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "optuna.db").exists()


def test_a_lost_interval_is_replaced_from_the_member_best_at_the_epoch_it_started_from(tmp_path):
    """Member 0 is ahead (0.95 at epoch 4) but was behind member 1 at epoch 2 (0.90 against 0.92), where member 2's
    lost interval started: the replacement takes member 1's weights, ranked like with like, not the latest figure
    of a member trained further."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from xp.studies.pbt import PBT_ATTR, Population
    from xp.studies.study import load_spec
    from xp.studies.trial import distributions

    spec = load_spec("pbt_lr")
    dists = distributions(spec)
    study = optuna.create_study(direction="maximize")
    pop = Population(study, spec, dists, 8, tmp_path, 0)

    def interval(member, generation, values, state=TrialState.COMPLETE):
        attr = {**pop._interval(member, generation, None, None)}
        study.add_trial(create_trial(state=state, params={"lr": 0.01, "momentum": 0.9}, distributions=dists,
                                     value=values[max(values)] if state == TrialState.COMPLETE else None,
                                     intermediate_values=values, user_attrs={PBT_ATTR: attr}))
        return study.trials[-1]

    interval(0, 0, {1: 0.80, 2: 0.90})
    ahead = interval(0, 1, {3: 0.93, 4: 0.95})
    best_at_2 = interval(1, 0, {1: 0.85, 2: 0.92})
    interval(2, 0, {1: 0.40, 2: 0.50})
    lost = interval(2, 1, {3: 0.55}, TrialState.FAIL)
    assert pop._replace(lost)
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert len(queued) == 1
    a = queued[0].user_attrs[PBT_ATTR]
    assert (a["member"], a["from"], a["donor"], a["start"]) == (2, best_at_2.number, 1, 2), (a, ahead.number)


def test_a_member_failing_past_max_retry_is_dropped_and_a_missing_commit_stops_the_study(tmp_path):
    """An interval that failed for its training is replaced, up to max_retry times; past that its member trains no
    more, the budget shrinks by its intervals and the summary's line says the answer lacks it. An interval that
    found no commit where its complete source committed stops the study at once, naming checkpoint_dir."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from xp.errors import ConfigError
    from xp.states import TrialState as Told  # (as the scheduler tells: xp's)
    from xp.studies.pbt import PBT_ATTR, Population, dropped_line
    from xp.studies.study import load_spec
    from xp.studies.trial import distributions

    spec = load_spec("pbt_lr")  # (4 members, 8 epochs, an interval of 2: 16 intervals; max_retry 2)
    dists = distributions(spec)
    study = optuna.create_study(direction="maximize")
    pop = Population(study, spec, dists, 8, tmp_path, 0)

    def interval(member, generation, start_from, state):
        study.add_trial(create_trial(state=state, params={"lr": 0.01, "momentum": 0.9}, distributions=dists,
                                     value=0.9 if state == TrialState.COMPLETE else None,
                                     intermediate_values={generation * 2 + 1: 0.8},
                                     user_attrs={PBT_ATTR: pop._interval(member, generation, start_from, None)}))
        return study.trials[-1]

    def running(frozen):  # (the scheduler's trial, as a slot runs it)
        return optuna.trial.Trial(study, frozen._trial_id)

    sources = [interval(m, 0, None, TrialState.COMPLETE) for m in range(4)]
    assert pop.target() == 16
    failed = running(interval(3, 1, sources[3].number, TrialState.RUNNING))
    for n in range(spec.max_retry + 1):
        assert pop.told(failed, Told.FAIL, [], "training failed: FloatingPointError: loss is nan") == Told.FAIL
        queued = study.get_trials(states=(TrialState.WAITING,))
        assert len(queued) == (1 if n < spec.max_retry else 0), n
        if queued:  # the replacement runs, and fails in turn
            study._storage.set_trial_state_values(queued[0]._trial_id, TrialState.RUNNING)
            failed = running(queued[0])
    assert pop.target() == 4 + 3 * 3  # member 3's three intervals left are not trained
    line = dropped_line(study, spec)
    assert line and line[0].startswith("population: member 3 trained no more") and "3 of 4 members" in line[0], line

    moved = running(interval(0, 1, sources[0].number, TrialState.RUNNING))
    missing = f"resume={tmp_path / f'trial-{sources[0].number}'}: no committed state there (it is written by ...)"
    with pytest.raises(ConfigError, match=f"checkpoint_dir={tmp_path}: member 0's interval .* do not share"):
        pop.told(moved, Told.FAIL, [], missing)
