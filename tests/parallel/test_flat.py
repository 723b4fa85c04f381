"""Flat parameter/gradient buffers: views, layout, buckets, strides, rebinding."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from caffe_py.parallel.flat import FlatParams


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def test_params_become_views_and_keep_values():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    flat = FlatParams(list(model.parameters()))
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
        assert p.untyped_storage().data_ptr() == flat.data.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
    # reverse layout, 64-byte (16 float) alignment: the last bias comes first
    # conv.weight 108 -> 112, conv.bias 4 -> 16, fc.weight 720, fc.bias 5 -> 16
    assert flat.offsets == [752, 736, 16, 0]
    assert flat.numel == 864


def test_backward_accumulates_into_the_flat_grad():
    model = _model()
    flat = FlatParams(list(model.parameters()))
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    ref = _model()
    ref(x).sum().backward()
    for k, p in enumerate(ref.parameters()):
        assert torch.equal(flat.view(flat.grad, k), p.grad)
    assert flat.grad.abs().sum() > 0
    flat.grad.zero_()
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())


def test_writes_to_flat_data_reach_the_module():
    model = _model()
    flat = FlatParams(list(model.parameters()))
    flat.data.fill_(0.5)
    assert float(model[3].bias.detach()[0]) == 0.5
    assert float(model[0].weight.detach()[0, 0, 0, 0]) == 0.5


def test_buckets_cover_the_buffer_in_backward_order():
    model = _model()
    flat = FlatParams(list(model.parameters()), bucket_bytes=100 * 4)
    # linear weight (720) is one bucket, then the rest together reach 100 elements
    assert [(b.start, b.end, b.members) for b in flat.buckets] == [
        (0, 736, (3, 2)), (736, 864, (1, 0))]
    assert flat.bucket_of == [1, 1, 0, 0]
    assert sum(b.numel for b in flat.buckets) == flat.numel


def test_channels_last_weights_keep_their_strides():
    model = _model().to(memory_format=torch.channels_last)
    w = model[0].weight
    strides = w.stride()
    FlatParams(list(model.parameters()))
    assert w.stride() == strides and w.is_contiguous(memory_format=torch.channels_last)


def test_rebind_after_grad_set_to_none():
    model = _model()
    flat = FlatParams(list(model.parameters()))
    for p in model.parameters():
        p.grad = None
    x = torch.ones(1, 3, 8, 8)
    model(x).sum().backward()
    assert flat.grad.abs().sum() == 0
    assert flat.rebind_grads() == 4
    assert torch.equal(flat.view(flat.grad, 3), model[3].bias.grad)
    assert flat.rebind_grads() == 0 and float(flat.grad[0]) == 1.0


def test_state_buffers_without_grad_and_mixed_dtypes():
    bn = nn.BatchNorm2d(3)
    flat = FlatParams([bn.running_mean, bn.running_var], with_grad=False)
    assert flat.grad is None
    flat.data.fill_(2.0)
    assert float(bn.running_var[1]) == 2.0
    with pytest.raises(ValueError, match="tensor 1 is torch.float64 on cpu"):
        FlatParams([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def test_rebind_is_an_identity_check_when_nothing_moved():
    model = _model()
    flat = FlatParams(list(model.parameters()))
    views = [p.grad for p in model.parameters()]
    model(torch.ones(1, 3, 8, 8)).sum().backward()
    torch._foreach_zero_([p.grad for p in model.parameters()])
    assert flat.rebind_grads() == 0
    assert all(p.grad is v for p, v in zip(model.parameters(), views, strict=True))
    # a new view object over the same window is rebound but is not a move
    model[3].bias.grad = flat.view(flat.grad, 3)
    assert flat.rebind_grads() == 0 and model[3].bias.grad is views[3]
    # a gradient replaced by a tensor elsewhere is copied in and counted
    model[3].bias.grad = torch.full((5,), 2.0)
    assert flat.rebind_grads() == 1 and model[3].bias.grad is views[3]
    assert torch.equal(flat.view(flat.grad, 3), torch.full((5,), 2.0))


def test_bucket_sizes_for_a_resnet50_sized_gradient():
    # ResNet-50's 161 learnable blobs in float32 (~102 MB): the default 25 MB buckets give
    # few, large copies (at most 5), each bucket >= 25 MB except the last, in layout order
    from caffe_py.parallel.flat import DEFAULT_BUCKET_BYTES

    shapes = [(64, 3, 7, 7), (64,), (64,)] + [(512, 512, 3, 3), (512,), (512,)] * 8 \
        + [(2048, 512, 1, 1), (2048,), (2048,)] * 3 + [(1000, 2048), (1000,)]
    flat = FlatParams([torch.zeros(s) for s in shapes], with_grad=False)
    assert 95e6 < flat.numel * 4 < 105e6
    sizes = [b.numel * 4 for b in flat.buckets]
    assert DEFAULT_BUCKET_BYTES == 25 * 2**20
    assert len(sizes) == 4
    assert flat.buckets[0].members[:2] == (len(shapes) - 1, len(shapes) - 2)   # fc first
    assert all(s >= DEFAULT_BUCKET_BYTES for s in sizes[:-1])
    assert [b.start for b in flat.buckets[1:]] == [b.end for b in flat.buckets[:-1]]
    assert flat.buckets[-1].end == flat.numel


def _lenet_params():
    # LeNet's learnable blobs: conv1, conv2, ip1, ip2 (weight, bias each)
    shapes = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]
    return [torch.zeros(s) for s in shapes]


def test_a_small_gradient_is_reduced_in_parts_its_last_layers_first():
    # LeNet's 1.7 MB is smaller than 4 x 25 MB: buckets of a quarter of it, cut at tensors.
    # Layout (elements, 16-aligned): ip2.b 16, ip2.w 5008, ip1.b 512, ip1.w 400000 | conv2.b
    # 64, conv2.w 25008, conv1.b 32, conv1.w 512: the InnerProducts, then the Convolutions
    from caffe_py.parallel.flat import plan_reduction

    flat = FlatParams(_lenet_params())
    assert flat.numel == 431152
    plan = plan_reduction(flat)
    assert [(b.index, b.start, b.end, b.members) for b in plan] == [
        (0, 0, 405536, (7, 6, 5, 4)), (1, 405536, 431152, (3, 2, 1, 0))]
    assert [(b.start, b.end) for b in flat.buckets] == [(0, 431152)]   # the weights' units
    # buckets smaller than a part: the bucket size rules (conv2 reaches 20,000 elements)
    assert [(b.start, b.end) for b in plan_reduction(flat, bucket_bytes=20_000 * 4)] == [
        (0, 405536), (405536, 430608), (430608, 431152)]
    # one part: the whole buffer after backward
    assert [(b.start, b.end) for b in plan_reduction(flat, parts=1)] == [(0, 431152)]
    assert plan_reduction(FlatParams([])) == []


def test_a_resnet50_sized_gradient_is_reduced_in_25_mb_buckets():
    from caffe_py.parallel.flat import DEFAULT_BUCKET_BYTES, plan_reduction

    shapes = [(64, 3, 7, 7), (64,), (64,)] + [(512, 512, 3, 3), (512,), (512,)] * 8 \
        + [(2048, 512, 1, 1), (2048,), (2048,)] * 3 + [(1000, 2048), (1000,)] * 4
    flat = FlatParams([torch.zeros(s) for s in shapes], with_grad=False)
    assert flat.numel * 4 > 4 * DEFAULT_BUCKET_BYTES
    plan = plan_reduction(flat)
    assert [(b.start, b.end) for b in plan] == [(b.start, b.end) for b in flat.buckets]
    assert [b.end for b in plan] == [8196032, 16074688, 23155648, 30236608, 30246144]


def _resnet50_params():
    """ResNet-50's learnable blobs as the generated config has them: each Convolution's weight
    (no bias), each Scale's two, the InnerProduct's two."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out = 4 * width
            if b == 0:
                shapes += [(out, cin, 1, 1), (out,), (out,)]
            shapes += [(width, cin, 1, 1), (width,), (width,), (width, width, 3, 3), (width,),
                       (width,), (out, width, 1, 1), (out,), (out,)]
            cin = out
    shapes += [(1000, 2048), (1000,)]
    return [torch.zeros(s) for s in shapes]


def test_resnet50s_own_gradient_is_reduced_in_four_buckets():
    # the generated config's 161 blobs (102 MB): from fc1000 back, 26.0, 31.5 and 27.3 MB, and
    # conv1 to res4c's 17.3 MB last, reduced after backward (a limit of 1 MiB on that last
    # bucket, res2 and conv1 alone, measured the same step on 2 x H200: docs/parallel.md)
    from caffe_py.parallel.flat import plan_reduction

    flat = FlatParams(_resnet50_params(), with_grad=False)
    assert len(flat.tensors) == 161 and flat.numel * 4 == 102228160
    plan = plan_reduction(flat)
    assert [b.numel * 4 for b in plan] == [26046400, 31502336, 27330560, 17348864]
    assert plan[0].members[:2] == (160, 159) and plan[-1].members[-1] == 0
    assert [b.start for b in plan[1:]] == [b.end for b in plan[:-1]]
