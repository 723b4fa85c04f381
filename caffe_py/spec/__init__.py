"""YAML specs with Caffe's field names: loading with line marks, typed messages, validation."""
