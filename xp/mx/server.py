"""What the parameter servers run with kvstore=dist_async: the optimizer and xp's learning-rate
schedule, pickled to them by MXNet (the servers need xp installed)."""

from __future__ import annotations

from typing import Any

import mxnet as mx

from xp.run.plan import Plan, learning_rate


class ServerOptimizer(mx.optimizer.Optimizer):
    """Around the real optimizer: pushes to the gather key are added up (MXNetBackend.gather), every
    other key is updated by the real optimizer. Attributes read and written go to the real optimizer,
    so Trainer and Module configure it (names, multipliers, rescaling) as they would the real one."""

    def __init__(self, inner: Any, gather_index: int):  # no super().__init__: its fields live in `inner`
        self.__dict__.update(_inner=inner, _gather=gather_index)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:  # while unpickling
            raise AttributeError(name)
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __getstate__(self) -> dict:  # not Optimizer's: the real optimizer pickles itself
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def create_state(self, index: Any, weight: Any) -> Any:
        return None if index == self._gather else self._inner.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return None if index == self._gather else self._inner.create_state_multi_precision(index, weight)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._apply("update", index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._apply("update_multi_precision", index, weight, grad, state)

    def _apply(self, method: str, index: Any, weight: Any, grad: Any, state: Any) -> None:
        many = isinstance(index, (list, tuple))  # MXNet's updater passes lists when it aggregates
        rest = []
        for i, w, g, s in zip(index, weight, grad, state) if many else [(index, weight, grad, state)]:
            if i == self._gather:
                w[:] += g
            else:
                rest.append((i, w, g, s))
        if rest:
            args = [list(column) for column in zip(*rest)] if many else rest[0]
            getattr(self._inner, method)(*args)


class PlanSchedule:
    """xp's learning-rate schedule where MXNet's optimizer asks for it: on the servers, with dist_async.

    A server counts updates, one per worker push; a global step is one update from every worker.
    Picklable (it travels to the servers with the optimizer), and only needs xp installed there.
    """

    FIELDS = ("steps_per_epoch", "warmup_epochs", "effective_lr", "lr_schedule", "lr_decay", "lr_steps", "epochs")

    def __init__(self, plan: Plan):
        self.fields = {k: getattr(plan, k) for k in self.FIELDS}
        self.workers = plan.workers
        self.base_lr = plan.effective_lr  # MXNet's optimizer reads (and sets) it

    def __call__(self, num_update: int) -> float:
        from types import SimpleNamespace

        plan: Any = SimpleNamespace(**self.fields)  # the plan's fields learning_rate reads
        return learning_rate(plan, max(0, num_update - 1) // self.workers)
