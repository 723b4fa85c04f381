"""Caffe's tools under their own names, reading their arguments as gflags does, so that a
script written for Caffe's build/tools runs with ``cpy`` in front: ``cpy convert_imageset
--resize_height=32 --resize_width=32 --shuffle -backend lmdb ROOT/ list.txt DB``.

gflags' rules: a flag is ``-name`` or ``--name``, its value after ``=`` or in the next
argument; a boolean flag alone is true, ``-noname`` false, ``-name=false`` too; flags and
positional arguments may be mixed, and ``--`` ends the flags. (cpy's own spelling with dashes,
``--resize-height``, is read as well.) Each tool logs Caffe's lines on stderr, as Caffe's
tools do, and calls the same library code as cpy's own command.
"""
from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

log = logging.getLogger("caffe_py.commands")

_TRUE, _FALSE = ("true", "t", "yes", "y", "1"), ("false", "f", "no", "n", "0")


@dataclass(frozen=True)
class GFlag:
    """One flag of a tool: its name, kind (bool, int or str), default and help."""

    name: str
    kind: type
    default: Any
    help: str


NUMBER = re.compile(r"-[0-9]+(\.[0-9]*)?")
"""A negative number among the arguments (e.g. extract_features' num_mini_batches)."""
HELP_FLAGS = ("-h", "-help", "--help", "-helpshort", "--helpshort")
"""gflags' help flags. click's own short help option would read a single-dash flag holding an
'h' (-shuffle, -resize_height, -check_size) as a cluster of short options and print the help
instead of running the tool."""


class GFlagsError(click.ClickException):
    """An argument gflags would refuse (printed as one line, ``Error: ...``, exit status 1)."""


def parse_gflags(tool: str, args: Sequence[str],
                 flags: Sequence[GFlag]) -> tuple[dict[str, Any], list[str]]:
    """(flag values by name, the positional arguments) of ``args``, as gflags reads them."""
    known = {f.name: f for f in flags}
    values = {f.name: f.default for f in flags}
    positional: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg == "--":
            positional.extend(items[i:])
            break
        if not arg.startswith("-") or arg == "-" or NUMBER.fullmatch(arg):
            positional.append(arg)   # a negative number is a value, as in gflags
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        name = name.replace("-", "_")
        flag = known.get(name)
        if flag is None and name.startswith("no") and name[2:] in known and \
                known[name[2:]].kind is bool and not eq:
            values[name[2:]] = False
            continue
        if flag is None:
            listed = ", ".join(f"-{f}" for f in known) or "none"
            raise GFlagsError(f"{tool}: unknown flag -{name} (its flags: {listed})")
        if flag.kind is bool:
            if eq and value.lower() not in _TRUE + _FALSE:
                raise GFlagsError(f"{tool}: -{name}={value}: expected true or false")
            values[name] = not eq or value.lower() in _TRUE
            continue
        if not eq:
            if i >= len(items):
                raise GFlagsError(f"{tool}: flag -{name} is missing its value")
            value, i = items[i], i + 1
        if flag.kind is int:
            try:
                values[name] = int(value)
            except ValueError:
                raise GFlagsError(f"{tool}: -{name}={value}: expected an integer") from None
        else:
            values[name] = value
    return values, positional


def caffe_tool(name: str, short: str, usage: str,
               flags: Sequence[GFlag] = ()) -> Callable[..., Any]:
    """A click command ``name`` whose arguments go to the decorated function as gflags reads
    them: ``fn(values, positional)``; ``short`` is its line in ``cpy --help``, ``usage``
    Caffe's usage line."""
    table = "\n".join(f"  -{f.name} ({f.kind.__name__}, default {f.default!r}): {f.help}"
                      for f in flags)

    def decorate(fn: Callable[[dict[str, Any], list[str]], None]) -> click.Command:
        def run(args: tuple[str, ...]) -> None:
            if any(a in HELP_FLAGS for a in args[:args.index("--") if "--" in args else None]):
                ctx = click.get_current_context()
                click.echo(ctx.get_help())
                ctx.exit(0)
            values, positional = parse_gflags(name, args, flags)
            fn(values, positional)
        doc = inspect.cleandoc(fn.__doc__ or "")
        text = f"{doc}\n\n\b\nUsage: cpy {usage}" + (f"\n\n\b\nFlags:\n{table}" if table else "")
        command = click.command(name, help=text, context_settings={
            "ignore_unknown_options": True, "help_option_names": ["--help"]})(
            click.argument("args", nargs=-1, type=click.UNPROCESSED)(run))
        command.short_help = short
        return command
    return decorate


def need(tool: str, usage: str, positional: list[str], least: int, most: int) -> None:
    """Between ``least`` and ``most`` positional arguments, else Caffe's usage in one line."""
    if not least <= len(positional) <= most:
        raise GFlagsError(f"{tool}: expected {least if least == most else f'{least} to {most}'} "
                          f"arguments, got {len(positional)}; usage: cpy {usage}")


UPGRADE_USAGE = "upgrade_net_proto_text v0_net_proto_file_in net_proto_file_out"


@caffe_tool("upgrade_net_proto_text", "Caffe's tool: a V0/V1 net prototxt upgraded",
            UPGRADE_USAGE)
def upgrade_net_proto_text(_flags: dict[str, Any], positional: list[str]) -> None:
    """Upgrade a V0 or V1 net prototxt to the current format (Caffe's
    upgrade_net_proto_text): OUT.prototxt in Caffe's text format, OUT.yaml as caffe-py's
    spec (what cpy import-prototxt writes)."""
    need("upgrade_net_proto_text", UPGRADE_USAGE, positional, 2, 2)
    from ..tools.to_prototxt import upgrade_net_file

    upgrade_net_file(*positional)


