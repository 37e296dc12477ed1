"""Where is the bottleneck? The same experiment, briefly, three ways (seed: "our GPUs were stalling").

real data (the full pipeline and training), IO only (the pipeline alone), synthetic
data (training alone, on a batch already in memory); with several devices also
synthetic on one device. The verdict compares the rates:

- input-bound: real well below synthetic, and the pipeline alone barely faster than real training
  or under half of synthetic: the decoder cannot keep up even with the cores to itself; more
  decode threads (data_nthreads) help, up to the cores;
- communication-bound: N devices on synthetic data well below N x one device;
- mixed: real well below synthetic although the pipeline alone comes near it: decoding and
  training compete for the same cores;
- compute-bound: the pipeline keeps up; only faster devices or less work help.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from xp.data.datasets import DatasetSpec
from xp.run.callbacks import ThroughputMeter
from xp.run.train import fire, train_epoch

if TYPE_CHECKING:
    from xp.run.plan import Plan

log = logging.getLogger("xp")

SLOW = 0.8  # "well below": less than 80% of the reference rate


@dataclass(frozen=True)
class Diagnosis:
    verdict: str  # input-bound | communication-bound | compute-bound | mixed
    advice: str
    rates: dict[str, float]
    pipeline: str = ""  # the input path that ran, in words
    kept_up: bool = True  # the pipeline alone delivered at least what training alone consumes


def judge(real: float, io: float, synthetic: float, threads: int, devices: int = 1,
          synthetic_one: float | None = None, cores: int | None = None) -> Diagnosis:
    rates = {"real": real, "io": io, "synthetic": synthetic}
    if synthetic_one:
        rates["synthetic_1_device"] = synthetic_one
    if real < SLOW * synthetic and (io < 1.5 * real or io < synthetic / 2):
        want = max(math.ceil(threads * synthetic / max(io, 1e-9)), threads + 1)
        if cores and threads >= cores:
            more = f"data_nthreads ({threads}) already covers this machine's {cores} cores: "
        else:
            more = (f"raise data_nthreads from {threads} to about {min(want, cores) if cores else want}"
                    + (f" (this machine has {cores} cores)" if cores else "") + ", or ")
        advice = (f"the input pipeline delivers {io:.0f} samples/s, training could take {synthetic:.0f}: {more}"
                  "store smaller images (xp.prepare --resize)")
        return Diagnosis("input-bound", advice, rates)
    if devices > 1 and synthetic_one and synthetic < SLOW * devices * synthetic_one:
        eff = synthetic / (devices * synthetic_one)
        return Diagnosis("communication-bound", f"{devices} devices reach {eff:.0%} of {devices} x one device on "
                         "in-memory data: gradient aggregation dominates; try a larger batch per device, "
                         "kvstore=device (or nccl on GPUs), or fewer devices", rates)
    if real < SLOW * synthetic:
        return Diagnosis("mixed", f"training reaches {real / synthetic:.0%} of its in-memory rate although the "
                         f"pipeline alone delivers {io:.0f} samples/s: decoding and training compete for the "
                         "same cores", rates)
    return Diagnosis("compute-bound", f"the input pipeline keeps up ({io:.0f} samples/s alone against "
                     f"{real:.0f} in training): only faster devices, mixed precision or a smaller model help", rates)


def measure(plan: Plan, backend_cls: type, extra: list | None = None) -> tuple[float, str]:
    """samples/s of one short epoch of `plan` (warm-up batches excluded), without evaluation; and how the
    backend made its batches (Backend.input_path)."""
    backend = backend_cls()
    backend.setup(plan)
    meter = ThroughputMeter(plan.timing_warmup_batches, "rate")
    callbacks = [meter, *(extra or [])]
    fire(callbacks, "on_train_begin")
    try:
        fire(callbacks, "on_epoch_begin", 1)
        train_epoch(backend.plan, backend, 1, lambda step, n: fire(callbacks, "on_batch_end", 1, step, n))
        fire(callbacks, "on_train_epoch_end", 1)
        metrics: dict[str, float] = {}
        fire(callbacks, "on_epoch_end", 1, metrics)
    finally:
        fire(callbacks, "on_end")
    return metrics["rate"], backend.input_path


def diagnose(plan: Plan, backend_cls: type, steps: int, cores: int | None = None) -> Diagnosis:
    short = replace(plan, epochs=1, steps_per_epoch=min(plan.steps_per_epoch, steps))
    d = plan.dataset
    synthetic_data = DatasetSpec("synthetic", d.num_classes, d.image_shape, short.steps_per_epoch * plan.global_batch,
                                 plan.global_batch, {})
    real, _ = measure(short, backend_cls)
    io, pipeline = measure(replace(short, test_io=True), backend_cls)
    synthetic, _ = measure(replace(short, dataset=synthetic_data), backend_cls)
    one = None
    if len(plan.devices) > 1:
        single = replace(short, dataset=synthetic_data, devices=plan.devices[:1], worker_batch=plan.batch,
                         global_batch=plan.batch * plan.workers)
        one, _ = measure(single, backend_cls)
    verdict = judge(real, io, synthetic, plan.data_nthreads, len(plan.devices) * plan.workers, one, cores)
    return replace(verdict, pipeline=pipeline, kept_up=io >= synthetic)


def diagnosed(plan: Plan, backend_cls: type) -> tuple[float, dict[str, str], dict[str, str]]:
    """A diagnose=true run: the diagnosis on the console, and what its MLflow run keeps: (the real rate, the
    params, the tags)."""
    log.info(f"diagnosis: {min(plan.steps_per_epoch, plan.diagnose_steps)} batches each with real data, "
             "IO only and synthetic data" + (", and synthetic on one device" if len(plan.devices) > 1 else ""))
    d = diagnose(plan, backend_cls, plan.diagnose_steps, os.cpu_count())
    for k, v in d.rates.items():
        log.info(f"  {k:<20} {v:10.1f} samples/s")
    log.info(f"input: {d.pipeline}: " + (f"kept up ({d.rates['io']:.0f} samples/s alone, training alone takes "
                                          f"{d.rates['synthetic']:.0f})" if d.kept_up else
                                          f"did not keep up ({d.rates['io']:.0f} samples/s alone, training alone "
                                          f"could take {d.rates['synthetic']:.0f})"))
    log.info(f"verdict: {d.verdict}: {d.advice}")
    params = {**{f"diagnosis.{k}_samples_per_s": f"{v:.6g}" for k, v in d.rates.items()},
              "diagnosis.input_path": d.pipeline, "diagnosis.input_kept_up": str(d.kept_up).lower()}
    return d.rates["real"], params, {"xp.diagnosis": d.verdict, "xp.input": d.pipeline}
