"""xp as a package: a built wheel (not editable) installed into a fresh virtual environment runs the default
experiment and a study from another directory, with conf/ and sweeps/ shipped inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import ROOT, mlflow_runs, xp_env


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_outside_the_checkout(tmp_path, store):
    # built from a copy of the tracked files: a build in the checkout rewrites its xp.egg-info in place, which the
    # other tests' commands (run there, where it comes first on sys.path) would read half-written: "no backend"
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True,
                             check=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    wheel = next(wheels.glob("xp-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    # xp itself comes from the wheel; its dependencies (mxnet, mlflow, ...: gigabytes) from this environment's
    # site-packages, appended after the venv's own (a path line: this environment's editable xp stays inactive)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (venv / "lib" / site.split("/lib/", 1)[1] / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = xp_env(store, {"XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"})
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(py), "-c", "import xp, xp.cli, xp.studies.study; print(xp.__file__, xp.cli.CONF_DIR, "
                            "xp.studies.study.SWEEPS_DIR)"], cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.split() == [str(p) for p in (venv / "lib" / site.split("/lib/", 1)[1] / "xp" / "__init__.py",
                                                     venv / "lib" / site.split("/lib/", 1)[1] / "xp" / "conf",
                                                     venv / "lib" / site.split("/lib/", 1)[1] / "xp" / "sweeps")]
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
