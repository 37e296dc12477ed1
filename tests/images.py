"""Small image folders for the tests: generated images plus the two real JPEG photos scikit-learn ships."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np


def sample_photos() -> list[Path]:
    import sklearn.datasets

    folder = Path(sklearn.datasets.__file__).parent / "images"
    return sorted(folder.glob("*.jpg"))  # china.jpg, flower.jpg (427x640)


def make_folder(root: Path, per_class: int = 12, size: tuple[int, int] = (40, 56), with_photos: bool = True) -> Path:
    """Classes 'bars' (horizontal stripes), 'columns' (vertical stripes), 'disc' (a bright disc):
    learnable at a glance. PNG and JPEG mixed; sizes vary so resizing is exercised.
    With with_photos, a class 'photos' holds sklearn's two JPEG photos."""
    import cv2

    rng = np.random.RandomState(0)
    for cls in ("bars", "columns", "disc"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = size[0] + rng.randint(0, 9), size[1] + rng.randint(0, 9)
            img = rng.randint(0, 60, (h, w, 3)).astype(np.uint8)
            color = rng.randint(150, 256, 3).tolist()
            if cls == "bars":
                img[:: 6] = color
                img[1:: 6] = color
            elif cls == "columns":
                img[:, :: 6] = color
                img[:, 1:: 6] = color
            else:
                cv2.circle(img, (w // 2, h // 2), min(h, w) // 3, color, -1)
            ext = ".png" if i % 2 else ".jpg"
            cv2.imwrite(str(root / cls / f"{cls}_{i:03d}{ext}"), img)
    if with_photos:
        (root / "photos").mkdir(exist_ok=True)
        for p in sample_photos():
            shutil.copy(p, root / "photos" / p.name)
    return root


def write_digits_folder(root: Path, per_class: int = 60) -> Path:
    """sklearn's real 8x8 digits as 32x32 PNGs, one folder per digit."""
    import cv2
    from sklearn.datasets import load_digits

    d = load_digits()
    counts: dict[int, int] = {}
    for img, y in zip(d.images, d.target):
        if counts.get(int(y), 0) >= per_class:
            continue
        counts[int(y)] = counts.get(int(y), 0) + 1
        os.makedirs(root / str(y), exist_ok=True)
        big = cv2.resize((img * 15).astype(np.uint8), (32, 32), interpolation=cv2.INTER_NEAREST)
        cv2.imwrite(str(root / str(y) / f"{counts[int(y)]:04d}.png"), big)
    return root


def digit_images(folder, n):
    """The first n validation digits as 8-bit PNG files named INDEX-LABEL.png."""
    import cv2

    from xp.data.datasets import _digits_split, _load_digits

    images, target = _load_digits()
    folder.mkdir()
    for i in _digits_split(0.2, None)[1][:n]:
        cv2.imwrite(str(folder / f"{i}-{target[i]}.png"), np.round(images[i] * 255 / 16).astype(np.uint8))
    return folder
