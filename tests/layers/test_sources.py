"""ImageData, WindowData, HDF5Data, HDF5Output and MemoryData: their errors, and resuming a
shuffled or sampled source exactly (the values themselves are held to Caffe's by
tests/golden/test_data_golden.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from caffe_py.errors import DataError, NetError, SpecError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source

h5py = pytest.importorskip("h5py")


def images(tmp_path, sizes=((4, 5),) * 7):
    rng = np.random.default_rng(0)
    lines = []
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        lines.append(f"{i}.png {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return "list.txt"


def net(tmp_path, layer: dict, phase="TRAIN", seed=3) -> Net:
    spec = parse_net({"name": "n", "layer": [layer]}, Source(str(tmp_path / "n.yaml"), tmp_path))
    return Net(spec, phase, seed=seed)


def batches(tmp_path, layer: dict, n: int, *, state=None, seed=3):
    """n batches' labels (and first tops); the read state after them."""
    model = net(tmp_path, layer, seed=seed)
    out = []
    with ReaderPool() as pool:
        attach_feeds(model, pool, seed=seed)
        if state is not None:
            pool.load_state_dict(state)
        pool.start()
        for _ in range(n):
            tops = model().outputs
            out.append({k: v.clone() for k, v in tops.items()})
        return out, pool.state_dict()


