"""Pruning a study of two or more objectives (xp.studies.pruning's Pareto rule): a trial dominated at an epoch by
enough complete trials at the same epoch stops; every trial on the front so far goes on; the decision is kept on
the trial and its run."""

from __future__ import annotations

import pytest

from conftest import mlflow_runs, run_xp, said

TWO = [{"metric": "val_accuracy", "direction": "maximize"}, {"metric": "throughput", "direction": "maximize"}]


def _study(tmp_path, **options):
    from xp.studies.study import spec_from
    from xp.studies.trial import open_study

    spec = spec_from({"study_name": "two", "storage": f"sqlite:///{tmp_path}/optuna.db", "n_trials": 20,
                      "sampler": "random", "sampler_seed": 0, "pruner": "pareto", "pruner_options": options,
                      "objectives": TWO, "params": {"lr": {"type": "float", "low": 0.01, "high": 0.1}}}, "two")
    return open_study(spec), spec


def _trial(study, spec, epochs: list[list[float]], complete: bool = True):
    """A trial that reports `epochs` (its objectives after epoch 1, 2, ...) as a run does, asking after each
    whether it goes on; returns it and the first reason it was given to stop (None: it never was)."""
    from xp.studies.pruning import Pruning

    trial = study.ask()
    pruning, why = Pruning(trial, spec), None
    for epoch, values in enumerate(epochs, 1):
        pruning.report(values, epoch)
        why = pruning.should_prune()
        if why is not None:
            study.tell(trial, state=__import__("optuna").trial.TrialState.PRUNED)
            return trial, why
    if complete:
        study.tell(trial, epochs[-1])
    return trial, why


def test_a_trial_dominated_at_its_epoch_by_enough_complete_trials_stops_and_the_front_goes_on(tmp_path):
    study, spec = _study(tmp_path, n_startup_trials=3, n_warmup_steps=1, min_dominators=2)
    # the front at epoch 1: (accuracy, samples/s); their last epochs better, as training goes
    front = [[[0.60, 900.0], [0.90, 950.0]], [[0.70, 700.0], [0.95, 720.0]], [[0.80, 400.0], [0.97, 410.0]]]
    for epochs in front:
        _, why = _trial(study, spec, epochs)
        assert why is None  # (start-up: fewer than 3 complete trials, nothing is pruned)
    # dominated at epoch 1 by trials 0 and 1 (less accurate and slower than both): stops there, though its last
    # epoch would have been the best of all
    dominated, why = _trial(study, spec, [[0.55, 650.0], [0.99, 1000.0]])
    assert why is not None and "dominated at epoch 1 by 2 of 3 complete trials (0, 1)" in why, why
    record = study.trials[dominated.number].user_attrs["xp.pruned_by"]
    assert record["epoch"] == 1 and sorted(record["dominated_by"]) == ["0", "1"] and record["of_complete"] == 3
    assert record["values"] == {"val_accuracy": 0.55, "throughput": 650.0}
    assert record["dominated_by"]["1"] == {"val_accuracy": 0.70, "throughput": 700.0}
    # each of these is on the front at every epoch (better in one objective than every trial before it), or
    # dominated by one trial only: all go on to the end
    keep = [[[0.99, 100.0], [0.99, 100.0]],  # the most accurate, the slowest
            [[0.10, 2000.0], [0.20, 2000.0]],  # the fastest, the least accurate
            [[0.65, 800.0], [0.93, 820.0]],  # between the front's points: dominated by none
            [[0.59, 890.0], [0.90, 900.0]]]  # dominated by trial 0 alone: fewer than min_dominators
    for epochs in keep:
        trial, why = _trial(study, spec, epochs)
        assert why is None, (epochs, why)
        assert "xp.pruned_by" not in study.trials[trial.number].user_attrs
    # like with like: after epoch 1 (0.75, 600) is dominated by no complete trial's epoch 1, though by the final
    # values of trials 0, 1 and 6: it goes on; after epoch 2 the complete trials' epoch 2 dominate it
    late, why = _trial(study, spec, [[0.75, 600.0], [0.89, 700.0]])
    assert why is not None and "dominated at epoch 2 by 4 of 7 complete trials (0, 1, 6, 7)" in why, why


