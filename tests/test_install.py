"""xp as a package: a built wheel (not editable) installed into a fresh virtual environment runs the default
experiment and a study from another directory, with conf/ and sweeps/ shipped inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, mlflow_runs, xp_env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """xp's wheel (the module's tests install it), built from a copy of the tracked files: a build in the checkout
    rewrites its xp.egg-info in place, which the other tests' commands (run there, where it comes first on sys.path)
    would read half-written."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True,
                             check=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    return next(wheels.glob("xp-*.whl"))


def fresh_venv(tmp_path) -> tuple[Path, Path]:
    """A new virtual environment (its python, its site-packages) that sees this environment's packages after its
    own (mxnet, mlflow, ...: gigabytes): a path line, so this environment's editable xp stays inactive there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_outside_the_checkout(tmp_path, store, wheel):
    py, site = fresh_venv(tmp_path)
    venv = py.parent.parent
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = xp_env(store, {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"})
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(py), "-c", "import xp, xp.cli, xp.studies.study; print(xp.__file__, xp.cli.CONF_DIR, "
                            "xp.studies.study.SWEEPS_DIR)"], cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.split() == [str(p) for p in (site / "xp" / "__init__.py", site / "xp" / "conf",
                                                     site / "xp" / "sweeps")]
    proc = subprocess.run([str(py), "-m", "xp", "epochs=2"], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([str(venv / "bin" / "xp"), "-m", "sweep=lr_batch", "sweep.n_trials=2", "epochs=1"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = mlflow_runs(store)
    names = sorted(r.info.run_name for r in runs)
    assert len(runs) == 4 and names[0] == "epochs=2" and names[1].startswith("study lr_batch")
    assert all(n.startswith("trial ") for n in names[2:])
    assert not (elsewhere / "conf").exists() and (elsewhere / "outputs").is_dir()  # Hydra wrote where it ran


# Another MLflow 3.x than the one CI tests xp's private uses of it with (constraints.txt). The package index has
# MLflow 3.18.0 and mlflow-skinny 3.18.0 but no mlflow-tracing 3.18.0, which MLflow 3.18.0 pins: no environment can
# hold all of MLflow 3.18.0 that pip accepts, so it is installed without its dependencies (its tracing package is
# this environment's, 3.17.2) and xp's wheel so too; MLflow 3.16.1 comes whole, and pip installs the wheel with its
# dependencies resolved against it.
OTHER_MLFLOW = {"3.18.0": ["mlflow", "mlflow-skinny"], "3.16.1": ["mlflow", "mlflow-skinny", "mlflow-tracing"]}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(OTHER_MLFLOW))
def test_the_wheel_beside_another_mlflow_keeps_it_and_a_run_a_study_and_a_model_round_trip(tmp_path, version, wheel):
    """xp requires a range of MLflow 3.x (pyproject.toml), not the version CI pins: installed where another MLflow
    is, it keeps that MLflow; xp's uses of MLflow's internals are gated to the tested version (xp.tracking.gate),
    so there a run, a study (its best model registered) and a prediction from the registry take MLflow's public API,
    said in one line (under the range's lower bound, 3.16.1: a run)."""
    import json
    import zipfile

    from packaging.requirements import Requirement
    from packaging.version import Version

    from images import digit_images

    metadata = zipfile.ZipFile(wheel).read("xp-0.1.0.dist-info/METADATA").decode().splitlines()
    wanted = [Requirement(line.split(": ", 1)[1]) for line in metadata if line.startswith("Requires-Dist: mlflow")]
    assert len(wanted) == 1 and version in wanted[0].specifier, wanted  # a range that holds it: not a pin
    downloads = tmp_path / "downloads"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(downloads),
                    *(f"{name}=={version}" for name in OTHER_MLFLOW[version])], check=True, capture_output=True,
                   timeout=600)
    py, site = fresh_venv(tmp_path)
    whole = len(OTHER_MLFLOW[version]) == 3
    pip = [str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(downloads)]
    subprocess.run([*pip, *([] if whole else ["--no-deps"]), *(f"{name}=={version}" for name in OTHER_MLFLOW[version])],
                   check=True, capture_output=True, timeout=600)
    installed = subprocess.run([*pip, *([] if whole else ["--no-deps"]), str(wheel)], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    versions = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('mlflow'), "
                               "m.version('mlflow-skinny'), m.version('xp'))"], capture_output=True, text=True,
                              check=True).stdout.split()
    assert versions == [version, version, "0.1.0"], versions  # the wheel kept the MLflow it found

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = f"sqlite:///{tmp_path}/mlflow.db"
    env = xp_env(store, {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db", "XP_STATE_DIR": str(tmp_path / "state")})
    env.pop("PYTHONPATH", None)
    env.pop("XP_MLFLOW_PUBLIC", None)

    try:
        def xp(*args: str) -> subprocess.CompletedProcess:
            done = subprocess.run([str(py), "-m", *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
            return done

        run = xp("xp", "epochs=2")
        assert f"MLflow {version} is not one xp was tested with" in run.stdout + run.stderr, run.stderr[-3000:]
        oldest = version == min(OTHER_MLFLOW, key=Version)  # the range's lower bound: a run (CI's minutes: the rest once)
        if not oldest:
            xp("xp", "-m", "sweep=lr_batch", "sweep.n_trials=2", "epochs=1")
            images = digit_images(tmp_path / "images", 6)
            out = xp("xp.predict", "models:/lr_batch@best", str(images), "--tracking-uri", store)
            lines = [line.split("\t") for line in out.stdout.strip().splitlines()]
            assert len(lines) == 6 and all(0.0 < float(p) <= 1.0 for _, _, p in lines), out.stdout
        # the store as that MLflow reads it (its schema may be newer than this environment's MLflow knows)
        read = subprocess.run([str(py), "-c", textwrap.dedent("""
            import json, sys
            from mlflow import MlflowClient
            c = MlflowClient(sys.argv[1])
            runs = c.search_runs([c.get_experiment_by_name("xp").experiment_id])
            best = c.get_model_version_by_alias("lr_batch", "best").run_id if sys.argv[2] == "study" else None
            print(json.dumps({"runs": {r.info.run_name: [r.info.status, len(c.get_metric_history(r.info.run_id,
                "val_accuracy")), r.data.tags.get("xp.logged_model", "")] for r in runs}, "best": best,
                "trials": [r.info.run_id for r in runs if r.info.run_name.startswith("trial ")]}))
            """), store, "run" if oldest else "study"], cwd=elsewhere, env=env, capture_output=True, text=True,
            timeout=300)
        assert read.returncode == 0, read.stderr[-3000:]
        kept = json.loads(read.stdout)
        assert kept["runs"]["epochs=2"][:2] == ["FINISHED", 2] and kept["runs"]["epochs=2"][2], kept
        if oldest:
            assert list(kept["runs"]) == ["epochs=2"], kept
            return
        trials = {n: v for n, v in kept["runs"].items() if n.startswith("trial ")}
        assert len(trials) == 2 and all(v[:2] == ["FINISHED", 1] and v[2] for v in trials.values()), kept
        assert kept["best"] in kept["trials"], kept
    finally:  # the tracking service its commands started in its state folder (it would idle 30 minutes)
        from xp.tracking import services

        services.stop(tmp_path / "state", every=True)
