"""GPU telemetry against a fake NVML, the compute-capability guard, and cost arithmetic."""

import time
from types import SimpleNamespace

import pytest

from xp.run import callbacks
from xp.run.callbacks import CostMeter
from xp.errors import ConfigError
from xp.run.telemetry import GPUSampler, nvml_indices


class FakeNVML:
    """Two GPUs whose readings follow a script; records what was asked."""

    def __init__(self, util=(50, 70), mem_mb=(1000, 3000), power_mw=(100_000, 200_000), cc=(8, 0), name="A100"):
        self.util, self.mem, self.power, self.cc, self.name = util, mem_mb, power_mw, cc, name
        self.inits = self.shutdowns = 0
        self.queried: set[int] = set()

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        self.queried.add(i)
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[h % 2])

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.mem[h % 2] * 2**20)

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power[h % 2]

    def nvmlDeviceGetName(self, h):
        return self.name.encode()

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.cc


def one_sampled_epoch(nvml, indices, seconds: float = 0.1) -> tuple[GPUSampler, dict]:
    """A GPUSampler over `nvml` through one epoch of `seconds`; the sampler and the epoch's metrics."""
    s = GPUSampler(indices, interval_s=0.01, nvml=nvml)
    s.on_train_begin()
    s.on_epoch_begin(1)
    time.sleep(seconds)
    metrics = {}
    s.on_epoch_end(1, metrics)
    s.on_end()
    return s, metrics


def test_sampler_aggregates_per_epoch_and_per_gpu():
    nvml = FakeNVML()
    s, metrics = one_sampled_epoch(nvml, [2, 3])
    assert nvml.queried == {2, 3} and nvml.inits == 1 and nvml.shutdowns == 1
    assert metrics["gpu_utilization_pct"] == pytest.approx(60)  # mean over both GPUs and all samples
    assert (metrics["gpu_utilization_pct_min"], metrics["gpu_utilization_pct_max"]) == (50, 70)
    assert metrics["gpu_memory_mb"] == pytest.approx(3000)  # the peak
    assert metrics["gpu_power_w"] == pytest.approx(150)
    assert metrics["gpu2_utilization_pct"] == pytest.approx(50) and metrics["gpu3_memory_mb"] == pytest.approx(3000)
    assert s._thread is None  # stopped


class FakeNVMLv2(FakeNVML):
    """An NVML with v2 memory info: v1 counts the driver's reserve (500 MiB here) as used, v2 does not."""

    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        reserve = 0 if version == self.nvmlMemory_v2 else 500
        return SimpleNamespace(used=(self.mem[h % 2] + reserve) * 2**20)


def test_memory_is_read_as_nvidia_smi_shows_it_without_the_drivers_reserve():
    """On an H100 NVML's v1 memory info said 14,339 MiB where nvidia-smi said 13,859: v1 counts the reserve."""
    for nvml in (FakeNVMLv2(), FakeNVML()):  # v2 where NVML has it; v1 otherwise
        _, metrics = one_sampled_epoch(nvml, [0, 1], 0.05)
        assert metrics["gpu_memory_mb"] == pytest.approx(3000), type(nvml).__name__


class FakeProcesses(FakeNVML):
    """Two trials packed on GPU 0: this process holds 700 MiB of the 3,000 in use, another 2,300."""

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        import os

        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=700 * 2**20),
                SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=2300 * 2**20)] if h == 0 else []


def test_a_packed_trial_logs_its_own_gpu_memory_beside_the_gpus():
    """gpu_memory_mb is the GPU's (both packed trials); gpu_process_memory_mb this process's own; no own entry
    (NVML without per-process figures, or not this process): no such metric rather than a wrong one."""
    _, metrics = one_sampled_epoch(FakeProcesses(mem_mb=(3000, 3000)), [0], 0.05)
    assert metrics["gpu_memory_mb"] == pytest.approx(3000) and metrics["gpu_process_memory_mb"] == pytest.approx(700)
    _, metrics = one_sampled_epoch(FakeProcesses(), [1], 0.05)
    assert "gpu_process_memory_mb" not in metrics and metrics["gpu_memory_mb"] == pytest.approx(3000)
    _, metrics = one_sampled_epoch(FakeNVML(), [0], 0.05)
    assert "gpu_process_memory_mb" not in metrics


