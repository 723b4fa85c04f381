"""Small synthetic inputs for the converter and reader tests: IDX files, PNG images, CIFAR
batches, image files and LMDBs of encoded records."""
from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image


def write_idx(folder: Path, images: np.ndarray, labels: np.ndarray, *, gz: bool = True
              ) -> tuple[Path, Path]:
    """MNIST-format files for (N, rows, cols) uint8 images and (N,) labels."""
    n, rows, cols = images.shape
    image_bytes = struct.pack(">4i", 2051, n, rows, cols) + images.astype(np.uint8).tobytes()
    label_bytes = struct.pack(">2i", 2049, len(labels)) + labels.astype(np.uint8).tobytes()
    suffix = ".gz" if gz else ""
    image_path = folder / f"images-idx3-ubyte{suffix}"
    label_path = folder / f"labels-idx1-ubyte{suffix}"
    image_path.write_bytes(gzip.compress(image_bytes) if gz else image_bytes)
    label_path.write_bytes(gzip.compress(label_bytes) if gz else label_bytes)
    return image_path, label_path


def random_idx(folder: Path, n: int, rows: int = 3, cols: int = 4, seed: int = 0, gz=True):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, rows, cols), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    return (*write_idx(folder, images, labels, gz=gz), images, labels)


def write_png(path: Path, array_hwc: np.ndarray) -> Path:
    """An RGB (H, W, 3) or gray (H, W) uint8 array as a PNG file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array_hwc, mode="RGB" if array_hwc.ndim == 3 else "L").save(path)
    return path


def write_cifar_batch(path: Path, images_rgb_chw: np.ndarray, labels: np.ndarray) -> Path:
    """CIFAR-10 binary records: a label byte, then the R, G and B 32x32 planes."""
    records = [bytes([int(label)]) + image.astype(np.uint8).tobytes()
               for image, label in zip(images_rgb_chw, labels, strict=True)]
    path.write_bytes(b"".join(records))
    return path


def image_file(seed: int, mode: str = "RGB", fmt: str = "JPEG", size=(12, 10)) -> bytes:
    """A small photo-like image file (gradients and a little noise), JPEG at quality 90.

    The gradients' slopes and the grain shrink with the size so that larger images stay
    smooth, like photos (on uint8 wrap-around stripes JPEG decoders differ by tens of levels,
    nvJPEG from PIL by 10 on average, against 0.7 on a smooth image of the same size)."""
    rng = np.random.default_rng(seed)
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    slopes = min(20, 200 // w), min(15, 180 // h), min(8, 200 // (h + w))
    grain = min(40, 400 // w)  # 40 levels at the default size, less on larger images
    rgb = np.stack([x * slopes[0] + seed, y * slopes[1], (x + y) * slopes[2]], -1) \
        + rng.integers(0, grain, (*size, 3))
    image = Image.fromarray(rgb.astype(np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def write_encoded_db(path, files, *, bad: dict[int, bytes] | None = None) -> str:
    """An LMDB of encoded records as convert_imageset --encoded writes them: keys
    ``%08d_img<i>.jpg``, label 7 i; ``bad`` replaces some values."""
    from support import write_db

    from caffe_py.io.formats.datum import Datum

    return write_db(path, [(bad or {}).get(i, Datum(data=file, label=7 * i, encoded=True))
                           for i, file in enumerate(files)],
                    keys=[b"%08d_img%d.jpg" % (i, i) for i in range(len(files))])
