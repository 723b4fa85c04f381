"""`cpy import-prototxt`: bring a Caffe .prototxt (net or solver) over as a caffe-py YAML spec."""
from __future__ import annotations

import click

from ..tools.to_yaml import import_file


@click.command("import-prototxt")
@click.argument("source", metavar="IN", type=click.Path(dir_okay=False))
@click.argument("out", metavar="OUT", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(["auto", "net", "solver"]), default="auto",
              show_default=True,
              help="auto: a file with layer/layers is a net, one with base_lr/net/train_net a "
                   "solver")
@click.option("--caffe-root", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="the directory Caffe ran from; relative paths in IN resolve against it "
                   "and are rewritten relative to OUT's directory  [default: the current "
                   "directory]")
def import_prototxt_command(source: str, out: str, kind: str, caffe_root: str | None) -> None:
    """Convert the Caffe prototxt IN to the YAML spec OUT, then load OUT to check it."""
    report = import_file(source, out, kind=kind, root=caffe_root)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"wrote {out}: {report.summary}")


COMMANDS = [import_prototxt_command]
