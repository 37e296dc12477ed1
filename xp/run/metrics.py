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
        self.update_many([(logits, labels)])

    def update_many(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
        """Add several batches at once (one pass of numpy over all their rows, far cheaper than one per batch;
        the sums come out as batch by batch). Returns the running loss sum after each batch."""
        logits = np.concatenate([b[0] for b in batches]) if len(batches) > 1 else batches[0][0]
        labels = (np.concatenate([b[1] for b in batches]) if len(batches) > 1 else batches[0][1]).astype(np.int64)
        z = logits.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # diverged logits: the loss says so (NaN/inf)
            z = z - z.max(axis=1, keepdims=True)
            log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        losses = -log_probs[np.arange(len(labels)), labels]
        hits = logits.argmax(axis=1) == labels
        hits5 = (np.argpartition(-logits, 5, axis=1)[:, :5] == labels[:, None]).any(axis=1) if self.top5 else None
        running, start = [], 0
        for b in batches:
            end = start + len(b[1])
            self.loss_sum += float(losses[start:end].sum())  # per batch, in order: the same sums as one at a time
            running.append(self.loss_sum)
            start = end
        self.correct += int(hits.sum())
        if hits5 is not None:
            self.correct5 += int(hits5.sum())
        self.n += len(labels)
        return running

    def result(self, prefix: str) -> dict[str, float]:
        n = max(1, self.n)
        out = {f"{prefix}_loss": self.loss_sum / n, f"{prefix}_accuracy": self.correct / n}
        if self.top5:
            out[f"{prefix}_top5_accuracy"] = self.correct5 / n
        return out
