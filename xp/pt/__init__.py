"""What the PyTorch backend (plugins/torch_ddp.py) brings of its own: models and data loading.

models: xp's LeNet in PyTorch and torchvision's networks under xp's model names;
data: batches on the same sample order and sharding as the MXNet iterators (xp.datasets),
RecordIO files decoded in DataLoader workers. Only the torch backend imports this package.
"""
