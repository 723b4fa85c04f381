"""`python cli.py ...` does what the installed `cpy ...` does."""
from caffe_py.cli import main

if __name__ == "__main__":
    main()
