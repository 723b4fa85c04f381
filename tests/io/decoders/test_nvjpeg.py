"""JPEG records decoded on the GPU: the batch path around the decoder (stack, crop, mirror, BGR,
size checks, falling back to the CPU workers) with a stand-in decoder on the CPU, and with
nvJPEG (torchvision) where there is CUDA: the CPU path's records in the same order, pixels
within nvJPEG's tolerance."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from support import data_net
from synthetic import image_file as jpeg
from synthetic import write_encoded_db as write_db

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.decoders import nvjpeg
from caffe_py.io.decoders.workers import DecodeOptions, DecodeWorkers
from caffe_py.io.feed.image_batch import BatchImages
from caffe_py.io.feed.transformer import Transformer
from caffe_py.io.formats.datum import decode_image
from caffe_py.io.reader import reader
from caffe_py.io.reader.records import RecordBatch
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import TransformationParameter, parse_layer
from caffe_py.spec.schema import Source

H, W = 12, 10


def data_layer(db, transform):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": 4},
                        "transform_param": transform}, Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase="TRAIN"))


class StandIn:
    """nvJPEG's part played on the CPU: RGB (C, H, W) tensors, or a refusal."""

    stream = None

    def __init__(self, refuse: bool = False):
        self.refuse = refuse

    def decode(self, files):
        if self.refuse:
            raise RuntimeError("nvjpeg: Failed to get image info: 6")
        return [torch.from_numpy(np.ascontiguousarray(decode_image(f)[::-1])) for f in files]


def batch_images(options: DecodeOptions, gpu=None) -> tuple[BatchImages, Transformer]:
    t = Transformer(TransformationParameter(crop_size=7, mirror=True), "TRAIN", (3, H, W),
                    seed=2)
    images = BatchImages("db", (3, H, W), None, DecodeWorkers(1), options,
                         torch.device("cpu"))
    images.gpu = gpu
    return images, t


def files_batch(files) -> RecordBatch:
    return RecordBatch(0, 1, None, np.arange(len(files)), tuple(b"k%d" % i for i in
                                                                range(len(files))), files)


def test_the_device_path_crops_mirrors_and_reorders_as_the_cpu_workers():
    images, t = batch_images(DecodeOptions(1, "auto"), StandIn())
    batch = files_batch(tuple(jpeg(i) for i in range(6)))
    choices = t.choices_for(0, 1, 6)
    assert choices.flips.any() and not choices.flips.all()
    want = np.empty((6, 3, 7, 7), np.uint8)
    images.host(batch, choices, want)
    whole = images.on_device(batch)  # RGB, uncropped: the feed's transform takes it from here
    assert images.rgb and tuple(whole.shape) == (6, 3, H, W)
    assert torch.equal(t.device_crop(whole, choices, reverse_channels=True),
                       torch.from_numpy(want))
    assert torch.equal(t.device_transform(whole, choices, None, reverse_channels=True),
                       t.device(torch.from_numpy(want), choices, None))


def test_a_batch_with_other_files_goes_to_the_cpu_workers():
    images, t = batch_images(DecodeOptions(1, "auto"), StandIn())
    batch = files_batch((jpeg(0), jpeg(1, fmt="PNG")))
    assert images.on_device(batch) is None


def test_a_file_of_another_size_from_the_gpu_names_its_key():
    images, t = batch_images(DecodeOptions(1, "auto"), StandIn())
    batch = files_batch((jpeg(0), jpeg(1, size=(H, W + 1))))
    with pytest.raises(DataError, match=r"^db: record 'k1' is uint8 \[3, 12, 11\] but the first "
                                        r"record is uint8 \[3, 12, 10\]"):
        images.on_device(batch)


