"""The reference for a study's per-trial cost: a bare Optuna loop over a bare Gluon loop, in one process. The same
search space, sampler, pruner and network as `python -m xp -m sweep=lr_batch` (xp's TPE, seeded per trial
number, so both propose the same trials; the median pruner; LeNet on the digits, validation accuracy reported
after every epoch), an SQLite study, and nothing else: no tracking, no config, no files.

    .venv/bin/python benchmarks/bare_study.py STORAGE_URL N_TRIALS EPOCHS
"""

from __future__ import annotations

import sys


def main(storage: str, n_trials: int, epochs: int) -> int:
    import numpy as np
    import optuna

    from common import compose
    from xp.run.plan import build_plan
    from xp.studies.study import load_spec
    from xp.studies.trial import make_pruner, make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    plan = build_plan(compose(), visible_gpus=0)
    arrays = load(plan)

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 0.002, 0.2, log=True)
        batch = trial.suggest_categorical("batch", [16, 32, 64, 128])
        momentum = trial.suggest_float("momentum", 0.5, 0.95)

        def after_epoch(accuracy: float, epoch: int) -> None:
            trial.report(accuracy, epoch)
            if epoch < epochs and trial.should_prune():
                raise optuna.TrialPruned()

        return train(plan, arrays, lr, batch, momentum, epochs, after_epoch)

    spec = load_spec("lr_batch")  # xp's sampler (TPE, seeded per trial number) and pruner: the same proposals
    study = optuna.create_study(study_name="bare", storage=storage, direction="maximize",
                                sampler=make_sampler(spec), pruner=make_pruner(spec))
    study.optimize(objective, n_trials=n_trials)
    print(f"bare: {len(study.trials)} trials, best val_accuracy {study.best_value:.4f}")
    return 0 if np.isfinite(study.best_value) else 1


def load(plan) -> tuple:
    """The digits as training reads them: (x, y, validation x) as MXNet arrays, validation labels, train size."""
    import mxnet as mx

    from xp.data import datasets

    x, y, vx, vy = datasets.load_arrays(plan.dataset)
    return mx.nd.array(x), mx.nd.array(y), mx.nd.array(vx), vy, len(x)


def train(plan, arrays: tuple, lr: float, batch: int, momentum: float, epochs: int, after_epoch=None) -> float:
    """One trial's training, bare: LeNet on the digits (arrays: load()) with SGD; after each epoch,
    after_epoch(validation accuracy, epoch) (it may raise to stop); returns the last accuracy."""
    import mxnet as mx
    from mxnet import autograd, gluon

    from xp.data import datasets
    from xp.mx.models import build_net

    xs, ys, vxs, vy, n = arrays
    mx.random.seed(plan.seed)
    net = build_net(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr * batch / 32,
                                                         "momentum": momentum, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        order = mx.nd.array(datasets.epoch_order(n, plan.seed, epoch, True))
        data, label = xs.take(order), ys.take(order)
        for i in range(n // batch):
            with autograd.record():
                loss = loss_fn(net(data[i * batch:(i + 1) * batch]), label[i * batch:(i + 1) * batch])
            loss.backward()
            trainer.step(batch)
        accuracy = float((net(vxs).asnumpy().argmax(axis=1) == vy).mean())
        if after_epoch is not None:
            after_epoch(accuracy, epoch)
    return accuracy


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
