"""The seeds' claims as one-command recipes (sweeps/*.yaml with settings and a claim) and the report's
seed-claims section, measured from the runs' own metrics."""

import subprocess
import sys

from conftest import ROOT, mlflow_runs, run_xp, xp_env
from xp.studies import study


def test_a_recipes_settings_join_the_command_line_which_wins():
    argv = study.recipe_settings(["-m", "sweep=scaling", "epochs=3", "'cpu_devices=choice(1,2)'"])
    assert argv[:4] == ["-m", "sweep=scaling", "epochs=3", "'cpu_devices=choice(1,2)'"]
    assert "epochs=16" not in argv and {"warmup_epochs=2", "lr_schedule=cosine", "lr=0.05"} <= set(argv)
    assert study.recipe_settings(["-m", "sweep=lr_batch", "epochs=3"]) == ["-m", "sweep=lr_batch", "epochs=3"]


def test_the_scaling_recipe_reports_efficiency_recomputed_from_its_runs(tmp_path, store):
    """One command runs 1, 2 and 4 CPU contexts with the linear scaling rule and warm-up; accuracy holds within
    a point; the report's efficiency is throughput(N) / (N x throughput(1)) of the runs' own logged figures."""
    env = {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}
    p = run_xp(tmp_path, store, "-m", "sweep=scaling", env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    client, runs = mlflow_runs(store)
    parent = next(r for r in runs if r.data.tags.get("xp.sweep") == "true")
    trials = {int(r.data.params["derived.num_devices"]): r for r in runs if r.data.tags.get("xp.recipe") == "scaling"}
    assert sorted(trials) == [1, 2, 4]
    for r in trials.values():  # the recipe's settings, and the linear rule on top of them
        p_ = r.data.params
        assert (p_["epochs"], p_["warmup_epochs"], p_["lr_schedule"]) == ("16", "2", "cosine")
        assert float(p_["derived.effective_lr"]) == 0.05 * int(p_["derived.global_batch"]) / 32
    acc = {n: r.data.metrics["val_accuracy"] for n, r in trials.items()}
    assert abs(acc[2] - acc[1]) <= 0.01 and abs(acc[4] - acc[1]) <= 0.01, acc
    thr = {n: float(r.data.params["summary.throughput_samples_per_s"]) for n, r in trials.items()}

    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "xp.report", "--parent", parent.info.run_id, "--out", str(out)],
                         cwd=ROOT, env=xp_env(store), capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    md = (out / "report.md").read_text()
    claims = md.split("## Seed claims")[1].split("## Trials")[0]
    for n in (1, 2, 4):
        assert f"| {n} | {thr[n]:.1f} | {n * thr[1]:.1f} | {thr[n] / (n * thr[1]):.1%} | {acc[n]:.4f} |" in claims
    assert f"| scaling | 96% at 8 GPUs | {thr[4] / (4 * thr[1]):.0%} at 4 CPU contexts | holds |" in claims
    assert "they share 2 cores" in claims and (out / "claim_scaling.png").stat().st_size > 10_000


def test_two_processes_making_the_jpeg_digits_at_once_both_get_one_whole_folder(tmp_path):
    code = ("import sys; from pathlib import Path; from xp.data.generated import digits_jpeg; "
            "print(digits_jpeg(Path(sys.argv[1]), 24, 80))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs[0] == outs[1]
    folder = tmp_path / "digits-jpeg-24px-q80"
    assert outs[0] == str(folder) and (folder / ".complete").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no half-made folder left
    assert sum(1 for _ in folder.glob("*/*.jpg")) == 1797 and len(list(folder.iterdir())) == 11


def test_the_input_pipeline_recipe_finds_the_knee_and_says_where_it_stalls(tmp_path, store):
    """Decode threads 1, 2, 4, 8 on the generated JPEG digits: input-bound at 1 thread, not at the knee, more
    throughput with more threads; the report's figures are the runs' own."""
    env = {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db", "XP_CACHE_DIR": str(tmp_path / "cache")}
    p = run_xp(tmp_path, store, "-m", "sweep=input_pipeline", env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    client, runs = mlflow_runs(store)
    parent = next(r for r in runs if r.data.tags.get("xp.sweep") == "true")
    trials = {int(r.data.params["data_nthreads"]): r for r in runs if r.data.tags.get("xp.recipe") == "input_pipeline"}
    assert sorted(trials) == [1, 2, 4, 8]
    thr = {t: float(r.data.params["summary.throughput_samples_per_s"]) for t, r in trials.items()}
    verdict = {t: r.data.tags["xp.diagnosis"] for t, r in trials.items()}
    assert verdict[1] == "input-bound"
    assert max(thr.values()) >= 1.3 * thr[1], thr  # 1.5-1.6x measured here (README); 1.3 leaves room for noise

    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "xp.report", "--parent", parent.info.run_id, "--out", str(out)],
                         cwd=ROOT, env=xp_env(store), capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    claims = (out / "report.md").read_text().split("## Seed claims")[1].split("## Trials")[0]
    best = max(thr, key=thr.get)
    knee = min(t for t in thr if thr[t] >= 0.95 * thr[best])
    assert verdict[knee] != "input-bound"
    for t in (1, 2, 4, 8):
        assert f"| {t} | {thr[t]:.1f} | {thr[t] / thr[1]:.2f}x | {'knee' if t == knee else ''} | {verdict[t]} |" in claims
    assert f"| input_pipeline | 1.75x at 4 -> 32 threads | {thr[best] / thr[1]:.2f}x from 1 to {best} threads | holds |" in claims
    assert (out / "claim_input_pipeline.png").stat().st_size > 10_000
