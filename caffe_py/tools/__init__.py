"""Tools that bring Caffe's own files over to caffe-py.

``prototxt`` reads protobuf text format (Caffe's .prototxt nets and solvers) into an ordered
tree that keeps every field's line, column and comments; ``to_yaml`` turns that tree into
caffe-py's YAML spec, upgrading legacy (V1) nets as Caffe's ``UpgradeNetAsNeeded`` does, and
checks the result by loading it with caffe-py's own loaders (``cpy import-prototxt``).
"""
