"""Bottleneck verdicts: on constructed rates, and on a deliberately slow input pipeline."""

import pytest

from conftest import mlflow_runs, run_xp
from images import make_folder
from xp.run.diagnose import judge


def test_input_bound_when_training_waits_for_the_pipeline():
    d = judge(real=300, io=320, synthetic=3000, threads=2, cores=16)
    assert d.verdict == "input-bound" and "raise data_nthreads from 2 to about 16" in d.advice
    assert judge(real=300, io=320, synthetic=3000, threads=2, cores=4).advice.count("about 4") == 1
    # CI's rates once: the pipeline alone faster than training on real data (which shares its cores with the
    # decoder), yet at 11% of what training alone takes: the pipeline is what limits, not the sharing
    assert judge(real=239.3, io=362.9, synthetic=3207.2, threads=1).verdict == "input-bound"
    # threads already at the cores: no advice to raise them past the cores
    d = judge(real=300, io=320, synthetic=3000, threads=2, cores=2)
    assert d.verdict == "input-bound" and "raise" not in d.advice and "already covers this machine's 2 cores" in d.advice


def test_compute_bound_when_the_pipeline_keeps_up():
    assert judge(real=950, io=5000, synthetic=1000, threads=4).verdict == "compute-bound"


def test_communication_bound_when_devices_do_not_add_up():
    d = judge(real=1000, io=9000, synthetic=1050, threads=8, devices=4, synthetic_one=500)
    assert d.verdict == "communication-bound" and "4 devices reach 52% of 4 x one device" in d.advice
    assert judge(real=1900, io=9000, synthetic=1950, threads=8, devices=4, synthetic_one=500).verdict == "compute-bound"


def test_mixed_when_both_compete_for_cores():
    assert judge(real=500, io=5000, synthetic=1000, threads=2).verdict == "mixed"
    # the pipeline alone at 74% of training alone, real at 44% of the pipeline alone (8 decode workers, 2 cores)
    assert judge(real=1369.7, io=3085.8, synthetic=4168.3, threads=8, cores=2).verdict == "mixed"


@pytest.mark.slow
@pytest.mark.quiet
@pytest.mark.parametrize("backend, path", [("gluon", "cpu (1 decode threads)"), ("torch", "cpu (1 decode workers)")])
def test_a_slow_pipeline_is_called_input_bound(tmp_path, store, backend, path):
    # big JPEGs stored at full size, one decode thread, a tiny network on 16x16 crops
    root = make_folder(tmp_path / "big", per_class=40, size=(480, 640), with_photos=False)
    proc = run_xp(tmp_path, store, "diagnose=true", f"backend={backend}", "dataset=folder", f"dataset.root={root}",
                  "dataset.store_size=0", "dataset.resize=0", "dataset.image_shape=[3,16,16]", "data_nthreads=1",
                  "batch=8", "diagnose_steps=12", env={"XP_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verdict: input-bound" in proc.stdout, proc.stdout[-1500:]
    assert f"input: {path}: did not keep up (" in proc.stdout
    run = mlflow_runs(store)[1][0]
    assert run.data.tags["xp.diagnosis"] == "input-bound" and run.data.tags["xp.input"] == path
    p = run.data.params
    assert float(p["diagnosis.synthetic_samples_per_s"]) > 1.25 * float(p["diagnosis.real_samples_per_s"])
    assert p["diagnosis.input_path"] == path and p["diagnosis.input_kept_up"] == "false"
