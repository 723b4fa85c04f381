"""YAML specs with Caffe's field names: loading with line marks, typed messages, validation.

The whole schema (caffe.proto's part that caffe-py reads) lives here, and nothing here imports
torch or the layer library, so loading and validating a spec stays fast.
"""
