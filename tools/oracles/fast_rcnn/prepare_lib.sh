#!/usr/bin/env bash
# prepare_lib.sh -- make py-faster-rcnn's (or py-R-FCN's) lib/ importable by caffe-py, CPU only.
#
#   bash tools/oracles/fast_rcnn/prepare_lib.sh /path/to/py-faster-rcnn OUT
#   PYTHONPATH=OUT/lib:OUT/.deps cpy ...   (CPY_RCNN_LIB=OUT/lib for the test that uses it)
#
# The repositories' lib/ holds the Python layers their end-to-end prototxts name
# (roi_data_layer.layer.RoIDataLayer, rpn.anchor_target_layer, rpn.proposal_layer,
# rpn.proposal_target_layer) and their helpers. Three things keep it from running as it is:
#   1. it is Python 2 of numpy 1's time: lib2to3 rewrites it (print, xrange, dict methods,
#      imports...), yaml.load(s) becomes yaml.safe_load(s) (PyYAML 6 wants a Loader) and
#      numpy's removed aliases np.int, np.float, np.bool, np.object their builtins; the
#      regions-per-image counts, which Python 2 divided as integers and numpy 1 took as float
#      sizes, and a class's column (from a float label), become ints;
#   2. two Cython extensions must be built: utils.cython_bbox and nms.cpu_nms (Cython is
#      installed into OUT/.cython, not into the environment; numpy 2's Cython declarations
#      have no np.int_t, so cpu_nms.pyx's argsort indices are typed np.intp_t);
#   3. nms.gpu_nms needs CUDA and nvcc: a stand-in module is written that refuses to run, and
#      fast_rcnn.config's USE_GPU_NMS must be False (the test sets it; so should a user:
#      cfg.USE_GPU_NMS = False, or `USE_GPU_NMS: False` in the experiment's YAML).
# Its own Python needs (easydict, OpenCV's cv2) go into OUT/.deps. The repository is a git
# clone (or bare git directory); its HEAD's lib/ is used.
set -euo pipefail

SRC=$1
OUT=$2
GIT=$( [ -d "$SRC/.git" ] && echo "$SRC/.git" || echo "$SRC")
rm -rf "$OUT/lib"
mkdir -p "$OUT"
git --git-dir="$GIT" archive HEAD lib | tar x -C "$OUT"

python3 - "$OUT/lib" <<'EOF'
import re
import sys
import warnings
from pathlib import Path

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from lib2to3 import refactor

tool = refactor.RefactoringTool(refactor.get_fixers_from_package("lib2to3.fixes"))
for path in Path(sys.argv[1]).rglob("*.py"):
    text = path.read_text()
    try:
        new = str(tool.refactor_string(text + ("\n" if not text.endswith("\n") else ""),
                                       str(path)))
    except Exception as exc:  # a file lib2to3 cannot parse stays as it is
        print(f"{path}: left as it is ({exc})")
        continue
    new = re.sub(r"\bnp\.(int|float|bool|object)\b(?![\d_])", r"\1", new)
    # Python 2's integer division and numpy 1's float sizes: the regions per image
    new = new.replace("cfg.TRAIN.BATCH_SIZE / num_images", "cfg.TRAIN.BATCH_SIZE // num_images")
    new = re.sub(r"= np\.round\((cfg\.TRAIN\.FG_FRACTION \* rois_per_image)\)$",
                 r"= int(np.round(\1))", new, flags=re.M)
    new = new.replace("start = 4 * cls\n", "start = int(4 * cls)\n")  # a float class index
    path.write_text(new.replace("yaml.load(", "yaml.safe_load("))
EOF

sed -i -E 's/np\.int_t/np.intp_t/g; s/np\.(int|float|bool)\b([^_0-9]|$)/\1\2/g' \
  "$OUT"/lib/nms/cpu_nms.pyx "$OUT"/lib/utils/bbox.pyx
[ -d "$OUT/.cython/Cython" ] || \
  python3 -m pip install --quiet --target "$OUT/.cython" "cython<3.1" >/dev/null
cat > "$OUT/lib/setup_cpu.py" <<'EOF'
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("utils.cython_bbox", ["utils/bbox.pyx"], include_dirs=[np.get_include()]),
    Extension("nms.cpu_nms", ["nms/cpu_nms.pyx"], include_dirs=[np.get_include()]),
]
setup(name="rcnn_lib_cpu", ext_modules=cythonize(extensions, language_level=3, quiet=True))
EOF
(cd "$OUT/lib" && PYTHONPATH="$OUT/.cython" python3 setup_cpu.py build_ext --inplace >/dev/null)
cat > "$OUT/lib/nms/gpu_nms.py" <<'EOF'
"""Stand-in for the CUDA extension nms.gpu_nms (not built: no nvcc). Set
fast_rcnn.config.cfg.USE_GPU_NMS = False to use nms.cpu_nms."""


def gpu_nms(*args, **kwargs):
    raise RuntimeError("nms.gpu_nms was not built (no CUDA): set cfg.USE_GPU_NMS = False")
EOF
[ -d "$OUT/.deps/easydict" ] || \
  python3 -m pip install --quiet --no-deps --target "$OUT/.deps" easydict \
    opencv-python-headless >/dev/null
echo "prepared $OUT/lib (with $OUT/.deps)"
