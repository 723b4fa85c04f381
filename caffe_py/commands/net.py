"""`cpy net`: build a net from its spec and print its layers, shapes and parameter counts."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..net import SummaryRow


@click.command("net")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--phase", type=click.Choice(["TRAIN", "TEST"]), default=None,
              help="which layers to keep (include/exclude rules)  [default: the net's "
                   "state.phase, else TRAIN]")
@click.option("--stage", "stages", multiple=True, metavar="S",
              help="a stage the net is in, besides the net's state.stage (repeat for several)")
@click.option("--level", type=int, default=None,
              help="the net's level  [default: the net's state.level, else 0]")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=C,H,W",
              callback=lambda ctx, param, value: parse_shapes(value),
              help="the record shape of a Data layer (by layer or top name) whose database "
                   "does not exist here (repeat for several)")
@click.option("--allow-python", is_flag=True,
              help="import the modules of Python layers to compute their shapes (they run "
                   "their code; without this flag such a net is refused, naming the file)")
def net_command(config: str, phase: str | None, stages: tuple[str, ...], level: int | None,
                input_shapes: dict[str, tuple[int, ...]], allow_python: bool) -> None:
    """Build the net in CONFIG and print one row per layer, then the totals.

    Data layers need no database: their shapes come from data_param.batch_size, the
    transform's crop and the first record of the database when it exists (else
    --input-shape). Nothing runs but shape arithmetic: no file is written (an HDF5Output's
    file_name stays as it is) and no module is imported unless --allow-python.
    """
    from ..net import Net  # torch loads when the command runs, not for --help
    from ..spec.net_spec import load_net

    net = Net(load_net(config), phase, stages=stages, level=level,
              options={"record_shapes": input_shapes, "inspect": True,
                       "allow_python": allow_python})
    rows = net.summary()
    click.echo(f"net '{net.name}' ({net.phase}" + "".join(f", stage {s}" for s in
                                                          sorted(net.stages))
               + (f", level {net.level}" if net.level else "") + ")")
    for line in format_table(rows):
        click.echo(line)
    total = sum(r.params for r in rows)
    click.echo(f"{len(rows)} layers, {total:,} learnable parameters "
               f"({total * 4 / 2**20:.2f} MiB as float32)")
    click.echo(f"inputs: {', '.join(net.input_names) or 'none'}; "
               f"outputs: {', '.join(net.output_names) or 'none'}; "
               "loss: " + (" + ".join(f"{w:g} * {t}" for t, w in net.loss_weights.items())
                           or "none"))


def parse_shapes(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """``('data=3,227,227', 'label=')`` -> ``{'data': (3, 227, 227), 'label': ()}``; a bad
    value is a usage error."""
    shapes = {}
    for value in values:
        name, eq, dims = value.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            shape = (0,)
        if not name or not eq or (shape and min(shape) < 1):
            raise click.BadParameter(f"'{value}' is not NAME=C,H,W (positive sizes, e.g. "
                                     "data=3,256,256; an HDF5Data top: one row's shape, "
                                     "label= for a scalar)", param_hint="--input-shape")
        shapes[name] = shape
    return shapes


def format_table(rows: list[SummaryRow]) -> list[str]:
    """Aligned columns: layer, type, 'top shape' (one line per extra top), parameters."""
    cells = [("layer", "type", "top shapes", "params")]
    for r in rows:
        tops = [f"{name} {list(shape)}" for name, shape in r.tops] or ["-"]
        cells.append((r.name, r.type, tops[0], f"{r.params:,}"))
        cells.extend(("", "", top, "") for top in tops[1:])
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d:>{widths[3]}}".rstrip()
            for a, b, c, d in cells]


COMMANDS = [net_command]
