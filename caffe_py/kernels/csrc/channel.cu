// Per-channel kernels: PReLU and the fused bias-add + activation, forward and backward.
//
// A tensor is viewed in memory order as [outer, C, inner]: NCHW gives (N, C, H*W), channels_last
// gives (N*H*W, C, 1), a 2-D InnerProduct output (N, C, 1), a channel-shared PReLU (1, 1, n).
// The element at memory index i belongs to channel (i / inner) % C; a thread computes that once
// per pack and steps it along the pack, so packs may straddle channels. The forward launches
// like elementwise.cu (many waves of 128-thread blocks, 4 packs per thread).
//
// The backward also reduces over everything but the channel (PReLU's slope gradient, the bias
// gradient) in the same pass that writes grad_x:
//   rows path (inner >= kRowsMinInner, NCHW convolutions): one warp per segment of one
//     (n, c) row; the warp sums its segment with shuffles and adds it into one of kSlots
//     partial sums of channel c (slots spread the atomics of one channel over 32 addresses).
//   columns path (small inner: channels_last, InnerProduct, small feature maps): the tensor is
//     an [outer, L = C * inner] matrix; each thread owns one pack of columns and walks down
//     the rows, the block sums its rows in shared memory and adds one partial per column.
// The partials (float, double for double tensors) are summed to [C] by ATen at the end.
#include "common.cuh"

namespace caffe_py {
namespace {

constexpr int kSlots = 32;
constexpr int64_t kRowsMinInner = 512;

struct PreluFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A slope, A) const {
    return x > A(0) ? x : slope * x;
  }
};

template <typename Act>
struct BiasActFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A bias, A p) const {
    return Act{}(x + bias, p);
  }
};

// Caffe's PReLU backward: dx = g * (x > 0 ? 1 : slope); dslope += g * x where x <= 0.
struct PreluBwd {
  template <typename A>
  __device__ __forceinline__ void operator()(A g, A x, A slope, A, A& gx, A& contrib) const {
    const bool pos = x > A(0);
    gx = pos ? g : slope * g;
    contrib = pos ? A(0) : g * x;
  }
};

// Bias + activation backward from the output y: d = f'(g, y); grad_x = d; dbias += d.
template <typename ActBwd>
struct BiasActBwd {
  template <typename A>
  __device__ __forceinline__ void operator()(A g, A y, A, A p, A& gx, A& contrib) const {
    gx = ActBwd{}(g, y, p);
    contrib = gx;
  }
};

// Forward: the launch of elementwise.cu (128 threads, kPacks packs each, many waves). The
// channel of a pack is (e0 / inner) % C; I is uint32_t when every index fits (two 32-bit
// divisions per pack instead of two 64-bit ones, which cost more than the memory traffic).
template <typename T, int V, typename I, typename Op>
__global__ void __launch_bounds__(kThreads)
channel_fwd_kernel(const T* x, const T* param, T* y, int64_t n, I C, I inner,
                   typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  const I packs = static_cast<I>(n / V);
  const I base = static_cast<I>(blockIdx.x) * static_cast<I>(kBlockPacks) + threadIdx.x;
  const P* xv = reinterpret_cast<const P*>(x);
  P* yv = reinterpret_cast<P*>(y);
  P in[kPacks];
#pragma unroll
  for (int u = 0; u < kPacks; ++u)
    if (base + u * kThreads < packs) in[u] = xv[base + u * kThreads];
#pragma unroll
  for (int u = 0; u < kPacks; ++u) {
    const I j = base + u * kThreads;
    if (j < packs) {
      const I e0 = j * V;
      const I q = e0 / inner;
      I r = e0 - q * inner;
      I c = q % C;
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out.v[k] = static_cast<T>(op(static_cast<A>(in[u].v[k]), static_cast<A>(param[c]), p));
        if (++r == inner) {
          r = 0;
          if (++c == C) c = 0;
        }
      }
      yv[j] = out;
    }
  }
  const int64_t t = static_cast<int64_t>(packs) * V + threadIdx.x;
  if (blockIdx.x == gridDim.x - 1 && t < n) {
    const I c = static_cast<I>((t / inner) % C);
    y[t] = static_cast<T>(op(static_cast<A>(x[t]), static_cast<A>(param[c]), p));
  }
}

