"""`cpy convert idx|imageset|cifar`, `cpy compute-mean`, `cpy db-info`: Caffe's data tools
(convert_mnist_data, convert_imageset, convert_cifar_data, compute_image_mean) over LMDB or
LevelDB (``--backend``, lmdb by default as in Caffe's tools)."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from ..io.db.db import BACKENDS
from ..io.db.partial import partial_path
from ..io.formats.images import ENCODE_TYPES
from ..tools.convert import (
    ImagesetOptions,
    convert_cifar,
    convert_idx,
    convert_imageset,
    folder_list,
    terminal_progress,
)
from ..tools.dbinfo import db_info
from ..tools.mean import compute_mean

F = TypeVar("F", bound=Callable[..., Any])
_RESUME_HELP = "continue an interrupted conversion (DB.partial) after its last committed record"
backend_option = click.option(
    "--backend", type=click.Choice(BACKENDS), default="lmdb", show_default=True,
    help="the database kind (Caffe's tools default to lmdb; plyvel reads and writes leveldb)")



def image_list_options(command: F) -> F:
    """The options convert_imageset and convert_annoset share: what each image becomes."""
    options = [
        click.option("--gray", is_flag=True, help="store one gray channel instead of BGR"),
        click.option("--shuffle", is_flag=True, help="shuffle the list before writing"),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0,
                     show_default=True,
                     help="the shuffle's seed"),
        click.option("--resize-width", type=int, default=0, show_default=True,
                     help="resize every image to this width (with --resize-height)"),
        click.option("--resize-height", type=int, default=0, show_default=True,
                     help="resize every image to this height (with --resize-width)"),
        click.option("--check-size", is_flag=True,
                     help="require every image to have the same size"),
    ]
    for option in reversed(options):  # the decorators' order: --help lists them as written
        command = option(command)
    return command


class Stopped(Exception):
    """SIGTERM or SIGHUP during a conversion, raised where the writer is, as Ctrl-C's
    KeyboardInterrupt is: the writer keeps (or drops, if empty) DB.partial either way."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)


@contextmanager
def resumable(*dbs: str | Path) -> Iterator[None]:
    """Turn Ctrl-C, SIGTERM or SIGHUP during a conversion into one line that says how to
    continue it (without this, SIGTERM ended the process with no word, status 143)."""
    def stop(signum: int, _frame: Any) -> None:
        raise Stopped(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS} if main else {}
    try:
        yield
    except (KeyboardInterrupt, Stopped) as exc:
        how = f"stopped by {exc}" if isinstance(exc, Stopped) else "interrupted"
        left = [str(partial_path(db)) for db in dbs if partial_path(db).exists()]
        if left:
            raise click.ClickException(
                f"{how}: {', '.join(left)} keeps the records written so far; run the same "
                "command with --resume to continue it") from None
        raise click.ClickException(f"{how} before any record of {', '.join(map(str, dbs))} "
                                   "was written; nothing was kept") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@click.group("convert")
def convert_group() -> None:
    """Convert a dataset into an LMDB or LevelDB of Caffe Datum records (readable by Caffe
    too)."""


@convert_group.command("idx")
@click.argument("images", type=click.Path(dir_okay=False))
@click.argument("labels", type=click.Path(dir_okay=False))
@click.argument("db", type=click.Path())
@click.option("--resume", is_flag=True, help=_RESUME_HELP)
@backend_option
def convert_idx_command(images: str, labels: str, db: str, resume: bool, backend: str) -> None:
    """MNIST-format IMAGES and LABELS (IDX, gzipped or not) into DB, keys %08d."""
    with resumable(db):
        result = convert_idx(images, labels, db, resume=resume, progress=terminal_progress(),
                             backend=backend)
    click.echo(result.line())


@convert_group.command("imageset")
@click.argument("root", type=click.Path(file_okay=False))
@click.argument("paths", nargs=-1, metavar="[LISTFILE] DB", type=click.Path())
@click.option("--from-folders", is_flag=True,
              help="no LISTFILE: ROOT's sub-folders are the classes (torchvision ImageFolder's "
                   "rule: sorted names -> labels 0..K-1); writes labels.txt and DB_list.txt "
                   "beside DB")
@image_list_options
@click.option("--encoded", is_flag=True, help="store the image files (PNG/JPEG), not pixels")
@click.option("--encode-type", type=click.Choice(ENCODE_TYPES), default=None,
              help="with --encoded: re-encode to this format (default: keep each file's own)")
@click.option("--resume", is_flag=True, help=_RESUME_HELP)
@backend_option
def convert_imageset_command(root: str, paths: tuple[str, ...], from_folders: bool, gray: bool,
                             shuffle: bool, seed: int, resize_width: int, resize_height: int,
                             check_size: bool, encoded: bool, encode_type: str | None,
                             resume: bool, backend: str) -> None:
    """Images named in LISTFILE ('path label' lines, paths relative to ROOT) into DB, keys
    %08d_<path>, pixels in BGR order as Caffe's convert_imageset stores them; with
    --from-folders, the images of ROOT's class folders (ROOT/cat/1.jpg, ROOT/dog/2.jpg)."""
    if encode_type and not encoded:
        raise click.UsageError("--encode-type needs --encoded")
    if len(paths) != (1 if from_folders else 2):
        raise click.ClickException("give ROOT DB with --from-folders" if from_folders else
                                   "give ROOT LISTFILE DB (or ROOT DB with --from-folders)")
    db = paths[-1]
    options = ImagesetOptions(gray=gray, shuffle=shuffle, seed=seed, resize_width=resize_width,
                              resize_height=resize_height, check_size=check_size,
                              encoded=encoded, encode_type=encode_type or "")
    listfile = paths[0]
    if from_folders:
        options.check()  # before anything is written
        folders = folder_list(root, db)
        listfile = str(folders.list_file)
        click.echo(folders.line())
    with resumable(db):
        result = convert_imageset(root, listfile, db, options, resume=resume,
                                  progress=terminal_progress(), backend=backend)
    click.echo(result.line())


