"""A user's module that fails as it is imported."""

RATIO = 1 / 0


def net(task):
    return None
