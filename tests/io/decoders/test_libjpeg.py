"""The CPU workers' JPEG decoder: torchvision's (libjpeg-turbo, the GIL released) where it is
installed, else PIL's. The dispatch (which records take it, the fallbacks to PIL, the checks,
the automatic thread count and the automatic choice against nvJPEG) is tested with a stand-in
decoder; torchvision's own pixels against PIL's, bit for bit, where torchvision is installed
(the GPU machine: `benchmarks/gpu_single.sh` runs tests/io)."""
from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image
from synthetic import image_file

from caffe_py.errors import DataError
from caffe_py.io.decoders import libjpeg
from caffe_py.io.decoders import workers as workers_module
from caffe_py.io.decoders.workers import DecodeOptions, DecodeWorkers
from caffe_py.io.feed.image_batch import BatchImages
from caffe_py.io.feed.transformer import Transformer
from caffe_py.io.formats.datum import decode_image
from caffe_py.io.reader.records import RecordBatch
from caffe_py.spec.net_spec import TransformationParameter

H, W = 12, 10
has_torchvision = libjpeg.unavailable() is None


class StandIn:
    """torchvision's part played by PIL: (3, H, W) RGB, None for what it leaves to PIL."""

    def __init__(self, refuse=()):
        self.calls, self.refuse = 0, set(refuse)

    def __call__(self, file):
        self.calls += 1
        if bytes(file) in self.refuse:
            return None
        chw = decode_image(bytes(file))
        return np.ascontiguousarray(chw[::-1]) if chw.shape[0] == 3 else None


@pytest.fixture
def stand_in(monkeypatch):
    decoder = StandIn()
    monkeypatch.setattr(libjpeg, "unavailable", lambda: None)
    monkeypatch.setattr(libjpeg, "decode_rgb", decoder)
    return decoder


def crops(files, options, channels=3, color=None, count=2):
    """The CPU workers' crops of ``files`` and the reader decoder's (the oracle)."""
    t = Transformer(TransformationParameter(crop_size=7, mirror=True), "TRAIN",
                    (channels, H, W), seed=4)
    choices = t.choices_for(0, 1, len(files))
    workers = DecodeWorkers(count)
    workers.start()
    try:
        images = BatchImages("db", (channels, H, W), color, workers, options,
                             torch.device("cpu"))
        out = np.empty((len(files), channels, 7, 7), np.uint8)
        images.host(RecordBatch(0, 1, None, np.arange(len(files)),
                                tuple(b"k%d" % i for i in range(len(files))), files),
                    choices, out)
    finally:
        workers.close()
    want = np.empty_like(out)
    t.host([decode_image(bytes(f), color=color) for f in files], choices, want)
    return images, out, want


def test_colour_jpegs_take_torchvision_and_give_the_readers_crops(stand_in):
    files = tuple(memoryview(image_file(i)) for i in range(8))
    images, out, want = crops(files, DecodeOptions(2, "off"))
    assert images.libjpeg and stand_in.calls == 8
    assert np.array_equal(out, want)


def test_what_torchvision_leaves_goes_to_pil(stand_in):
    files = tuple(image_file(i) for i in range(6))
    stand_in.refuse = {files[2], files[5]}
    _, out, want = crops(files, DecodeOptions(2, "off"))
    assert stand_in.calls == 6
    assert np.array_equal(out, want)


@pytest.mark.parametrize(("mode", "fmt", "color", "channels", "options"), [
    ("L", "JPEG", None, 1, DecodeOptions(2, "off")),  # gray records
    ("RGB", "JPEG", False, 1, DecodeOptions(2, "off")),  # colour read as gray
    ("RGB", "PNG", None, 3, DecodeOptions(2, "off")),  # not a JPEG
    ("RGB", "JPEG", None, 3, DecodeOptions(2, "off", "pil")),  # PIL asked for
])
def test_other_records_are_pils(stand_in, mode, fmt, color, channels, options):
    files = tuple(image_file(i, mode, fmt) for i in range(4))
    _, out, want = crops(files, options, channels, color)
    assert stand_in.calls == 0
    assert np.array_equal(out, want)


def test_a_jpeg_of_the_wrong_size_names_its_record(stand_in):
    files = (image_file(0), image_file(1, size=(H + 2, W)))
    with pytest.raises(DataError, match=r"^db: record 'k1' is uint8 \[3, 14, 10\] but the "
                                        r"first record is uint8 \[3, 12, 10\]; a Data layer "):
        crops(files, DecodeOptions(1, "off"), count=1)


@pytest.mark.skipif(has_torchvision, reason="checks the message without torchvision")
def test_torchvision_asked_for_without_it_is_a_one_line_error():
    with pytest.raises(DataError, match=r"^db: cannot decode JPEG records with torchvision: "
                                        r"torchvision is not installed; install torchvision, "
                                        r"or set CPY_CPU_DECODE=auto or pil$"):
        BatchImages("db", (3, H, W), None, DecodeWorkers(1),
                    DecodeOptions(1, "off", "torchvision"), torch.device("cpu"))
    images = BatchImages("db", (3, H, W), None, DecodeWorkers(1), DecodeOptions(1, "off"),
                         torch.device("cpu"))
    assert not images.libjpeg


