"""A synthetic segmentation set: toy images with known masks, for the SegNet-style net of
configs/segnet_toy (tests/test_segmentation_training.py trains it; docs/segmentation.md
shows a longer run).

Each image is a noisy background holding up to three shapes, each a class of its own colour
family: squares (class 1, reddish), discs (class 2, greenish) and triangles (class 3,
bluish); everything else is class 0. Colours, sizes and places are drawn from numpy seed
``seed``, so a set is the same file for file on every machine. Written as PNGs (the image
BGR as OpenCV reads it, the label gray) with the list files SegNet's DenseImageData reads::

    python3 data/toy_segmentation.py OUT [--train 64] [--test 16] [--size 32] [--seed 0]

writes OUT/{train,test}/NNNN.png and NNNN_label.png, OUT/train.txt and OUT/test.txt.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CLASSES = ("background", "square", "disc", "triangle")
_COLOURS = {1: (200, 60, 60), 2: (60, 190, 70), 3: (70, 80, 210)}  # RGB


def draw(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One (H, W, 3) uint8 RGB image and its (H, W) uint8 label mask."""
    image = rng.integers(70, 150, (size, size, 3)).astype(np.float64)
    image += rng.normal(0, 12, image.shape)
    label = np.zeros((size, size), np.uint8)
    yy, xx = np.mgrid[:size, :size]
    for cls in rng.permutation([1, 2, 3])[:rng.integers(1, 4)]:
        r = rng.integers(size // 8, size // 4 + 1)
        cy, cx = rng.integers(r, size - r, 2)
        if cls == 1:
            inside = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
        elif cls == 2:
            inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        else:
            inside = (yy - cy <= r) & (yy - cy >= -r) & (abs(xx - cx) <= (yy - cy + r) / 2)
        colour = np.array(_COLOURS[int(cls)]) + rng.normal(0, 15, 3)
        image[inside] = colour + rng.normal(0, 10, (int(inside.sum()), 3))
        label[inside] = cls
    return np.clip(image, 0, 255).astype(np.uint8), label


def write_set(out: Path, train: int = 64, test: int = 16, size: int = 32,
              seed: int = 0) -> Path:
    """Write the set under ``out``; returns ``out``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("test", test)):
        if not count:
            continue
        (out / split).mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(count):
            image, label = draw(rng, size)
            Image.fromarray(image).save(out / split / f"{i:04d}.png")
            Image.fromarray(label).save(out / split / f"{i:04d}_label.png")
            lines.append(f"{split}/{i:04d}.png {split}/{i:04d}_label.png")
        (out / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--test", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_set(args.out, args.train, args.test, args.size, args.seed)
    print(f"wrote {args.train} + {args.test} images of {args.size} x {args.size} to {args.out}")


if __name__ == "__main__":
    main()
