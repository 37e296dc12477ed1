"""xp.check's probe of a network on PyTorch: one batch of the run's data through the network the backend builds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xp.run.plan import Plan


class Probe:
    def __init__(self, plan: Plan):
        from xp.pt.models import build_model

        torch.manual_seed(plan.seed)
        self.plan = plan
        self.net = build_model(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)

    def batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's first training batch, as the backend reads it (one process)."""
        from xp.pt.data import make_batches

        x, y = next(iter(make_batches(self.plan, 1, 0, pin=False)[0].epoch(0)))
        return x.numpy().astype(np.float32), y.numpy().astype(np.int64)

    def outputs(self, x: np.ndarray) -> np.ndarray:
        net = copy.deepcopy(self.net).eval()
        with torch.no_grad():
            return net(torch.from_numpy(x)).numpy()

    def grads(self, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[dict[str, np.ndarray], float]:
        """Each parameter's gradient of the mean cross-entropy on (x, y), in training mode, from the same weights
        and random state (seed) every time."""
        net = copy.deepcopy(self.net).train()
        torch.manual_seed(seed)
        loss = nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        return {n: p.grad.numpy().copy() for n, p in net.named_parameters() if p.grad is not None}, loss.item()

    def losses(self, x: np.ndarray, y: np.ndarray, steps: int, lr: float) -> list[float]:
        net = copy.deepcopy(self.net).train()
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        out = []
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    def step_time(self, x: np.ndarray, y: np.ndarray, steps: int) -> float:
        import time

        net = copy.deepcopy(self.net).train()
        opt = torch.optim.SGD(net.parameters(), lr=0.0)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        nn.functional.cross_entropy(net(xt), yt).backward()  # the first step's set-up is not a step's time
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(net(xt), yt).backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    def suspects(self) -> dict[str, list[str]]:
        """The layers that make N workers differ from one: BatchNorm without sync (each worker's statistics are
        its own samples'), dropout (each worker draws its own masks)."""
        bn = [f"{n} ({type(m).__name__})" for n, m in self.net.named_modules()
              if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)]
        drop = [f"{n} ({type(m).__name__})" for n, m in self.net.named_modules()
                if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
        return {"BatchNorm without sync": bn, "dropout": drop}

    def exported(self, x: np.ndarray, folder: Path) -> np.ndarray:
        """Predictions of the network saved as xp logs it (MLflow's PyTorch flavor) and loaded back."""
        import mlflow.pyfunc

        from xp.pt.export import save

        params = {n: v.detach().numpy().copy() for n, v in self.net.state_dict().items()
                  if not n.endswith("num_batches_tracked")}
        save(self.net, params, folder, x, {})
        return np.asarray(mlflow.pyfunc.load_model(str(folder)).predict(x))

    def parameter_of(self, name: str) -> str:
        return name

    def framework_version(self) -> Any:
        return torch.__version__