@pytest.mark.parametrize(("workers", "feeds", "gpu", "nvjpeg"), [
    (8, 1, "auto", False), (7, 1, "auto", True), (8, 1, "on", True), (8, 1, "off", False),
    (16, 2, "auto", False), (16, 3, "auto", True)])
def test_auto_leaves_nvjpeg_out_for_enough_torchvision_threads(stand_in, monkeypatch, caplog,
                                                                workers, feeds, gpu, nvjpeg):
    monkeypatch.setattr(BatchImages, "_gpu_decoder", lambda self: "nvJPEG")
    caplog.set_level(logging.INFO, logger="caffe_py")
    images = BatchImages("db", (3, H, W), None, DecodeWorkers(workers),
                         DecodeOptions(workers, gpu), torch.device("cuda", 0), feeds=feeds)
    assert images.libjpeg
    assert (images.gpu == "nvJPEG") is nvjpeg
    said = (f"db: JPEG records are decoded by torchvision on {workers} CPU threads (faster than "
            "nvJPEG beside training; CPY_GPU_DECODE=on for nvJPEG)")
    assert (said in caplog.text) is (gpu == "auto" and not nvjpeg)


def test_the_automatic_thread_count_follows_the_decoder(monkeypatch):
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 16)
    monkeypatch.setattr(libjpeg, "installed", lambda: True)
    assert DecodeOptions().threads == 14
    assert DecodeOptions(cpu="pil").threads == 4
    assert DecodeOptions(5, cpu="torchvision").threads == 5
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 64)
    assert DecodeOptions().threads == 16
    monkeypatch.setattr(libjpeg, "installed", lambda: False)
    assert DecodeOptions().threads == 4


def test_the_cpu_decoder_from_the_environment():
    assert DecodeOptions.from_env({"CPY_CPU_DECODE": " PIL "}) == DecodeOptions(None, "auto",
                                                                                 "pil")
    assert DecodeOptions.from_env({"CPY_CPU_DECODE": ""}).cpu == "auto"
    with pytest.raises(DataError, match=r"^CPY_CPU_DECODE='opencv' is not one of auto, "
                                        r"torchvision, pil; unset it for auto$"):
        DecodeOptions.from_env({"CPY_CPU_DECODE": "opencv"})
    with pytest.raises(DataError, match=r"^CPU decode must be one of auto, torchvision, pil, "
                                        r"got 'cv2'$"):
        DecodeOptions(cpu="cv2")


# --- torchvision itself -----------------------------------------------------------------------
needs_torchvision = pytest.mark.skipif(not has_torchvision,
                                       reason="needs torchvision (the GPU machine has it)")


def _jpeg(seed, mode="RGB", size=(48, 40), **save):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    smooth = (pixels.astype(np.int32) + np.roll(pixels, 1, 0) + np.roll(pixels, 1, 1)) // 3
    out = io.BytesIO()
    Image.fromarray(smooth.astype(np.uint8)).convert(mode).save(out, "JPEG", **save)
    return out.getvalue()


@needs_torchvision
@pytest.mark.parametrize("save", [
    {"quality": 90}, {"quality": 75, "subsampling": 0}, {"quality": 95, "subsampling": 1},
    {"quality": 90, "progressive": True}, {"quality": 50, "optimize": True}])
def test_torchvision_decodes_colour_jpegs_as_pil_bit_for_bit(save):
    for seed in range(4):
        file = _jpeg(seed, size=(33 + seed, 47), **save)
        rgb = libjpeg.decode_rgb(memoryview(file))
        assert rgb.dtype == np.uint8 and rgb.shape == (3, 33 + seed, 47)
        assert np.array_equal(rgb[::-1], decode_image(file))


@needs_torchvision
def test_torchvision_leaves_gray_cmyk_and_broken_files_to_pil():
    assert libjpeg.decode_rgb(_jpeg(0, "L")) is None
    assert libjpeg.decode_rgb(_jpeg(0, "CMYK")) is None
    assert libjpeg.decode_rgb(_jpeg(0)[:200]) is None
    assert libjpeg.decode_rgb(b"\xff\xd8\xff not a jpeg") is None


@needs_torchvision
def test_torchvision_workers_give_the_pil_workers_crops():
    files = tuple(memoryview(image_file(i)) for i in range(12))
    images, out, want = crops(files, DecodeOptions(3, "off", "torchvision"), count=3)
    assert images.libjpeg
    assert np.array_equal(out, want)


def test_a_torchvision_that_does_not_import_says_why(monkeypatch):
    import sys
    import types

    monkeypatch.setattr(libjpeg, "_state", {})
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.io", types.ModuleType("torchvision.io"))
    assert libjpeg.unavailable() == ("torchvision does not import (cannot import name "
                                     "'ImageReadMode' from 'torchvision.io' (unknown location))")
    assert libjpeg.decode_rgb(b"\xff\xd8") is None
