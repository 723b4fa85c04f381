"""The tools behind `cpy`'s file commands.

``convert`` writes Caffe's databases (convert_mnist_data, convert_imageset,
convert_cifar_data), ``dbinfo`` reads one whole and checks it, ``mean`` computes its mean file
(compute_image_mean); they use ``caffe_py.io``'s formats and databases and no torch.
``curves`` plots a run's metrics, ``draw`` a net, ``export`` writes TorchScript, torch.export or
ONNX.

``prototxt`` reads protobuf text format (Caffe's .prototxt nets and solvers) into an ordered
tree that keeps every field's line, column and comments; ``to_yaml`` turns that tree into
caffe-py's YAML spec, upgrading legacy (V1) nets as Caffe's ``UpgradeNetAsNeeded`` does, and
checks the result by loading it with caffe-py's own loaders (``cpy import-prototxt``).
"""
