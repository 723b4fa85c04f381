"""``python -m caffe_py ...`` runs the command line, as ``cpy ...`` does."""
from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
