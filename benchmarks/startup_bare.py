"""The bare script `benchmarks/startup.py` compares `python -m xp epochs=1` with: LeNet (xp's layers) hybridized,
on sklearn's digits read from the file sklearn ships, batch 32, SGD lr 0.02 momentum 0.9 (xp's defaults), one epoch, validation accuracy printed.
It writes nothing and logs nothing: the start-up a hand-written Gluon script pays."""

import importlib.util
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

spec = importlib.util.find_spec("sklearn")
data = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")
x, y = (data[:, :-1].reshape(-1, 1, 8, 8) / 16.0).astype(np.float32), data[:, -1].astype(np.float32)
order = np.random.RandomState(0).permutation(len(y))
n_val = int(round(len(y) * 0.2))
train, val = order[n_val:], order[:n_val]

net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2, 2),
        gluon.nn.Conv2D(64, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2, 2),
        gluon.nn.Flatten(), gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.02, "momentum": 0.9})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
batch = 32
for i in range(0, len(train) - batch + 1, batch):
    idx = train[i:i + batch]
    xb, yb = mx.nd.array(x[idx]), mx.nd.array(y[idx])
    with autograd.record():
        loss = loss_fn(net(xb), yb)
    loss.backward()
    trainer.step(batch)
pred = net(mx.nd.array(x[val])).argmax(axis=1).asnumpy()
print(f"val_accuracy {float((pred == y[val]).mean()):.4f}")
