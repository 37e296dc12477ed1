"""GPU telemetry per epoch (NVML on a background thread) and MLflow's system metrics.

MLflow's system metrics (CPU, memory, and GPU where present) are sampled with MLflow's
own monitors rather than re-implemented; xp decides when (start, end, and in between). The GPU sampler adds what MLflow does not
give: figures per epoch, for the GPUs of this run only, aligned with throughput.
Without NVML (a CPU machine) there are no GPU metrics and nothing fails.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from xp.run.callbacks import Callback

if TYPE_CHECKING:
    from xp.run.plan import Plan

log = logging.getLogger("xp")


def nvml_indices(count: int) -> list[int]:
    """NVML (physical) indices of the first `count` GPUs this process sees (CUDA_VISIBLE_DEVICES order)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask:
        entries = [e.strip() for e in mask.split(",") if e.strip().isdigit()]
        if len(entries) >= count:
            return [int(e) for e in entries[:count]]
    return list(range(count))


# NVML GPM metric ids (nvml.h: NVML_GPM_METRIC_*), as xp names them
GPM_METRICS = {"sm_active_pct": 2, "sm_occupancy_pct": 3, "tensor_active_pct": 5}


class GPM:
    """NVML's GPU performance monitoring (Hopper and later): how busy the chip was between two samples, where
    utilization says only that a kernel was running. SM active: share of SMs busy; SM occupancy: resident
    warps against the maximum; tensor active: share of time the SMs ran tensor-core instructions."""

    def __init__(self, nvml: Any, handles: list[tuple[int, Any]]):
        self.nvml = nvml
        self.handles = [(i, h) for i, h in handles if self._supported(h)]
        self._first: dict[int, Any] = {}

    def _supported(self, handle: Any) -> bool:
        try:
            return bool(self.nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:  # an older driver or GPU, or a pynvml without GPM
            return False

    def _sample(self, handle: Any) -> Any:
        sample = self.nvml.nvmlGpmSampleAlloc()
        self.nvml.nvmlGpmSampleGet(handle, sample)
        return sample

    def begin(self) -> None:
        self.release()
        self._first = {i: self._sample(h) for i, h in self.handles}

    def end(self) -> dict[int, dict[str, float]]:
        """Each GPU's metrics since begin()."""
        out = {}
        for i, h in self.handles:
            if i not in self._first:
                continue
            second = self._sample(h)
            request = self.nvml.c_nvmlGpmMetricsGet_t()
            request.version, request.numMetrics = self.nvml.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
            request.sample1, request.sample2 = self._first[i], second
            for j, metric_id in enumerate(GPM_METRICS.values()):
                request.metrics[j].metricId = metric_id
            try:
                self.nvml.nvmlGpmMetricsGet(request)
                out[i] = {name: float(request.metrics[j].value) for j, name in enumerate(GPM_METRICS)
                          if request.metrics[j].nvmlReturn == 0}
            finally:
                self.nvml.nvmlGpmSampleFree(second)
        self.release()
        return out

    def release(self) -> None:
        for sample in self._first.values():
            self.nvml.nvmlGpmSampleFree(sample)
        self._first = {}


class GPUSampler(Callback):
    """Samples utilization (%), memory used (MB) and power (W) of the run's GPUs every interval_s, and the
    memory this process holds on them (packed trials share a GPU: its memory used counts all of them).

    Every second is the default: NVML calls are cheap, but each holds the driver lock,
    and a tight loop slows the other clients (nvidia-smi, the training process itself).
    """

    def __init__(self, indices: list[int], interval_s: float = 1.0, nvml: Any = None):
        self.indices, self.interval = indices, interval_s
        self.nvml = nvml
        self._samples: list[tuple[int, float, float, float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpm: dict[int, dict[str, float]] = {}

    def on_train_begin(self) -> None:
        if self.nvml is None:
            try:
                import pynvml

                self.nvml = pynvml
            except ImportError:
                return
        try:
            self.nvml.nvmlInit()
            self._handles = [(i, self.nvml.nvmlDeviceGetHandleByIndex(i)) for i in self.indices]
        except Exception as e:  # no driver: no GPU metrics, training goes on
            log.debug("NVML unavailable: %s", e)
            self.nvml = None
            return
        self.gpm = GPM(self.nvml, self._handles)
        gpm = ", ".join(str(i) for i, _ in self.gpm.handles)
        log.info(f"  GPU telemetry    utilization, memory, power every {self.interval:g}s; "
                 + (f"SM occupancy and tensor activity per epoch (NVML GPM) on GPU {gpm}" if gpm
                    else "no NVML GPM on these GPUs (Hopper and later have it): no SM occupancy"))
        self._thread = threading.Thread(target=self._loop, name="xp-gpu-sampler", daemon=True)
        self._thread.start()

    def _memory_used(self, h: Any) -> float:
        """Bytes in use as nvidia-smi counts them: NVML's v2 memory info leaves out what the driver reserves,
        which v1 counts as used (on an H100: 14,339 MiB by v1 against nvidia-smi's 13,859 MiB)."""
        v2 = getattr(self.nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                return float(self.nvml.nvmlDeviceGetMemoryInfo(h, version=v2).used)
            except Exception:  # an older driver: v1
                pass
        return float(self.nvml.nvmlDeviceGetMemoryInfo(h).used)

    def _own_memory(self, h: Any) -> float:
        """Bytes this process holds on the GPU (NVML's compute processes); NaN where NVML does not say (no
        entry for this process id, as in a container with its own process ids; no per-process accounting)."""
        try:
            own = [p.usedGpuMemory for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
                   if p.pid == os.getpid() and p.usedGpuMemory is not None]
        except Exception:  # an NVML without it
            return float("nan")
        return float(sum(own)) if own else float("nan")

    def sample(self) -> None:
        rows = []
        for i, h in self._handles:
            util = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            mem = self._memory_used(h) / 2**20
            try:
                power = self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
            except Exception:  # some boards do not report power
                power = float("nan")
            rows.append((i, util, mem, power, self._own_memory(h) / 2**20))
        with self._lock:
            self._samples.extend(rows)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as e:
                log.debug("GPU sample failed: %s", e)
            self._stop.wait(self.interval)

    def on_epoch_begin(self, epoch: int) -> None:
        with self._lock:
            self._samples = []
        self._gpm = {}
        if self._thread is not None and self.gpm.handles:
            try:
                self.gpm.begin()
            except Exception as e:  # telemetry never stops training
                log.debug("GPM sample failed: %s", e)

    def on_train_epoch_end(self, epoch: int) -> None:
        if self._thread is not None and self.gpm.handles:
            try:
                self._gpm = self.gpm.end()  # the training part of the epoch, as throughput is
            except Exception as e:
                log.debug("GPM metrics failed: %s", e)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self._thread is None:
            return
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:  # an epoch shorter than the interval: take one sample now
            self.sample()
            with self._lock:
                samples, self._samples = self._samples, []
        utils = [s[1] for s in samples]
        powers = [s[3] for s in samples if s[3] == s[3]]
        metrics["gpu_utilization_pct"] = sum(utils) / len(utils)
        metrics["gpu_utilization_pct_min"] = min(utils)
        metrics["gpu_utilization_pct_max"] = max(utils)
        metrics["gpu_memory_mb"] = max(s[2] for s in samples)
        if own := [s[4] for s in samples if s[4] == s[4]]:
            metrics["gpu_process_memory_mb"] = max(own)
        if powers:
            metrics["gpu_power_w"] = sum(powers) / len(powers)
        for i in self.indices:
            mine = [s for s in samples if s[0] == i]
            if mine:
                metrics[f"gpu{i}_utilization_pct"] = sum(s[1] for s in mine) / len(mine)
                metrics[f"gpu{i}_memory_mb"] = max(s[2] for s in mine)
        for name in GPM_METRICS:
            per_gpu = {i: m[name] for i, m in self._gpm.items() if name in m}
            if per_gpu:
                metrics[f"gpu_{name}"] = sum(per_gpu.values()) / len(per_gpu)
                metrics.update({f"gpu{i}_{name}": v for i, v in per_gpu.items()})

    def on_end(self) -> None:
        if self._thread is not None:
            self.gpm.release()
            self._stop.set()
            self._thread.join(timeout=5 * self.interval + 1)
            self._thread = None
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


START_S = 0.25  # the first system sample: the start of training (CPU % needs a window to average over)


class _Monitors:
    """MLflow's system metrics, by its names (system/...): CPU, memory, disk and network measured here with psutil
    as MLflow's monitors measure them (importing MLflow for them costs a run 2 s), and a GPU's by MLflow's own
    monitor where the run has GPUs and NVML or ROCm answers. Not MLflow's SystemMetricsMonitor: that one's logger
    opens the default tracking store ($MLFLOW_TRACKING_URI), creating its schema there, unlocked, whatever store
    the run uses."""

    def __init__(self, gpus: bool = False):
        import psutil

        self.psutil, self.monitors, self._points = psutil, list[Any](), list[dict[str, float]]()
        sent = psutil.net_io_counters()
        self._net0 = (sent.bytes_recv / 1e6, sent.bytes_sent / 1e6)  # (since the run's start, as MLflow's)
        if not gpus:
            return
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        for gpu in ("gpu_monitor.GPUMonitor", "rocm_monitor.ROCMMonitor"):
            module, name = gpu.split(".")
            try:
                self.monitors.append(getattr(__import__(f"mlflow.system_metrics.metrics.{module}",
                                                        fromlist=[name]), name)())
                break
            except Exception:  # no such GPU here
                continue

    def collect_metrics(self) -> None:
        ps = self.psutil
        memory, disk = ps.virtual_memory(), ps.disk_usage(os.sep)
        self._points.append({"cpu_utilization_percentage": ps.cpu_percent(),
                             "system_memory_usage_megabytes": memory.used / 1e6,
                             "system_memory_usage_percentage": memory.used / memory.total * 100,
                             "disk_usage_percentage": disk.percent, "disk_usage_megabytes": disk.used / 1e6,
                             "disk_available_megabytes": disk.free / 1e6})
        for m in self.monitors:
            m.collect_metrics()

    def aggregate_metrics(self) -> dict[str, float]:
        out = {k: round(sum(p[k] for p in self._points) / len(self._points), 1) for k in self._points[0]} \
            if self._points else {}
        sent = self.psutil.net_io_counters()
        out.update(network_receive_megabytes=sent.bytes_recv / 1e6 - self._net0[0],
                   network_transmit_megabytes=sent.bytes_sent / 1e6 - self._net0[1])
        for m in self.monitors:
            out.update(m.aggregate_metrics())
        return out

    def clear(self) -> None:
        self._points.clear()
        for monitor in self.monitors:
            monitor.clear_metrics()


class SystemMetrics(Callback):
    """MLflow's system metrics for this run (its monitors and `system/` names: CPU, memory, disk, network, GPU),
    sampled at the start of training (after START_S), then after 1 s and at intervals doubling up to interval_s,
    and once more at the end: a run of seconds gets a few points, one of hours one every interval_s, and every
    run its start and its end. CPU % is the average since the previous sample (psutil)."""

    def __init__(self, log_metrics: Callable[[dict[str, float], int], None], interval_s: float, gpus: bool = False):
        self.log_metrics = log_metrics  # the run's tracker: its spool, no wait on MLflow
        self.interval, self.gpus = interval_s, gpus
        self._step = 0
        self.monitor: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_begin(self) -> None:
        try:
            self.monitor = _Monitors(self.gpus)
        except Exception as e:  # a missing psutil must not stop training
            log.warning("MLflow system metrics are off: %s", e)
            return
        self._thread = threading.Thread(target=self._loop, name="xp-system-metrics", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        """One point of every system metric (on the sampling thread: psutil's CPU % is per thread)."""
        self.monitor.collect_metrics()
        self.log_metrics({f"system/{k}": v for k, v in self.monitor.aggregate_metrics().items()}, self._step)
        self._step += 1
        self.monitor.clear()

    def _loop(self) -> None:
        import psutil

        psutil.cpu_percent()  # CPU % is measured from here; psutil keeps its reference per thread
        wait, then = min(START_S, self.interval), min(1.0, self.interval)
        while not self._stop.wait(wait):
            try:
                self.sample()
            except Exception as e:
                log.debug("system metrics sample failed: %s", e)
                return
            wait, then = then, min(2 * then, self.interval)
        try:
            self.sample()  # the end of the run, in this thread: CPU % since its previous sample
        except Exception as e:
            log.warning("could not log the last system metrics: %s", e)

    def on_end(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=30)
        self._thread = None


def telemetry(plan: Plan, log_metrics: Callable[[dict[str, float], int], None] | None = None) -> list[Callback]:
    """The run's samplers: NVML on GPUs; MLflow's system metrics into log_metrics (the run's tracker), if any."""
    out: list[Callback] = []
    if plan.device_type == "gpu":
        out.append(GPUSampler(nvml_indices(len(plan.devices)), plan.telemetry_interval_s))
    if log_metrics and plan.system_metrics_interval_s:
        out.append(SystemMetrics(log_metrics, plan.system_metrics_interval_s, plan.device_type == "gpu"))
    return out
