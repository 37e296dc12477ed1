"""Predict the classes of image files with a model xp logged: python -m xp.predict MODEL_URI PATH...

MODEL_URI: models:/NAME@best (a study's registered best), models:/NAME/VERSION, models:/MODEL_ID, or
runs:/RUN_ID/model. PATH: image files, or folders of them (searched recursively). Each image is read as the
model's data set reads its images (its xp_input.json: shape, channels, pixel transform) and one line is printed
per image: the path, the class's name and its probability. The model is fetched once into xp's cache
(xp.tracking.models.fetch, as pretrained= fetches it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

IMAGES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


class PredictError(Exception):
    """What the user gave cannot be predicted with: one line."""


def image_files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGES)
        elif p.is_file():
            out.append(p)
        else:
            raise PredictError(f"{p}: no such file or folder")
    if not out:
        raise PredictError(f"{' '.join(paths)}: no image files ({', '.join(IMAGES)})")
    return out


def load(uri: str, tracking_uri: str) -> tuple[Any, dict[str, Any]]:
    """The model at `uri` (fetched as fine-tuning fetches it: once, into xp's cache) as a Python-function model, and
    its input's description."""
    import mlflow.pyfunc

    from xp.errors import ConfigError
    from xp.tracking.models import quiet
    from xp.readback.registry import fetch
    from xp.storefiles import sqlite_path

    if (db := sqlite_path(tracking_uri)) is not None and not db.is_file():
        raise PredictError(f"{uri}: no MLflow store at {tracking_uri} (give --tracking-uri)")
    try:
        local, described = fetch(uri, tracking_uri, what="")
    except ConfigError as e:
        raise PredictError(str(e)) from None
    with quiet():
        return mlflow.pyfunc.load_model(str(local)), described


def read_image(path: Path, described: dict[str, Any]) -> np.ndarray:
    """One image file as the model takes it: (C, H, W) float32, as its data set's validation images are made."""
    import cv2

    c, h, w = described["image_shape"]
    img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
    if img is None:
        raise PredictError(f"{path}: not an image OpenCV can read")
    pixels = described.get("pixels", {})
    short = int(pixels.get("resize") or 0)
    if short and min(img.shape[:2]) != short:  # the shorter side to `resize`, then the centre crop
        scale = short / min(img.shape[:2])
        img = cv2.resize(img, (max(w, round(img.shape[1] * scale)), max(h, round(img.shape[0] * scale))),
                         interpolation=cv2.INTER_LINEAR)
    if img.shape[0] >= h and img.shape[1] >= w and short:
        top, left = (img.shape[0] - h) // 2, (img.shape[1] - w) // 2
        img = img[top:top + h, left:left + w]
    if img.shape[:2] != (h, w):
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
    x = img.reshape(h, w, -1)[..., ::-1].transpose(2, 0, 1)  # BGR -> RGB, channels first
    if described.get("transform"):  # a registered data set's own: its pixels as its samples are made
        x = np.asarray(_transform(described["transform"])(np.ascontiguousarray(x)), np.float32)
    else:
        x = x.astype(np.float32) * float(pixels.get("scale", 1.0))
    mean = np.asarray(pixels.get("mean", [0.0] * c), np.float32).reshape(-1, 1, 1)
    std = np.asarray(pixels.get("std", [1.0] * c), np.float32).reshape(-1, 1, 1)
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)


def _transform(path: str) -> Any:
    from xp.errors import ConfigError
    from xp.models import imported

    try:
        return imported(path, "the model's data set transform")
    except ConfigError as e:
        raise PredictError(f"{e} (install the package of the model's data set here)") from None


def predict(model: Any, described: dict[str, Any], files: list[Path], batch: int = 64) -> list[tuple[Path, str, float]]:
    names = described["classes"]
    out = []
    for i in range(0, len(files), batch):
        chunk = files[i:i + batch]
        scores = np.asarray(model.predict(np.stack([read_image(f, described) for f in chunk])), np.float64)
        probs = np.exp(scores - scores.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        out += [(f, names[int(k)] if int(k) < len(names) else str(int(k)), float(p[k]))
                for f, p, k in zip(chunk, probs, probs.argmax(1))]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xp.predict", description=__doc__.splitlines()[0])
    ap.add_argument("model", help="models:/NAME@best, models:/NAME/VERSION, models:/MODEL_ID or runs:/RUN_ID/model")
    ap.add_argument("paths", nargs="+", help="image files or folders")
    ap.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI or "
                                           "sqlite:///mlruns/mlflow.db)")
    args = ap.parse_args(argv)
    from xp.tracking.stores import resolve_uri

    try:
        files = image_files(args.paths)
        model, described = load(args.model, resolve_uri(args.tracking_uri))
        for path, name, p in predict(model, described, files):
            print(f"{path}\t{name}\t{p:.4f}")
    except PredictError as e:
        print(f"xp.predict: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # its reader stopped reading (| head)
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
