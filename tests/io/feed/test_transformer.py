"""The transformer against a plain per-element loop written as data_transformer.cpp reads."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from caffe_py.errors import DataError
from caffe_py.io.feed.transformer import _MASK64, Transformer, _splitmix64, read_mean_file
from caffe_py.spec.net_spec import TransformationParameter

pytestmark = pytest.mark.usefixtures("no_stray_threads")


def caffe_loop(array, tp, h_off, w_off, mirror, mean=None):
    """One record exactly as Caffe's Transform(Datum) loop computes it."""
    c_n, height, width = array.shape
    ch = cw = tp.crop_size
    if not tp.crop_size:
        ch, cw = height, width
    out = np.zeros((c_n, ch, cw), dtype=np.float32)
    values = tp.mean_value * c_n if len(tp.mean_value) == 1 else tp.mean_value
    for c in range(c_n):
        for h in range(ch):
            for w in range(cw):
                x = np.float32(array[c, h_off + h, w_off + w])
                if mean is not None:
                    x = (x - mean[c, h_off + h, w_off + w]) * np.float32(tp.scale)
                elif values:
                    x = (x - np.float32(values[c])) * np.float32(tp.scale)
                else:
                    x = x * np.float32(tp.scale)
                out[c, h, cw - 1 - w if mirror else w] = x
    return out


def varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))


def blobproto(array: np.ndarray, legacy: bool = False) -> bytes:
    """A BlobProto: shape (field 7, packed dims) or legacy num..width, data (field 5, packed)."""
    if legacy:
        head = b"".join(bytes([n << 3]) + varint(d) for n, d in zip((1, 2, 3, 4), array.shape,
                                                                    strict=True))
    else:
        dims = b"".join(varint(d) for d in array.shape)
        shape = b"\x0a" + varint(len(dims)) + dims
        head = b"\x3a" + varint(len(shape)) + shape
    data = array.astype("<f4").tobytes()
    return head + b"\x2a" + varint(len(data)) + data


def records(n, shape=(3, 7, 9), seed=0, dtype=np.uint8):
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def check_against_loop(tp, phase, arrays, mean=None, seed=3):
    t = Transformer(tp, phase, arrays[0].shape, seed=seed)
    positions = list(range(10, 10 + len(arrays)))
    got = t(arrays, positions)
    choices = t.choices(positions)
    want = np.stack([caffe_loop(a, tp, *choices.offsets[i], choices.flips[i], mean)
                     for i, a in enumerate(arrays)])
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)
    assert got.dtype == torch.float32
    # the CPU feed's numpy-only path gives the same batch bit for bit
    fed = t.numpy(np.stack(arrays), t.choices_for(10, 1, len(arrays)))
    assert fed.dtype == np.float32
    np.testing.assert_array_equal(fed, got.numpy())
    return choices


def test_test_phase_crops_the_centre():
    tp = TransformationParameter(crop_size=4)
    t = Transformer(tp, "TEST", (3, 6, 9))
    assert t.out_shape == (3, 4, 4)
    assert t.choices(range(5)).offsets.tolist() == [[1, 2]] * 5
    check_against_loop(tp, "TEST", records(4, (3, 6, 9)))


def test_train_crops_at_random_offsets_over_the_whole_range():
    tp = TransformationParameter(crop_size=4)
    t = Transformer(tp, "TRAIN", (3, 7, 9))
    offsets = t.choices(range(400)).offsets
    assert set(offsets[:, 0].tolist()) == {0, 1, 2, 3}
    assert set(offsets[:, 1].tolist()) == {0, 1, 2, 3, 4, 5}
    assert not t.choices(range(400)).flips.any()  # mirror is off
    check_against_loop(tp, "TRAIN", records(6))


def test_mirror_flips_about_half_in_both_phases():
    tp = TransformationParameter(mirror=True)
    for phase in ("TRAIN", "TEST"):
        flips = Transformer(tp, phase, (1, 2, 2), seed=9).choices(range(1000)).flips
        assert 450 < int(flips.sum()) < 550
    choices = check_against_loop(tp, "TRAIN", records(8))
    assert choices.flips.any() and not choices.flips.all()


def test_mean_file_is_indexed_at_the_crop_offset_and_mirrored(tmp_path):
    mean = np.random.default_rng(1).uniform(0, 255, (3, 7, 9)).astype(np.float32)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blobproto(mean[None]))
    tp = TransformationParameter(crop_size=5, mirror=True, mean_file=str(path), scale=0.5)
    choices = check_against_loop(tp, "TRAIN", records(8), mean=mean)
    assert len({tuple(o) for o in choices.offsets.tolist()}) > 1  # per-record mean windows
    check_against_loop(tp, "TEST", records(8), mean=mean)  # one window for the batch
    no_crop = TransformationParameter(mean_file=str(path))
    check_against_loop(no_crop, "TRAIN", records(3), mean=mean)


