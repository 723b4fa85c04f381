"""`cpy train`, `cpy test`, `cpy time`, `cpy device-query`: Caffe's tools/caffe.cpp actions.

Thin: parse and check the flags, then call the library (caffe_py.train for training). Every
user error is a CaffePyError, which the CLI group prints as one line with exit status 1. The
library is imported when a command runs, so `--help` stays fast.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from ..options import COMPILES, DEFAULT_DIST_TIMEOUT_S, DIST_BACKENDS, GRAPHS, REDUCTIONS
from ..solver.signals import EFFECTS
from ..spec.solver_spec import PRECISIONS
from .output import console_handler, log_options, terminal_progress

if TYPE_CHECKING:
    import torch

    from ..net import Net

log = logging.getLogger("caffe_py.commands")

FILE = click.Path(dir_okay=False)  # a file name (the shell completes it); checked on use
GPUS_HELP = "devices: cpu, cpu:N (N CPU replicas), 0 or 0,1,2,3 (CUDA ids), or all"


def net_state_options(phase: str | None = None) -> Any:
    """Caffe's -phase (with ``phase``: its default), -level and -stage: the state the net is
    built in (include/exclude rules)."""
    def decorate(command: Any) -> Any:
        command = click.option(
            "--stage", "stages", multiple=True, metavar="S[,S2]",
            help="a stage the net is in (Caffe's -stage a,b; repeatable)")(command)
        command = click.option("--level", type=int, default=None,
                               help="the net's level (Caffe's -level)")(command)
        if phase is not None:
            command = click.option(
                "--phase", type=click.Choice(["TRAIN", "TEST"]), default=phase,
                show_default=True, help="the phase the net is built for")(command)
        return command
    return decorate


def split_stages(stages: Sequence[str]) -> list[str]:
    """``('a,b', 'c')`` -> ``['a', 'b', 'c']`` (Caffe's -stage is one comma list)."""
    return [s for group in stages for s in group.split(",") if s]


def set_option(command: Any) -> Any:
    """--set KEY=VALUE, repeatable: solver fields by name, net fields as net.LAYER.FIELD."""
    return click.option(
        "--set", "sets", multiple=True, metavar="KEY=VALUE",
        help="override a solver field (base_lr=0.05) or a net field by layer name "
             "(net.conv1.convolution_param.num_output=32); repeatable")(command)


@click.command("train")
@log_options
@set_option
@click.option("--solver", "solver_file", required=True, type=FILE, metavar="S.yaml",
              help="the solver spec (SolverParameter fields)")
@click.option("--gpus", default=None, metavar="LIST", help=GPUS_HELP)
@click.option("--weights", default=None, type=FILE, metavar="W[,W2]",
              help="weights files to fine-tune from, copied by layer name in order")
@click.option("--snapshot", default=None, type=FILE, metavar="STATE",
              help="a <prefix>_iter_<N>.solverstate.pt file to resume from, or 'latest': the "
                   "newest state of the solver's snapshot_prefix that loads")
@click.option("--tensorboard", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="also write the metrics as TensorBoard scalars into DIR")
@click.option("--overwrite", is_flag=True,
              help="start a new run over a snapshot_prefix that already has snapshots")
@click.option("--sigint-effect", type=click.Choice(EFFECTS), default="stop", show_default=True,
              help="what Ctrl-C does (after the current iteration)")
@click.option("--sighup-effect", type=click.Choice(EFFECTS), default="snapshot",
              show_default=True, help="what SIGHUP does (after the current iteration)")
@click.option("--sigterm-effect", type=click.Choice(EFFECTS), default="snapshot-stop",
              show_default=True,
              help="what SIGTERM (preemption) does (after the current iteration)")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="override the solver's precision")
@click.option("--reduction", type=click.Choice(REDUCTIONS), default="auto",
              show_default=True,
              help="multi-device gradient reduction: tree (Caffe's P2PSync), nccl, or auto "
                   "(GPUs with graphs: whole iterations captured with NCCL's all-reduce; "
                   "else the tree)")
@click.option("--graphs", type=click.Choice(GRAPHS), default=None,
              help="CUDA graphs: auto (the default: capture whenever the net allows it), on "
                   "(an error when it does not), off (eager)")
@click.option("--cuda-graphs/--no-cuda-graphs", "cuda_graphs", default=None, hidden=True,
              help="the older spelling of --graphs on / --graphs off")
@click.option("--deterministic", is_flag=True,
              help="bit-identical runs on GPUs too (deterministic cuDNN and kernels; slower), "
                   "and on a busy CPU (the thread count does not follow the load)")
@click.option("--compile", "compile_net", type=click.Choice(COMPILES), default="auto",
              is_flag=False, flag_value="on", show_default=True,
              help="torch.compile the net: on (--compile alone: before the first iteration), "
                   "off, or auto (on one GPU, when the measured step says the run has more "
                   "than half an hour left)")
@click.option("--dist-backend", type=click.Choice(DIST_BACKENDS), default=None,
              help="between hosts, when WORLD_SIZE > 1 (default: nccl on GPUs, gloo on CPU)")
