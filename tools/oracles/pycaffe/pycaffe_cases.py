"""The examples compared between BVLC's pycaffe and caffe-py's: what each runs and keeps.

script: the exported script (in caffe_tree/ and in a prepared workspace); cwd: where it runs,
inside the workspace (the notebooks from examples/, as their caffe_root = '../' expects);
args: its command line; makes: what prep.py makes for it; files: what it writes that is
compared (arrays of .npy and .caffemodel files, text of the rest); ignore: printed lines left
out of the comparison (timings); rtol: the tolerance, when not compare.RTOL."""
from __future__ import annotations

CASES: dict[str, dict] = {
    "api-semantics": {
        "script": "examples/api_semantics.py", "cwd": "examples", "args": [],
        "makes": ["api", "mnist"], "files": ["examples/api_arrays.npz"]},
    "00-classification": {
        "script": "examples/00-classification.py", "cwd": "examples", "args": [],
        "makes": ["caffenet", "imagenet_aux", "pictures"], "files": []},
    "01-learning-lenet": {
        "script": "examples/01-learning-lenet.py", "cwd": "examples", "args": [],
        "makes": ["mnist"],
        "files": ["examples/mnist/custom_auto_train.prototxt",
                  "examples/mnist/custom_auto_solver.prototxt"],
        # the test scores after each of 50 SGD iterations: the two float32 BLAS paths agree
        # to 1e-5 for the first iterations and part by 1e-3 of the largest score by the 40th
        # (rounding, amplified by momentum SGD); the losses stay within 1e-4 throughout
        "rtol": 2e-3},
    "net_surgery": {
        "script": "examples/net_surgery.py", "cwd": "examples", "args": [],
        "makes": ["caffenet", "imagenet_aux", "pictures"],
        "files": ["examples/net_surgery/bvlc_caffenet_full_conv.caffemodel"]},
    "pascal-multilabel-with-datalayer": {
        "script": "examples/pascal-multilabel-with-datalayer.py", "cwd": "examples",
        "args": [], "makes": ["caffenet_pascal", "pascal"],
        "files": ["examples/pascal_multilabel_with_datalayer/trainnet.prototxt",
                  "examples/pascal_multilabel_with_datalayer/solver.prototxt"]},
    "classify": {
        "script": "python/classify.py", "cwd": ".",
        "args": ["examples/images/cat.jpg", "cat_probs.npy"],
        "makes": ["caffenet", "imagenet_aux", "pictures"], "files": ["cat_probs.npy"],
        "ignore": [r"^Done in [\d.]+ s\.$"]},
    "classify-center-only": {
        "script": "python/classify.py", "cwd": ".",
        "args": ["--center_only", "--images_dim", "240,250", "examples/images/cat.jpg",
                 "cat_center.npy"],
        "makes": ["caffenet", "imagenet_aux", "pictures"], "files": ["cat_center.npy"],
        "ignore": [r"^Done in [\d.]+ s\.$"]},
    "draw_net": {
        "script": "python/draw_net.py", "cwd": ".",
        "args": ["examples/mnist/lenet_train_test.prototxt", "lenet.dot"],
        "makes": [], "files": ["lenet.dot"]},
    "draw_net-test-phase": {
        "script": "python/draw_net.py", "cwd": ".",
        "args": ["--rankdir", "TB", "--phase", "TEST", "--display_lrm",
                 "examples/mnist/lenet_train_test.prototxt", "lenet_test.png"],
        "makes": [], "files": ["lenet_test.png"]},
}