class FakeGPM(FakeNVML):
    """A Hopper-like NVML: GPM samples are counters (cycles active, warps resident, tensor cycles) that the script
    advances; metrics between two samples are their ratios, as NVML computes them. GPU 3 has no GPM."""

    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self):
        super().__init__()
        self.clock = 0  # advanced by the test: cycles elapsed
        self.live: set[int] = set()
        self.allocated = 0

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(h != 3))

    def nvmlGpmSampleAlloc(self):
        self.allocated += 1
        sample = SimpleNamespace(id=self.allocated)
        self.live.add(sample.id)
        return sample

    def nvmlGpmSampleGet(self, h, sample):
        sample.device, sample.clock = h, self.clock

    def nvmlGpmSampleFree(self, sample):
        self.live.remove(sample.id)

    @staticmethod
    def c_nvmlGpmMetricsGet_t():
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, req):
        assert req.version == 1 and req.sample1.device == req.sample2.device and req.sample2.clock > req.sample1.clock
        busy = {2: 90.0, 3: 40.0, 5: 25.0} if req.sample1.device == 2 else {2: 70.0, 3: 20.0, 5: 5.0}
        for m in req.metrics[:req.numMetrics]:
            m.value = busy[m.metricId]
        return req


def test_gpm_metrics_per_epoch_beside_utilization():
    """SM occupancy and tensor activity per epoch, measured over its training part, where NVML has GPM; GPUs
    without it (GPU 3 here) get none, and every sample is freed."""
    nvml = FakeGPM()
    s = GPUSampler([2, 3], interval_s=0.01, nvml=nvml)
    s.on_train_begin()
    assert [i for i, _ in s.gpm.handles] == [2]
    s.on_epoch_begin(1)
    nvml.clock += 1000
    s.on_train_epoch_end(1)
    metrics = {}
    s.on_epoch_end(1, metrics)
    s.on_end()
    assert (metrics["gpu_sm_occupancy_pct"], metrics["gpu_tensor_active_pct"], metrics["gpu_sm_active_pct"]) == \
        (40.0, 25.0, 90.0)
    assert metrics["gpu2_sm_occupancy_pct"] == 40.0 and "gpu3_sm_occupancy_pct" not in metrics
    assert metrics["gpu_utilization_pct"] == pytest.approx(60)  # NVML's utilization beside it, unchanged
    assert nvml.live == set() and nvml.allocated == 2


def test_without_gpm_there_are_no_gpm_metrics():
    s = GPUSampler([0], interval_s=0.01, nvml=FakeNVML())  # an A100-like NVML: no GPM functions at all
    s.on_train_begin()
    s.on_epoch_begin(1)
    s.on_train_epoch_end(1)
    metrics = {}
    s.on_epoch_end(1, metrics)
    s.on_end()
    assert metrics["gpu_utilization_pct"] == 50 and not [k for k in metrics if "occupancy" in k or "tensor" in k]


def test_short_epoch_still_gets_a_sample():
    s = GPUSampler([0], interval_s=60, nvml=FakeNVML())
    s.on_train_begin()
    s.on_epoch_begin(1)
    with s._lock:
        s._samples = []  # the thread's first sample was taken before the epoch began
    metrics = {}
    s.on_epoch_end(1, metrics)
    s.on_end()
    assert metrics["gpu_utilization_pct"] == 50


def test_without_nvml_nothing_is_logged_and_nothing_fails():
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    s = GPUSampler([0], nvml=Broken())
    s.on_train_begin()
    metrics = {}
    s.on_epoch_begin(1)
    s.on_epoch_end(1, metrics)
    s.on_end()
    assert metrics == {}


