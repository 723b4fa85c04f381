"""AnnotatedData's pipeline (caffe_py/io/feed/annotated_transform.py, ssd_image.py) and feed: what
each random step does to the pixels and the boxes, that the batch samplers honour their
constraints, OpenCV's HSV arithmetic, and the feed's determinism and round-robin. (The
deterministic path is held to SSD's fork in tests/golden/forks.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.feed import ssd_image
from caffe_py.io.feed.annotated_transform import (
    AnnotatedTransformer,
    Box,
    jaccard,
    label_rows,
    sample_box,
    satisfies,
)
from caffe_py.io.formats.annotated import (
    BBOX,
    AnnotatedDatum,
    Annotation,
    AnnotationGroup,
    NormalizedBBox,
)
from caffe_py.io.formats.datum import Datum
from caffe_py.spec.layer_params.detection import (
    AnnotatedTransformationParameter,
    BatchSampler,
    EmitConstraint,
    ExpansionParameter,
    ResizeParameter,
    SampleConstraint,
    Sampler,
)

F32 = np.float32


def record(h: int = 20, w: int = 30) -> AnnotatedDatum:
    """A raw image, black but for a white box at columns 6..14, rows 4..9 (its annotation)."""
    pixels = np.zeros((3, h, w), np.uint8)
    pixels[:, 4:10, 6:15] = 255
    box = NormalizedBBox(6 / w, 4 / h, 15 / w, 10 / h, difficult=False)
    return AnnotatedDatum(Datum(3, h, w, pixels.tobytes(), -1, encoded=False), BBOX,
                          [AnnotationGroup(1, [Annotation(0, box)])])


def encoded(h: int = 20, w: int = 30) -> AnnotatedDatum:
    from caffe_py.io.formats.images import encode_image

    r = record(h, w)
    pixels = np.frombuffer(r.datum.data, np.uint8).reshape(3, h, w)
    r.datum = Datum(3, h, w, encode_image(pixels, "png"), -1, encoded=True)
    return r


def transformer(**tp) -> AnnotatedTransformer:
    samplers = tp.pop("samplers", [])
    return AnnotatedTransformer(AnnotatedTransformationParameter(**tp), samplers, "TRAIN",
                                None, None)


def box_pixels(data: np.ndarray, b: Box) -> np.ndarray:
    h, w = data.shape[1:]
    return data[:, int(round(float(b.ymin) * h)):int(round(float(b.ymax) * h)),
                int(round(float(b.xmin) * w)):int(round(float(b.xmax) * w))]


def test_mirror_flips_pixels_and_boxes():
    t = transformer(mirror=True)
    for seed in range(8):
        data, groups = t(record(), np.random.default_rng(seed))
        b = groups[0][1][0]
        assert np.all(box_pixels(data, b) == 255)  # the box still frames the white block
        assert float(b.xmin) in (pytest.approx(6 / 30), pytest.approx(1 - 15 / 30))


def test_expansion_moves_the_box_with_the_image():
    t = transformer(expand_param=ExpansionParameter(prob=1.0, max_expand_ratio=3.0),
                    mean_value=[10.0])
    for seed in range(6):
        data, groups = t(encoded(), np.random.default_rng(seed))
        b = groups[0][1][0]
        assert data.shape[1] >= 20 and data.shape[2] >= 30
        assert np.all(box_pixels(data, b) == 245)  # 255 - mean
        assert (data == -10).any() or data.shape[1:] == (20, 30)  # the canvas is the mean


def test_samplers_keep_only_crops_that_meet_their_constraint():
    sampler = BatchSampler(sampler=Sampler(min_scale=0.3, max_scale=1.0,
                                           min_aspect_ratio=0.5, max_aspect_ratio=2.0),
                           sample_constraint=SampleConstraint(min_jaccard_overlap=0.3),
                           max_sample=1, max_trials=50)
    objects = [(F32(0.2), F32(0.2), F32(0.5), F32(0.5))]
    rng = np.random.default_rng(1)
    for _ in range(200):
        b = sample_box(sampler.sampler, rng)
        assert 0 <= b[0] < b[2] <= 1 and 0 <= b[1] < b[3] <= 1
        if satisfies(b, objects, sampler.sample_constraint):
            assert jaccard(b, objects[0]) >= F32(0.3)
    t = transformer(samplers=[sampler],
                    emit_constraint=EmitConstraint(emit_type="CENTER"),
                    resize_param=ResizeParameter(height=24, width=24))
    for seed in range(10):
        data, groups = t(encoded(), np.random.default_rng(seed))
        assert data.shape == (3, 24, 24)
        for _, boxes in groups:  # every kept box lies in the crop
            assert all(0 <= float(v) <= 1 for b in boxes for v in b.corners)


def test_resize_modes_give_their_sizes():
    image = np.arange(3 * 20 * 30, dtype=np.uint8).reshape(3, 20, 30)
    assert ssd_image.apply_resize(image, "WARP", 10, 12, "LINEAR", "CONSTANT", []).shape == \
        (3, 10, 12)
    padded = ssd_image.apply_resize(image, "FIT_LARGE_SIZE_AND_PAD", 30, 30, "NEAREST",
                                    "CONSTANT", [7.0])
    assert padded.shape == (3, 30, 30) and np.all(padded[:, :5] == 7)
    assert ssd_image.apply_resize(image, "FIT_SMALL_SIZE", 10, 10, "AREA", "CONSTANT",
                                  []).shape == (3, 10, 15)
    for interp in ("CUBIC", "LANCZOS4"):
        assert ssd_image.resize(image, 7, 9, interp).shape == (3, 7, 9)


def test_hsv_round_trip_and_hue_shift():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (3, 16, 16), dtype=np.uint8)
    hsv = ssd_image.bgr_to_hsv(image)
    assert hsv[0].max() < 180
    back = ssd_image.hsv_to_bgr(hsv)
    assert np.abs(back.astype(int) - image).max() <= 4  # 8-bit HSV loses a little
    gray = np.full((3, 2, 2), 90, np.uint8)
    np.testing.assert_array_equal(ssd_image.adjust_hue(gray, 40.0), gray)  # no hue to shift
    red = np.zeros((3, 1, 1), np.uint8)
    red[2] = 255
    green = ssd_image.adjust_hue(red, 60.0)  # 120 degrees on OpenCV's 0..180 scale
    assert green[:, 0, 0].tolist() == [0, 255, 0]


def test_label_rows_layout():
    rows = label_rows([[(3, [Box(F32(.1), F32(.2), F32(.3), F32(.4), 7, True)])], [],
                       [(1, [Box(F32(0), F32(0), F32(1), F32(1))])]])
    np.testing.assert_allclose(rows[0, 0], [[0, 3, 7, .1, .2, .3, .4, 1],
                                            [2, 1, 0, 0, 0, 1, 1, 0]], rtol=1e-7)
    assert label_rows([[], []]).tolist() == [[[[-1] * 8]]]


def test_feed_is_deterministic_per_position_and_splits_replicas(tmp_path):
    from caffe_py.io.db.lmdb_store import LmdbWriter
    from caffe_py.io.formats.annotated import encode_annotated
    from caffe_py.net import Net
    from caffe_py.spec.net_spec import load_net

    with LmdbWriter(tmp_path / "db") as writer:
        for i in range(6):
            writer.put(f"{i:08d}".encode(), encode_annotated(encoded(20 + i % 2, 30)))
    (tmp_path / "net.yaml").write_text(
        f"name: t\nlayer:\n- name: data\n  type: AnnotatedData\n  top: [data, label]\n"
        f"  data_param: {{source: {tmp_path / 'db'}, batch_size: 2}}\n"
        "  transform_param: {mirror: true, resize_param: {height: 16, width: 16}}\n")

    def batches(replicas: int, seed: int) -> list[list[torch.Tensor]]:
        nets = [Net(load_net(tmp_path / "net.yaml"), "TRAIN") for _ in range(replicas)]
        out: list[list[torch.Tensor]] = [[] for _ in range(replicas)]
        with ReaderPool(replicas=replicas) as pool:
            for r, net in enumerate(nets):
                attach_feeds(net, pool, replica=r, seed=seed)
            pool.start()
            for _ in range(3):
                for r, net in enumerate(nets):
                    result = net()
                    out[r].append(result.outputs["data"].clone())
        return out

    one = batches(1, seed=5)[0]
    again = batches(1, seed=5)[0]
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    two = batches(2, seed=5)
    # replica r of 2 gets records r, r + 2, ...: together, one replica's batches of 4 records
    merged = torch.stack([two[r][0][k] for k in range(2) for r in range(2)])
    assert torch.equal(merged, torch.cat([one[0], one[1]]))
