"""The data of examples/vit.py: images and labels from one HDF5 file, split 80/20; an offline set generated once.

The file holds ``images`` (N x H x W x 3, uint8) and ``labels`` (N, integers from 0), the layout of the
course's Tiny-ImageNet file. Offline, a learnable set of 2,000 images of 32 x 32 in 10 classes (coloured
gratings, one orientation, frequency and tint per class, in noise) is written once into $GPUSCALE_DATA
or ~/.cache/gpuscale by rank 0 while the others wait.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

import gpuscale

OFFLINE_VERSION = 2  # bump when the generator changes, so a stale cached file is not reused
log = gpuscale.get_logger("vit")


def generate_offline_h5(path: Path, *, num_classes: int = 10, per_class: int = 200, size: int = 32, seed: int = 0) -> None:
    """Write a learnable image set: each class a tinted sine grating of its own angle and frequency, in noise."""
    import h5py

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = np.empty((num_classes * per_class, size, size, 3), dtype=np.uint8)
    labels = np.repeat(np.arange(num_classes), per_class)
    for i, label in enumerate(labels):
        angle = math.pi * label / num_classes + rng.normal(0, 0.12)
        frequency = 3 + 2 * (label % 3) + rng.normal(0, 0.2)
        phase = rng.uniform(0, 2 * math.pi)
        wave = np.sin(2 * math.pi * frequency * (xx * math.cos(angle) + yy * math.sin(angle)) + phase)
        tint = 0.6 + 0.15 * np.array([math.cos(label), math.sin(label * 1.7), math.cos(label * 2.3)])
        image = 0.5 + 0.3 * wave[..., None] * tint + rng.normal(0, 0.45, (size, size, 3))
        images[i] = np.clip(image * 255, 0, 255).astype(np.uint8)
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=labels.astype(np.int64))
        f.attrs["version"] = OFFLINE_VERSION
    os.replace(tmp, path)  # readers never see a half-written file


def offline_data_path(rt: gpuscale.Runtime) -> Path:
    """The generated file, made once by rank 0 while the others wait."""
    home = Path(os.environ.get("GPUSCALE_DATA") or Path.home() / ".cache" / "gpuscale")
    path = home / f"vit-offline-v{OFFLINE_VERSION}.h5"
    if rt.is_main and not path.exists():
        log.info("generating the offline image set in %s (once)", path)
        home.mkdir(parents=True, exist_ok=True)
        generate_offline_h5(path)
    rt.barrier()
    return path


class H5Images(Dataset):
    """Images and labels of one HDF5 file, read lazily (each process and loader worker opens its own handle)."""

    def __init__(self, path: Path, indices: np.ndarray, image_size: int) -> None:
        self.path, self.indices, self.image_size = path, indices, image_size
        self._file: Any = None  # an h5py.File, opened in the process that reads

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._file is None:
            import h5py

            self._file = h5py.File(self.path, "r")
        index = int(self.indices[i])
        image = torch.from_numpy(self._file["images"][index]).permute(2, 0, 1).float().div_(255)
        if image.shape[-1] != self.image_size:
            image = F.interpolate(image[None], size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)[0]
        return (image - 0.5) / 0.5, int(self._file["labels"][index])


def open_splits(path: Path, image_size: int | None) -> tuple[H5Images, H5Images, int, int]:
    """Training and validation sets (80/20, seed 42), the number of classes and the image size."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            missing = [key for key in ("images", "labels") if key not in f]
            if missing:
                raise ValueError(f"{path} has no dataset {', '.join(missing)} (it has: {', '.join(f.keys()) or 'nothing'}); "
                                 "the file must hold images (N x H x W x 3, uint8) and labels (N)")
            shape = f["images"].shape
            labels = f["labels"][:]
    except OSError as exc:
        raise ValueError(f"cannot open {path} as HDF5: {exc}") from None
    if len(shape) != 4 or shape[-1] != 3 or shape[1] != shape[2] or shape[0] != len(labels):
        raise ValueError(f"{path}: images have shape {shape} for {len(labels)} labels; expected N x S x S x 3 for N labels")
    order = np.random.default_rng(42).permutation(len(labels))
    cut = int(0.8 * len(labels))
    size = image_size or shape[1]
    return H5Images(path, order[:cut], size), H5Images(path, order[cut:], size), int(labels.max()) + 1, size
