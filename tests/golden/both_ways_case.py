"""The tiny training run whose files go both ways between Caffe and caffe-py: a net and solver
in caffe-py's YAML form (make_both_ways.py writes them as prototxt for Caffe).

20 records of 1 x 6 x 6 in batches of 4: after 5 iterations every record was read once, so a
run resumed at iteration 5 reads from the first record whichever program resumes it (Caffe's
solver state holds no read position). SGD with momentum and a multistep rate (stepvalue 3 and
7) exercise the history blobs and current_step.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent / "both_ways"
FIXTURE = HERE / "caffe.npz"
RECORDS, SHAPE, BATCH = 20, (1, 6, 6), 4
SNAPSHOT, MAX_ITER = 5, 10

NET = {
    "name": "tiny",
    "layer": [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "transform_param": {"scale": 0.00390625},
         "data_param": {"source": "records_lmdb", "batch_size": BATCH, "backend": "LMDB"}},
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution_param": {"num_output": 2, "kernel_size": 3,
                               "weight_filler": {"type": "xavier"},
                               "bias_filler": {"type": "constant", "value": 0.1}}},
        {"name": "relu", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv", "top": "ip",
         "inner_product_param": {"num_output": 3, "weight_filler": {"type": "gaussian",
                                                                    "std": 0.1}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"},
    ],
}


def solver(prefix: str, fmt: str) -> dict:
    """The solver (net.yaml / net.prototxt beside it), snapshots to ``prefix`` in ``fmt``
    (BINARYPROTO or HDF5)."""
    return {"net": "net.prototxt", "base_lr": 0.05, "momentum": 0.9, "weight_decay": 0.001,
            "lr_policy": "multistep", "gamma": 0.5, "stepvalue": [3, 7], "display": 1,
            "max_iter": MAX_ITER, "snapshot": SNAPSHOT, "snapshot_prefix": prefix,
            "snapshot_format": fmt, "random_seed": 1, "solver_mode": "CPU"}
