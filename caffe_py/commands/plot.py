"""`cpy plot`: training curves of several runs in one picture (Caffe's plot_training_log.py)."""
from __future__ import annotations

import click


@click.command("plot")
@click.argument("runs", metavar="RUN...", nargs=-1, required=True)
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="the picture: .png, .svg or .pdf")
@click.option("--x", "x", type=click.Choice(["iterations", "seconds"]), default="iterations",
              show_default=True, help="what the curves run against")
@click.option("--y", "names", default="loss,accuracy,lr", show_default=True, metavar="A,B",
              help="the series, by column or its last part (loss, lr, accuracy, test0/loss)")
def plot_command(runs: tuple[str, ...], out: str, x: str, names: str) -> None:
    """Draw the curves of each RUN: a <snapshot_prefix>_metrics.csv, a snapshot prefix, or a
    training log (caffe-py's or Caffe's)."""
    from ..tools.curves import plot

    drawn = plot(runs, out, x=x, names=[n.strip() for n in names.split(",") if n.strip()])
    click.echo(f"wrote {out}: {', '.join(sorted(drawn))} of {len(runs)} run(s)")


COMMANDS = [plot_command]