def test_mean_value_one_or_per_channel_and_scale():
    check_against_loop(TransformationParameter(mean_value=[104, 117, 123], scale=0.017,
                                               crop_size=3), "TRAIN", records(4))
    check_against_loop(TransformationParameter(mean_value=[127.5], scale=1 / 128),
                       "TEST", records(4))


def test_float_records():
    arrays = records(4, dtype=np.float32)
    check_against_loop(TransformationParameter(crop_size=3, mirror=True, scale=2.0,
                                               mean_value=[0.5]), "TRAIN", arrays)


def test_choices_depend_only_on_seed_and_position():
    tp = TransformationParameter(crop_size=2, mirror=True)
    a, b = Transformer(tp, "TRAIN", (1, 8, 8), seed=7), Transformer(tp, "TRAIN", (1, 8, 8), seed=7)
    first = a.choices([5, 6, 7, 8])
    again = b.choices([7, 8])
    np.testing.assert_array_equal(first.offsets[2:], again.offsets)
    np.testing.assert_array_equal(first.flips[2:], again.flips)
    other = Transformer(tp, "TRAIN", (1, 8, 8), seed=8).choices([5, 6, 7, 8])
    assert not np.array_equal(first.offsets, other.offsets)


def scalar_choices(t: Transformer, positions) -> tuple[list, list]:
    """The per-record draw, one Python splitmix64 chain per record (the reference the
    vectorised draw must equal): mirror bit, then h_off, then w_off."""
    _, h, w = t.record_shape
    crop, offsets, flips = t.tp.crop_size, [], []
    for pos in positions:
        state = (t.seed ^ (pos * 0x9E3779B97F4A7C15)) & _MASK64
        r_mirror, state = _splitmix64(state)
        r_h, state = _splitmix64(state)
        r_w, _ = _splitmix64(state)
        flips.append(bool(t.tp.mirror and r_mirror & 1))
        if crop and t.phase == "TRAIN":
            offsets.append([r_h % (h - crop + 1), r_w % (w - crop + 1)])
        else:
            offsets.append([(h - crop) // 2, (w - crop) // 2] if crop else [0, 0])
    return offsets, flips


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_vectorised_choices_equal_the_per_record_draw(phase, seed):
    tp = TransformationParameter(crop_size=5, mirror=True)
    t = Transformer(tp, phase, (3, 9, 12), seed=seed)
    positions = [0, 1, 2, 63, 64, 10**6, 2**40 + 3]
    offsets, flips = scalar_choices(t, positions)
    got = t.choices(positions)
    assert got.offsets.tolist() == offsets and got.flips.tolist() == flips
    assert len(set(flips)) == 2 and (phase == "TEST" or len({tuple(o) for o in offsets}) > 2)
    batch = t.choices_for(64, 3, 4)  # a replica's batch: positions 64, 67, 70, 73
    assert batch.offsets.tolist() == scalar_choices(t, [64, 67, 70, 73])[0]


def test_choices_without_randomness_are_one_shared_constant():
    t = Transformer(TransformationParameter(crop_size=4), "TEST", (1, 8, 10))
    a, b = t.choices_for(0, 1, 3), t.choices([5, 9, 11])
    assert a is b and a.offsets.tolist() == [[2, 3]] * 3 and not a.flips.any()
    assert not a.offsets.flags.writeable  # shared between batches: nobody may change it


def test_errors_name_the_problem_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"^layer 'x': transform_param.crop_size 8 is larger than "
                                        r"the records \(3 x 7 x 9\); use a crop_size <= 7$"):
        Transformer(TransformationParameter(crop_size=8), "TRAIN", (3, 7, 9), where="layer 'x': ")
    with pytest.raises(DataError, match="mean_value has 2 values for 3 channels; give one value"):
        Transformer(TransformationParameter(mean_value=[1, 2]), "TRAIN", (3, 7, 9))
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blobproto(np.zeros((1, 3, 4, 4), np.float32), legacy=True))
    with pytest.raises(DataError, match=rf"^mean_file {path} has shape \[3, 4, 4\] but the "
                                        r"records are \[3, 7, 9\]; compute the mean"):
        Transformer(TransformationParameter(mean_file=str(path)), "TRAIN", (3, 7, 9))
    with pytest.raises(DataError, match=r"^mean_file .*missing: file not found; create a mean "
                                        r"file with `cpy compute-mean"):
        read_mean_file(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x3a\x05\x0a")
    with pytest.raises(DataError, match="not a Caffe BlobProto"):
        read_mean_file(bad)


def test_mean_file_legacy_dims_and_doubles(tmp_path):
    mean = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    path = tmp_path / "legacy"
    path.write_bytes(blobproto(mean, legacy=True))
    np.testing.assert_array_equal(read_mean_file(path), mean[0])
    doubles = tmp_path / "doubles"
    body = mean.astype("<f8").tobytes()  # double_data = 8, packed
    blob = b"\x08\x01\x10\x02\x18\x03\x20\x04" + b"\x42" + varint(len(body)) + body
    doubles.write_bytes(blob)
    np.testing.assert_array_equal(read_mean_file(doubles), mean[0])
    doubles.write_bytes(blob + struct.pack("<B", 0x28))  # a tag with no value after it
    with pytest.raises(DataError, match="not a Caffe BlobProto"):
        read_mean_file(doubles)


def test_mirroring_on_the_device_half_gives_the_same_batch(tmp_path):
    mean = np.random.default_rng(2).uniform(0, 255, (3, 7, 9)).astype(np.float32)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blobproto(mean[None]))
    tp = TransformationParameter(crop_size=5, mirror=True, mean_file=str(path), scale=0.25)
    arrays, positions = records(8), list(range(8))
    t = Transformer(tp, "TRAIN", (3, 7, 9), seed=4)
    choices = t.choices(positions)
    assert choices.flips.any() and not choices.flips.all()
    host = np.empty((8, 3, 5, 5), np.uint8)
    t.host(arrays, choices, host, mirror=False)
    split = t.device(torch.from_numpy(host), choices, t.device_mean(torch.device("cpu")),
                     mirror=True)
    assert torch.equal(split, t(arrays, positions))


