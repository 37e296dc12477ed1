"""What the MXNet backends (Gluon, Module API, Horovod) share.

models: one network definition (a Gluon HybridBlock); data: iterators on the
mx.io.DataIter contract, sharded by worker rank; metrics: loss and accuracy
computed identically for every backend; base: the batch loop.
Only backend plugins import this package; the core never imports mxnet.
"""
