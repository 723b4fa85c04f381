"""A synthetic detection set in Pascal-VOC layout: images of coloured rectangles, ellipses and
triangles on a noisy background, their boxes in VOC XML, the list files and the label map that
`cpy convert annoset` (or SSD's create_annoset.py) reads.

    python3 data/shapes_detection.py OUT [--train 400] [--test 100] [--size 64] [--seed 0]

writes OUT/JPEGImages/<id>.png, OUT/Annotations/<id>.xml, OUT/trainval.txt and OUT/test.txt
('JPEGImages/<id>.png Annotations/<id>.xml' lines), OUT/test_name_size.txt and
OUT/labelmap.prototxt (background 0, rectangle 1, ellipse 2, triangle 3). Every image holds one
to three shapes of 14 to 45 % of its side, overlapping each other by at most a third; the same
seed makes the same set. docs/detection.md trains a small SSD on it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

CLASSES = ("rectangle", "ellipse", "triangle")


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def make_image(rng: np.random.Generator, size: int):
    """One image (a PIL RGB image) and its objects [(class name, (x0, y0, x1, y1))]."""
    from PIL import Image, ImageDraw

    base = rng.integers(60, 200)
    noise = rng.normal(base, 18, (size, size, 3)).clip(0, 255).astype(np.uint8)
    image = Image.fromarray(noise, "RGB")
    draw = ImageDraw.Draw(image)
    objects: list[tuple[str, tuple[int, int, int, int]]] = []
    for _ in range(int(rng.integers(1, 4))):
        for _attempt in range(20):
            w = int(rng.integers(int(0.14 * size), int(0.45 * size) + 1))
            h = int(rng.integers(int(0.14 * size), int(0.45 * size) + 1))
            x0 = int(rng.integers(0, size - w))
            y0 = int(rng.integers(0, size - h))
            box = (x0, y0, x0 + w, y0 + h)
            if all(_overlap(box, b) <= 1 / 3 for _, b in objects):
                break
        else:
            continue
        name = CLASSES[int(rng.integers(len(CLASSES)))]
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        corners = [box[0], box[1], box[2] - 1, box[3] - 1]
        if name == "rectangle":
            draw.rectangle(corners, fill=color)
        elif name == "ellipse":
            draw.ellipse(corners, fill=color)
        else:
            draw.polygon([(box[0], box[3] - 1), (box[2] - 1, box[3] - 1),
                          ((box[0] + box[2] - 1) / 2, box[1])], fill=color)
        objects.append((name, box))
    return image, objects


def voc_xml(name: str, size: int, objects: list[tuple[str, tuple[int, int, int, int]]]) -> str:
    parts = [f"<annotation>\n  <filename>{name}</filename>\n  <size>\n    <width>{size}</width>"
             f"\n    <height>{size}</height>\n    <depth>3</depth>\n  </size>"]
    for cls, (x0, y0, x1, y1) in objects:
        parts.append(f"  <object>\n    <name>{cls}</name>\n    <difficult>0</difficult>\n"
                     f"    <bndbox>\n      <xmin>{x0}</xmin>\n      <ymin>{y0}</ymin>\n"
                     f"      <xmax>{x1}</xmax>\n      <ymax>{y1}</ymax>\n    </bndbox>\n"
                     "  </object>")
    parts.append("</annotation>\n")
    return "\n".join(parts)


def write_set(out: str | Path, train: int, test: int, size: int = 64, seed: int = 0) -> Path:
    """Write the set into ``out`` (created); returns it."""
    out = Path(out)
    (out / "JPEGImages").mkdir(parents=True, exist_ok=True)
    (out / "Annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lists: dict[str, list[str]] = {"trainval": [], "test": []}
    for index in range(train + test):
        name = f"{index:06d}"
        image, objects = make_image(rng, size)
        image.save(out / "JPEGImages" / f"{name}.png")
        (out / "Annotations" / f"{name}.xml").write_text(voc_xml(f"{name}.png", size, objects))
        split = "trainval" if index < train else "test"
        lists[split].append(f"JPEGImages/{name}.png Annotations/{name}.xml")
    for split, lines in lists.items():
        (out / f"{split}.txt").write_text("".join(f"{line}\n" for line in lines))
    (out / "test_name_size.txt").write_text("".join(
        f"{line.split()[0].split('/')[1][:-4]} {size} {size}\n" for line in lists["test"]))
    items = [("none_of_the_above", 0, "background")] + [(c, i + 1, c)
                                                         for i, c in enumerate(CLASSES)]
    (out / "labelmap.prototxt").write_text("".join(
        f'item {{\n  name: "{n}"\n  label: {label}\n  display_name: "{d}"\n}}\n'
        for n, label, d in items))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the folder to write")
    parser.add_argument("--train", type=int, default=400, help="trainval images")
    parser.add_argument("--test", type=int, default=100, help="test images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0, help="the set's seed")
    args = parser.parse_args(argv)
    out = write_set(args.out, args.train, args.test, args.size, args.seed)
    print(f"{out}: {args.train} trainval and {args.test} test images of {args.size} x "
          f"{args.size}, classes {', '.join(CLASSES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
