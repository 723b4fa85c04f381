// Elementwise activations: y = f(x) and dx = f'(g, s), one streaming pass each.
//
// The forward is unary.cuh's kernel with the launch kFwd (ReLU) or kFwdMath (ELU, Sigmoid,
// TanH) of common.cuh. The backward follows PyTorch's vectorized elementwise kernel too:
// 128-thread blocks, one block per kThreads * kPacks 16-byte packs, so a 64 MB float tensor
// is 8192 blocks (many waves; a finished block frees its slot at once, instead of a one-wave
// grid-stride loop whose slowest threads set the end). Thread t of block b moves packs
// b * 512 + t + 128 * u (u < 4): each load instruction of a warp covers 512 contiguous bytes.
// All loads of the chunk come first, then the math and the stores. Only the last block checks
// bounds; it also writes the elements after the last whole pack. When a pointer is not 16-byte
// aligned (a view such as x[1:]) the same kernel runs with a pack of one element.
// `out` may be `x` itself (in place): each element is read before it is written, by one thread.
#include "unary.cuh"

namespace caffe_py {
namespace {

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads)
binary_kernel(const T* g, const T* s, T* gi, int64_t n, typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kBlockPacks + threadIdx.x;
  const P* gv = reinterpret_cast<const P*>(g);
  const P* sv = reinterpret_cast<const P*>(s);
  P* outv = reinterpret_cast<P*>(gi);
  P gin[kPacks], sin[kPacks];
  if (base + (kPacks - 1) * kThreads < packs) {
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      gin[u] = gv[base + u * kThreads];
      sin[u] = sv[base + u * kThreads];
    }
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k)
        out.v[k] = static_cast<T>(
            op(static_cast<A>(gin[u].v[k]), static_cast<A>(sin[u].v[k]), p));
      outv[base + u * kThreads] = out;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      if (base + u * kThreads < packs) {
        gin[u] = gv[base + u * kThreads];
        sin[u] = sv[base + u * kThreads];
      }
    }
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      if (base + u * kThreads < packs) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k)
          out.v[k] = static_cast<T>(
              op(static_cast<A>(gin[u].v[k]), static_cast<A>(sin[u].v[k]), p));
        outv[base + u * kThreads] = out;
      }
    }
  }
  const int64_t t = packs * V + threadIdx.x;
  if (blockIdx.x == gridDim.x - 1 && t < n)
    gi[t] = static_cast<T>(op(static_cast<A>(g[t]), static_cast<A>(s[t]), p));
}

// The tail needs one thread per leftover element (< V <= 8 < kThreads).
template <typename T, typename Op>
void launch_binary(const at::Tensor& g, const at::Tensor& s, at::Tensor& gi, double p, Op op) {
  const int64_t n = g.numel();
  const T* gp = g.const_data_ptr<T>();
  const T* sp = s.const_data_ptr<T>();
  T* gip = gi.mutable_data_ptr<T>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  using A = typename OpMath<T>::type;
  constexpr int V = pack_width<T>();
  if (aligned16(gp) && aligned16(sp) && aligned16(gip)) {
    binary_kernel<T, V, Op>
        <<<chunk_blocks(n / V), kThreads, 0, stream>>>(gp, sp, gip, n, static_cast<A>(p), op);
  } else {
    binary_kernel<T, 1, Op>
        <<<chunk_blocks(n), kThreads, 0, stream>>>(gp, sp, gip, n, static_cast<A>(p), op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void act_forward(const at::Tensor& x, at::Tensor& out, int64_t kind, double p) {
  check_input(x);
  check_same(out, x, "out");
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "act_forward", [&] {
    switch (kind) {
      case kRelu: launch_unary<scalar_t>(x, out, p, ReluFwd{}); break;
      case kElu: launch_unary<scalar_t, kFwdMath>(x, out, p, EluFwd{}); break;
      case kSigmoid: launch_unary<scalar_t, kFwdMath>(x, out, p, SigmoidFwd{}); break;
      case kTanh: launch_unary<scalar_t, kFwdMath>(x, out, p, TanhFwd{}); break;
      default: TORCH_CHECK(false, "unknown activation kind " + num(kind));
    }
  });
}

// s is the saved tensor: the output y, or the input x where from_output is false (ReLU with a
// negative slope < 0 and ELU with alpha < 0 cannot tell x's sign from y's).
void act_backward(const at::Tensor& g, const at::Tensor& s, at::Tensor& grad_in, int64_t kind,
                  double p, bool from_output) {
  check_input(s);
  check_same(g, s, "grad_out");
  check_same(grad_in, s, "grad_in");
  if (s.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(s.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), "act_backward", [&] {
    switch (kind) {
      case kRelu: launch_binary<scalar_t>(g, s, grad_in, p, ReluBwd{}); break;
      case kElu:
        if (from_output) launch_binary<scalar_t>(g, s, grad_in, p, EluBwdFromOutput{});
        else launch_binary<scalar_t>(g, s, grad_in, p, EluBwdFromInput{});
        break;
      case kSigmoid: launch_binary<scalar_t>(g, s, grad_in, p, SigmoidBwd{}); break;
      case kTanh: launch_binary<scalar_t>(g, s, grad_in, p, TanhBwd{}); break;
      default: TORCH_CHECK(false, "unknown activation kind " + num(kind));
    }
  });
}

}  // namespace caffe_py
