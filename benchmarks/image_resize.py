"""The INTER_LINEAR resize of ImageData's new_height/new_width and cpy convert's --resize-*:
OpenCV's own cv2.resize (used when opencv-python(-headless) is installed) against the numpy
path (used without it), per image, on seeded random uint8 images; both give the same bits.
Prints a markdown table.

    python benchmarks/image_resize.py [--repeats 50]
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from caffe_py.io.formats import images

CASES = [((3, 375, 500), (256, 256)), ((3, 480, 640), (224, 224)), ((3, 256, 256), (227, 227)),
         ((1, 28, 28), (32, 32)), ((3, 32, 32), (64, 64))]


def per_image(fn, array: np.ndarray, size: tuple[int, int], repeats: int) -> float:
    """Seconds per call, the best of three rounds of ``repeats``."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn(array, *size)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    cv2 = images._CV2
    if cv2 is None:
        raise SystemExit("needs opencv-python-headless: pip install 'caffe-py[opencv]'")
    rng = np.random.default_rng(0)
    print(f"cv2 {cv2.__version__}, numpy {np.__version__}, {platform.processor() or 'cpu'}")
    print("| image (C, H, W) | to (H, W) | numpy ms | cv2 ms | cv2 speed-up | same bits |")
    print("|---|---|---|---|---|---|")
    for shape, size in CASES:
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        slow = per_image(images.resize_linear_numpy, array, size, args.repeats)
        fast = per_image(images.resize_linear, array, size, args.repeats)
        same = np.array_equal(images.resize_linear(array, *size),
                              images.resize_linear_numpy(array, *size))
        print(f"| {shape} | {size} | {slow * 1e3:.3f} | {fast * 1e3:.3f} | {slow / fast:.1f}x "
              f"| {same} |")


if __name__ == "__main__":
    main()
