"""`python -m xp.check model=NAME dataset=NAME [backend=...]`: does a network train here, export, and train the
same on N workers as on one? One short table; exit 1 when a line fails, 2 on bad input.

    python -m xp.check model=tinynet dataset=shapes backend=torch
    python -m xp.check --list          # the registered networks and data sets
    python -m xp.check --config-dir myconf model=mynet dataset=mydata   # options of your own config folder

Every line is measured on the run's own first training batch (B = batch, as the backend reads it):
  output      the network's output for the batch is (B, classes)
  trains      overfitting that batch (SGD, momentum 0.9): learns (the loss below FALL x the first in STEPS steps at
              the run's lr), learns slowly (a warning: only in more steps, up to LONG_STEPS or LONG_S seconds, or at
              10x or 0.1x the lr), or does not learn (FAIL, saying what it tried and saw: loss flat, rising, NaN)
  export      saved as xp logs it (MLflow), loaded back: the same predictions (within RTOL)
  N workers   2 workers of B/2, their gradients averaged (as dist_sync, Horovod and DDP do), against 1 of B: the
              same gradient for every parameter (within RTOL); where not, the layers that make them differ
              (BatchNorm without sync, dropout) or, with none of those, a layer that reads the batch size
  samples/s   forward, backward and update of the batch on this machine
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xp.errors import ConfigError, XPError

if TYPE_CHECKING:
    from xp.run.plan import Plan

STEPS = 20  # steps on one batch in which a network that learns lowers the loss below FALL x the first
RTOL, ATOL = 1e-4, 1e-6
FALL = 0.9  # the loss after STEPS steps is below FALL x the first
LONG_STEPS, LONG_S = 200, 10.0  # a slow starter's chance: up to this many steps, or about these seconds, per lr
LRS = (1.0, 10.0, 0.1)  # the learning rates tried for it: the run's, times these
FLAT = 0.01  # a loss within this fraction of the first is flat


def _reached(losses: list[float]) -> int | None:
    """The first step whose loss is below FALL x the first (None: none, or the loss went NaN before)."""
    for i, v in enumerate(losses):
        if not math.isfinite(v):
            return None
        if v < FALL * losses[0]:
            return i
    return None


def _saw(losses: list[float]) -> str:
    """What a loss curve that did not fall did: NaN, rising, flat, or fell too little."""
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad is not None:
        return f"loss NaN after {bad} steps"
    first, last = losses[0], losses[-1]
    if last > first * (1 + FLAT):
        return f"loss rising {first:.4f} -> {last:.4f}"
    if abs(last - first) <= FLAT * abs(first):
        return f"loss flat at {first:.4f}"
    return f"loss {first:.4f} -> {last:.4f}, not below {FALL:g}x"


def learning(probe: Any, x: np.ndarray, y: np.ndarray, lr: float) -> tuple[str, str]:
    """The "trains" line: (ok | warn | FAIL, what it saw). Overfits the one batch as practitioners check a network:
    STEPS steps at the run's lr; if the loss has not fallen, up to LONG_STEPS steps (LONG_S seconds) at each of
    LRS x lr, the first that makes it fall saying "learns slowly"."""
    losses = probe.losses(x, y, STEPS, lr)
    if _reached(losses) is not None:
        return "ok", f"learns: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps at lr {lr:g}"
    per_step = probe.step_time(x, y, 3)  # (warm: a framework's first steps set things up)
    steps = max(STEPS, min(LONG_STEPS, int(LONG_S / max(per_step, 1e-6))))
    tried = []
    for mult in LRS:
        at = lr * mult
        curve = probe.losses(x, y, steps, at)
        tried.append((at, curve))
        i = _reached(curve)
        if i is not None:
            return "warn", (f"learns slowly: loss {curve[0]:.4f} -> {curve[i]:.4f} in {i + 1} steps at lr {at:g} "
                            f"({losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps at lr {lr:g})")
    return "FAIL", (f"does not learn: in {steps} steps " + "; ".join(f"at lr {at:g} {_saw(c)}" for at, c in tried))


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


def rows(plan: Plan, backend_cls: Any) -> list[tuple[str, str, str]]:
    """Each line of the check: (what, ok | warn | FAIL, what it saw)."""
    probe = backend_cls.probe(plan)
    x, y = probe.batch()
    out: list[tuple[str, str, str]] = []

    def line(what: str, ok: bool, said: str) -> None:
        out.append((what, "ok" if ok else "FAIL", said))

    got = probe.outputs(x)
    want = (len(x), plan.dataset.num_classes)
    line("output", got.shape == want, f"{got.shape} for a batch of {len(x)}, {want[1]} classes")
    out.append(("trains", *learning(probe, x, y, plan.lr)))
    with tempfile.TemporaryDirectory(prefix="xp-check-") as tmp:
        back = probe.exported(x, Path(tmp) / "model")
    same = _close(back, probe.outputs(x))
    line("export", same, "MLflow model loaded back: " + ("the same predictions" if same else
                                                        f"predictions differ by {np.abs(back - got).max():.3g}"))
    if len(x) % 2:
        line("N workers", False, f"batch={len(x)}: give an even batch to split it over 2 workers")
    else:
        line("N workers", *exactness(probe, x, y, plan.seed))
    step = probe.step_time(x, y, 5)
    line("samples/s", True, f"{len(x) / step:,.0f} (batch {len(x)}, {probe.framework_version()})")
    return out


def table(name: str, lines: list[tuple[str, str, str]]) -> str:
    width = max(len(k) for k, _, _ in lines)
    head = f"xp.check {name}"
    return "\n".join([head, *(f"  {k:<{width}}  {status:<4}  {said}" for k, status, said in lines)])


def listing() -> str:
    from xp import models
    from xp.data import datasets, plugins

    return (f"networks (model=NAME): {', '.join(models.names())}\n"
            f"data sets (dataset=NAME): {', '.join(sorted({*datasets.builtin(), *plugins.names()}))}")


CONFIG_DIR = ("--config-dir", "-cd")  # the user's own config folder (its model/ and dataset/ options), as for xp


def main(argv: list[str] | None = None) -> int:
    from xp import preflight
    from xp.data import plugins
    from xp.cli import error_line
    from xp.launching.launcher import offer_options
    from xp.run.backend_plan import plan_and_backend
    from xp.studies import studyfile

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "--list" in argv:
            print(listing())
            return 0
        flags = [a for i, a in enumerate(argv) if a.startswith("-") and a.split("=")[0] not in CONFIG_DIR
                 and not (i and argv[i - 1] in CONFIG_DIR)]
        if flags:
            raise ConfigError(f"{flags[0]}: python -m xp.check takes KEY=VALUE settings (model=NAME dataset=NAME "
                              "backend=NAME ...), --config-dir DIR (your own options) or --list")
        studyfile.register()
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
    return 1 if any(status == "FAIL" for _, status, _ in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