@click.option("--dist-timeout", type=click.FloatRange(min=1), default=DEFAULT_DIST_TIMEOUT_S,
              show_default=True, metavar="S",
              help="between hosts: seconds any wait for another host may take")
@net_state_options()
def train_command(solver_file: str, gpus: str | None, weights: str | None,
                  snapshot: str | None, sigint_effect: str, sighup_effect: str,
                  sigterm_effect: str,
                  precision: str | None, reduction: str, graphs: str | None,
                  cuda_graphs: bool | None, deterministic: bool, compile_net: str,
                  sets: tuple[str, ...], overwrite: bool, tensorboard: str | None,
                  dist_backend: str | None, dist_timeout: float, level: int | None,
                  stages: tuple[str, ...]) -> None:
    """Train the net of a solver spec (Caffe's `caffe train`)."""
    if cuda_graphs is not None:
        older = "on" if cuda_graphs else "off"
        if graphs not in (None, older):
            raise click.UsageError(f"--graphs {graphs} and --{'' if cuda_graphs else 'no-'}"
                                   "cuda-graphs disagree; give --graphs alone")
        graphs = older
    from ..options import TrainOptions
    from ..train import train

    options = TrainOptions(weights=[w for w in (weights or "").split(",") if w],
                           snapshot=snapshot, overwrite=overwrite, sigint_effect=sigint_effect,
                           sighup_effect=sighup_effect, sigterm_effect=sigterm_effect,
                           precision=precision, reduction=reduction, graphs=graphs or "auto",
                           deterministic=deterministic, compile=compile_net,
                           dist_backend=dist_backend, dist_timeout=dist_timeout,
                           tensorboard=tensorboard, progress=terminal_progress())
    state = [f"train_state.level={level}"] if level is not None else []
    if stages:  # Caffe's -level/-stage: the TRAIN net's state
        state.append(f"train_state.stage={json.dumps(split_stages(stages))}")
    train(solver_file, gpus, options, sets=[*sets, *state])


@click.command("test")
@log_options
@set_option
@click.option("--model", required=True, type=FILE, metavar="NET.yaml",
              help="the net spec (TEST phase)")
@click.option("--weights", required=True, type=FILE, metavar="W", help="the trained weights")
@click.option("--iterations", type=click.IntRange(min=1), default=50, show_default=True,
              help="batches to run")
@click.option("--gpus", default=None, metavar="LIST", help=f"{GPUS_HELP} (the first is used)")
@click.option("--json", "as_json", is_flag=True,
              help="print one JSON object {output: mean} on stdout (logs go to stderr)")
@click.option("--ap-version", type=click.Choice(["11point", "MaxIntegral", "Integral"]),
              default="Integral", show_default=True,
              help="a detection net (DetectionEvaluate outputs): how its mAP is computed")
@click.option("--per-class", is_flag=True, help="a detection net: also print each class's AP")
@net_state_options(phase="TEST")
def test_command(model: str, weights: str, iterations: int, gpus: str | None,
                 as_json: bool, ap_version: str, per_class: bool, sets: tuple[str, ...],
                 phase: str, level: int | None, stages: tuple[str, ...]) -> None:
    """Score a trained net: each batch's outputs, then their means (Caffe's `caffe test`); a
    detection net's DetectionEvaluate outputs give their mAP over the batches instead."""
    from ..devices import parse_devices, prepare_host
    from ..errors import SolverError
    from ..solver import evaluate
    from ..solver.snapshot import load_weights
    from ..solver.solver import memory_format_for

    if as_json:  # stdout carries the JSON object alone
        handler = console_handler()
        if handler is not None:
            handler.err = True
    device = parse_devices(gpus, solver_mode="CPU")[0]
    prepare_host([device])
    log.info(f"Using {device}")
    net = _net(model, phase, device, sets, level=level, stages=split_stages(stages))
    # as training lays it out (Module.to takes memory_format; its stubs do not say so)
    net.to(memory_format=memory_format_for("AUTO", device, net))  # type: ignore[call-overload]
    net.copy_from(load_weights(weights), source=weights)

    def on_batch(i: int, values: dict[str, torch.Tensor], loss: float) -> None:
        for name, value in values.items():
            for v in value.tolist():
                log.info(f"Batch {i}, {name} = {v:g}")

    from ..solver.detection_eval import is_detection_net, run_detection_batches

    with evaluate.fed(net):
        if is_detection_net(net):
            means = run_detection_batches(net, iterations, ap_version, per_class=per_class)
        else:
            means = evaluate.run_batches(net, iterations, on_batch=on_batch)
    if means is None:  # only a stop between batches ends it early; none is asked for here
        raise SolverError(f"{model}: testing stopped before its first batch")
    log.info(f"Loss: {float(means['__loss__']):g}")
    outputs = evaluate.output_means(means)
    for name, value in outputs.items():
        weight = net.loss_weights.get(name, 0.0)
        for v in value.tolist():
            extra = f" (* {weight:g} = {weight * v:g} loss)" if weight else ""
            log.info(f"{name} = {v:g}{extra}")
    if as_json:
        result = {name: (v.item() if v.numel() == 1 else v.tolist())
                  for name, v in outputs.items()}
        click.echo(json.dumps(result))


