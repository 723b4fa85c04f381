"""Faster R-CNN's and R-FCN's end-to-end nets with their repositories' own Python layers (lib/,
made importable by tools/oracles/fast_rcnn/prepare_lib.sh): the test nets' forward proposes
regions and scores them, and Faster R-CNN's training net reads a roidb through RoIDataLayer,
assigns anchors and proposals, and gives finite losses that reach its first convolution.

The suite cannot fetch the libs: these tests run when CPY_RCNN_LIB names a prepared
py-faster-rcnn lib/ (CPY_RFCN_LIB: py-R-FCN's), its Python needs beside it in ../.deps, and the
corpus files are collected (tests/fixtures/prototxts/collect.py); otherwise they skip. The
nets' building alone is in the corpus test, with stand-in layers.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from caffe_py.net import Net
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.to_yaml import import_file

EXTERNAL = Path(__file__).resolve().parents[1] / "fixtures" / "prototxts" / "external"
LIB = os.environ.get("CPY_RCNN_LIB")
NETS = EXTERNAL / "rbgirshick" / "py-faster-rcnn" / "models" / "pascal_voc" / "ZF" / \
    "faster_rcnn_end2end"
RFCN_LIB = os.environ.get("CPY_RFCN_LIB")
RFCN_NETS = EXTERNAL / "YuwenXiong" / "py-R-FCN" / "models" / "pascal_voc" / "ResNet-50" / \
    "rfcn_end2end"


def needs(lib: str | None, nets: Path, variable: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not lib or not nets.is_dir(),
        reason=f"needs {variable} (tools/oracles/fast_rcnn/prepare_lib.sh) and the collected "
               "corpus (tests/fixtures/prototxts/collect.py)")


def put_on_path(monkeypatch, lib: str) -> None:
    monkeypatch.syspath_prepend(str(Path(lib).parent / ".deps"))
    monkeypatch.syspath_prepend(lib)


def forget_lib() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in ("fast_rcnn", "rpn", "roi_data_layer", "utils", "nms"):
            sys.modules.pop(name, None)


@pytest.fixture
def lib(monkeypatch):
    """py-faster-rcnn's lib on sys.path, configured for CPU end-to-end training."""
    put_on_path(monkeypatch, LIB)
    from fast_rcnn.config import cfg

    saved = {k: cfg[k] for k in ("USE_GPU_NMS",)}
    train = dict(cfg.TRAIN)
    cfg.USE_GPU_NMS = False
    cfg.TRAIN.update(HAS_RPN=True, IMS_PER_BATCH=1, BBOX_NORMALIZE_TARGETS_PRECOMPUTED=True,
                     RPN_POSITIVE_OVERLAP=0.7, RPN_BATCHSIZE=256, PROPOSAL_METHOD="gt",
                     BG_THRESH_LO=0.0, SCALES=(224,), MAX_SIZE=320)
    yield cfg
    cfg.update(saved)
    cfg.TRAIN.clear()
    cfg.TRAIN.update(train)
    forget_lib()


@pytest.fixture
def rfcn_lib(monkeypatch):
    """py-R-FCN's lib on sys.path, NMS on the CPU."""
    put_on_path(monkeypatch, RFCN_LIB)
    from fast_rcnn.config import cfg

    cfg.USE_GPU_NMS = False
    yield cfg
    cfg.USE_GPU_NMS = True
    forget_lib()


def build(nets: Path, name: str, phase: str, tmp: Path) -> Net:
    import_file(nets / name, tmp / "net.yaml", root=nets)
    return Net(load_net(tmp / "net.yaml"), phase)


@needs(LIB, NETS, "CPY_RCNN_LIB")
def test_the_test_net_proposes_and_scores_regions(lib, tmp_path):
    net = build(NETS, "test.prototxt", "TEST", tmp_path)
    image = torch.randn(1, 3, 224, 288, generator=torch.Generator().manual_seed(0)) * 40
    out = net({"data": image, "im_info": torch.tensor([[224.0, 288.0, 1.0]])})
    probs, boxes = out.outputs["cls_prob"], out.outputs["bbox_pred"]
    assert probs.shape[1] == 21 and boxes.shape == (probs.shape[0], 84)
    assert probs.shape[0] >= 1  # the proposal layer's regions, one score row each
    np.testing.assert_allclose(probs.sum(1).detach().numpy(), 1, rtol=1e-5)


@needs(LIB, NETS, "CPY_RCNN_LIB")
def test_the_training_net_reads_a_roidb_and_gives_its_losses(lib, tmp_path):
    import cv2

    image = (np.random.default_rng(1).random((200, 260, 3)) * 255).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    entry = {"image": str(tmp_path / "a.png"), "width": 260, "height": 200, "flipped": False,
             "boxes": np.array([[20, 30, 120, 150], [130, 40, 250, 190]], np.uint16),
             "gt_classes": np.array([3, 7], np.int32),
             "gt_overlaps": np.zeros((2, 21), np.float32),
             "max_classes": np.array([3, 7]), "max_overlaps": np.ones(2, np.float32)}
    roidb = [entry, dict(entry, flipped=True)]  # (it groups images two by two)
    net = build(NETS, "train.prototxt", "TRAIN", tmp_path)
    data = next(layer for layer in net.layers if layer.spec.type == "Python")
    data.impl.obj.set_roidb(roidb)
    torch.manual_seed(0)
    with torch.no_grad():  # its convolutions have no fillers (ImageNet weights are loaded)
        for name, weights in net.named_parameters():
            weights.normal_(0, 0.01) if name.endswith("weight") else weights.zero_()
    out = net()
    losses = {k: float(v.detach()) for k, v in out.outputs.items()}
    assert set(losses) == {"cls_loss", "bbox_loss", "rpn_cls_loss", "rpn_loss_bbox"}
    assert all(np.isfinite(v) and v >= 0 for v in losses.values())
    out.loss.backward()
    conv1 = next(layer for layer in net.layers if layer.name == "conv1")
    assert float(conv1.weight.grad.abs().sum()) > 0


@needs(RFCN_LIB, RFCN_NETS, "CPY_RFCN_LIB")
def test_rfcn_scores_its_proposals_through_position_sensitive_pooling(rfcn_lib, tmp_path):
    net = build(RFCN_NETS, "test_agnostic.prototxt", "TEST", tmp_path)
    torch.manual_seed(0)
    with torch.no_grad():  # deploy weights are trained ones; small random ones here
        for name, weights in net.named_parameters():
            weights.normal_(0, 0.01) if name.endswith("weight") else weights.zero_()
    image = torch.randn(1, 3, 160, 224, generator=torch.Generator().manual_seed(0)) * 40
    out = net({"data": image, "im_info": torch.tensor([[160.0, 224.0, 1.0]])})
    probs, boxes = out.outputs["cls_prob"], out.outputs["bbox_pred"]
    assert probs.shape[1] == 21 and boxes.shape[:2] == (probs.shape[0], 8)  # class-agnostic
    assert probs.shape[0] >= 1
    np.testing.assert_allclose(probs.detach().reshape(probs.shape[0], -1).sum(1).numpy(), 1,
                               rtol=1e-5)
