"""`cpy export` (a net for deployment outside caffe-py: TorchScript, torch.export, ONNX) and
`cpy draw` (a net as a graph picture)."""
from __future__ import annotations

import click

from .net import parse_shapes


@click.command("export")
@click.argument("net", metavar="NET", type=click.Path(dir_okay=False))
@click.argument("weights", metavar="WEIGHTS", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="the file to write: .onnx, .pt2 (torch.export) or .pt "
                                   "(TorchScript) says the format")
@click.option("--format", "fmt", type=click.Choice(["torchscript", "pt2", "onnx"]),
              default=None, help="TorchScript (torch.jit.load), an exported program "
                                 "(torch.export.load) or ONNX  [default: from FILE's suffix]")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=N,C,H,W",
              callback=lambda ctx, param, value: parse_shapes(value),
              help="for a train/test spec: the shape of each input of its deploy form "
                   "(the data layers' tops; repeat for several)")
@click.option("--static-batch", is_flag=True,
              help="keep the batch size as declared (default: the export takes any batch size)")
def export_command(net: str, weights: str, fmt: str | None, out: str,
                   input_shapes: dict[str, tuple[int, ...]], static_batch: bool) -> None:
    """Export the net NET (a deploy spec, or a train/test spec with --input-shape) with the
    weights WEIGHTS, checked against caffe-py's own forward before it is written."""
    from ..tools.export import export, format_of

    fmt = format_of(out, fmt)
    diffs = export(net, weights, fmt, out, input_shapes=input_shapes or None,
                   static_batch=static_batch)
    batch = "batch as declared" if static_batch else "any batch size"
    click.echo(f"wrote {out} ({fmt}, {batch}); largest difference from the net: "
               f"{max(diffs, default=0.0):.2g}")


@click.command("draw")
@click.argument("net", metavar="NET", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="net.svg, net.png, net.pdf (with Graphviz) or net.dot")
@click.option("--rankdir", type=click.Choice(["LR", "TB", "BT", "RL"]), default="LR",
              show_default=True, help="the direction the graph flows")
@click.option("--phase", type=click.Choice(["TRAIN", "TEST", "ALL"]), default="ALL",
              show_default=True, help="draw the layers of one phase, or all")
def draw_command(net: str, out: str, rankdir: str, phase: str) -> None:
    """Draw the net NET (YAML or prototxt) as Caffe's draw_net.py does."""
    from ..spec.net_spec import load_net
    from ..tools.draw import draw

    draw(load_net(net), out, phase=None if phase == "ALL" else phase, rankdir=rankdir)
    click.echo(f"wrote {out}")


COMMANDS = [export_command, draw_command]
