"""`cpy net`: build a net from its spec and print its layers, shapes and parameter counts."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..net import SummaryRow


@click.command("net")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--phase", type=click.Choice(["TRAIN", "TEST"]), default="TRAIN", show_default=True,
              help="which layers to keep (include/exclude rules)")
@click.option("--stage", "stages", multiple=True, metavar="S",
              help="a stage the net is in (repeat for several)")
@click.option("--level", type=int, default=0, show_default=True, help="the net's level")
def net_command(config: str, phase: str, stages: tuple[str, ...], level: int) -> None:
    """Build the net in CONFIG and print one row per layer, then the totals."""
    from ..net import Net  # torch loads when the command runs, not for --help
    from ..spec.net_spec import load_net

    net = Net(load_net(config), phase, stages=stages, level=level)
    rows = net.summary()
    click.echo(f"net '{net.name}' ({phase}" + "".join(f", stage {s}" for s in stages)
               + (f", level {level}" if level else "") + ")")
    for line in format_table(rows):
        click.echo(line)
    total = sum(r.params for r in rows)
    click.echo(f"{len(rows)} layers, {total:,} learnable parameters "
               f"({total * 4 / 2**20:.2f} MiB as float32)")
    click.echo(f"inputs: {', '.join(net.input_names) or 'none'}; "
               f"outputs: {', '.join(net.output_names) or 'none'}; "
               "loss: " + (" + ".join(f"{w:g} * {t}" for t, w in net.loss_weights.items())
                           or "none"))


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
