"""The data-layer cases compared with the genuine Caffe: one net of one data layer each, as a
dict in caffe-py's YAML form (make_data_golden.py writes it as a prototxt for Caffe).

Paths are relative to tests/golden/data_layers/inputs (Caffe runs there; caffe-py resolves them
against it). ``forwards`` is how many batches each side produces; ``compare`` names the tops
compared value for value ("label" alone where Caffe draws crops or mirrors per record from its
own stream, which caffe-py draws per record position: the order is still compared).
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent / "data_layers"
INPUTS = HERE / "inputs"
FIXTURE = HERE / "caffe.npz"


def _layer(type_name: str, block: str, params: dict, **extra) -> dict:
    return {"name": "d", "type": type_name, "top": ["data", "label"], block: params, **extra}


CASES: dict[str, dict] = {
    # Data over Caffe-written databases: centre crop, mean file and scale (TEST), mean values
    # and scale (TRAIN, nothing random); 6 records in batches of 4: the third batch wraps.
    "data_lmdb_test": dict(
        phase="TEST", seed=1, forwards=3, compare=("data", "label"),
        layer=_layer("Data", "data_param", {"source": "images_lmdb", "batch_size": 4,
                                            "backend": "LMDB"},
                     transform_param={"crop_size": 4, "mean_file": "images_mean.binaryproto",
                                      "scale": 0.5})),
    "data_leveldb_train": dict(
        phase="TRAIN", seed=1, forwards=3, compare=("data", "label"),
        layer=_layer("Data", "data_param", {"source": "images_leveldb", "batch_size": 4,
                                            "backend": "LEVELDB"},
                     transform_param={"mean_value": [10, 20, 30], "scale": 2.0})),
    # Data reading caffe-py-written databases (cpy convert imageset, both backends) and mean
    # (cpy compute-mean): what Caffe made of them.
    "data_ours_lmdb": dict(
        phase="TEST", seed=1, forwards=2, compare=("data", "label"),
        layer=_layer("Data", "data_param", {"source": "ours_lmdb", "batch_size": 4,
                                            "backend": "LMDB"},
                     transform_param={"mean_file": "ours_mean.binaryproto"})),
    "data_ours_leveldb": dict(
        phase="TEST", seed=1, forwards=2, compare=("data", "label"),
        layer=_layer("Data", "data_param", {"source": "ours_leveldb", "batch_size": 4,
                                            "backend": "LEVELDB"})),
    # ImageData: OpenCV's resize up and down, crop, mean values and scale (TEST).
    "image_data_resize": dict(
        phase="TEST", seed=1, forwards=4, compare=("data", "label"),
        layer=_layer("ImageData", "image_data_param",
                     {"source": "images.txt", "batch_size": 3, "new_height": 5,
                      "new_width": 9},
                     transform_param={"crop_size": 4, "mean_value": [100, 50, 25],
                                      "scale": 0.25})),
    "image_data_gray": dict(
        phase="TEST", seed=1, forwards=2, compare=("data", "label"),
        layer=_layer("ImageData", "image_data_param",
                     {"source": "images.txt", "batch_size": 3, "new_height": 7,
                      "new_width": 6, "is_color": False})),
    # ImageData's shuffle: Caffe's order for random_seed 7, reshuffled after every pass.
    "image_data_shuffle": dict(
        phase="TRAIN", seed=7, forwards=6, compare=("data", "label"),
        layer=_layer("ImageData", "image_data_param",
                     {"source": "images.txt", "batch_size": 4, "new_height": 6,
                      "new_width": 6, "shuffle": True})),
    # ... with a random skip and mirroring (its draws come first): the order is Caffe's.
    "image_data_shuffle_skip_mirror": dict(
        phase="TRAIN", seed=11, forwards=5, compare=("label",),
        layer=_layer("ImageData", "image_data_param",
                     {"source": "images.txt", "batch_size": 4, "new_height": 6,
                      "new_width": 6, "shuffle": True, "rand_skip": 5},
                     transform_param={"mirror": True})),
    # HDF5Data over two files (5 and 3 rows), in order and shuffled (glibc's rand()).
    "hdf5_plain": dict(
        phase="TRAIN", seed=1, forwards=4, compare=("data", "label"),
        layer=_layer("HDF5Data", "hdf5_data_param", {"source": "h5_list.txt", "batch_size": 3})),
    "hdf5_shuffle": dict(
        phase="TRAIN", seed=1, forwards=8, compare=("data", "label"),
        layer=_layer("HDF5Data", "hdf5_data_param", {"source": "h5_list.txt", "batch_size": 3,
                                                     "shuffle": True})),
    "hdf5_one_file_shuffle": dict(
        phase="TRAIN", seed=1, forwards=5, compare=("data", "label"),
        layer=_layer("HDF5Data", "hdf5_data_param", {"source": "h5_one.txt", "batch_size": 2,
                                                     "shuffle": True})),
    # WindowData: Caffe's sampling for random_seed 5, context padding past the image's edges,
    # warping, mirroring, mean values and scale; square crops with a mean file.
    "window_warp": dict(
        phase="TRAIN", seed=5, forwards=5, compare=("data", "label"),
        layer=_layer("WindowData", "window_data_param",
                     {"source": "windows.txt", "batch_size": 4, "fg_fraction": 0.5,
                      "context_pad": 2, "scale": 0.5},
                     transform_param={"crop_size": 8, "mirror": True,
                                      "mean_value": [104, 117, 123]})),
    "window_square": dict(
        phase="TRAIN", seed=9, forwards=4, compare=("data", "label"),
        layer=_layer("WindowData", "window_data_param",
                     {"source": "windows.txt", "batch_size": 3, "crop_mode": "square",
                      "fg_threshold": 0.6, "bg_threshold": 0.3},
                     transform_param={"crop_size": 7, "mean_file": "window_mean.binaryproto"})),
}


# HDF5Output: one forward of HDF5Data's first batch (data (3, 2, 3) and label (3,)) into a file;
# Caffe's file is inputs/hdf5_output_caffe.h5.
HDF5_OUTPUT_NET = {
    "name": "hdf5_output",
    "layer": [
        {"name": "d", "type": "HDF5Data", "top": ["data", "label"],
         "hdf5_data_param": {"source": "h5_list.txt", "batch_size": 3}},
        {"name": "out", "type": "HDF5Output", "bottom": ["data", "label"],
         "hdf5_output_param": {"file_name": "hdf5_output.h5"}},
    ],
}


def net_dict(case: dict) -> dict:
    """The whole net of a case, in caffe-py's YAML form."""
    return {"name": "data_case", "layer": [case["layer"]]}
