"""The PyTorch baselines for benchmarks/multigpu.py: the same caffe-py Net, driven by plain loops.

    # one GPU, a minimal loop: forward, backward, torch.optim.SGD step
    python benchmarks/ddp_baseline.py --solver configs/resnet50_dummy.yaml --plain
    # DistributedDataParallel on 4 GPUs (keep NCCL_NVLS_ENABLE=0 in the environment)
    torchrun --nproc_per_node 4 benchmarks/ddp_baseline.py --solver configs/resnet50_dummy.yaml
    # torchvision's resnet50 on one GPU, same batch/precision/format (a reference row)
    python benchmarks/ddp_baseline.py --solver configs/resnet50_dummy.yaml --plain --torchvision
    # DDP fed by the usual DataLoader (16 worker processes per GPU) from the Data layer's LMDB
    torchrun --nproc_per_node 4 benchmarks/ddp_baseline.py --solver S.yaml --peer-workers 16

The model is the TRAIN net of the solver spec, built by caffe_py.net.Net on each GPU (same
layers, same per-GPU batch), under the solver's precision (BF16: bfloat16 autocast, float32
weights and update) and, with --channels-last, in channels_last memory format. Rank 0 prints one
JSON line: {"kind", "model", "run", "gpus", "batch", "images_per_s", "step_ms"}.

With --peer-workers K the net's Data layer reads from benchmarks/imagenet_peer.py's DataLoader
instead of caffe-py's feed: K worker processes per GPU over the layer's own LMDB, its crop,
mirror and mean_file's channel means (what benchmarks/imagenet_data.py calls the peer).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from caffe_py.net import Net
from caffe_py.spec.solver_spec import SolverParameter, load_solver


class LossOf(nn.Module):
    """The net's weighted loss as the only output (what DDP and the plain loop need).

    ``forward`` takes the net's input dict (empty: the net reads DummyData), so DDP, which
    indexes its positional inputs, gets one argument.
    """

    def __init__(self, net: Net):
        super().__init__()
        self.net = net

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(inputs).loss


class TorchvisionLoss(nn.Module):
    """torchvision's resnet50 on a fixed batch (constant images, labels 0) with softmax loss:
    a reference for the caffe-py Net's own 1-GPU speed, same batch and precision."""

    def __init__(self, batch: int, device: torch.device, *, channels_last: bool):
        super().__init__()
        import torchvision

        self.model = torchvision.models.resnet50().to(device)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.model = self.model.to(memory_format=fmt)
        self.images = torch.full((batch, 3, 224, 224), 0.5, device=device).contiguous(
            memory_format=fmt)
        self.labels = torch.zeros(batch, dtype=torch.long, device=device)
        self.batch = batch

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(self.images), self.labels)


def build_net(param: SolverParameter, device: torch.device, *, channels_last: bool,
              seed: int = 1) -> Net:
    """The solver's TRAIN net on ``device``, optionally in channels_last format."""
    spec, state = param.train_net_spec()
    net = Net(spec, "TRAIN", stages=state.stage, level=state.level, device=device, seed=seed)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    return net


def batch_size(net: Net) -> int:
    """The per-GPU batch: the first axis of the first data layer's first top."""
    first = net.layers[0]
    return int(first.top_shapes[0][0])


@contextmanager
def peer_fed(net: Net, workers: int, device: torch.device) -> Iterator[None]:
    """The net's Data layer fed by the DataLoader peer over its own source and transform."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from imagenet_peer import channel_means, peer_feed

    from caffe_py.io import swap_feed

    layer = net.data_layers()[0]
    source = layer.param("data_param").source
    transform = layer.param("transform_param")
    with peer_feed(Path(source), transform.crop_size, batch_size(net),
                   channel_means(transform.mean_file), device, workers) as feed:
        swap_feed(layer, feed)
        yield


def autocast(param: SolverParameter, device: torch.device):
    if param.precision == "BF16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def sgd(param: SolverParameter, module: nn.Module) -> torch.optim.SGD:
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.optim.SGD(params, lr=param.base_lr or 0.01, momentum=param.momentum,
                           weight_decay=param.weight_decay)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(model: nn.Module, opt: torch.optim.Optimizer, param: SolverParameter,
               device: torch.device, warmup: int, iters: int, sync=lambda: None) -> float:
    """Seconds for ``iters`` steps after ``warmup`` steps (GPU work included)."""
    start = 0.0
    for it in range(warmup + iters):
        if it == warmup:
            synchronize(device)
            sync()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(param, device):
            loss = model({})
        loss.backward()
        opt.step()
    synchronize(device)
    sync()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--solver", required=True, help="solver spec (its TRAIN net is the model)")
    ap.add_argument("--plain", action="store_true", help="one GPU, no DDP")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--torchvision", action="store_true",
                    help="torchvision's resnet50 at the solver net's batch (one GPU with "
                         "--plain, else under DDP)")
    ap.add_argument("--json", type=Path, help="also append the result line to this file")
    ap.add_argument("--cpu", action="store_true", help="smoke test on CPU (gloo for DDP)")
    ap.add_argument("--peer-workers", type=int, default=0,
                    help="feed the net's Data layer by a DataLoader with this many worker "
                         "processes per GPU (the usual PyTorch way) instead of caffe-py's feed")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    param = load_solver(args.solver)
    if args.plain:
        world, rank = 1, 0
        device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
        net = build_net(param, device, channels_last=args.channels_last)
        model = LossOf(net)
        name = "pytorch 1-GPU loop"
        if args.torchvision:
            model = TorchvisionLoss(batch_size(net), device, channels_last=args.channels_last)
            name = "torchvision resnet50, pytorch 1-GPU loop (reference, not the caffe-py net)"
        fed = peer_fed(net, args.peer_workers, device) if args.peer_workers else nullcontext()
        with fed:
            seconds = timed_loop(model, sgd(param, model), param, device, args.warmup,
                                 args.iters)
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo" if args.cpu else "nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.cpu:
            device = torch.device("cpu")
        else:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
            torch.cuda.set_device(device)
        net = build_net(param, device, channels_last=args.channels_last)
        module: nn.Module = LossOf(net)
        if args.torchvision:
            module = TorchvisionLoss(batch_size(net), device, channels_last=args.channels_last)
        model = DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
                    gradient_as_bucket_view=True)
        fed = (peer_fed(net, args.peer_workers, device) if args.peer_workers
               else nullcontext())
        with fed:
            seconds = timed_loop(model, sgd(param, model), param, device, args.warmup,
                                 args.iters, sync=dist.barrier)
        name = (f"torchrun DDP x{world}" + (", torchvision resnet50" if args.torchvision else "")
                + (f", DataLoader ({args.peer_workers} workers per GPU)" if args.peer_workers
                   else ""))
    batch = batch_size(net)
    if rank == 0:
        line = json.dumps({"kind": "throughput", "model": net.name, "run": name,
                           "gpus": world, "batch": batch,
                           "images_per_s": round(args.iters * batch * world / seconds, 1),
                           "step_ms": round(1000 * seconds / args.iters, 2)})
        print(line, flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(line + "\n")
    if not args.plain:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
