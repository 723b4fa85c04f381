"""``python -m caffe_py.pycaffe SCRIPT [ARGS...]``: run a pycaffe script on caffe-py."""
import sys

from .runner import main

sys.exit(main())
