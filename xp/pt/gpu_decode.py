"""dataset.decode=gpu: DataLoader workers read a batch's records (xp.pt.data.EncodedRecords); the main
process decodes them on the GPU with nvJPEG (torchvision.io.decode_jpeg, the batch in one call), then crops,
resizes, mirrors and normalises the whole batch in a few batched kernels (crop_resize), with the CPU path's
per-sample draws (xp.pt.data.geometry), so a sample's pixels do not depend on where it was decoded."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch



class GpuDecoder:
    """dataset.decode=gpu, the main process's part: a batch's JPEGs decoded on `device` by nvJPEG in one call,
    then cropped, resized (bilinear, rounded to whole levels as OpenCV's resize of 8-bit pixels is), mirrored
    and normalised there as one batch. An image nvJPEG cannot decode (not a JPEG, CMYK) is decoded by OpenCV on
    the CPU and copied over; `cpu_decoded` counts them."""

    def __init__(self, images: Any, device: Any):
        self.images, self.device = images, torch.device(device)
        c = images.shape[0]
        self.mean = torch.tensor(images.mean, device=self.device).view(c, 1, 1)
        self.std = torch.tensor(images.std, device=self.device).view(c, 1, 1)
        self.cpu_decoded = 0

    def __call__(self, blob: torch.Tensor, sizes: torch.Tensor, numbers: torch.Tensor, epoch: int) -> torch.Tensor:
        import torch.nn.functional as F

        indices: list[int] = numbers.tolist()
        images = self.decode(list(torch.split(blob, sizes.tolist())), indices)
        boxes, mirrors = [], []
        for j, (img, i) in enumerate(zip(images, indices)):
            g = self.images.geometry(tuple(img.shape[1:]), i, epoch)
            if g.resize:  # an image not stored at dataset.resize: its shorter side brought there first, on its own
                x = F.interpolate(img[None].float(), size=g.resize, mode="bilinear", align_corners=False)
                images[j] = x.round_()[0].to(torch.uint8)
            boxes.append(g.box)
            mirrors.append(g.mirror)
        out = crop_resize(images, boxes, mirrors, self.images.shape[1:])
        return out.sub_(self.mean).div_(self.std)

    def decode(self, parts: list[torch.Tensor], numbers: list[int]) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        mode = ImageReadMode.GRAY if self.images.shape[0] == 1 else ImageReadMode.RGB
        try:
            return list(decode_jpeg(parts, mode=mode, device=self.device))
        except RuntimeError:  # one of them is not for nvJPEG: each on its own
            pass
        out = []
        for part, i in zip(parts, numbers):
            try:
                out.append(decode_jpeg(part, mode=mode, device=self.device))
            except RuntimeError:
                out.append(self._cpu_decode(part, i))
        return out

    def _cpu_decode(self, part: torch.Tensor, i: int) -> torch.Tensor:
        import cv2

        from xp.data.recordio import DataError

        c = self.images.shape[0]
        img = cv2.imdecode(part.numpy(), cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
        if img is None:
            raise DataError(f"{self.images.file.rec_path}: record {self.images.keys[i]} holds no decodable image")
        self.cpu_decoded += 1
        img = img[:, :, None] if img.ndim == 2 else img[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).to(self.device)


def gpu_decode_problem(device: Any) -> str | None:
    """Why JPEGs cannot be decoded on `device` by this torchvision (one line), or None when they can."""
    try:
        from torchvision.io import decode_jpeg, encode_jpeg

        decode_jpeg(encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8)), device=device)
    except Exception as e:  # a probe: whatever fails (no driver, a CPU-only build, no nvJPEG) means it cannot
        return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return None


def crop_resize(images: Sequence[torch.Tensor], boxes: Sequence[tuple[int, int, int, int]], mirrors: Sequence[bool],
                size: Sequence[int]) -> torch.Tensor:
    """Each image's box (top, left, height, width) resized to `size` and mirrored where asked, as a float batch
    (N, C, height, width) of whole levels. The resize is F.interpolate's bilinear one (align_corners=False: the
    same source points and weights, in float32) applied to the box alone; all images at once: the images end
    to end in one buffer, each output pixel's four source pixels gathered from it (per image, one kernel per
    step of crop, resize, round and mirror cost about 0.3 ms an image on an H100: 0.6x the CPU workers)."""
    dev, c = images[0].device, images[0].shape[0]
    flat = torch.cat([img.reshape(c, -1) for img in images], 1).float()
    widths = [img.shape[2] for img in images]
    offsets = np.concatenate([[0], np.cumsum([img.shape[1] * img.shape[2] for img in images])[:-1]])
    meta = torch.tensor([[o, w, *box, m] for o, w, box, m in zip(offsets, widths, boxes, mirrors)],
                        dtype=torch.int64).to(dev, non_blocking=True)
    offset, width, top, left, height, wide, mirror = meta.T
    y0, y1, ly = _axis(int(size[0]), top, height)
    x0, x1, lx = _axis(int(size[1]), left, wide)
    flipped = mirror.bool()[:, None]
    x0, x1, lx = (torch.where(flipped, v.flip(1), v) for v in (x0, x1, lx))
    rows0, rows1 = (offset[:, None] + y * width[:, None] for y in (y0, y1))

    def at(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return flat[:, rows[:, :, None] + cols[:, None, :]]  # (C, N, height, width)

    lx, ly = lx[:, None, :], ly[:, :, None]
    top_row = (1 - lx) * at(rows0, x0) + lx * at(rows0, x1)
    bottom_row = (1 - lx) * at(rows1, x0) + lx * at(rows1, x1)
    out = (1 - ly) * top_row + ly * bottom_row
    return out.round_().permute(1, 0, 2, 3).contiguous()


def _axis(n: int, start: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis, for n output pixels of each box (start, length): the two source indexes and the second
    one's weight, as upsample_bilinear2d computes them (source = scale x (i + 0.5) - 0.5, not below 0)."""
    scale = length.float() / n
    src = ((torch.arange(n, device=start.device, dtype=torch.float32) + 0.5) * scale[:, None] - 0.5).clamp_(min=0)
    i0 = src.long()
    i1 = i0 + (i0 < length[:, None] - 1).long()
    return start[:, None] + i0, start[:, None] + i1, src - i0