def test_a_refused_batch_is_decoded_on_the_cpu_then_auto_stops_using_the_gpu(caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    images, t = batch_images(DecodeOptions(1, "auto"), StandIn(refuse=True))
    batch = files_batch(tuple(jpeg(i) for i in range(3)))
    choices = t.choices_for(0, 1, 3)
    assert images.on_device(batch) is None
    out = np.empty((3, 3, 7, 7), np.uint8)
    images.host(batch, choices, out)
    assert images.gpu is None
    assert "db: nvJPEG could not decode a batch (nvjpeg: Failed to get image info: 6); JPEG " \
           "records are decoded on 1 CPU threads from now on" in caplog.text


def test_a_refused_batch_with_gpu_decode_on_is_an_error():
    images, t = batch_images(DecodeOptions(1, "on"), StandIn(refuse=True))
    batch = files_batch(tuple(jpeg(i) for i in range(3)))
    choices = t.choices_for(0, 1, 3)
    assert images.on_device(batch) is None
    with pytest.raises(DataError, match=r"^db: nvJPEG could not decode a batch of JPEG records "
                                        r"that PIL decodes \(nvjpeg: Failed to get image info: "
                                        r"6\); set CPY_GPU_DECODE=off or auto$"):
        images.host(batch, choices, np.empty((3, 3, 7, 7), np.uint8))


def test_a_file_no_decoder_reads_is_reported_by_its_key_not_as_a_refusal():
    images, t = batch_images(DecodeOptions(1, "on"), StandIn(refuse=True))
    batch = files_batch((jpeg(0), b"\xff\xd8 broken"))
    choices = t.choices_for(0, 1, 2)
    assert images.on_device(batch) is None
    with pytest.raises(DataError, match="^db: record 'k1': encoded image does not decode"):
        images.host(batch, choices, np.empty((2, 3, 7, 7), np.uint8))
    assert images.gpu_error is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_gpu_decode_on_without_cuda_is_an_error_at_attach_and_auto_falls_back(caplog):
    with pytest.raises(DataError, match=r"^db: cannot decode JPEG records on the GPU: CUDA is "
                                        r"not available; install torchvision, or set "
                                        r"CPY_GPU_DECODE=auto or off$"):
        BatchImages("db", (3, H, W), None, DecodeWorkers(2), DecodeOptions(2, "on"),
                    torch.device("cuda"))
    caplog.set_level(logging.INFO, logger="caffe_py")
    images = BatchImages("db", (3, H, W), None, DecodeWorkers(2), DecodeOptions(2, "auto"),
                         torch.device("cuda"))
    assert images.gpu is None
    assert "db: JPEG records are decoded on 2 CPU threads (CUDA is not available)" in caplog.text


# --- nvJPEG itself ----------------------------------------------------------------------------
needs_nvjpeg = pytest.mark.skipif(nvjpeg.unavailable() is not None,
                                  reason=f"needs CUDA and torchvision ({nvjpeg.unavailable()})")


def _feed_batches(db, gpu: str, steps: int, device: str = "cuda"):
    layer = data_layer(db, {"crop_size": 8, "mirror": True, "mean_value": [5, 6, 7],
                            "scale": 0.5})
    with ReaderPool(decode=DecodeOptions(2, gpu)) as pool:
        attach_feeds(data_net(layer), pool, device=device, seed=5)
        pool.start()
        out = [tuple(t.cpu() for t in layer()) for _ in range(steps)]
        return out, layer.feed.images.gpu is not None


@pytest.mark.gpu
@needs_nvjpeg
def test_nvjpeg_feed_gives_the_cpu_records_in_order_within_tolerance(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    db = write_db(tmp_path / "db", [jpeg(i, size=(48, 40)) for i in range(20)])
    host, _ = _feed_batches(db, "off", 8, device="cpu")
    cpu, used_cpu = _feed_batches(db, "off", 8)
    gpu, used_gpu = _feed_batches(db, "on", 8)
    assert not used_cpu and used_gpu
    for (h_data, h_label), (c_data, c_label), (g_data, g_label) in zip(host, cpu, gpu,
                                                                        strict=True):
        assert torch.equal(c_data, h_data)  # the CUDA feed's CPU decode: bit for bit
        assert torch.equal(c_label, g_label) and torch.equal(h_label, g_label)
        assert g_data.shape == c_data.shape == (4, 3, 8, 8)
        diff = (g_data - c_data).abs() / 0.5  # in pixel levels (scale 0.5)
        assert diff.mean(dim=(1, 2, 3)).max() < 2  # torchvision's own tolerance, per image
