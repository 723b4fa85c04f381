"""Synthetic ImageNet-style LMDBs, as ``convert_imageset --resize_height=256 --resize_width=256``
writes them, raw and ``--encoded`` (JPEG, quality 90), plus their mean file.

    python benchmarks/make_imagenet_lmdb.py /tmp/cpy_imagenet                 # 32,000 images
    python benchmarks/make_imagenet_lmdb.py /tmp/toy --images 48 --size 40    # a toy set

ImageNet cannot be fetched here, so the images are made: photo-like 256 x 256 pictures with
structure at every scale, not noise. Each is a smooth two-way colour gradient under a 1/f^a
("fractal") texture (a from 0.5 to 1.0, the spectrum of natural images; fine detail in the
brightness, the colour smoother, as in photographs), 3 to 6 shapes (discs, rectangles, bars)
of their own colour carrying an oriented grating and the texture, and a little grain. At
quality 90 (4:2:0) their JPEG files average about 39 KB (10-90%: 34-43 KB) and differ from
the raw pixels by about 4 levels on average: in the range of ImageNet photos resized to
256 x 256 (a full-size ImageNet JPEG is about 110 KB at roughly 500 x 375; at the same bits per
pixel 256 x 256 is 35-50 KB).

Written like the converter: keys ``%08d_n<class>/<file>.JPEG`` in list order, labels 0..999;
raw records are Datum (3, 256, 256) BGR with encoded=false, encoded ones hold the JPEG file
with encoded=true; the mean is ``compute_image_mean``'s BlobProto (1, 3, 256, 256). Images are
made by worker processes (one per core); the two databases and the mean are written by this
one. With ``--check`` an existing set made with the same arguments is reused.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caffe_py.io.db.lmdb_store import LmdbWriter  # noqa: E402
from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file  # noqa: E402
from caffe_py.io.formats.datum import Datum, datum_from_array, encode_datum  # noqa: E402

CLASSES = 1000
CHUNK = 64  # images per worker task
VERSION = 1
"""Of the pictures: a set made by another version is made again, not reused."""


# --- the images -------------------------------------------------------------------------------
class Painter:
    """Makes the (S, S, 3) RGB uint8 photo-like images of one size (module docstring)."""

    def __init__(self, size: int):
        self.size = size
        fy, fx = np.fft.fftfreq(size)[:, None], np.fft.rfftfreq(size)[None, :]
        self.radius = np.sqrt(fx * fx + fy * fy)
        self.radius[0, 0] = 1.0
        y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
        self.y, self.x = y, x

    def texture(self, rng: np.random.Generator, alpha: float, n: int) -> np.ndarray:
        """``n`` fields (n, S, S) of 1/f^alpha noise, unit standard deviation."""
        shape = (n, self.size, self.size // 2 + 1)
        spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
        spectrum /= self.radius ** alpha
        spectrum[:, 0, 0] = 0
        field = np.fft.irfft2(spectrum, s=(self.size, self.size)).astype(np.float32)
        return field / field.std(axis=(1, 2), keepdims=True)

    def detail(self, rng: np.random.Generator) -> np.ndarray:
        """(S, S, 3) texture as photographs have it: fine detail in the brightness, the colour
        smoother (what JPEG's 4:2:0 chroma subsampling assumes)."""
        alpha = rng.uniform(0.5, 1.0)
        luma = self.texture(rng, alpha, 1)[0] * rng.uniform(20, 45)
        chroma = self.texture(rng, alpha + 0.8, 3) * rng.uniform(5, 15)
        return luma[..., None] + np.moveaxis(chroma, 0, -1)

    def shape_mask(self, rng: np.random.Generator) -> np.ndarray:
        x, y = self.x, self.y
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.08, 0.35)
        kind = rng.integers(0, 3)
        if kind == 0:
            return (x - cx) ** 2 + (y - cy) ** 2 < r * r
        if kind == 1:
            return (abs(x - cx) < r) & (abs(y - cy) < r * rng.uniform(0.3, 1))
        angle = rng.uniform(0, np.pi)
        return abs((x - cx) * np.cos(angle) + (y - cy) * np.sin(angle)) < r * 0.25

    def image(self, rng: np.random.Generator) -> np.ndarray:
        x, y = self.x[..., None], self.y[..., None]
        base = rng.uniform(40, 215, 3).astype(np.float32)
        slope = rng.uniform(-80, 80, (2, 3)).astype(np.float32)
        texture = self.detail(rng)  # (S, S, 3)
        img = base + (x - 0.5) * slope[0] + (y - 0.5) * slope[1] + texture
        for _ in range(rng.integers(3, 7)):
            mask = self.shape_mask(rng)[..., None]
            freq, angle = rng.uniform(6, 30), rng.uniform(0, np.pi)
            grating = np.sin(2 * np.pi * freq * (x * np.cos(angle) + y * np.sin(angle)))
            colour = rng.uniform(0, 255, 3).astype(np.float32)
            img = np.where(mask, colour + grating * rng.uniform(0, 30) + texture[::-1], img)
        grain = rng.standard_normal(img.shape[:2], dtype=np.float32)[..., None]
        img += grain * rng.uniform(2, 8)  # sensor grain, in the brightness
        return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_file(rgb: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def make_chunk(task: tuple[int, int, int, int, int]) -> tuple[list, list, np.ndarray]:
    """Images start .. stop-1 (seeded by their index): their raw and JPEG values, and the
    sum of their BGR (3, S, S) pixels in float64."""
    start, stop, size, quality, seed = task
    painter = Painter(size)
    raw, encoded = [], []
    total = np.zeros((3, size, size), np.float64)
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        rgb = painter.image(rng)
        bgr = np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1))  # (3, S, S), as OpenCV
        total += bgr
        label = label_of(i)
        raw.append(encode_datum(datum_from_array(bgr, label, encoded=False)))
        encoded.append(encode_datum(Datum(data=jpeg_file(rgb, quality), label=label,
                                          encoded=True)))
    return raw, encoded, total


