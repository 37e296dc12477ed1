"""`python -m xp.check model=NAME dataset=NAME [backend=...]`: does a network train here, export, and train the
same on N workers as on one? One short table; exit 1 when a line fails, 2 on bad input.

    python -m xp.check model=tinynet dataset=shapes backend=torch
    python -m xp.check --list          # the registered networks and data sets

Every line is measured on the run's own first training batch (B = batch, as the backend reads it):
  output      the network's output for the batch is (B, classes)
  trains      one step, then the loss falls over STEPS steps on that batch (SGD, momentum 0.9)
  export      saved as xp logs it (MLflow), loaded back: the same predictions (within RTOL)
  N workers   2 workers of B/2, their gradients averaged (as dist_sync, Horovod and DDP do), against 1 of B: the
              same gradient for every parameter (within RTOL); where not, the layers that make them differ
              (BatchNorm without sync, dropout) or, with none of those, a layer that reads the batch size
  samples/s   forward, backward and update of the batch on this machine
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xp.errors import ConfigError, XPError

if TYPE_CHECKING:
    from xp.run.plan import Plan

STEPS = 20  # steps on one batch that must lower the loss
RTOL, ATOL = 1e-4, 1e-6
FALL = 0.9  # the loss after STEPS steps is below FALL x the first


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))


def exactness(probe: Any, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[bool, str]:
    """One worker's gradient on B against two workers' on B/2, averaged."""
    whole, _ = probe.grads(x, y, seed)
    half = len(x) // 2
    first, _ = probe.grads(x[:half], y[:half], seed)
    second, _ = probe.grads(x[half:], y[half:], seed + 1)  # another worker: its own random state
    differ = [n for n in whole if not _close(whole[n], (first[n] + second[n]) / 2)]
    if not differ:
        return True, f"2 x B/2 = 1 x B for all {len(whole)} parameters (rtol {RTOL:g})"
    causes = [f"{kind}: {', '.join(layers[:4])}{' ...' if len(layers) > 4 else ''}"
              for kind, layers in probe.suspects().items() if layers]
    if not causes:
        again, _ = probe.grads(x, y, seed)
        causes = ["a layer that reads the batch size (or draws at random)" if all(
            _close(whole[n], again[n]) for n in whole) else "a layer whose result changes from run to run"]
    return False, (f"{len(differ)} of {len(whole)} parameters differ ({', '.join(differ[:3])}"
                   f"{' ...' if len(differ) > 3 else ''}); from {'; '.join(causes)}")


def rows(plan: Plan, backend_cls: Any) -> list[tuple[str, bool, str]]:
    probe = backend_cls.probe(plan)
    x, y = probe.batch()
    out: list[tuple[str, bool, str]] = []
    got = probe.outputs(x)
    want = (len(x), plan.dataset.num_classes)
    out.append(("output", got.shape == want, f"{got.shape} for a batch of {len(x)}, {want[1]} classes"))
    losses = probe.losses(x, y, STEPS, plan.lr)
    falls = bool(np.isfinite(losses).all() and losses[-1] < FALL * losses[0])
    out.append(("trains", falls, f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps at lr {plan.lr:g}"))
    with tempfile.TemporaryDirectory(prefix="xp-check-") as tmp:
        back = probe.exported(x, Path(tmp) / "model")
    same = _close(back, probe.outputs(x))
    out.append(("export", same, "MLflow model loaded back: " + ("the same predictions" if same else
                                                               f"predictions differ by {np.abs(back - got).max():.3g}")))
    if len(x) % 2:
        out.append(("N workers", False, f"batch={len(x)}: give an even batch to split it over 2 workers"))
    else:
        ok, said = exactness(probe, x, y, plan.seed)
        out.append(("N workers", ok, said))
    step = probe.step_time(x, y, 5)
    out.append(("samples/s", True, f"{len(x) / step:,.0f} (batch {len(x)}, {probe.framework_version()})"))
    return out


def table(name: str, lines: list[tuple[str, bool, str]]) -> str:
    width = max(len(k) for k, _, _ in lines)
    head = f"xp.check {name}"
    return "\n".join([head, *(f"  {k:<{width}}  {'ok  ' if ok else 'FAIL'}  {said}" for k, ok, said in lines)])


def listing() -> str:
    from xp import models
    from xp.data import datasets, plugins

    return (f"networks (model=NAME): {', '.join(models.names())}\n"
            f"data sets (dataset=NAME): {', '.join(sorted({*datasets.builtin(), *plugins.names()}))}")


def main(argv: list[str] | None = None) -> int:
    from xp import preflight
    from xp.data import plugins
    from xp.cli import error_line
    from xp.launching.launcher import offer_options
    from xp.run.backend_plan import plan_and_backend
    from xp.studies import study

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "--list" in argv:
            print(listing())
            return 0
        if any(a.startswith("-") for a in argv):
            raise ConfigError(f"{next(a for a in argv if a.startswith('-'))}: python -m xp.check takes KEY=VALUE "
                              "settings (model=NAME dataset=NAME backend=NAME ...) or --list")
        study.register()
        offer_options()
        plugins.offer_options()
        configs = preflight.preflight([*argv, "workers=1"]).configs
        if len(configs) != 1:
            raise ConfigError("python -m xp.check checks one network on one data set: give one value per setting")
        plan, backend_cls = plan_and_backend(configs[0])
        lines = rows(plan, backend_cls)
    except XPError as e:
        return error_line(e, e.exit_code)
    except KeyboardInterrupt:
        return error_line("interrupted (Ctrl-C)", 130)
    print(table(f"model={plan.model.name} dataset={plan.dataset.name} backend={plan.backend}", lines))
    return 0 if all(ok for _, ok, _ in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
