"""Image sets xp makes itself (no downloads here): sklearn's real digits as large colour JPEGs, so an input
pipeline has real decoding to do (the input-pipeline recipe) and a classifier still has something to learn."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

DONE = ".complete"  # written last: a folder without it is unfinished (a killed or concurrent maker)


def digits_jpeg(cache: Path, size: int, quality: int) -> Path:
    """sklearn's 1,797 digits, each a size x size JPEG (one sub-folder per digit): upscaled, tinted and on a
    textured background (a JPEG of noise-free flat colour decodes far faster than a photo). Made once per
    (size, quality) under `cache`, atomically: two processes making it at once both end with one whole folder."""
    import cv2
    from sklearn.datasets import load_digits

    root = cache / f"digits-jpeg-{size}px-q{quality}"
    if (root / DONE).exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".tmp-", dir=cache))
    try:
        digits = load_digits()
        rng = np.random.RandomState(0)
        for i, (img, label) in enumerate(zip(digits.images, digits.target)):
            glyph = cv2.resize((img / 16.0).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
            glyph = np.clip(glyph, 0, 1)[..., None]
            back = rng.randint(40, 120, 3) + rng.randint(-40, 41, (size, size, 3), dtype=np.int16)
            fore = rng.randint(150, 256, 3)
            pixels = np.clip(back * (1 - glyph) + fore * glyph, 0, 255).astype(np.uint8)
            folder = tmp / str(label)
            folder.mkdir(exist_ok=True)
            cv2.imwrite(str(folder / f"{i:04d}.jpg"), pixels, [cv2.IMWRITE_JPEG_QUALITY, quality])
        (tmp / DONE).write_text("")
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first: its folder is as good as ours
            if not (root / DONE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
