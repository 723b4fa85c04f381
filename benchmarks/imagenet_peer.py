"""The usual PyTorch way to train from a Caffe LMDB, the peer benchmarks/imagenet_data.py
measures the Data layer against: a map-style Dataset over the LMDB's keys, each DataLoader
worker process opening its own read-only environment, PIL for JPEG files, torchvision's
transforms, pinned memory and a non_blocking copy to the device.

Transforms, as Caffe's transform_param (crop, mirror, mean, scale 1) reads in torchvision:
RandomCrop(crop), RandomHorizontalFlip(), ToTensor() (JPEG, from PIL) or ConvertImageDtype
(raw records, uint8 tensors), Normalize(mean / 255, 1 / 255) with the mean file's channel
means: (x - mean) in float32, channels in the decoder's order (RGB from PIL; BGR raw).
"""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch


def channel_means(mean_file: str | Path) -> list[float]:
    """The mean file's per-channel means (B, G, R): what the peer's Normalize subtracts."""
    from caffe_py.io.formats.blobproto import read_mean_file

    mean = read_mean_file(mean_file)
    return [float(v) for v in mean.reshape(len(mean), -1).mean(1)]


def peer_missing() -> str | None:
    """Why the peer cannot run here (None: it can)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return "torchvision is not installed on this machine"
    return None


class LmdbImages(torch.utils.data.Dataset):
    """Records of a Caffe LMDB: (image (C, crop, crop) float32, label)."""

    def __init__(self, path: Path, crop: int, means_bgr: list[float]):
        import lmdb
        from torchvision import transforms

        self.path = str(path)
        env = lmdb.open(self.path, readonly=True, lock=False, readahead=False, subdir=True)
        with env.begin() as txn:
            self.keys = list(txn.cursor().iternext(values=False))
        env.close()
        self.env = None
        self.pid = None
        scale = [1 / 255] * 3
        picked = [transforms.RandomCrop(crop), transforms.RandomHorizontalFlip()]
        self.from_pil = transforms.Compose(picked + [
            transforms.ToTensor(), transforms.Normalize([m / 255 for m in means_bgr[::-1]],
                                                        scale)])
        self.from_tensor = transforms.Compose(picked + [
            transforms.ConvertImageDtype(torch.float32),
            transforms.Normalize([m / 255 for m in means_bgr], scale)])

    def __len__(self) -> int:
        return len(self.keys)

    def _txn(self):
        if self.env is None or self.pid != os.getpid():  # one environment per worker process
            import lmdb

            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False,
                                 subdir=True)
            self.pid = os.getpid()
        return self.env.begin()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        from caffe_py.io.formats.datum import decode_datum

        with self._txn() as txn:
            datum = decode_datum(txn.get(self.keys[index]))
        if datum.encoded:
            image = Image.open(io.BytesIO(datum.data)).convert("RGB")
            return self.from_pil(image), datum.label
        pixels = np.frombuffer(datum.data, np.uint8).reshape(datum.channels, datum.height,
                                                              datum.width)
        return self.from_tensor(torch.from_numpy(pixels.copy())), datum.label


class PeerFeed:
    """``next()`` -> (data, labels) on ``device``, from a DataLoader, epoch after epoch."""

    def __init__(self, loader: torch.utils.data.DataLoader, device: torch.device):
        self.loader, self.device = loader, device
        self.batches = iter(loader)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            data, label = next(self.batches)
        except StopIteration:  # a new epoch (the workers persist)
            self.batches = iter(self.loader)
            data, label = next(self.batches)
        return (data.to(self.device, non_blocking=True),
                label.to(self.device, non_blocking=True))


@contextlib.contextmanager
def peer_feed(db: Path, crop: int, batch: int, means_bgr: list[float], device: torch.device,
              workers: int) -> Iterator[PeerFeed]:
    """The peer on database ``db``; its worker processes stop on leaving the block."""
    dataset = LmdbImages(db, crop, means_bgr)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                         num_workers=workers, pin_memory=True, drop_last=True,
                                         persistent_workers=workers > 0)
    feed = PeerFeed(loader, device)
    try:
        yield feed
    finally:
        shutdown = getattr(feed.batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del feed.batches
