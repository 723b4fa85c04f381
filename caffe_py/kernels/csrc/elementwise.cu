// Elementwise activations: y = f(x) and dx = f'(g, s), one streaming pass each.
//
// Each thread moves U = Unroll<T>::value 16-byte packs per loop trip (all loads first, then
// the math and the stores, so U loads are in flight), in a grid-stride loop over a grid of at
// most one full wave. Elements past the last whole pack, and every element when a pointer is
// not 16-byte aligned (a view such as x[1:]), take the scalar path: the same kernel with a
// pack of one.
// `out` may be `x` itself (in place): each element is read before it is written, by one thread.
#include "common.cuh"

namespace caffe_py {
namespace {

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
unary_kernel(const T* x, T* y, int64_t n, typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t packs = n / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * U;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x;
       base < packs; base += step) {
    P in[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * blockDim.x;
      if (j < packs) in[u] = reinterpret_cast<const P*>(x)[j];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * blockDim.x;
      if (j < packs) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(op(static_cast<A>(in[u].v[k]), p));
        reinterpret_cast<P*>(y)[j] = out;
      }
    }
  }
  // The tail: fewer than V elements after the last whole pack.
  const int64_t t = packs * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) y[t] = static_cast<T>(op(static_cast<A>(x[t]), p));
}

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
binary_kernel(const T* g, const T* s, T* gi, int64_t n, typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t packs = n / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * U;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x;
       base < packs; base += step) {
    P gin[U], sin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * blockDim.x;
      if (j < packs) {
        gin[u] = reinterpret_cast<const P*>(g)[j];
        sin[u] = reinterpret_cast<const P*>(s)[j];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * blockDim.x;
      if (j < packs) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k)
          out.v[k] = static_cast<T>(
              op(static_cast<A>(gin[u].v[k]), static_cast<A>(sin[u].v[k]), p));
        reinterpret_cast<P*>(gi)[j] = out;
      }
    }
  }
  const int64_t t = packs * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) gi[t] = static_cast<T>(op(static_cast<A>(g[t]), static_cast<A>(s[t]), p));
}

// The tail needs one thread per leftover element (< V <= 8), which any grid has.
template <typename T, typename Op>
void launch_unary(const at::Tensor& x, at::Tensor& y, double p, Op op) {
  const int64_t n = x.numel();
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.mutable_data_ptr<T>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  using A = typename OpMath<T>::type;
  constexpr int V = pack_width<T>();
  constexpr int U = Unroll<T>::value;
  if (aligned16(xp) && aligned16(yp)) {
    const int blocks = grid_size((n / V + U - 1) / U);
    unary_kernel<T, V, Op><<<blocks, kBlock, 0, stream>>>(xp, yp, n, static_cast<A>(p), op);
  } else {
    const int blocks = grid_size((n + U - 1) / U);
    unary_kernel<T, 1, Op><<<blocks, kBlock, 0, stream>>>(xp, yp, n, static_cast<A>(p), op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Op>
void launch_binary(const at::Tensor& g, const at::Tensor& s, at::Tensor& gi, double p, Op op) {
  const int64_t n = g.numel();
  const T* gp = g.const_data_ptr<T>();
  const T* sp = s.const_data_ptr<T>();
  T* gip = gi.mutable_data_ptr<T>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  using A = typename OpMath<T>::type;
  constexpr int V = pack_width<T>();
  constexpr int U = Unroll<T>::value;
  if (aligned16(gp) && aligned16(sp) && aligned16(gip)) {
    const int blocks = grid_size((n / V + U - 1) / U);
    binary_kernel<T, V, Op><<<blocks, kBlock, 0, stream>>>(gp, sp, gip, n, static_cast<A>(p), op);
  } else {
    const int blocks = grid_size((n + U - 1) / U);
    binary_kernel<T, 1, Op><<<blocks, kBlock, 0, stream>>>(gp, sp, gip, n, static_cast<A>(p), op);
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
      case kElu: launch_unary<scalar_t>(x, out, p, EluFwd{}); break;
      case kSigmoid: launch_unary<scalar_t>(x, out, p, SigmoidFwd{}); break;
      case kTanh: launch_unary<scalar_t>(x, out, p, TanhFwd{}); break;
      default: TORCH_CHECK(false, "unknown activation kind ", kind);
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
      default: TORCH_CHECK(false, "unknown activation kind ", kind);
    }
  });
}

}  // namespace caffe_py
