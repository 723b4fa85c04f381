"""The names of every parameter block caffe.proto's LayerParameter has (Caffe 1.0).

V1LayerParameter's blocks are a subset of these names. A layer may carry any of them in
Caffe, which reads only the blocks of the layer's type and ignores the rest; caffe-py does the
same (with a warning), while a key in neither list is a misspelling and an error.
"""
from __future__ import annotations

# LayerParameter fields 100-148 of caffe.proto (BVLC master 9b89154, Caffe 1.0).
CAFFE_LAYER_BLOCKS = frozenset({
    "transform_param", "loss_param", "accuracy_param", "argmax_param", "batch_norm_param",
    "bias_param", "clip_param", "concat_param", "contrastive_loss_param", "convolution_param",
    "crop_param", "data_param", "dropout_param", "dummy_data_param", "eltwise_param",
    "elu_param", "embed_param", "exp_param", "flatten_param", "hdf5_data_param",
    "hdf5_output_param", "hinge_loss_param", "image_data_param", "infogain_loss_param",
    "inner_product_param", "input_param", "log_param", "lrn_param", "memory_data_param",
    "mvn_param", "parameter_param", "pooling_param", "power_param", "prelu_param",
    "python_param", "recurrent_param", "reduction_param", "relu_param", "reshape_param",
    "scale_param", "sigmoid_param", "softmax_param", "spp_param", "slice_param",
    "swish_param", "tanh_param", "threshold_param", "tile_param", "window_data_param",
})

# The fields of those blocks that name files (relative ones resolve against where Caffe runs).
CAFFE_PATH_FIELDS = {
    "data_param": ("source", "mean_file"),
    "transform_param": ("mean_file",),
    "image_data_param": ("source", "mean_file", "root_folder"),
    "window_data_param": ("source", "mean_file", "root_folder"),
    "hdf5_data_param": ("source",),
    "hdf5_output_param": ("file_name",),
    "infogain_loss_param": ("source",),
}

__all__ = ["CAFFE_LAYER_BLOCKS", "CAFFE_PATH_FIELDS"]