def test_visible_devices_map_to_nvml_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml_indices(2) == [3, 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_indices(2) == [0, 1]


def test_hopper_gpu_is_refused_for_mxnet_cu112():
    from xp.mx.base import check_compute_capability

    with pytest.raises(ConfigError, match=r"GPU 0 is NVIDIA H100 .*compute capability 9.0.*mxnet-cu112 has kernels "
                                          r"up to sm_86 and no PTX"):
        check_compute_capability(1, FakeNVML(cc=(9, 0), name="NVIDIA H100 80GB HBM3"), wheel="mxnet-cu112")
    check_compute_capability(1, FakeNVML(cc=(8, 6), name="NVIDIA A10G"), wheel="mxnet-cu112")  # fine
    check_compute_capability(1, FakeNVML(cc=(9, 0)), wheel=None)  # a CPU or unknown build: not this check's call


def test_cost_is_wall_time_from_the_jobs_start_times_price_and_target_is_timed(monkeypatch):
    clock = iter([1800.0, 3600.0])  # epoch 1's end, epoch 2's end: the job started at 0
    monkeypatch.setattr(callbacks.time, "time", lambda: next(clock))
    m = CostMeter(price_per_hour=3.06, target_accuracy=0.9, start_s=0.0)
    e1, e2 = {"val_accuracy": 0.85}, {"val_accuracy": 0.95}
    m.on_epoch_end(1, e1)
    m.on_epoch_end(2, e2)
    assert e1["cost_usd"] == pytest.approx(1.53) and e1["epoch_cost_usd"] == pytest.approx(1.53)
    assert "time_to_target_s" not in e1
    assert e2["cost_usd"] == pytest.approx(3.06) and e2["time_to_target_s"] == 3600
    assert e2["cost_to_target_usd"] == pytest.approx(3.06)


def test_an_elastic_rounds_bill_goes_on_from_the_jobs_clock_at_the_traces_prices(monkeypatch):
    """A relaunched round (job started at 0, the last epoch billed at 1,000 s) bills the relaunch's gap too, for
    each worker at the trace's price of each moment, and says what the same instance time costs on demand."""
    trace = ((0.0, 2, 1.0), (1500.0, 3, 2.0))
    monkeypatch.setattr(callbacks.time, "time", lambda: 2000.0)
    m = CostMeter(3.06, before=[{"elapsed_s": 1000.0, "cost_usd": 0.5, "cost_on_demand_usd": 1.0}], instances=2,
                  job_start_s=0.0, trace=(trace, 1.0), on_demand_per_hour=3.06)
    e = {}
    m.on_epoch_end(5, e)
    assert e["elapsed_s"] == 2000.0 and e["spot_price_per_hour"] == 2.0
    assert e["cost_usd"] == pytest.approx(0.5 + 2 * (500 * 1.0 + 500 * 2.0) / 3600)
    assert e["cost_on_demand_usd"] == pytest.approx(1.0 + 2 * 1000 * 3.06 / 3600)


def test_spot_pricing_and_missing_spot_price():
    from conftest import compose_config
    from xp.run.plan import build_plan

    p = build_plan(compose_config("hardware=p3.16xlarge", "pricing=spot", "hardware.spot_price_per_hour=7.34"),
                   visible_gpus=0)
    assert p.cost_per_hour == 7.34
    assert build_plan(compose_config("hardware=p3.16xlarge"), visible_gpus=0).cost_per_hour == 24.48
    with pytest.raises(ConfigError, match=r"pricing=spot: hardware=p3.16xlarge has no spot price"):
        build_plan(compose_config("hardware=p3.16xlarge", "pricing=spot"), visible_gpus=0)


def test_progress_bar_counts_samples_when_enabled():
    from xp.run.callbacks import ProgressBar

    bar = ProgressBar(steps=4, samples_per_step=8, enabled=True)
    bar.on_epoch_begin(1)
    for i in range(4):
        bar.on_batch_end(1, i, 8)
    assert bar.bar.n == 32 and bar.bar.total == 32
    bar.on_train_epoch_end(1)
    assert bar.bar is None
    quiet = ProgressBar(steps=4, samples_per_step=8)  # pytest's stderr is not a terminal
    quiet.on_epoch_begin(1)
    assert quiet.bar is None


@pytest.mark.slow
def test_mlflow_system_metrics_are_logged(tmp_path, store):
    from conftest import mlflow_runs, run_xp

    proc = run_xp(tmp_path, store, "epochs=20", "system_metrics_interval_s=0.2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = mlflow_runs(store)[1][0]
    system = [k for k in run.data.metrics if k.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system and "system/system_memory_usage_megabytes" in system
    assert "gpu_utilization_pct" not in run.data.metrics  # no NVML here: absent, not zero


def test_system_metrics_are_sampled_at_the_start_and_the_end_of_a_short_run(tmp_path):
    """MLflow's own monitor samples every 10 s and logs nothing for a run shorter than that; xp samples at the
    start of training, at doubling intervals, and at the end."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from xp.run.telemetry import SystemMetrics

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "a").as_uri())
    points = {}
    for name, seconds in (("instant", 0.0), ("short", 0.6)):
        run_id = client.create_run(exp, run_name=name).info.run_id
        s = SystemMetrics(lambda m, step, r=run_id: client.log_batch(  # as the run's tracker logs them
            r, metrics=[Metric(k, v, int(time.time() * 1000), step) for k, v in m.items()]), interval_s=10)
        s.on_train_begin()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # a busy training loop: CPU % must say so
            sum(range(10_000))
        s.on_end()
        points[name] = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
        assert client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert len(points["instant"]) == 1 and len(points["short"]) == 2  # the end; the start and the end
    assert [p.step for p in points["short"]] == [0, 1] and all(p.value > 0 for p in points["short"])
    cpu = [p.value for p in client.get_metric_history(run_id, "system/cpu_utilization_percentage")]
    assert len(cpu) == 2 and min(cpu) > 10  # one of 2 cores busy is 50%: measured since the sampler began


@pytest.mark.slow
def test_system_metrics_write_to_the_runs_store_only(tmp_path):
    """MLflow's own system-metrics monitor opened the default store (sqlite:///mlflow.db in the working folder, or
    $MLFLOW_TRACKING_URI) from every run, creating its schema there: a stray database beside the user's files
    (one was committed to this repository), and two trials creating one at once raced through its migrations."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, mlflow_runs

    store = f"sqlite:///{tmp_path}/store/m.db"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    r = subprocess.run([sys.executable, "-m", "xp", "epochs=1", f"tracking_uri={store}",
                        "system_metrics_interval_s=1", f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    (run,) = mlflow_runs(store)[1]
    assert "system/cpu_utilization_percentage" in run.data.metrics  # the samples still reach the run
