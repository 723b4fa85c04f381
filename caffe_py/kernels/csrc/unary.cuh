// The unary forward y = f(x), with its launch shape and memory flavours as template
// parameters: elementwise.cu instantiates the shipped ones (kFwd and kFwdMath in common.cuh)
// and csrc/fwd_variants*.cu every variant of the sweep.
//
// Launch (PyTorch's vectorized_elementwise_kernel design): `Threads`-thread blocks, thread t
// of block b moves the `Packs` 16-byte packs b * Threads * Packs + t + Threads * u (u < Packs),
// so each load instruction of a warp covers 512 contiguous bytes; one block per
// Threads * Packs packs, many waves, no grid-stride loop. All loads of a chunk come first,
// then the math and the stores. Only the last block checks bounds; it also writes the
// elements after the last whole pack. When a pointer is not 16-byte aligned (a view such as
// x[1:]) the same kernel runs with a pack of one element (plain loads and stores).
// `y` may be `x` itself (in place): each element is read before it is written, by one thread.
#pragma once

#include <cstring>

#include "common.cuh"

namespace caffe_py {

// A 16-byte pack through the chosen load instruction; other sizes load plainly.
template <Ld L, typename P>
__device__ __forceinline__ P load_pack(const P* p) {
  if constexpr (L == Ld::kPlain || sizeof(P) != 16) {
    return *p;
  } else {
    const int4* q = reinterpret_cast<const int4*>(p);
    const int4 r = L == Ld::kNc ? __ldg(q) : __ldcs(q);
    P out;
    memcpy(&out, &r, 16);
    return out;
  }
}

template <St S, typename P>
__device__ __forceinline__ void store_pack(P* p, const P& v) {
  if constexpr (S == St::kPlain || sizeof(P) != 16) {
    *p = v;
  } else {
    int4 r;
    memcpy(&r, &v, 16);
    if constexpr (S == St::kCs) __stcs(reinterpret_cast<int4*>(p), r);
    else __stcg(reinterpret_cast<int4*>(p), r);
  }
}

template <typename T, int V, int Threads, int Packs, Ld L, St S, typename Op>
__global__ void __launch_bounds__(Threads)
unary_kernel(const T* x, T* y, int64_t n, typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (Threads * Packs) + threadIdx.x;
  const P* xv = reinterpret_cast<const P*>(x);
  P* yv = reinterpret_cast<P*>(y);
  P in[Packs];
  if (base + (Packs - 1) * Threads < packs) {  // every block but (maybe) the last
#pragma unroll
    for (int u = 0; u < Packs; ++u) in[u] = load_pack<L>(xv + base + u * Threads);
#pragma unroll
    for (int u = 0; u < Packs; ++u) {
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(op(static_cast<A>(in[u].v[k]), p));
      store_pack<S>(yv + base + u * Threads, out);
    }
  } else {
#pragma unroll
    for (int u = 0; u < Packs; ++u)
      if (base + u * Threads < packs) in[u] = load_pack<L>(xv + base + u * Threads);
#pragma unroll
    for (int u = 0; u < Packs; ++u) {
      if (base + u * Threads < packs) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(op(static_cast<A>(in[u].v[k]), p));
        store_pack<S>(yv + base + u * Threads, out);
      }
    }
  }
  // The tail: fewer than V elements after the last whole pack, written by the last block.
  const int64_t t = packs * V + threadIdx.x;
  if (blockIdx.x == gridDim.x - 1 && t < n) y[t] = static_cast<T>(op(static_cast<A>(x[t]), p));
}

// Launches y = op(x, p) over x.numel() elements with the given shape and flavours; x and y
// were checked by the caller (same dense layout). The tail needs one thread per leftover
// element (< V <= 8 < Threads).
template <typename T, int Threads, int Packs, Ld L, St S, typename Op>
void launch_unary_with(const at::Tensor& x, at::Tensor& y, double p, Op op) {
  static_assert(Threads >= 32 && Threads % 32 == 0 && Packs >= 1, "bad forward launch shape");
  const int64_t n = x.numel();
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.mutable_data_ptr<T>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  using A = typename OpMath<T>::type;
  constexpr int V = pack_width<T>();
  constexpr int64_t per_block = static_cast<int64_t>(Threads) * Packs;
  auto blocks = [&](int64_t items) {
    return static_cast<unsigned>(std::max<int64_t>(1, (items + per_block - 1) / per_block));
  };
  if (aligned16(xp) && aligned16(yp)) {
    unary_kernel<T, V, Threads, Packs, L, S, Op>
        <<<blocks(n / V), Threads, 0, stream>>>(xp, yp, n, static_cast<A>(p), op);
  } else {
    unary_kernel<T, 1, Threads, Packs, L, S, Op>
        <<<blocks(n), Threads, 0, stream>>>(xp, yp, n, static_cast<A>(p), op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The shipped forward with launch C (kFwd or kFwdMath): C.packs2 packs for 2-byte types and,
// for doubles, twice C.packs4 (the elements per thread of float, as PyTorch does).
template <typename T, const FwdConfig& C>
constexpr int fwd_packs() {
  return sizeof(T) == 2 ? C.packs2 : sizeof(T) == 8 ? 2 * C.packs4 : C.packs4;
}

template <typename T, const FwdConfig& C = kFwd, typename Op>
void launch_unary(const at::Tensor& x, at::Tensor& y, double p, Op op) {
  launch_unary_with<T, C.threads, fwd_packs<T, C>(), C.load, C.store>(x, y, p, op);
}

}  // namespace caffe_py