@pytest.mark.parametrize("phase,tp", [
    ("TRAIN", dict(crop_size=4, mirror=True)), ("TEST", dict(crop_size=4, mirror=True)),
    ("TEST", dict(crop_size=3)), ("TRAIN", dict(mirror=True)), ("TRAIN", dict())])
def test_gather_from_a_decoded_database_equals_the_host_crop(phase, tp):
    """One gather of records by index (wrapping, repeated) gives what host() makes of the same
    records one by one: random windows, the centre, whole records; flipped here or not."""
    records = np.random.default_rng(2).integers(0, 256, (9, 2, 7, 6), dtype=np.uint8)
    t = Transformer(TransformationParameter(**tp), phase, (2, 7, 6), seed=4)
    index = np.array([7, 8, 0, 1, 1, 5])
    choices = t.choices_for(20, 3, len(index))
    for mirror in (True, False):
        want = np.empty((6, *t.out_shape), np.uint8)
        t.host(records[index], choices, want, mirror=mirror)
        out = np.full_like(want, 255)
        assert t.gather(records, index, choices, out, mirror=mirror) is out
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(t.gather(records, index, choices, mirror=mirror), want)
    assert tp.get("mirror") is None or choices.flips.any()  # the flips were exercised


def _device_crop_matches_the_cpu_path(tmp_path, device: str) -> None:
    """Whole records on the device, cropped and mirrored by one gather (the GPU decode path's
    crop), then the device half: the CPU path's batch bit for bit, raw records, every
    transform; with the channels reversed, the same crops of an RGB copy."""
    mean = np.random.default_rng(2).uniform(0, 255, (3, 7, 9)).astype(np.float32)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blobproto(mean[None]))
    batch = np.stack(records(8))
    cases = [("TRAIN", dict(crop_size=5, mirror=True, mean_file=str(path), scale=0.25)),
             ("TRAIN", dict(crop_size=4, mirror=True, mean_value=[104, 117, 123], scale=0.017)),
             ("TEST", dict(crop_size=5, mean_value=[3.5])), ("TRAIN", dict(mirror=True)),
             ("TEST", dict(scale=0.5))]
    for phase, tp in cases:
        t = Transformer(TransformationParameter(**tp), phase, (3, 7, 9), seed=4)
        choices = t.choices_for(11, 2, 8)
        full = torch.from_numpy(batch).to(device)
        crops = t.device_crop(full, choices)
        got = t.device(crops, choices, t.device_mean(torch.device(device)), mirror=False)
        assert torch.equal(got.cpu(), torch.from_numpy(t.numpy(batch, choices))), (phase, tp)
        rgb = torch.from_numpy(np.ascontiguousarray(batch[:, ::-1])).to(device)
        assert torch.equal(t.device_crop(rgb, choices, reverse_channels=True).cpu(), crops.cpu())
        # the whole transform at once (on CUDA one kernel), from BGR and from RGB records
        mean = t.device_mean(torch.device(device))
        assert torch.equal(t.device_transform(full, choices, mean).cpu(), got.cpu()), (phase, tp)
        assert torch.equal(t.device_transform(rgb, choices, mean, reverse_channels=True).cpu(),
                           got.cpu()), (phase, tp)


def test_device_crop_gives_the_cpu_paths_batch(tmp_path):
    _device_crop_matches_the_cpu_path(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_crop_gives_the_cpu_paths_batch_on_cuda(tmp_path):
    _device_crop_matches_the_cpu_path(tmp_path, "cuda")
