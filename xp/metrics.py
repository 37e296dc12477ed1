"""Loss and accuracy from logits, computed the same way for every backend (MXNet and PyTorch alike)."""

from __future__ import annotations

import numpy as np


class Scores:
    """Accumulates cross-entropy, top-1 and top-5 accuracy over batches (numpy, exact sums)."""

    def __init__(self, num_classes: int):
        self.top5 = num_classes > 5
        self.n = 0
        self.loss_sum = 0.0
        self.correct = 0
        self.correct5 = 0

    def update(self, logits: np.ndarray, labels: np.ndarray, pad: int = 0) -> None:
        if pad:
            logits, labels = logits[:-pad], labels[:-pad]
        labels = labels.astype(np.int64)
        z = logits.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # diverged logits: the loss says so (NaN/inf)
            z = z - z.max(axis=1, keepdims=True)
            log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        self.loss_sum += float(-log_probs[np.arange(len(labels)), labels].sum())
        self.correct += int((logits.argmax(axis=1) == labels).sum())
        if self.top5:
            top = np.argpartition(-logits, 5, axis=1)[:, :5]
            self.correct5 += int((top == labels[:, None]).any(axis=1).sum())
        self.n += len(labels)

    def result(self, prefix: str) -> dict[str, float]:
        n = max(1, self.n)
        out = {f"{prefix}_loss": self.loss_sum / n, f"{prefix}_accuracy": self.correct / n}
        if self.top5:
            out[f"{prefix}_top5_accuracy"] = self.correct5 / n
        return out


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of training step `step` (0-based, over the whole run) on worker `rank`: random layers
    (dropout) draw from it, so a run resumed at any batch draws what the uninterrupted run drew."""
    import zlib

    return zlib.crc32(f"{seed}:{rank}:{step}".encode())
