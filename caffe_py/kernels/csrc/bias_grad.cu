// The bias gradient alone: g summed over every axis but the channel, for a contiguous tensor
// viewed as [outer, C, inner] (a Convolution's output in NCHW: (N, C, H*W)).
//
// PyTorch sums it with its generic reduction over axes (0, 2, 3), which for the short rows of
// a small convolution (LeNet's conv2: 64 x 50 x 8 x 8) keeps few blocks busy: 19 us on an H200
// for 0.8 MB. Here block (c, s) of a (C, S) grid owns the s-th share of channel c's
// outer * inner values: each thread walks them in 16-byte packs, four loads in flight, then the
// block adds its threads' sums in a fixed tree. With S == 1 the block writes the channel's sum;
// with S > 1 it writes a partial and a second kernel adds a channel's S partials in order. No
// atomics and no zero fill: the same bits on every run, and nothing for a CUDA graph but
// kernels.
#include "common.cuh"

namespace caffe_py {
namespace {

constexpr int kGradUnroll = 4;
// A block takes at least this many values of its channel (a small channel is one block).
constexpr int64_t kMinPerBlock = 8192;

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kBlock)
bias_grad_kernel(const T* g, float* out, I row_packs, I total, I C, I inner, I share) {
  using P = Pack<T, V>;
  const I c = blockIdx.x;
  const I lo = static_cast<I>(blockIdx.y) * share;
  const I hi = lo + share < total ? lo + share : total;
  float acc = 0.f;
  for (I j = lo + threadIdx.x; j < hi; j += kGradUnroll * kBlock) {
    P in[kGradUnroll];
#pragma unroll
    for (int u = 0; u < kGradUnroll; ++u) {
      const I k = j + u * kBlock;
      if (k < hi) {
        const I n = k / row_packs;
        in[u] = reinterpret_cast<const P*>(g + (n * C + c) * inner)[k - n * row_packs];
      }
    }
#pragma unroll
    for (int u = 0; u < kGradUnroll; ++u) {
      if (j + u * kBlock < hi) {
#pragma unroll
        for (int v = 0; v < V; ++v) acc += static_cast<float>(in[u].v[v]);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  __shared__ float warps[kBlock / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kBlock / 32 ? warps[lane] : 0.f;
#pragma unroll
    for (int o = kBlock / 64; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) out[static_cast<int64_t>(c) * gridDim.y + blockIdx.y] = acc;
  }
}

// out[c] = the S partials of channel c added in order.
__global__ void bias_grad_finish(const float* part, float* out, int64_t C, int S) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.f;
  for (int s = 0; s < S; ++s) sum += part[c * S + s];
  out[c] = sum;
}

template <typename T, int V, typename I>
void launch_bias_grad(const T* gp, float* dst, int64_t outer, int64_t C, int64_t inner,
                      int S) {
  const int64_t row_packs = inner / V;
  const int64_t total = outer * row_packs;
  const int64_t share = (total + S - 1) / S;
  bias_grad_kernel<T, V, I><<<dim3(static_cast<unsigned>(C), static_cast<unsigned>(S)), kBlock,
                              0, c10::cuda::getCurrentCUDAStream()>>>(
      gp, dst, static_cast<I>(row_packs), static_cast<I>(total), static_cast<I>(C),
      static_cast<I>(inner), static_cast<I>(share));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int V>
void launch_bias_grad_any(const T* gp, float* dst, int64_t outer, int64_t C, int64_t inner,
                          int S) {
  // 32-bit indices when every element index fits (two 32-bit divisions a pack, not 64-bit).
  if (outer * C * inner < (int64_t{1} << 31))
    launch_bias_grad<T, V, uint32_t>(gp, dst, outer, C, inner, S);
  else
    launch_bias_grad<T, V, int64_t>(gp, dst, outer, C, inner, S);
}

}  // namespace

at::Tensor bias_grad(const at::Tensor& g, int64_t C, int64_t inner) {
  TORCH_CHECK(g.is_cuda(), "bias_grad: g must be a CUDA tensor");
  TORCH_CHECK(g.is_contiguous(), "bias_grad: g must be contiguous; call .contiguous() first");
  TORCH_CHECK(C >= 1 && inner >= 1,
              "bias_grad: C and inner must be >= 1, got " + num(C) + " and " + num(inner));
  TORCH_CHECK(g.numel() % (C * inner) == 0, "bias_grad: g's " + num(g.numel()) +
                                                " elements do not split into [outer, " + num(C) +
                                                ", " + num(inner) + "]");
  TORCH_CHECK(C <= INT32_MAX, "bias_grad: more channels than a grid holds");
  TORCH_CHECK(g.scalar_type() == at::kFloat || g.scalar_type() == at::kHalf ||
                  g.scalar_type() == at::kBFloat16,
              "bias_grad: g must be float32, float16 or bfloat16, got ", g.scalar_type());
  const auto opts = g.options().dtype(at::kFloat);
  at::Tensor out = at::empty({C}, opts);
  const int64_t outer = g.numel() / (C * inner);
  if (outer == 0) return out.zero_();
  const c10::cuda::CUDAGuard guard(g.device());
  const int64_t per = outer * inner;
  const int64_t want = (wave_blocks() + C - 1) / C;
  const int S = static_cast<int>(std::max<int64_t>(
      1, std::min({want, (per + kMinPerBlock - 1) / kMinPerBlock, int64_t{65535}})));
  at::Tensor part = S == 1 ? out : at::empty({C, S}, opts);
  float* dst = part.mutable_data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "bias_grad", [&] {
    // float64 never gets here (checked above); the dispatch's double case is compiled only
    using T = scalar_t;
    constexpr int V = pack_width<T>();
    const T* gp = g.const_data_ptr<T>();
    if (aligned16(gp) && inner % V == 0)
      launch_bias_grad_any<T, V>(gp, dst, outer, C, inner, S);
    else
      launch_bias_grad_any<T, 1>(gp, dst, outer, C, inner, S);
  });
  if (S > 1) {
    const int threads = 128;
    const unsigned blocks = static_cast<unsigned>((C + threads - 1) / threads);
    bias_grad_finish<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        dst, out.mutable_data_ptr<float>(), C, S);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace caffe_py