def assert_resumes(tmp_path, layer: dict, first: int = 2, then: int = 3) -> None:
    straight, _ = batches(tmp_path, layer, first + then)
    _, state = batches(tmp_path, layer, first)
    resumed, _ = batches(tmp_path, layer, then, state=state)
    for a, b in zip(straight[first:], resumed, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def image_data(**params):
    return {"name": "d", "type": "ImageData", "top": ["data", "label"],
            "image_data_param": {"source": "list.txt", "batch_size": 3, **params}}


def test_image_data_shuffle_and_skip_resume_exactly(tmp_path):
    images(tmp_path)
    assert_resumes(tmp_path, image_data(shuffle=True, rand_skip=4))


def test_image_data_resizes_with_cv2_as_with_numpy(tmp_path, monkeypatch):
    """new_height/new_width: cv2.resize where OpenCV is installed, the numpy path otherwise;
    the batches are the same to the bit."""
    from caffe_py.io.formats import images as image_files

    if image_files._CV2 is None:
        pytest.skip("opencv-python(-headless) is not installed")
    images(tmp_path, sizes=((9, 7), (4, 5), (12, 3), (5, 5), (8, 6), (3, 9), (6, 6)))
    layer = image_data(new_height=5, new_width=4, shuffle=True)
    calls = []
    real = image_files._CV2.resize
    monkeypatch.setattr(image_files._CV2, "resize", lambda *a, **k: calls.append(1) or
                        real(*a, **k))
    with_cv2, _ = batches(tmp_path, layer, 3)
    assert len(calls) >= 7 and with_cv2[0]["data"].shape == (3, 3, 5, 4)
    monkeypatch.setattr(image_files, "_CV2", None)
    with_numpy, _ = batches(tmp_path, layer, 3)
    for a, b in zip(with_cv2, with_numpy, strict=True):
        assert torch.equal(a["data"], b["data"]) and torch.equal(a["label"], b["label"])


def test_image_data_errors(tmp_path):
    with pytest.raises(DataError, match=r"list.txt: list file not found"):
        net(tmp_path, image_data())
    images(tmp_path, sizes=((4, 5), (4, 5), (6, 5)))
    with pytest.raises(NetError, match=r"image_data_param.rand_skip 9 is more than the 3 "
                                       r"images of .*list.txt; use a rand_skip <= 3"):
        net(tmp_path, image_data(rand_skip=9))
    with pytest.raises(SpecError, match=r"new_height and new_width go together"):
        net(tmp_path, image_data(new_height=3))
    with pytest.raises(DataError) as err:
        batches(tmp_path, image_data(), 1)
    assert str(err.value).endswith("list.txt: 2.png is 3 x 6 x 5 but the first image is "
                                   "3 x 4 x 5; images of one batch need one size: set "
                                   "new_height and new_width")


def window_file(tmp_path, text=None):
    Image.fromarray(np.full((10, 12, 3), 7, np.uint8)).save(tmp_path / "w.png")
    (tmp_path / "windows.txt").write_text(text or (
        "# 0\nw.png\n3\n10\n12\n3\n1 0.9 1 1 8 7\n2 0.8 0 2 11 9\n0 0.1 3 3 6 6\n"))


def window_data(**transform):
    return {"name": "w", "type": "WindowData", "top": ["data", "label"],
            "window_data_param": {"source": "windows.txt", "batch_size": 4, "context_pad": 1,
                                  "fg_fraction": 0.5},
            "transform_param": {"crop_size": 5, "mirror": True, **transform}}


def test_window_data_resumes_exactly(tmp_path):
    window_file(tmp_path)
    assert_resumes(tmp_path, window_data())


def test_window_data_errors(tmp_path):
    window_file(tmp_path)
    with pytest.raises(NetError, match=r"transform_param.scale is not read by WindowData \(nor "
                                       r"by Caffe's\); set window_data_param.scale instead"):
        net(tmp_path, window_data(scale=2.0))
    with pytest.raises(NetError, match=r"needs transform_param.crop_size > 0"):
        net(tmp_path, window_data(crop_size=0))
    window_file(tmp_path, "# 0\nw.png\n3\n10\n12\n2\n1 0.9 1 1 8\n")
    with pytest.raises(DataError, match=r"windows.txt: ends inside the entry of image 0"):
        net(tmp_path, window_data())
    window_file(tmp_path, "# 0\nw.png\n3\n10\n12\n1\n1 0.9 1 1 8 7\n")
    with pytest.raises(DataError, match=r"windows.txt: no background window \(overlap < "
                                        r"bg_threshold\); WindowData samples both kinds"):
        batches(tmp_path, window_data(), 1)


def h5_files(tmp_path, rows=(5, 3), shapes=((2,), (2,))):
    names = []
    for i, (n, shape) in enumerate(zip(rows, shapes, strict=True)):
        with h5py.File(tmp_path / f"{i}.h5", "w") as f:
            values = np.arange(n * int(np.prod(shape)), dtype=np.float32)
            f["x"] = values.reshape(n, *shape) + 100 * i
            f["y"] = np.arange(n, dtype=np.int32) + 10 * i
        names.append(f"{i}.h5")
    (tmp_path / "h5.txt").write_text("\n".join(names) + "\n")


def hdf5_data(**params):
    return {"name": "h", "type": "HDF5Data", "top": ["x", "y"],
            "hdf5_data_param": {"source": "h5.txt", "batch_size": 3, **params}}


def test_hdf5_data_tops_and_shuffled_resume(tmp_path):
    h5_files(tmp_path)
    (first,), _ = batches(tmp_path, hdf5_data(), 1)
    assert first["x"].tolist() == [[0, 1], [2, 3], [4, 5]] and first["y"].tolist() == [0, 1, 2]
    assert first["y"].dtype == torch.float32  # integer datasets are read as float, as Caffe
    assert_resumes(tmp_path, hdf5_data(shuffle=True), first=2, then=4)


def test_hdf5_data_errors(tmp_path):
    h5_files(tmp_path, shapes=((2,), (3,)))
    with pytest.raises(DataError, match=r"1.h5: rows of x \[3\], y \[\] but .*0.h5 has x \[2\], "
                                        r"y \[\]; every file of an HDF5Data list needs the same"):
        net(tmp_path, hdf5_data())
    h5_files(tmp_path)
    with pytest.raises(DataError, match=r"0.h5: no dataset 'z'; HDF5Data reads one dataset per "
                                        r"top, named as the top"):
        net(tmp_path, {**hdf5_data(), "top": ["x", "z"]})


def test_hdf5_output_checks_its_bottoms(tmp_path):
    layers = [{"name": "in", "type": "Input", "top": ["a", "b"],
               "input_param": {"shape": [{"dim": [2, 3]}, {"dim": [3]}]}},
              {"name": "out", "type": "HDF5Output", "bottom": ["a", "b"],
               "hdf5_output_param": {"file_name": "o.h5"}}]
    with pytest.raises(NetError, match=r"layer 'out' \(HDF5Output\): bottom 'b' \(index 1\) "
                                       r"has 3 rows but the data has 2; give both the same"):
        Net(parse_net({"name": "n", "layer": layers}, Source(str(tmp_path / "n"), tmp_path)))


def memory_net():
    layer = {"name": "m", "type": "MemoryData", "top": ["data", "label"],
             "memory_data_param": {"batch_size": 2, "channels": 1, "height": 1, "width": 2}}
    return Net(parse_net({"name": "n", "layer": [layer]}, Source()), "TEST")


def test_memory_data_wraps_and_checks_its_arrays():
    model = memory_net()
    with pytest.raises(NetError, match=r"has no arrays; call reset\(data, labels\)"):
        model()
    model.set_input_arrays(np.arange(8, dtype=np.float32).reshape(4, 1, 1, 2),
                           np.array([[[[5]]], [[[6]]], [[[7]]], [[[8]]]], np.float32))
    got = [model().outputs["label"].tolist() for _ in range(3)]
    assert got == [[5, 6], [7, 8], [5, 6]]
    layer = model.layers[0]
    with pytest.raises(NetError, match=r"was given 3 rows, not a multiple of batch_size 2; "
                                       r"pass a multiple of 2 rows"):
        layer.reset(np.zeros((3, 1, 1, 2)), np.zeros(3))
    with pytest.raises(NetError, match=r"was given data of shape \[2, 1, 2, 1\]; rows must be "
                                       r"\[1, 1, 2\]"):
        layer.reset(np.zeros((2, 1, 2, 1)), np.zeros(2))


def test_two_replicas_share_one_shuffled_order(tmp_path):
    """Replica i of N takes records i, i+N, ... of the one order: together, one replica of
    batch N x B."""
    images(tmp_path)
    layer = image_data(shuffle=True)
    (one,), _ = batches(tmp_path, {**layer, "image_data_param": {
        **layer["image_data_param"], "batch_size": 6}}, 1)
    models = [net(tmp_path, layer) for _ in range(2)]
    with ReaderPool(replicas=2) as pool:
        for replica, model in enumerate(models):
            attach_feeds(model, pool, replica=replica, seed=3)
        pool.start()
        parts = [model().outputs["label"] for model in models]
    assert torch.equal(torch.stack(parts, 1).reshape(-1), one["label"])