BACKEND = GFlag("backend", str, "lmdb", "the database kind: lmdb or leveldb")
RESUME = GFlag("resume", bool, False, "continue an interrupted conversion (DB_NAME.partial) "
               "after its last committed record (caffe-py's)")
IMAGESET_USAGE = "convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME"


@caffe_tool("convert_imageset", "Caffe's tool: images of a list file into a DB",
            IMAGESET_USAGE,
            [GFlag("gray", bool, False, "treat images as grayscale ones"),
             GFlag("shuffle", bool, False, "randomly shuffle the order of images and labels"),
             BACKEND,
             GFlag("resize_width", int, 0, "width images are resized to"),
             GFlag("resize_height", int, 0, "height images are resized to"),
             GFlag("check_size", bool, False, "check that all the datum have the same size"),
             GFlag("encoded", bool, False, "save the encoded image in the datum"),
             GFlag("encode_type", str, "", "what to encode the image as ('png', 'jpg')"),
             RESUME])
def convert_imageset(flags: dict[str, Any], positional: list[str]) -> None:
    """Convert a set of images to the leveldb/lmdb format used as input for Caffe (Caffe's
    convert_imageset; cpy convert imageset is the same converter)."""
    need("convert_imageset", IMAGESET_USAGE, positional, 3, 3)
    from ..tools.convert import ImagesetOptions
    from ..tools.convert import convert_imageset as convert

    root, listfile, db = positional
    encode_type = flags["encode_type"].lower()
    if encode_type and not flags["encoded"]:
        log.info("encode_type specified, assuming encoded=true.")
    if flags["shuffle"]:
        log.info("Shuffling data")
    options = ImagesetOptions(gray=flags["gray"], shuffle=flags["shuffle"],
                              resize_width=max(0, flags["resize_width"]),
                              resize_height=max(0, flags["resize_height"]),
                              check_size=flags["check_size"],
                              encoded=flags["encoded"] or bool(encode_type),
                              encode_type="jpg" if encode_type == "jpeg" else encode_type)
    from .data import resumable

    with resumable(db):
        result = convert(root, listfile, db, options, resume=flags["resume"],
                         backend=flags["backend"])
    log.info(f"A total of {result.records} images.")
    log.info(f"Processed {result.written} files.")


MEAN_USAGE = "compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]"


@caffe_tool("compute_image_mean", "Caffe's tool: the mean image of a DB", MEAN_USAGE,
            [GFlag("backend", str, "lmdb", "the database kind: lmdb or leveldb")])
def compute_image_mean(flags: dict[str, Any], positional: list[str]) -> None:
    """Compute the mean image of a set of images given by a leveldb/lmdb (Caffe's
    compute_image_mean; written as a .binaryproto when OUTPUT_FILE is given)."""
    need("compute_image_mean", MEAN_USAGE, positional, 1, 2)
    from ..tools.mean import compute_mean

    log.info("Starting iteration")
    result = compute_mean(positional[0], positional[1] if len(positional) == 2 else None,
                          backend=flags["backend"])
    log.info(f"Processed {result.records} files.")
    if len(positional) == 2:
        log.info(f"Write to {positional[1]}")
    log.info(f"Number of channels: {result.mean.shape[0]}")
    for c, value in enumerate(result.channel_means):
        log.info(f"mean_value channel [{c}]: {value:g}")


MNIST_USAGE = "convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file"


@caffe_tool("convert_mnist_data", "Caffe's tool: MNIST files into a DB", MNIST_USAGE,
            [GFlag("backend", str, "lmdb", "the backend for storing the result"), RESUME])
def convert_mnist_data(flags: dict[str, Any], positional: list[str]) -> None:
    """Convert the MNIST dataset (IDX files, gzipped or not) to the lmdb/leveldb format used by
    Caffe to load data (Caffe's convert_mnist_data; cpy convert idx is the same converter)."""
    need("convert_mnist_data", MNIST_USAGE, positional, 3, 3)
    from ..tools.convert import convert_idx
    from .data import resumable

    with resumable(positional[2]):
        result = convert_idx(*positional, resume=flags["resume"], backend=flags["backend"])
    log.info(f"A total of {result.records} items.")
    log.info(f"Processed {result.written} files.")


FEATURES_USAGE = ("extract_features pretrained_net_param feature_extraction_proto_file "
                  "extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] "
                  "num_mini_batches db_type [CPU/GPU] [DEVICE_ID=0]")


@caffe_tool("extract_features", "Caffe's tool: blobs of a net into DBs", FEATURES_USAGE)
def extract_features(_flags: dict[str, Any], positional: list[str]) -> None:
    """Extract the features of the input data produced by a trained net: each named blob's
    values, image by image, into its own database of float Datums, keys %010d (Caffe's
    extract_features). Several blobs and databases go comma-separated, as many of each."""
    need("extract_features", FEATURES_USAGE, positional, 6, 8)
    from ..tools.extract import extract_features as extract

    weights, spec, blobs, dbs, batches, backend, *where = positional
    if not batches.lstrip("-").isdigit():
        raise GFlagsError(f"extract_features: num_mini_batches '{batches}' is not a number")
    device = "cpu"
    if where and where[0] == "GPU":
        index = where[1] if len(where) > 1 else "0"
        from ..devices import parse_devices

        device = str(parse_devices(index)[0])
        log.info("Using GPU")
        log.info(f"Using Device_id={index}")
    else:
        log.info("Using CPU")
    extract(weights, spec, blobs.split(","), dbs.split(","), int(batches), backend.lower(),
            device=device)


COMMANDS = [convert_imageset, compute_image_mean, convert_mnist_data, upgrade_net_proto_text,
            extract_features]
