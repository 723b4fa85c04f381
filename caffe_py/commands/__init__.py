"""Click commands, one module per family; caffe_py/cli.py collects their COMMANDS lists."""