def label_of(i: int) -> int:
    return (i * 7919) % CLASSES  # every class, spread over the list


def key_of(i: int) -> bytes:
    return b"%08d_n%04d/img_%08d.JPEG" % (i, label_of(i), i)


# --- the databases ----------------------------------------------------------------------------
def make(out: Path, images: int, size: int, quality: int, seed: int, workers: int) -> dict:
    """Write out/raw_lmdb, out/jpeg_lmdb and out/mean.binaryproto; returns what was made."""
    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    tasks = [(i, min(i + CHUNK, images), size, quality, seed) for i in range(0, images, CHUNK)]
    raw_bytes = images * (3 * size * size + 32)
    total = np.zeros((3, size, size), np.float64)
    jpeg_sizes = []
    with _chunks(tasks, workers) as chunks, \
            LmdbWriter(out / "raw_lmdb", map_size=int(raw_bytes * 1.1) + (64 << 20)) as raw_db, \
            LmdbWriter(out / "jpeg_lmdb", map_size=raw_bytes // 2 + (64 << 20)) as jpeg_db:
        index = 0
        for raw, encoded, part in chunks:
            for raw_value, jpeg_value in zip(raw, encoded, strict=True):
                raw_db.put(key_of(index), raw_value)
                jpeg_db.put(key_of(index), jpeg_value)
                jpeg_sizes.append(len(jpeg_value))
                index += 1
            total += part
    mean = (total / images).astype(np.float32)
    write_blob_file(out / "mean.binaryproto", blob_from_array(mean[None], legacy=True))
    info = {"images": images, "size": size, "quality": quality, "seed": seed, "version": VERSION,
            "jpeg_kb_mean": round(float(np.mean(jpeg_sizes)) / 1000, 1),
            "jpeg_kb_p10_p90": [round(float(np.percentile(jpeg_sizes, p)) / 1000, 1)
                                for p in (10, 90)],
            "seconds": round(time.perf_counter() - began, 1), "workers": workers}
    (out / "info.json").write_text(json.dumps(info, indent=1))
    return info


@contextlib.contextmanager
def _chunks(tasks: list, workers: int) -> Iterator:
    """The tasks' results in order: from worker processes (a clean interpreter each; a worker
    that dies fails the run instead of hanging it), or made here with one worker."""
    if workers <= 1:
        yield map(make_chunk, tasks)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        yield pool.map(make_chunk, tasks)


def existing(out: Path, images: int, size: int, quality: int, seed: int) -> dict | None:
    """The info of a set made with these arguments, if one is complete in ``out``."""
    try:
        info = json.loads((out / "info.json").read_text())
    except (OSError, ValueError):
        return None
    keys = ("images", "size", "quality", "seed", "version")
    same = [info.get(k) for k in keys] == [images, size, quality, seed, VERSION]
    return info if same and (out / "raw_lmdb").is_dir() and (out / "jpeg_lmdb").is_dir() else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--images", type=int, default=32000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--check", action="store_true",
                   help="reuse a set already made in OUT with the same arguments")
    args = p.parse_args(argv)
    info = existing(args.out, args.images, args.size, args.quality, args.seed) if args.check \
        else None
    if info is None:
        for name in ("raw_lmdb", "jpeg_lmdb", "mean.binaryproto", "info.json"):
            _remove(args.out / name)
        info = make(args.out, args.images, args.size, args.quality, args.seed, args.workers)
        print(f"made {args.out}: {json.dumps(info)}", flush=True)
    else:
        print(f"reusing {args.out}: {json.dumps(info)}", flush=True)
    return info


def _remove(path: Path) -> None:
    import shutil

    for target in (path, Path(f"{path}.partial")):
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


if __name__ == "__main__":
    main()