@click.command("time")
@log_options
@set_option
@click.option("--model", required=True, type=FILE, metavar="NET.yaml",
              help="the net spec (TRAIN phase)")
@click.option("--iterations", type=click.IntRange(min=1), default=50, show_default=True,
              help="forward-backward passes to time")
@click.option("--gpus", default=None, metavar="LIST", help=f"{GPUS_HELP} (the first is used)")
@click.option("--weights", default=None, type=FILE, metavar="W",
              help="weights to time the net with, copied by layer name (default: the fillers')")
@net_state_options(phase="TRAIN")
def time_command(model: str, iterations: int, gpus: str | None, weights: str | None,
                 sets: tuple[str, ...], phase: str, level: int | None,
                 stages: tuple[str, ...]) -> None:
    """Time each layer's forward and backward (Caffe's `caffe time`)."""
    from ..devices import parse_devices, prepare_host
    from ..net import Net
    from ..solver import evaluate
    from ..solver.snapshot import load_weights
    from ..solver.solver import memory_format_for
    from ..spec.overrides import load_net_with_overrides

    device = parse_devices(gpus, solver_mode="CPU")[0]
    prepare_host([device])
    log.info(f"Using {device}")
    net = Net(load_net_with_overrides(model, sets), phase, device=device, level=level,
              stages=split_stages(stages))
    if weights:
        net.copy_from(load_weights(weights), source=weights)
    # what training times (Module.to takes memory_format; its stubs do not say so)
    net.to(memory_format=memory_format_for("AUTO", device, net))  # type: ignore[call-overload]
    inputs = evaluate.random_inputs(net)
    with evaluate.fed(net):
        log.info("Performing Forward")
        loss = net(inputs).loss
        log.info(f"Initial loss: {float(loss.detach()):g}")
        log.info("Performing Backward")
        if loss.requires_grad:
            loss.backward()
        log.info("*** Benchmark begins ***")
        log.info(f"Testing for {iterations} iterations.")
        times = evaluate.time_layers(net, iterations, inputs)
    for line in evaluate.time_report(net, times, iterations):
        log.info(line)
    log.info("*** Benchmark ends ***")


@click.command("device-query")
@click.option("--gpus", default=None, metavar="LIST",
              help="the CUDA ids to describe (Caffe's -gpu 0 or -gpu all)  [default: all]")
def device_query_command(gpus: str | None) -> None:
    """List the CUDA devices: name, memory, capability and peer access."""
    import torch

    from ..devices import parse_devices

    if gpus is not None and gpus.strip().lower().startswith("cpu"):
        raise click.BadParameter(f"'{gpus}': device-query describes CUDA devices; give their "
                                 "ids (0 or 0,1) or all", param_hint="--gpus")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        if gpus is not None:
            parse_devices(gpus)  # ids without CUDA: the one-line error
        click.echo(f"No CUDA device is available: caffe-py runs on the CPU "
                   f"({os.cpu_count()} cores, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads).")
        return
    n = torch.cuda.device_count()
    ids = list(range(n)) if gpus is None else [int(d.index or 0) for d in parse_devices(gpus)]
    for i in ids:
        props = torch.cuda.get_device_properties(i)
        click.echo(f"Device id:                     {i}")
        click.echo(f"Name:                          {props.name}")
        click.echo(f"Total global memory:           {props.total_memory / 2**30:.2f} GiB")
        click.echo(f"Major revision number:         {props.major}")
        click.echo(f"Minor revision number:         {props.minor}")
        click.echo(f"Number of multiprocessors:     {props.multi_processor_count}")
    if n > 1 and gpus is None:
        click.echo("Peer access (row can access column):")
        click.echo("      " + " ".join(f"{j:>4}" for j in range(n)))
        for i in range(n):
            row = ["   -" if i == j else
                   f"{'yes' if torch.cuda.can_device_access_peer(i, j) else 'no':>4}"
                   for j in range(n)]
            click.echo(f"{i:>4}  " + " ".join(row))


def _net(model: str, phase: str, device: torch.device, sets: Sequence[str] = (), *,
         level: int | None = None, stages: Sequence[str] = ()) -> Net:
    from ..errors import SolverError
    from ..net import Net
    from ..spec.overrides import load_net_with_overrides

    net = Net(load_net_with_overrides(model, sets), phase, device=device, level=level,
              stages=stages)
    inputs = [layer.name for layer in net.layers if layer.spec.type == "Input"]
    if inputs:
        raise SolverError(f"{model}: the {phase} net has Input layer '{inputs[0]}', which "
                          "cpy test cannot feed; score a net that reads its data (Data layer)")
    return net


COMMANDS = [train_command, test_command, time_command, device_query_command]
