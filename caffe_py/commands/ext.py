"""`cpy build-ext`: build the CUDA activation kernels ahead of time (else: on first use)."""
from __future__ import annotations

import click


@click.command("build-ext")
@click.option("--verbose", is_flag=True, help="show the compiler's commands and output")
def build_ext_command(verbose: bool) -> None:
    """Compile caffe_py/kernels/csrc with nvcc into the extension cache and load it.

    Set TORCH_CUDA_ARCH_LIST (e.g. 9.0) to build for fewer GPU architectures, and
    TORCH_EXTENSIONS_DIR to move the cache.
    """
    from ..kernels import build  # torch loads when the command runs, not for --help

    directory, seconds = build.build(verbose=verbose)
    click.echo(f"built {build.NAME} in {directory} ({seconds:.1f} s)")


COMMANDS = [build_ext_command]