// Rows path. Requires inner % V == 0 so that every row starts on a pack boundary.
template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
channel_bwd_rows(const T* g, const T* s, const T* param, T* gx, typename OpMath<T>::type* partial,
                 int64_t rows, int64_t inner, int64_t C, int64_t segs,
                 typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  constexpr int kSegPacks = 32 * U;  // packs per warp task
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t row_packs = inner / V;
  const int64_t tasks = rows * segs;
  // t is the same for the 32 lanes of a warp, so the whole warp reaches the shuffles.
  for (int64_t t = warp; t < tasks; t += nwarps) {
    const int64_t row = t / segs;
    const int64_t first = (t - row * segs) * kSegPacks;
    const int64_t c = row % C;
    const A pc = static_cast<A>(param[c]);
    const P* gr = reinterpret_cast<const P*>(g + row * inner);
    const P* sr = reinterpret_cast<const P*>(s + row * inner);
    P* gxr = reinterpret_cast<P*>(gx + row * inner);
    P gin[U], sin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = first + u * 32 + lane;
      if (v < row_packs) {
        gin[u] = gr[v];
        sin[u] = sr[v];
      }
    }
    A acc = A(0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = first + u * 32 + lane;
      if (v < row_packs) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          A d, contrib;
          op(static_cast<A>(gin[u].v[k]), static_cast<A>(sin[u].v[k]), pc, p, d, contrib);
          out.v[k] = static_cast<T>(d);
          acc += contrib;
        }
        gxr[v] = out;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) atomicAdd(partial + c * kSlots + (t % kSlots), acc);
  }
}

// Columns path. Requires L % V == 0. Block (TX, TY): x walks columns, y walks rows.
template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
channel_bwd_cols(const T* g, const T* s, const T* param, T* gx, typename OpMath<T>::type* partial,
                 int64_t outer, int64_t L, int64_t inner, int slots,
                 typename OpMath<T>::type p, Op op) {
  using A = typename OpMath<T>::type;
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t packs_per_row = L / V;
  // One block row (gridDim.y == 1) owns its columns outright: it stores its sums into an
  // uninitialized buffer, no zero fill and no atomics (small batches: InnerProduct, N x C).
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = col < packs_per_row;
  A pc[V];
  A acc[V];
  {
    int64_t c = active ? (col * V) / inner : 0;
    int64_t r = active ? col * V - c * inner : 0;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      pc[k] = active ? static_cast<A>(param[c]) : A(0);
      acc[k] = A(0);
      if (++r == inner) {
        r = 0;
        ++c;
      }
    }
  }
  const int64_t rstep = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < outer;
       r0 += rstep * U) {
    P gin[U], sin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * rstep;
      if (active && row < outer) {
        gin[u] = reinterpret_cast<const P*>(g)[row * packs_per_row + col];
        sin[u] = reinterpret_cast<const P*>(s)[row * packs_per_row + col];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * rstep;
      if (active && row < outer) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          A d, contrib;
          op(static_cast<A>(gin[u].v[k]), static_cast<A>(sin[u].v[k]), pc[k], p, d, contrib);
          out.v[k] = static_cast<T>(d);
          acc[k] += contrib;
        }
        reinterpret_cast<P*>(gx)[row * packs_per_row + col] = out;
      }
    }
  }
  // Sum the block's rows: shared memory laid out [ty][tx][k], halved along ty in log2(ty)
  // steps (ty is a power of two) instead of one thread per column reading all ty rows.
  extern __shared__ unsigned char smem_raw[];
  A* sh = reinterpret_cast<A*>(smem_raw);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < V; ++k) sh[tid * V + k] = acc[k];
  __syncthreads();
  for (int half = static_cast<int>(blockDim.y) / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = (tid + half * static_cast<int>(blockDim.x)) * V;
#pragma unroll
      for (int k = 0; k < V; ++k) sh[tid * V + k] += sh[other + k];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
    // Block rows add into `slots` copies of the partials (blockIdx.y % slots), so that the
    // atomics on one address are gridDim.y / slots, not gridDim.y.
    A* dst = partial + static_cast<int64_t>(blockIdx.y % slots) * L;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A sum = sh[threadIdx.x * V + k];
      if (gridDim.y == 1)
        dst[col * V + k] = sum;
      else
        atomicAdd(dst + col * V + k, sum);
    }
  }
}

