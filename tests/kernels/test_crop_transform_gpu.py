"""The fused data transform kernel (csrc/transform.cu) against the same transform written
record by record in PyTorch ops: crop windows at per-record offsets, mirroring, reversed
channels, no mean, a per-channel mean and a per-pixel mean read at the source pixel, scale or
none, uint8 and float32 records, crops wider than a block's threads, and dispatch through
Transformer.device_transform. Equality is exact: the kernel rounds as the two ops do. Skipped
without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from caffe_py.io.feed.transformer import Transformer
from caffe_py.kernels import functions
from caffe_py.spec.net_spec import TransformationParameter

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def one_by_one(records, where, mean, scale, reverse, h, w):
    """The transform record by record: window, flip, channel order, mean at the source pixel."""
    out = []
    for b, (h0, w0, flip) in enumerate(where.tolist()):
        pix = records[b, :, h0:h0 + h, w0:w0 + w].float()
        if mean is not None:
            m = mean.reshape(-1, 1, 1) if mean.numel() == records.shape[1] else \
                mean[:, h0:h0 + h, w0:w0 + w]
        if reverse:
            pix = pix.flip(0)
        value = pix - m if mean is not None else pix
        if scale != 1.0:
            value = value * scale
        out.append(value.flip(-1) if flip else value)
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("mean_kind", ["none", "channel", "pixel"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,crop", [((3, 40, 300), (33, 290)), ((1, 9, 7), (9, 7)),
                                        ((3, 256, 256), (224, 224))])
def test_the_kernel_is_the_transform_record_by_record(dtype, mean_kind, reverse, shape, crop):
    records, where, mean = draw(7, 3, dtype, mean_kind, shape, crop, whole=True)
    both_scales(lambda scale, out: functions.crop_transform(records, where, mean, scale,
                                                            reverse, out),
                lambda scale: one_by_one(records, where, mean, scale, reverse, *crop),
                (len(records), shape[0], *crop))


def draw(seed, rng_seed, dtype, mean_kind, record, crop, *, whole):
    """Five records of shape ``record`` (``whole``) or their ``crop``-sized windows, uint8 or
    float32; each one's (h0, w0, flip) on the device (three of the five flipped); the mean."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, (c, hh, ww), (h, w) = 5, record, crop
    shape = (b, c, hh, ww) if whole else (b, c, h, w)
    if dtype == torch.uint8:
        data = torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)
    else:
        data = torch.rand(shape, generator=g, device="cuda") * 300 - 20
    rng = np.random.default_rng(rng_seed)
    where = np.stack([rng.integers(0, hh - h + 1, b), rng.integers(0, ww - w + 1, b),
                      np.array([1, 0, 1, 1, 0])], 1).astype(np.int32)
    mean = {"none": None, "channel": torch.tensor([104.0, 117.0, 123.5][:c], device="cuda"),
            "pixel": torch.rand((c, hh, ww), generator=g, device="cuda") * 255}[mean_kind]
    return data, torch.from_numpy(where).cuda(), mean


def both_scales(call, reference, out_shape):
    """``call(scale, out)`` writes ``out`` and returns it, equal to ``reference(scale)`` bit for
    bit, with a scale of 1 and another."""
    for scale in (1.0, 0.017):
        out = torch.full(out_shape, float("nan"), device="cuda")
        got = call(scale, out)
        want = reference(scale)
        assert got is out
        assert torch.equal(got, want), (scale, float((got - want).abs().max()))


def test_an_empty_batch_writes_nothing():
    out = torch.empty((0, 3, 4, 4), device="cuda")
    functions.crop_transform(torch.empty((0, 3, 6, 6), dtype=torch.uint8, device="cuda"),
                             torch.empty((0, 3), dtype=torch.int32, device="cuda"), None, 1.0,
                             False, out)
    assert out.shape == (0, 3, 4, 4)


def test_device_transform_takes_the_kernel_for_dense_records_and_the_ops_otherwise(monkeypatch):
    """Contiguous uint8 records on CUDA go to the kernel; a strided view goes the two-call
    way (the kernel's oracle); both give the CPU path's batch."""
    t = Transformer(TransformationParameter(crop_size=5, mirror=True, scale=0.5,
                                            mean_value=[10, 20, 30]), "TRAIN", (3, 8, 9), seed=1)
    batch = np.random.default_rng(0).integers(0, 256, (6, 3, 8, 9), dtype=np.uint8)
    choices = t.choices_for(0, 1, 6)
    want = torch.from_numpy(t.numpy(batch, choices))
    mean = t.device_mean(torch.device("cuda"))
    calls = []
    kernel = functions.crop_transform
    monkeypatch.setattr(functions, "crop_transform",
                        lambda *a: calls.append(1) or kernel(*a))
    dense = torch.from_numpy(batch).cuda()
    assert torch.equal(t.device_transform(dense, choices, mean).cpu(), want)
    assert calls == [1]
    wide = torch.zeros((6, 3, 8, 18), dtype=torch.uint8, device="cuda")
    wide[..., ::2] = dense
    strided = wide[..., ::2]
    assert torch.equal(t.device_transform(strided, choices, mean).cpu(), want)
    assert calls == [1]