def test_the_rule_waits_for_its_warm_up_and_start_up(tmp_path):
    study, spec = _study(tmp_path, n_startup_trials=2, n_warmup_steps=2, min_dominators=1)
    for epochs in ([[0.9, 900.0], [0.95, 950.0], [0.96, 960.0]], [[0.8, 800.0], [0.9, 900.0], [0.91, 910.0]]):
        _trial(study, spec, epochs)
    # dominated by both at every epoch: not before epoch 2 (the warm-up)
    trial, why = _trial(study, spec, [[0.1, 10.0], [0.2, 20.0], [0.3, 30.0]])
    assert why is not None and "dominated at epoch 2" in why, why


@pytest.mark.slow
def test_a_two_objective_study_prunes_its_dominated_trials_over_the_slots(tmp_path, store):
    """End to end, on the scheduler's slots (the run tells its worker's channel, the scheduler the study): a grid
    on one slot, so each trial is judged against the complete trials before it. Every decision is the rule's on
    the values the trials measured: a pruned trial is dominated by the trials its record names (and no others),
    a trial that went on by none; at least one trial (a learning rate that learns nothing, a smaller batch than
    the first's) is pruned, its reason on its run."""
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "two.yaml").write_text(
        "study_name: two\nn_trials: 4\nparallel: 1\nsampler: grid\npruner: pareto\n"
        "pruner_options: {n_startup_trials: 1, n_warmup_steps: 1, min_dominators: 1}\n"
        "objectives: [{metric: val_accuracy, direction: maximize}, {metric: throughput, direction: maximize}]\n"
        "params:\n  lr: {type: categorical, choices: [0.1, 0.00001]}\n  batch: {type: categorical, choices: [16, 8]}\n")
    env = {"XP_SWEEPS_DIR": str(sweeps), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}
    proc = run_xp(tmp_path, store, "-m", "sweep=two", "epochs=2", env=env, timeout=600)
    assert proc.returncode == 0, said(proc)
    import optuna

    from xp.studies.pruning import dominates

    trials = optuna.load_study(study_name="two", storage=env["XP_OPTUNA_STORAGE"]).trials
    assert [(t.params["lr"], t.params["batch"]) for t in trials] == [(0.1, 16), (0.1, 8), (1e-05, 16), (1e-05, 8)]
    assert trials[0].state.name == "COMPLETE" and {t.state.name for t in trials} == {"COMPLETE", "PRUNED"}
    assert trials[-1].state.name == "PRUNED" or trials[2].state.name == "PRUNED", [t.state.name for t in trials]
    runs = {int(r.data.tags["optuna.trial_number"]): r for r in mlflow_runs(store)[1]
            if "optuna.trial_number" in r.data.tags}
    for t in trials:
        at1 = t.user_attrs["xp.at.1"]
        before = {str(o.number): o.user_attrs["xp.at.1"] for o in trials[:t.number] if o.state.name == "COMPLETE"}
        dominators = sorted(n for n, v in before.items() if dominates(v, at1, [True, True]))
        if t.state.name == "PRUNED":
            record = t.user_attrs["xp.pruned_by"]
            assert record["epoch"] == 1 and sorted(record["dominated_by"]) == dominators != [], (t.number, record)
            assert record["values"] == {"val_accuracy": at1[0], "throughput": at1[1]}
            assert runs[t.number].data.tags["xp.pruned"].startswith("pruned after epoch 1 (dominated at epoch 1 by")
            assert runs[t.number].data.tags["optuna.trial_state"] == "PRUNED"
            assert runs[t.number].data.tags["mlflow.note.content"].startswith(f"Trial {t.number} pruned after epoch 1")
        else:
            assert dominators == [] and "xp.pruned_by" not in t.user_attrs, (t.number, at1, before)
            assert "xp.at.2" in t.user_attrs and "xp.pruned" not in runs[t.number].data.tags