template <typename T, int V, typename Op>
void launch_channel_fwd_v(const T* xp, const T* pp, T* yp, int64_t n, int64_t C, int64_t inner,
                          double p, Op op) {
  using A = typename OpMath<T>::type;
  const unsigned blocks = chunk_blocks(n / V);
  auto stream = c10::cuda::getCurrentCUDAStream();
  // 32-bit indices need every pack index of the grid (blocks * kBlockPacks) and element to fit.
  if (static_cast<int64_t>(blocks) * kBlockPacks * V + kThreads < (int64_t{1} << 32)) {
    channel_fwd_kernel<T, V, uint32_t, Op><<<blocks, kThreads, 0, stream>>>(
        xp, pp, yp, n, static_cast<uint32_t>(C), static_cast<uint32_t>(inner),
        static_cast<A>(p), op);
  } else {
    channel_fwd_kernel<T, V, int64_t, Op>
        <<<blocks, kThreads, 0, stream>>>(xp, pp, yp, n, C, inner, static_cast<A>(p), op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Op>
void launch_channel_fwd(const at::Tensor& x, const at::Tensor& param, at::Tensor& y, int64_t C,
                        int64_t inner, double p, Op op) {
  constexpr int V = pack_width<T>();
  const int64_t n = x.numel();
  const T* xp = x.const_data_ptr<T>();
  const T* pp = param.const_data_ptr<T>();
  T* yp = y.mutable_data_ptr<T>();
  if (aligned16(xp) && aligned16(yp))
    launch_channel_fwd_v<T, V, Op>(xp, pp, yp, n, C, inner, p, op);
  else
    launch_channel_fwd_v<T, 1, Op>(xp, pp, yp, n, C, inner, p, op);
}

template <typename T, int V, typename Op>
void launch_rows(const T* gp, const T* sp, const T* pp, T* gxp, typename OpMath<T>::type* part,
                 int64_t rows, int64_t inner, int64_t C, double p, Op op) {
  using A = typename OpMath<T>::type;
  constexpr int U = Unroll<T>::value;
  const int64_t seg_packs = 32 * U;
  const int64_t segs = (inner / V + seg_packs - 1) / seg_packs;
  const int blocks = grid_size(rows * segs * 32);
  channel_bwd_rows<T, V, Op><<<blocks, kBlock, 0, c10::cuda::getCurrentCUDAStream()>>>(
      gp, sp, pp, gxp, part, rows, inner, C, segs, static_cast<A>(p), op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Block (tx, ty) and grid of the columns path for an [outer, packs_per_row] matrix of packs.
// The grid fills about one wave; a batch of at most kColsOneRowTrips * ty * U rows gets a
// single block row (so it can skip the zero fill and the atomics, see channel_bwd_cols).
constexpr int64_t kColsOneRowTrips = 8;

template <typename T>
void cols_shape(int64_t outer, int64_t packs_per_row, dim3& grid, dim3& block) {
  constexpr int U = Unroll<T>::value;
  int tx = 1;
  while (tx < 32 && tx < packs_per_row) tx *= 2;
  const int ty = kBlock / tx;
  const int64_t gx_blocks = (packs_per_row + tx - 1) / tx;
  TORCH_CHECK(gx_blocks <= INT32_MAX, "a row of " + num(packs_per_row) + " packs is too long");
  const int64_t rows_needed = (outer + static_cast<int64_t>(ty) * U - 1) / (ty * U);
  const int64_t want = (wave_blocks() + gx_blocks - 1) / gx_blocks;
  int64_t gy_blocks = std::max<int64_t>(1, std::min({want, rows_needed, int64_t{65535}}));
  if (rows_needed <= kColsOneRowTrips) gy_blocks = 1;
  grid = dim3(static_cast<unsigned>(gx_blocks), static_cast<unsigned>(gy_blocks));
  block = dim3(tx, ty);
}

template <typename T, int V, typename Op>
void launch_cols(const T* gp, const T* sp, const T* pp, T* gxp, typename OpMath<T>::type* part,
                 int64_t outer, int64_t L, int64_t inner, int slots, double p, Op op,
                 dim3 grid, dim3 block) {
  using A = typename OpMath<T>::type;
  const size_t smem = sizeof(A) * kBlock * V;
  channel_bwd_cols<T, V, Op><<<grid, block, smem, c10::cuda::getCurrentCUDAStream()>>>(
      gp, sp, pp, gxp, part, outer, L, inner, slots, static_cast<A>(p), op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Writes grad_x and returns the per-channel reduction [C] (float, or double for double input).
template <typename T, typename Op>
at::Tensor launch_channel_bwd(const at::Tensor& g, const at::Tensor& s, const at::Tensor& param,
                              at::Tensor& gx, int64_t C, int64_t inner, double p, Op op) {
  using A = typename OpMath<T>::type;
  constexpr int V = pack_width<T>();
  const auto acc_type = std::is_same<A, double>::value ? at::kDouble : at::kFloat;
  const auto opts = g.options().dtype(acc_type);
  const int64_t n = g.numel();
  if (n == 0) return at::zeros({C}, opts);
  const int64_t outer = n / (C * inner);
  const T* gp = g.const_data_ptr<T>();
  const T* sp = s.const_data_ptr<T>();
  const T* pp = param.const_data_ptr<T>();
  T* gxp = gx.mutable_data_ptr<T>();
  const bool aligned = aligned16(gp) && aligned16(sp) && aligned16(gxp);
  if (inner >= kRowsMinInner) {
    at::Tensor part = at::zeros({C, kSlots}, opts);
    A* pt = part.mutable_data_ptr<A>();
    if (aligned && inner % V == 0)
      launch_rows<T, V, Op>(gp, sp, pp, gxp, pt, outer * C, inner, C, p, op);
    else
      launch_rows<T, 1, Op>(gp, sp, pp, gxp, pt, outer * C, inner, C, p, op);
    return part.sum(1);
  }
  const int64_t L = C * inner;
  const bool vec = aligned && L % V == 0;
  dim3 grid, block;
  cols_shape<T>(outer, vec ? L / V : L, grid, block);
  // One block row stores [L] outright; several add into [slots, L] (zeroed), summed here.
  const int slots = static_cast<int>(std::min<unsigned>(grid.y, kSlots));
  at::Tensor part = slots == 1 ? at::empty({L}, opts) : at::zeros({slots, L}, opts);
  A* pt = part.mutable_data_ptr<A>();
  if (vec)
    launch_cols<T, V, Op>(gp, sp, pp, gxp, pt, outer, L, inner, slots, p, op, grid, block);
  else
    launch_cols<T, 1, Op>(gp, sp, pp, gxp, pt, outer, L, inner, slots, p, op, grid, block);
  if (slots == 1) return inner == 1 ? part : part.view({C, inner}).sum(1);
  return part.view({static_cast<int64_t>(slots), C, inner}).sum(at::IntArrayRef{0, 2});
}

void check_channels(const at::Tensor& x, const at::Tensor& param, int64_t C, int64_t inner,
                    const char* what) {
  TORCH_CHECK(C >= 1 && inner >= 1, what,
              ": C and inner must be >= 1, got " + num(C) + " and " + num(inner));
  TORCH_CHECK(x.numel() % (C * inner) == 0, what,
              ": " + num(x.numel()) + " elements do not split into [outer, " + num(C) + ", " +
                  num(inner) + "]");
  TORCH_CHECK(param.is_cuda() && param.device() == x.device(), what,
              ": the parameter must be on x's device");
  TORCH_CHECK(param.scalar_type() == x.scalar_type(), what, ": the parameter has dtype ",
              param.scalar_type(), " but x has ", x.scalar_type());
  TORCH_CHECK(param.is_contiguous() && param.numel() == C, what, ": the parameter must be a ",
              "contiguous tensor of " + num(C) + " elements, got " + shape(param.sizes()));
}

}  // namespace

void prelu_forward(const at::Tensor& x, const at::Tensor& slope, at::Tensor& out, int64_t C,
                   int64_t inner) {
  check_input(x);
  check_same(out, x, "out");
  check_channels(x, slope, C, inner, "prelu_forward");
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "prelu_fwd", [&] {
    launch_channel_fwd<scalar_t>(x, slope, out, C, inner, 0.0, PreluFwd{});
  });
}

at::Tensor prelu_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& slope,
                          at::Tensor& grad_x, int64_t C, int64_t inner) {
  check_input(x);
  check_same(g, x, "grad_out");
  check_same(grad_x, x, "grad_x");
  check_channels(x, slope, C, inner, "prelu_backward");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dslope;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "prelu_bwd", [&] {
    dslope = launch_channel_bwd<scalar_t>(g, x, slope, grad_x, C, inner, 0.0, PreluBwd{});
  });
  return dslope;
}

void bias_act_forward(const at::Tensor& x, const at::Tensor& bias, at::Tensor& out, int64_t C,
                      int64_t inner, int64_t kind, double p) {
  check_input(x);
  check_same(out, x, "out");
  check_channels(x, bias, C, inner, "bias_act_forward");
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_act_fwd", [&] {
    switch (kind) {
      case kRelu: launch_channel_fwd<scalar_t>(x, bias, out, C, inner, p, BiasActFwd<ReluFwd>{});
        break;
      case kElu: launch_channel_fwd<scalar_t>(x, bias, out, C, inner, p, BiasActFwd<EluFwd>{});
        break;
      case kSigmoid:
        launch_channel_fwd<scalar_t>(x, bias, out, C, inner, p, BiasActFwd<SigmoidFwd>{});
        break;
      case kTanh: launch_channel_fwd<scalar_t>(x, bias, out, C, inner, p, BiasActFwd<TanhFwd>{});
        break;
      default: TORCH_CHECK(false, "unknown activation kind " + num(kind));
    }
  });
}

// y is the forward's output; every kind here can take its derivative from y (ReLU with a
// slope >= 0, ELU with alpha >= 0: the Python side checks).
at::Tensor bias_act_backward(const at::Tensor& g, const at::Tensor& y, const at::Tensor& bias,
                             at::Tensor& grad_x, int64_t C, int64_t inner, int64_t kind,
                             double p) {
  check_input(y);
  check_same(g, y, "grad_out");
  check_same(grad_x, y, "grad_x");
  check_channels(y, bias, C, inner, "bias_act_backward");
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor dbias;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "bias_act_bwd", [&] {
    switch (kind) {
      case kRelu:
        dbias = launch_channel_bwd<scalar_t>(g, y, bias, grad_x, C, inner, p,
                                             BiasActBwd<ReluBwd>{});
        break;
      case kElu:
        dbias = launch_channel_bwd<scalar_t>(g, y, bias, grad_x, C, inner, p,
                                             BiasActBwd<EluBwdFromOutput>{});
        break;
      case kSigmoid:
        dbias = launch_channel_bwd<scalar_t>(g, y, bias, grad_x, C, inner, p,
                                             BiasActBwd<SigmoidBwd>{});
        break;
      case kTanh:
        dbias = launch_channel_bwd<scalar_t>(g, y, bias, grad_x, C, inner, p,
                                             BiasActBwd<TanhBwd>{});
        break;
      default: TORCH_CHECK(false, "unknown activation kind " + num(kind));
    }
  });
  return dbias;
}

}  // namespace caffe_py