def crops_one_by_one(crops, where, mean, scale, flip_pixels):
    """Crops made on the host: mirrored here where flip_pixels says, the mean read where each
    pixel lay in its record (mirrored with the flip)."""
    h, w = crops.shape[2:]
    out = []
    for b, (h0, w0, flip) in enumerate(where.tolist()):
        pix = crops[b].float()
        if flip and flip_pixels:
            pix = pix.flip(-1)
        value = pix
        if mean is not None:
            m = mean.reshape(-1, 1, 1) if mean.numel() == crops.shape[1] else \
                mean[:, h0:h0 + h, w0:w0 + w]
            value = pix - (m.flip(-1) if flip and m.shape[-1] > 1 else m)
        if scale != 1.0:
            value = value * scale
        out.append(value)
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("mean_kind", ["none", "channel", "pixel"])
@pytest.mark.parametrize("flip_pixels", [False, True])
@pytest.mark.parametrize("record,crop", [((3, 40, 300), (33, 290)), ((1, 9, 7), (9, 7)),
                                         ((3, 256, 256), (224, 224))])
def test_the_crops_kernel_is_the_transform_record_by_record(dtype, mean_kind, flip_pixels,
                                                            record, crop):
    crops, where, mean = draw(11, 5, dtype, mean_kind, record, crop, whole=False)
    both_scales(lambda scale, out: functions.cropped_transform(crops, where, mean, scale,
                                                               flip_pixels, out),
                lambda scale: crops_one_by_one(crops, where, mean, scale, flip_pixels),
                crops.shape)


@pytest.mark.parametrize("mean", ["value", "file"])
@pytest.mark.parametrize("mirror", [False, True])
def test_device_takes_the_crops_kernel_with_the_ops_bits(monkeypatch, tmp_path, mean, mirror):
    """Transformer.device on CUDA crops gives the two-op way's bits (the kernel's oracle, taken
    with the kernel turned off) and the CPU path's, flipping on the device or not."""
    from caffe_py.io.feed import transformer as transformer_module
    from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file

    shape = (3, 12, 10)
    rng = np.random.default_rng(2)
    if mean == "file":
        path = tmp_path / "mean.binaryproto"
        write_blob_file(path, blob_from_array(rng.random((1, *shape), np.float32) * 200))
        tp = TransformationParameter(crop_size=7, mirror=True, scale=0.25, mean_file=str(path))
    else:
        tp = TransformationParameter(crop_size=7, mirror=True, scale=0.25,
                                     mean_value=[10, 20, 30])
    t = Transformer(tp, "TRAIN", shape, seed=3)
    records = rng.integers(0, 256, (8, *shape), dtype=np.uint8)
    choices = t.choices_for(0, 1, 8)
    assert choices.flips.any() and not choices.flips.all()
    want = torch.from_numpy(t.numpy(records, choices))
    crops = np.empty((8, *t.out_shape), np.uint8)
    t.host(records, choices, crops, mirror=not mirror)
    device_mean = t.device_mean(torch.device("cuda"))
    calls = []
    kernel = functions.cropped_transform
    monkeypatch.setattr(functions, "cropped_transform",
                        lambda *a: calls.append(1) or kernel(*a))
    got = t.device(torch.from_numpy(crops).cuda(), choices, device_mean, mirror=mirror)
    assert calls == [1]
    monkeypatch.setattr(transformer_module, "_values_fusable", lambda *a: False)
    ops = t.device(torch.from_numpy(crops).cuda(), choices, device_mean, mirror=mirror)
    assert calls == [1]
    assert torch.equal(got, ops)
    assert torch.equal(got.cpu(), want)


def test_the_crops_kernels_bad_arguments_are_one_line_errors():
    crops = torch.zeros((2, 3, 5, 6), dtype=torch.uint8, device="cuda")
    where = torch.zeros((2, 3), dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="^cropped_transform: out must be the crops' shape"):
        functions.cropped_transform(crops, where, None, 1.0, False,
                                    torch.empty((2, 3, 4, 6), device="cuda"))
    with pytest.raises(RuntimeError, match=r"^cropped_transform: mean must hold C values or be "
                                           r"C x MH x MW with MH >= h and MW >= w"):
        functions.cropped_transform(crops, where, torch.zeros((3, 4, 6), device="cuda"), 1.0,
                                    False, torch.empty((2, 3, 5, 6), device="cuda"))
    with pytest.raises(RuntimeError, match=r"^crop_transform: records must be uint8 or float32"):
        functions.crop_transform(crops.half(), where, None, 1.0, False,
                                 torch.empty((2, 3, 5, 6), device="cuda"))
