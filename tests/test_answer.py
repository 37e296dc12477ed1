"""A study's answer, written once by its search and read by every view (xp.answers): the console summary,
the progress line, the parent run's description and tags, best_trial.json, the registry's @best, the UI link's
first row and xp.report name the same trial, for a TPE study with tied trials, a confirmed study and a PBT study;
a run that resumes another's commit reports its own epochs; PBT spends no slot on a copy."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conftest import mlflow_runs, run_xp, said
from test_pbt import pop_env

TIED = """\
study_name: tied
n_trials: 3
sampler: grid
pruner: none
objectives: [{metric: val_accuracy, direction: maximize}]
params:
  timing_warmup_batches: {type: categorical, choices: [1, 2, 3]}
"""  # (a key that changes no trained weight: three trials tie exactly)

CONFIRMED = """\
study_name: cl
n_trials: 3
sampler: random
sampler_seed: 1
pruner: none
objectives: [{metric: val_accuracy, direction: maximize}]
params:
  lr: {type: float, low: 0.002, high: 0.2, log: true}
  batch: {type: categorical, choices: [16, 32, 64]}
  momentum: {type: float, low: 0.5, high: 0.95}
"""


def study_env(tmp_path, name: str, text: str) -> dict:
    d = tmp_path / "sweeps"
    d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(textwrap.dedent(text))
    return {"XP_SWEEPS_DIR": str(d), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}


def parent_of(store, study: str):
    return [r for r in mlflow_runs(store)[1] if r.data.tags.get("xp.sweep") == "true"
            and r.data.tags.get("optuna.study") == study][-1]


def read_everywhere(tmp_path, store, proc, study: str, registered: str) -> dict[str, int]:
    """The best trial as each view names it."""
    from xp.report import build

    client, _ = mlflow_runs(store)
    parent = parent_of(store, study)
    out = proc.stdout + proc.stderr
    said_best = {int(n) for n in re.findall(r"best trial: trial (\d+)", out)}
    assert len(said_best) == 1, f"the console names {said_best}: {out[-3000:]}"
    tags = parent.data.tags
    answer = json.load(open(client.download_artifacts(parent.info.run_id, "best_trial.json", str(tmp_path))))
    view = json.loads(client.get_experiment(parent.info.experiment_id).tags[
        f"mlflow.sharedViewState.xp-{parent.info.run_id}"])
    report = tmp_path / f"report-{study}"
    assert build.main(["--tracking-uri", store, "--parent", parent.info.run_id, "--out", str(report)]) == 0
    md = (report / "report.md").read_text()
    found = {"console": said_best.pop(),
             "progress line": int(re.findall(r"best trial (\d+) ", proc.stdout)[-1]),
             "description": int(re.search(r"best trial: \*\*trial (\d+)\*\*", tags["mlflow.note.content"])[1]),
             "tag": int(tags["xp.best_trial"]),
             "best_trial.json": answer["best"][0]["trial"],
             "@best": int(client.get_model_version_by_alias(registered, "best").tags["trial"]),
             "UI link's first row": first_row(client, parent.info.experiment_id, view),
             "report": int(re.search(r"- best trial: trial (\d+)", md)[1])}
    if winner := re.search(r"The winner: member \d+ \(trial (\d+)", md):
        found["report's population"] = int(winner[1])
    return found


def first_row(client, experiment_id: str, view: dict) -> int:
    """The first row of the UI's shared view, as MLflow's UI asks for it (its filter, its one sort key)."""
    kind, key = view["orderByKey"].split(".", 1)
    order = f"{kind}.{key} {'ASC' if view['orderByAsc'] else 'DESC'}"
    first = client.search_runs([experiment_id], view["searchFilter"], order_by=[order], max_results=1)[0]
    return int(first.data.tags["optuna.trial_number"])


def one_answer(found: dict[str, int]) -> int:
    assert len(set(found.values())) == 1, found
    return next(iter(found.values()))


@pytest.mark.mlflow_paths
@pytest.mark.slow
def test_a_study_with_tied_trials_names_one_best_everywhere(tmp_path, store):
    """Three trials tie exactly: the answer is the lowest trial number, in every view; the console says the tie."""
    env = study_env(tmp_path, "tied", TIED)
    proc = run_xp(tmp_path, store, "-m", "sweep=tied", "epochs=1", env=env, timeout=300)
    assert proc.returncode == 0, said(proc)
    assert "tied with trials 1, 2 at val_accuracy" in proc.stdout + proc.stderr
    assert one_answer(read_everywhere(tmp_path, store, proc, "tied", "tied")) == 0


@pytest.mark.slow
def test_a_confirmed_study_names_its_best_by_mean_everywhere_and_its_fixed_key_is_not_searched(tmp_path, store):
    """A study continued with sweep.confirm: one best (the best by mean), in every view; the progress line's best
    counts the earlier command's trials; the parent is named after the study; batch fixed on the command line is
    no searched column in the report nor in the UI link; the UI link shows the confirming runs."""
    import optuna

    env = study_env(tmp_path, "small", CONFIRMED)
    args = ("-m", "sweep=small", "sweep.study_name=cl", "epochs=1", "batch=32")
    first = run_xp(tmp_path, store, *args, "sweep.n_trials=2", env=env, timeout=300)
    assert first.returncode == 0, said(first)
    earlier = max(t.value for t in optuna.load_study(study_name="cl", storage=env["XP_OPTUNA_STORAGE"]).trials)
    proc = run_xp(tmp_path, store, *args, "sweep.confirm=2", "sweep.confirm_top=2", env=env, timeout=600)
    assert proc.returncode == 0, said(proc)
    progress = re.search(r"study: trial 2 complete .* best trial \d+ val_accuracy=([\d.]+)", proc.stdout)
    assert progress and float(progress[1]) >= round(earlier, 4) - 1e-4, (earlier, proc.stdout[-2000:])
    best = one_answer(read_everywhere(tmp_path, store, proc, "cl", "cl"))
    parent = parent_of(store, "cl")
    answer = json.loads(optuna.load_study(study_name="cl", storage=env["XP_OPTUNA_STORAGE"]).user_attrs["xp.answer"])
    assert answer["confirmed"][0]["trial"] == best and len(answer["confirmed"][0]["values"]) == 3
    assert parent.info.run_name.startswith("study cl:"), parent.info.run_name
    md = (tmp_path / "report-cl" / "report.md").read_text()
    assert "Searched: lr, momentum." in md and "Fixed on the command line (not searched): batch=32" in md
    client, runs = mlflow_runs(store)
    view = json.loads(client.get_experiment(parent.info.experiment_id).tags[
        f"mlflow.sharedViewState.xp-{parent.info.run_id}"])
    assert "params.`batch`" not in view["selectedColumns"] and "params.`lr`" in view["selectedColumns"]
    shown = client.search_runs([parent.info.experiment_id], view["searchFilter"])
    assert {r.data.tags["optuna.study"] for r in shown} == {"cl", "cl.confirm"} and len(shown) == 3 + 4


@pytest.mark.slow
def test_a_population_names_its_winner_everywhere_and_its_intervals_figures_are_their_own(tmp_path, store):
    """PBT: the study, the report's population section and its schedule plot name one winner; an interval's best
    is the best of the epochs it trained (what it took from its source is inherited, said apart); the report
    draws each population plot once; the first line says how it searches."""
    env = pop_env(tmp_path, interval=1, n=8)
    proc = run_xp(tmp_path, store, "-m", "sweep=pop", "epochs=2", f"checkpoint_dir={tmp_path}/ckpt", env=env,
                  timeout=600)
    assert proc.returncode == 0, said(proc)
    assert "population of 4 (pbt)" in proc.stdout + proc.stderr and "sampler tpe" not in proc.stdout + proc.stderr
    winner = one_answer(read_everywhere(tmp_path, store, proc, "pop", "pop"))
    md = (tmp_path / "report-pop" / "report.md").read_text()
    assert md.count("pbt_pop_population.png") == 1 and md.count("pbt_pop_schedule.png") == 1
    header = md.split("\n| trial |", 1)[1].split("\n", 1)[0]  # (the runs' table: what they varied, as columns)
    assert " lr " in header and not any(k in header for k in ("model.log", "resume", "checkpoint_dir")), header
    client, runs = mlflow_runs(store)
    second = [r for r in runs if r.data.tags.get("xp.pbt.epochs") == "2-2"]
    assert second, "no interval trained epoch 2"
    for r in second:  # its own epoch only; the commit's epoch 1, inherited, is said apart
        p = r.data.params
        assert p["summary.epochs_completed"] == "1" and p["summary.inherited_epochs"] == "1", p
        own = [m.value for m in client.get_metric_history(r.info.run_id, "val_accuracy") if m.step == 2]
        assert float(p["summary.best_val_accuracy"]) == pytest.approx(own[-1], abs=1e-6), (p, own)
    assert any(int(r.data.tags["optuna.trial_number"]) == winner for r in second)


def test_a_run_resumed_from_another_runs_commit_reports_the_epochs_it_trained(tmp_path, store):
    """resume=PATH of another run's commit: its summary is its own epochs; the commit's are named inherited."""
    ckpt = tmp_path / "ckpt"
    first = run_xp(tmp_path, store, "epochs=2", f"checkpoint_dir={ckpt}", "run_name=first")
    assert first.returncode == 0, said(first)
    then = run_xp(tmp_path, store, "epochs=3", f"resume={ckpt}", f"checkpoint_dir={tmp_path / 'ckpt2'}",
                  "run_name=then", "lr=0.001")
    assert then.returncode == 0, said(then)
    client, runs = mlflow_runs(store)
    done = {r.info.run_name: r for r in runs}
    before, after = done["first"].data, done["then"].data
    assert after.params["summary.epochs_completed"] == "1" and after.params["summary.inherited_epochs"] == "2"
    assert after.params["summary.first_epoch"] == "3" and after.params["summary.best_epoch"] == "3"
    assert float(after.params["summary.best_val_accuracy"]) == pytest.approx(after.metrics["val_accuracy"], abs=1e-6)
    assert float(after.params["summary.inherited_best_val_accuracy"]) == pytest.approx(
        float(before.params["summary.best_val_accuracy"]), abs=1e-6)


# --- PBT spends no slot on a copy ------------------------------------------------------------------------------

def population(tmp_path, quantile: float = 0.5):
    import optuna
    from optuna.trial import TrialState, create_trial

    from xp.studies.pbt import PBT_ATTR, Population
    from xp.studies.study import load_spec
    from xp.studies.trial import distributions

    spec = load_spec("pbt_lr")
    dists = distributions(spec)
    study = optuna.create_study(direction="maximize")
    pop = Population(study, spec, dists, 8, tmp_path, 0)
    pop.pbt = type(pop.pbt)(4, 2, quantile, pop.pbt.explore)

    def interval(member, score, params=None):
        study.add_trial(create_trial(state=TrialState.COMPLETE, params=params or {"lr": 0.01, "momentum": 0.9},
                                     distributions=dists, value=score, intermediate_values={1: score, 2: score},
                                     user_attrs={PBT_ATTR: pop._interval(member, 0, None, None)}))
        return study.trials[-1]
    return study, pop, interval


def test_a_member_tied_with_the_best_goes_on_and_takes_no_copy(tmp_path):
    from xp.studies.pbt import PBT_ATTR

    study, pop, interval = population(tmp_path)
    latest = {m: interval(m, 0.9582) for m in range(4)}  # every member at the same score
    for m in range(4):
        pop._next(latest[m], latest)
    queued = [t.user_attrs[PBT_ATTR] for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
    assert len(queued) == 4 and all(a["donor"] is None for a in queued), queued


def test_two_members_that_take_one_donor_explore_differently(tmp_path):
    """Members 2 and 3 are the worst and draw the same donor; with an explore rule that would copy it (factor 1,
    no resampling), the two intervals from its commit still train different hyperparameters, and not its own."""
    import random

    from xp.studies.pbt import PBT_ATTR
    from xp.studies.pbtspec import Explore

    study, pop, interval = population(tmp_path, quantile=0.5)
    pop.pbt = type(pop.pbt)(4, 2, 0.5, tuple(Explore(e.name, (1.0,), 0.0) for e in pop.pbt.explore))
    latest = {0: interval(0, 0.95), 1: interval(1, 0.94), 2: interval(2, 0.5), 3: interval(3, 0.4)}
    pop._rng = lambda trial: random.Random(7)  # (the same draws for both: only the check keeps them apart)
    pop._next(latest[2], latest)
    pop._next(latest[3], latest)
    queued = [t for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
    sources = {t.user_attrs[PBT_ATTR]["from"] for t in queued}
    params = [t.system_attrs["fixed_params"] for t in queued]
    donor = study.trials[sources.pop()]
    assert len(queued) == 2 and not sources and params[0] != params[1] and donor.params not in params, params


# --- a warm start, through the seam ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_warm_start_seeds_the_sampler_from_an_earlier_study_and_never_its_answer(tmp_path, store):
    """sweep.warm_start=old: old's finished trials in this space seed the new study's sampler (each proposal asked
    of a study that holds them, then run in the new one); the new study's trials, budget and answer are its own;
    said in one line and recorded. A study it cannot start from is one line, exit 2, before anything runs."""
    import optuna

    env = study_env(tmp_path, "small", CONFIRMED)
    storage = env["XP_OPTUNA_STORAGE"]
    old = run_xp(tmp_path, store, "-m", "sweep=small", "sweep.study_name=old", "epochs=1", "sweep.n_trials=4",
                 env=env, timeout=300)
    assert old.returncode == 0, said(old)
    warm = run_xp(tmp_path, store, "-m", "sweep=small", "sweep.study_name=new", "epochs=2", "sweep.n_trials=3",
                  "sweep.warm_start=old", env=env, timeout=300)
    assert warm.returncode == 0, said(warm)
    assert "warm start from study old: 4 of its 4 finished trials lie in this space; they seed the sampler, never " \
           "the answer" in warm.stdout + warm.stderr
    new = optuna.load_study(study_name="new", storage=storage)
    assert len(new.trials) == 3 and new.user_attrs["xp.warm_start"] == {"from": "old", "trials": 4, "of": 4}
    assert all("fixed_params" in t.system_attrs for t in new.trials)  # (each proposed by the seeded sampler)
    answer = json.loads(new.user_attrs["xp.answer"])
    assert answer["best"][0]["trial"] in (0, 1, 2) and answer["extra"]["warm_start"] == {"from": "old", "trials": 4}
    assert "warm-started from study old (4 trials)" in answer["search"]
    cold = run_xp(tmp_path, store, "-m", "sweep=small", "sweep.study_name=cold", "epochs=2", "sweep.n_trials=3",
                  env=env, timeout=300)
    assert cold.returncode == 0, said(cold)
    assert [t.params for t in optuna.load_study(study_name="cold", storage=storage).trials] != \
        [t.params for t in new.trials]

    for args, line in ((["sweep.warm_start=nosuch"], "sweep.warm_start=nosuch: no such study in this storage; it "
                                                      "holds: cold, new, old"),
                       (["sweep.warm_start=old", "sweep.objectives=[{metric: throughput, direction: maximize}]"],
                        "sweep.warm_start=old: it optimises maximize val_accuracy; this study maximize throughput")):
        refused = run_xp(tmp_path, store, "-m", "sweep=small", "sweep.study_name=other", *args, env=env, timeout=120)
        assert refused.returncode == 2 and line in refused.stderr and "Traceback" not in refused.stderr, said(refused)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "other" not in [s.study_name for s in optuna.get_all_study_summaries(storage)]
