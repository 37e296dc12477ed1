"""The chaos run in small (benchmarks/chaos.py, which says what it does and checks): one study on 2 slots of this
machine and 2 ssh hosts, Optuna on PostgreSQL and MLflow on a server, under 20 faults of every kind at a fixed seed;
its checker reads what was kept and finds no violation. The run's own figures (faults by kind, work lost) are in its
report; the full run (300 trials, 100 faults) in docs/reliability.md."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

SEED = 7


def test_a_study_under_faults_of_every_kind_keeps_every_trial_run_and_answer(tmp_path):
    import hosts

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from chaos import KINDS

    why = hosts.requirements()
    if why:
        pytest.fail(why)  # CI runs as root with the packages ./dev.sh installs
    report = tmp_path / "report.json"
    with open(tmp_path / "chaos.log", "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--trials", "40", "--faults",
                                 "20", "--seed", str(SEED), "--work", str(tmp_path / "work"), "--report", str(report)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=1200)
        finally:
            if proc.poll() is None:  # SIGTERM: it takes its hosts and servers down on the way out
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
    said = (tmp_path / "chaos.log").read_text()
    assert report.exists(), said[-4000:]
    got = json.loads(report.read_text())
    assert got["violations"] == [], (got["violations"], said[-3000:])
    assert got["faults"] >= 20 and set(got["by_kind"]) == set(KINDS), got["by_kind"]
    assert got["complete"] >= got["budget"] and proc.returncode == 0, said[-3000:]