@convert_group.command("cifar")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("db_prefix", type=click.Path())
@click.option("--resume", is_flag=True,
              help=_RESUME_HELP + "; a database already complete is skipped")
@backend_option
def convert_cifar_command(directory: str, db_prefix: str, resume: bool, backend: str) -> None:
    """CIFAR-10 binary batches in DIRECTORY into DB_PREFIX_train_<backend> (data_batch_1..5.bin)
    and DB_PREFIX_test_<backend> (test_batch.bin), RGB as Caffe's converter stores them."""
    with resumable(f"{db_prefix}_train_{backend}", f"{db_prefix}_test_{backend}"):
        results = convert_cifar(directory, db_prefix, resume=resume,
                                progress=terminal_progress(), backend=backend)
    for result in results:
        click.echo(result.line())


@convert_group.command("annoset")
@click.argument("root", type=click.Path(file_okay=False))
@click.argument("listfile", type=click.Path(dir_okay=False))
@click.argument("db", type=click.Path())
@click.option("--label-map-file", required=True, type=click.Path(dir_okay=False),
              help="the LabelMap prototxt giving each class name its label")
@image_list_options
@click.option("--check-label", is_flag=True, help="refuse a label map naming a class twice")
@click.option("--encoded", is_flag=True, help="store the image files (PNG/JPEG), not pixels")
@click.option("--encode-type", type=click.Choice(ENCODE_TYPES), default=None,
              help="with --encoded: the format; a file already in it is stored as it is "
                   "(default: re-encode in the file's own format, as SSD's tool)")
@click.option("--resume", is_flag=True, help=_RESUME_HELP)
@backend_option
def convert_annoset_command(root: str, listfile: str, db: str, label_map_file: str,
                            gray: bool, shuffle: bool, seed: int, resize_width: int,
                            resize_height: int, check_size: bool, check_label: bool,
                            encoded: bool, encode_type: str | None, resume: bool,
                            backend: str) -> None:
    """Images and their Pascal-VOC XML annotations named in LISTFILE ('image annotation'
    lines, relative to ROOT) into DB of SSD's AnnotatedDatum records, keys %08d_<image>, as
    SSD's convert_annoset (create_annoset.py) writes them: readable by AnnotatedData layers
    here and in SSD's Caffe."""
    from ..tools.annoset import AnnosetOptions, convert_annoset

    if encode_type and not encoded:
        raise click.UsageError("--encode-type needs --encoded")
    options = AnnosetOptions(label_map_file=label_map_file, gray=gray, shuffle=shuffle,
                             seed=seed, resize_width=resize_width, resize_height=resize_height,
                             check_size=check_size, check_label=check_label, encoded=encoded,
                             encode_type=encode_type or "")
    with resumable(db):
        result = convert_annoset(root, listfile, db, options, resume=resume,
                                 progress=terminal_progress(), backend=backend)
    click.echo(result.line())


@convert_group.command("image-sizes")
@click.argument("root", type=click.Path(file_okay=False))
@click.argument("listfile", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
def image_sizes_command(root: str, listfile: str, out: str) -> None:
    """Write OUT: 'name height width' for each image of LISTFILE (relative to ROOT), the
    name_size_file of DetectionEvaluate and DetectionOutput's save_output_param (SSD's
    get_image_size)."""
    from ..tools.annoset import write_image_sizes

    click.echo(f"{out}: {write_image_sizes(root, listfile, out)} images")


@click.command("compute-mean")
@click.argument("db", type=click.Path())
@click.argument("out", type=click.Path(dir_okay=False))
@backend_option
def compute_mean_command(db: str, out: str, backend: str) -> None:
    """Write the mean image of DB to OUT (a Caffe .binaryproto, for transform_param.mean_file)
    and print the per-channel means."""
    for line in compute_mean(db, out, progress=terminal_progress(), backend=backend).lines():
        click.echo(line)


@click.command("db-info")
@click.argument("db", type=click.Path())
@backend_option
def db_info_command(db: str, backend: str) -> None:
    """Count, shape and label histogram of DB, after checking that every record decodes (for
    a database of SSD's AnnotatedDatum records: image sizes and boxes per label)."""
    from ..tools.annoset import annoset_info, is_annotated

    if is_annotated(db, backend):
        for line in annoset_info(db, progress=terminal_progress(), backend=backend):
            click.echo(line)
        return
    for line in db_info(db, progress=terminal_progress(), backend=backend).lines():
        click.echo(line)


COMMANDS = [convert_group, compute_mean_command, db_info_command]
