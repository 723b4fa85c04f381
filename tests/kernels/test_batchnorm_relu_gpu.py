"""The BatchNorm kernels (csrc/batchnorm.cu: batch statistics, the folded Scale, a residual
sum and the ReLU) against a float64 oracle, and a net on them against the same net on
PyTorch's batch_norm.

The oracle takes the kernel's inputs in float64: batch mean and biased variance, y =
relu_p(xhat * gamma + beta), and BatchNorm's backward with the ReLU's mask. The mask is the
kernel's own (y > 0 for a slope >= 0): an element whose pre-activation is within float32
rounding of 0 may fall on either side, and the backward must follow the forward's choice, which
the kernels guarantee by recomputing it with the same arithmetic. Shapes cover the vector path
(C a multiple of the 16-byte pack), the scalar path (C = 21), (N, C) matrices, one block row
and many, and a batch too large for one wave. Skipped without CUDA; run with `pytest -m gpu`.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from caffe_py.kernels import build, functions
from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

EPS, MAF = 1e-5, 0.999
# (shape, dtype): channels_last 4-D unless the shape has 2 axes
CASES = [((8, 64, 14, 14), torch.bfloat16), ((8, 64, 14, 14), torch.float32),
         ((4, 48, 9, 7), torch.float16), ((6, 21, 5, 7), torch.bfloat16),
         ((6, 21, 5, 7), torch.float32), ((64, 48), torch.bfloat16), ((3, 40), torch.float32),
         ((32, 256, 28, 28), torch.bfloat16), ((2, 2048, 7, 7), torch.bfloat16)]
# rtol of one rounding to the dtype (float arithmetic inside)
RTOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
_seeds = itertools.count(1)


@pytest.fixture(scope="module", autouse=True)
def ext():
    return build.load()


def randn(shape, dtype=torch.float32, scale=1.0, shift=0.0):
    g = torch.Generator(device="cuda").manual_seed(next(_seeds))
    return (torch.randn(shape, generator=g, device="cuda") * scale + shift).to(dtype)


def layout(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def oracle(x, gamma, beta, dy, mask, p, residual=None):
    """float64 y, dx, dgamma, dbeta, batch mean and unbiased variance (the residual's
    gradient is dz, where the mask lets dy through)."""
    xd = x.double()
    dims = [0] + list(range(2, x.dim()))
    shape = [1, -1] + [1] * (x.dim() - 2)
    m = x.numel() // x.shape[1]
    mean = xd.mean(dims, keepdim=True)
    var = (xd - mean).square().mean(dims, keepdim=True)
    rstd = (var + EPS).rsqrt()
    xhat = (xd - mean) * rstd
    g = gamma.double().view(shape) if gamma is not None else torch.ones_like(rstd)
    b = beta.double().view(shape) if beta is not None else torch.zeros_like(rstd)
    z = xhat * g + b + (0.0 if residual is None else residual.double())
    y = torch.where(z > 0, z, p * z)
    dz = torch.where(mask, dy.double(), p * dy.double())
    dgamma = (dz * xhat).sum(dims)
    dbeta = dz.sum(dims)
    dxhat = dz * g
    dx = rstd * (dxhat - dxhat.mean(dims, keepdim=True)
                 - xhat * (dxhat * xhat).mean(dims, keepdim=True))
    return y, dx, dgamma, dbeta, mean.flatten(), var.flatten() * m / (m - 1), dz


def close(got, expected, rtol, what):
    """|got - expected| <= rtol * (|expected| + the largest |expected| / 16)."""
    err = (got.double() - expected).abs()
    bound = rtol * (expected.abs() + expected.abs().max() / 16)
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: max error {err.max().item():.3g} beyond the bound"


def run(x, gamma, beta, p, dy, residual=None):
    sums = [torch.zeros(x.shape[1], device="cuda"), torch.zeros(x.shape[1], device="cuda"),
            torch.zeros(1, device="cuda")]
    xg = x.detach().requires_grad_()
    params = [t.detach().requires_grad_() if t is not None else None for t in (gamma, beta)]
    rg = None if residual is None else residual.detach().requires_grad_()
    y = functions.batchnorm_relu(xg, params[0], params[1], *sums, EPS, MAF, p, residual=rg)
    y.backward(dy)
    return y, xg.grad, params, sums, None if rg is None else rg.grad


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("p", [0.0, 0.1, 1.0], ids=["relu", "leaky", "no activation"])
def test_forward_backward_and_running_sums_match_the_float64_oracle(shape, dtype, p):
    c = shape[1]
    x = layout(randn(shape, dtype, scale=1.5, shift=0.7))
    dy = layout(randn(shape, dtype))
    gamma, beta = randn(c, scale=0.5, shift=1.0), randn(c, scale=0.3)
    assert functions.batchnorm_relu_fits(x, gamma, beta)
    y, dx, (pg, pb), (mean_sum, var_sum, count), _ = run(x, gamma, beta, p, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    assert y.stride() == x.stride() and dx.stride() == x.stride()
    want_y, want_dx, want_dg, want_db, mean, var, _ = oracle(x, gamma, beta, dy, y > 0, p)
    rtol = RTOL[dtype]
    close(y, want_y, rtol, "y")
    close(dx, want_dx, rtol, "dx")
    close(pg.grad, want_dg, 1e-4, "dgamma")
    close(pb.grad, want_db, 1e-4, "dbeta")
    close(mean_sum, mean, 1e-5, "mean_sum")
    close(var_sum, var, 1e-4, "var_sum")
    assert count.item() == 1.0


def test_without_scale_and_after_earlier_sums():
    x = layout(randn((4, 32, 6, 6), torch.bfloat16, scale=3.0, shift=-2.0))
    dy = layout(randn(x.shape, torch.bfloat16))
    sums = [torch.full((32,), 2.0, device="cuda"), torch.full((32,), 5.0, device="cuda"),
            torch.full((1,), 3.0, device="cuda")]
    xg = x.detach().requires_grad_()
    y = functions.batchnorm_relu(xg, None, None, *sums, EPS, MAF, 0.0)
    y.backward(dy)
    want_y, want_dx, _, _, mean, var, _ = oracle(x, None, None, dy, y > 0, 0.0)
    close(y, want_y, RTOL[torch.bfloat16], "y")
    close(xg.grad, want_dx, RTOL[torch.bfloat16], "dx")
    close(sums[0], MAF * 2.0 + mean, 1e-5, "mean_sum")
    close(sums[1], MAF * 5.0 + var, 1e-4, "var_sum")
    assert sums[2].item() == torch.tensor(MAF * 3.0, dtype=torch.float32).item() + 1.0


def test_a_large_mean_keeps_an_accurate_variance():
    """Sums about the first row, not about zero: a mean 1000 standard deviations away."""
    x = layout(randn((16, 8, 10, 10), torch.float32, scale=1.0, shift=1000.0))
    dy = layout(randn(x.shape))
    y, dx, _, (_, var_sum, _), _ = run(x, None, None, 0.0, dy)
    want_y, want_dx, _, _, _, var, _ = oracle(x, None, None, dy, y > 0, 0.0)
    close(var_sum, var, 1e-3, "var_sum")
    close(y, want_y, 1e-3, "y")


@pytest.mark.parametrize("shape,dtype", [CASES[0], CASES[2], CASES[4], CASES[5], CASES[7]])
@pytest.mark.parametrize("p", [0.0, 1.0], ids=["relu", "no activation"])
def test_a_residual_sum_matches_the_float64_oracle(shape, dtype, p):
    c = shape[1]
    x = layout(randn(shape, dtype, scale=1.5, shift=0.7))
    r = layout(randn(shape, dtype, scale=0.8))
    dy = layout(randn(shape, dtype))
    gamma, beta = randn(c, scale=0.5, shift=1.0), randn(c, scale=0.3)
    assert functions.batchnorm_relu_fits(x, gamma, beta, residual=r)
    y, dx, (pg, pb), _, dr = run(x, gamma, beta, p, dy, residual=r)
    assert dr.dtype == dtype and dr.stride() == x.stride()
    want_y, want_dx, want_dg, want_db, _, _, want_dr = oracle(x, gamma, beta, dy, y > 0, p,
                                                               residual=r)
    rtol = RTOL[dtype]
    close(y, want_y, rtol, "y")
    close(dx, want_dx, rtol, "dx")
    close(dr, want_dr, rtol, "dr")
    close(pg.grad, want_dg, 1e-4, "dgamma")
    close(pb.grad, want_db, 1e-4, "dbeta")


def test_every_run_gives_the_same_bits():
    x = layout(randn((32, 64, 28, 28), torch.bfloat16))
    dy = layout(randn(x.shape, torch.bfloat16))
    gamma, beta = randn(64), randn(64)
    first = run(x, gamma, beta, 0.0, dy)
    second = run(x, gamma, beta, 0.0, dy)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert torch.equal(first[2][0].grad, second[2][0].grad)
    assert torch.equal(first[3][1], second[3][1])


def test_fits_only_the_layouts_and_dtypes_the_kernels_stream():
    x = randn((4, 8, 5, 5))
    assert not functions.batchnorm_relu_fits(x)  # NCHW
    assert functions.batchnorm_relu_fits(layout(x))
    assert not functions.batchnorm_relu_fits(layout(x).double())
    assert not functions.batchnorm_relu_fits(layout(x).cpu())
    assert not functions.batchnorm_relu_fits(randn((1, 8)))  # one value a channel
    assert not functions.batchnorm_relu_fits(layout(x), torch.ones(8, device="cuda").half())
    assert not functions.batchnorm_relu_fits(layout(x), residual=x)  # another layout
    assert not functions.batchnorm_relu_fits(layout(x), residual=layout(x).half())
    assert functions.batchnorm_relu_fits(layout(x), residual=layout(x))


BLOCK = """
name: block
layer:
  - {name: data, type: Input, top: [data, label],
     input_param: {shape: [{dim: [16, 3, 12, 12]}, {dim: [16]}]}}
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution_param: {num_output: 32, kernel_size: 3, pad: 1, bias_term: false,
                         weight_filler: {type: msra}}}
  - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
  - {name: scale1, type: Scale, bottom: conv1, top: conv1, scale_param: {bias_term: true}}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2,
     convolution_param: {num_output: 32, kernel_size: 3, pad: 1, bias_term: false,
                         weight_filler: {type: msra}}}
  - {name: bn2, type: BatchNorm, bottom: conv2, top: conv2}
  - {name: scale2, type: Scale, bottom: conv2, top: conv2, scale_param: {bias_term: true}}
  - {name: res, type: Eltwise, bottom: [conv1, conv2], top: res}
  - {name: res_relu, type: ReLU, bottom: res, top: res}
  - {name: conv3, type: Convolution, bottom: res, top: conv3,
     convolution_param: {num_output: 16, kernel_size: 3, pad: 1, bias_term: false,
                         weight_filler: {type: msra}}}
  - {name: bn3, type: BatchNorm, bottom: conv3, top: conv3}
  - {name: relu3, type: ReLU, bottom: conv3, top: conv3, relu_param: {negative_slope: 0.1}}
  - {name: pool, type: Pooling, bottom: conv3, top: pool,
     pooling_param: {pool: AVE, global_pooling: true}}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc,
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.3}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def train_step(options: dict, dtype: torch.dtype) -> tuple[Net, float, dict, dict]:
    """One forward and backward of BLOCK; convolutions and matrix products in full float32
    whatever earlier tests set (TF32 would move float32 results by 1e-3)."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=False):
        matmul = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return _train_step(options, dtype)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul


def _train_step(options: dict, dtype: torch.dtype) -> tuple[Net, float, dict, dict]:
    torch.manual_seed(0)
    net = Net(parse_net(loads(BLOCK), Source("net.yaml")), "TRAIN", seed=3, device="cuda",
              options=options).to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(5)
    data = torch.randn(16, 3, 12, 12, generator=g).cuda().contiguous(
        memory_format=torch.channels_last)
    label = torch.randint(0, 5, (16,), generator=g).float().cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = net({"data": data, "label": label})
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    return net, out.loss.item(), grads, {n: b.clone() for n, b in net.named_buffers()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"fuse_batchnorm_relu": False,
                                          "fuse_batchnorm_eltwise": False}],
                         ids=["fused", "kernels alone"])
def test_a_net_on_the_kernels_trains_as_the_net_on_pytorchs_batch_norm(dtype, options):
    net, loss, grads, bufs = train_step(options, dtype)
    ref_net, ref_loss, ref_grads, ref_bufs = train_step(
        {"fuse_batchnorm_relu": False, "fuse_batchnorm_eltwise": False,
         "batchnorm_kernels": False}, dtype)
    assert all(layer.kernels_allowed for layer in net.layers if layer.spec.type == "BatchNorm")
    assert not any(layer.kernels_allowed for layer in ref_net.layers
                   if layer.spec.type == "BatchNorm")
    assert net.fused_relu == ([] if options else [("bn1", "relu1"), ("bn3", "relu3")])
    assert net.fused_sum == ([] if options else [("bn2", "res", "res_relu")])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert abs(loss - ref_loss) <= tol * abs(ref_loss)
    assert grads.keys() == ref_grads.keys() and len(grads) == 9
    for name in ref_grads:
        scale = ref_grads[name].abs().max().item()
        err = (grads[name] - ref_grads[name]).abs().max().item()
        assert err <= 10 * tol * scale + 1e-7, name
    for name in ref_bufs:  # bn2's input differs by the rounding of bn1's bfloat16 output
        torch.testing.assert_close(bufs[name], ref_bufs[name], rtol=10 * tol, atol=tol / 10)
