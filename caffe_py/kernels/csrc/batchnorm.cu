// Training BatchNorm (batch statistics) with the Scale folded into it, optionally a residual r
// added after it (the Eltwise SUM of a residual block) and the ReLU after that, on tensors whose
// channel is their fastest axis (channels_last, or an (N, C) matrix), seen as [M, C] matrices.
// Three passes each way:
//   forward:  reduce   the per-channel sums of d = x - x[0, c] and of d * d (the first row is
//                      the shift: sums about a value near the mean keep the variance accurate);
//             finalize mean, biased variance, rstd = 1 / sqrt(var + eps), the affine
//                      a = gamma * rstd and b = beta - mean * a, and Caffe's running sums;
//             apply    y = relu_p(x * a + b [+ r]).
//   backward: reduce   dz = dy where x * a + b [+ r] > 0 (p * dy elsewhere, 0 for ReLU): the
//                      sums of dz and of dz * (x - mean);
//             finalize dbeta = sum dz, dgamma = rstd * sum dz (x - mean), and the coefficients
//                      of dx = a * dz + k * (x - mean) + d, k = -a rstd^2 sum dz (x - mean) / M,
//                      d = -a sum dz / M (BatchNorm's backward with Scale's dgamma and dbeta);
//             apply    dx (and dr = dz, the residual's gradient).
// The ReLU's mask is recomputed from x (and r) with the forward's own arithmetic, so the
// backward reads x and dy (and r) only, as BatchNorm's alone does, and y is never saved.
//
// The heavy passes share one launch: a thread owns one pack of V channels (V = 16 bytes), keeps
// that pack's per-channel numbers in registers and walks down the rows with U packs in flight;
// block (tx, ty), tx packs across and ty rows down, about one wave of blocks. A reduction's
// block sums its rows in shared memory and writes its own partial row of [rows, 2, C]; the
// finalize kernel adds the partial rows in a fixed order. There are no atomics, so every run
// gives the same bits.
#include "common.cuh"

namespace caffe_py {
namespace {

// float, half and bfloat16 (a double tensor takes PyTorch's path).
#define CAFFE_PY_DISPATCH_BN(TYPE, NAME, ...)                    \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                 \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)   \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)    \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

// Per-channel rows of the forward's coefficient tensor [kCoefRows, C] (float).
enum CoefRow : int { kA = 0, kB = 1, kMean = 2, kRstd = 3, kCoefRows = 4 };
// Rows of the backward's [kGradRows, C]: the parameter gradients, then dx's coefficients.
enum GradRow : int { kDgamma = 0, kDbeta = 1, kK = 2, kD = 3, kGradRows = 4 };

// Resident 256-thread blocks the register cap allows: 4 for the forward passes (64 registers),
// 3 for the forward apply with a residual, 2 for the backward's (three numbers per channel
// kept, two or three tensors read).
constexpr int kFwdBlocks = 4;
constexpr int kFwdResidualBlocks = 3;  // the apply with a residual reads two tensors
constexpr int kBwdBlocks = 2;

// The activation's input: x * a + b, plus the residual when there is one (R), the same float
// operations in every pass so that the backward's mask is the forward's.
template <bool R>
__device__ __forceinline__ float pre_act(float x, float a, float b, float r) {
  if constexpr (R) {
    return fmaf(x, a, b) + r;
  } else {
    return fmaf(x, a, b);
  }
}

// ReLU with slope p, written as common.cuh's ReluFwd / ReluBwd (NaN kept, 0 for -inf).
__device__ __forceinline__ float relu_fwd(float z, float p) { return ReluFwd{}(z, p); }
__device__ __forceinline__ float relu_bwd(float g, float z, float p) {
  return ReluBwd{}(g, z, p);
}

// Block (tx, ty) and grid (gx, gy) over an [M, cp] matrix of packs: tx the power of two >= cp
// (at most 32), about one full wave of blocks, no more block rows than the rows need.
struct Grid {
  dim3 grid;
  dim3 block;
};

template <typename T>
Grid bn_grid(int64_t M, int64_t cp) {
  constexpr int U = Unroll<T>::value;
  int tx = 1;
  while (tx < 32 && tx < cp) tx *= 2;
  const int ty = kBlock / tx;
  const int64_t gx = (cp + tx - 1) / tx;
  TORCH_CHECK(gx <= INT32_MAX, "a row of " + num(cp) + " packs is too long");
  const int64_t rows_needed = (M + static_cast<int64_t>(ty) * U - 1) / (ty * U);
  const int64_t want = (wave_blocks() + gx - 1) / gx;
  const int64_t gy = std::max<int64_t>(1, std::min({want, rows_needed, int64_t{65535}}));
  return Grid{dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(tx, ty)};
}

// The block's sums of s1 and s2 (V each per thread), halved along ty in shared memory; thread
// row 0 writes them as the block row's partial: part[blockIdx.y][0 | 1][col * V + k].
template <int V>
__device__ __forceinline__ void write_partial(const float (&s1)[V], const float (&s2)[V],
                                              float* part, int64_t C, int64_t col, bool active) {
  extern __shared__ float sh[];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    sh[(2 * tid) * V + k] = s1[k];
    sh[(2 * tid + 1) * V + k] = s2[k];
  }
  __syncthreads();
  for (int half = static_cast<int>(blockDim.y) / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = tid + half * static_cast<int>(blockDim.x);
#pragma unroll
      for (int k = 0; k < 2 * V; ++k) sh[2 * tid * V + k] += sh[2 * other * V + k];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
    float* row = part + static_cast<int64_t>(blockIdx.y) * 2 * C;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      row[col * V + k] = sh[2 * threadIdx.x * V + k];
      row[C + col * V + k] = sh[(2 * threadIdx.x + 1) * V + k];
    }
  }
}

// Forward reduce: sums of x - x[0, c] and its square. Requires C % V == 0.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock, kFwdBlocks)
bn_stats(const T* x, float* part, int64_t M, int64_t C) {
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t cp = C / V;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = col < cp;
  const P* xv = reinterpret_cast<const P*>(x);
  float shift[V], s1[V], s2[V];
  {
    P first;
    if (active) first = xv[col];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      shift[k] = active ? static_cast<float>(first.v[k]) : 0.0f;
      s1[k] = 0.0f;
      s2[k] = 0.0f;
    }
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < M;
       r0 += step * U) {
    P in[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (active && row < M) in[u] = xv[row * cp + col];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (active && r0 + u * step < M) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = static_cast<float>(in[u].v[k]) - shift[k];
          s1[k] += d;
          s2[k] = fmaf(d, d, s2[k]);
        }
      }
    }
  }
  write_partial<V>(s1, s2, part, C, col, active);
}

// Backward reduce: dz = relu'(dy) at x * a + b [+ r]; sums of dz and dz * (x - mean).
template <typename T, int V, bool R>
__global__ void __launch_bounds__(kBlock, kBwdBlocks)
bn_grad_sums(const T* g, const T* x, const T* r, const float* coef, float* part, int64_t M,
             int64_t C, float p) {
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t cp = C / V;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = col < cp;
  const P* gv = reinterpret_cast<const P*>(g);
  const P* xv = reinterpret_cast<const P*>(x);
  const P* rv = reinterpret_cast<const P*>(r);
  float a[V], b[V], mean[V], s1[V], s2[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = active ? col * V + k : 0;
    a[k] = coef[kA * C + c];
    b[k] = coef[kB * C + c];
    mean[k] = coef[kMean * C + c];
    s1[k] = 0.0f;
    s2[k] = 0.0f;
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < M;
       r0 += step * U) {
    P gin[U], xin[U], rin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (active && row < M) {
        gin[u] = gv[row * cp + col];
        xin[u] = xv[row * cp + col];
        if constexpr (R) rin[u] = rv[row * cp + col];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (active && r0 + u * step < M) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xk = static_cast<float>(xin[u].v[k]);
          const float rk = R ? static_cast<float>(rin[u].v[k]) : 0.0f;
          const float dz = relu_bwd(static_cast<float>(gin[u].v[k]),
                                    pre_act<R>(xk, a[k], b[k], rk), p);
          s1[k] += dz;
          s2[k] = fmaf(dz, xk - mean[k], s2[k]);
        }
      }
    }
  }
  write_partial<V>(s1, s2, part, C, col, active);
}

// The sums of a reduction's partial rows for channel c, in a fixed order: block (32, 32), 32
// channels across, each thread row adding every 32nd partial row, then a halving tree.
__device__ __forceinline__ bool channel_sums(const float* part, int rows, int64_t C,
                                             double& s1, double& s2) {
  __shared__ double sh[32][32][2];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double a1 = 0.0, a2 = 0.0;
  if (c < C) {
    for (int r = threadIdx.y; r < rows; r += 32) {
      a1 += part[static_cast<int64_t>(r) * 2 * C + c];
      a2 += part[static_cast<int64_t>(r) * 2 * C + C + c];
    }
  }
  sh[threadIdx.y][threadIdx.x][0] = a1;
  sh[threadIdx.y][threadIdx.x][1] = a2;
  __syncthreads();
  for (int half = 16; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.y) < half) {
      sh[threadIdx.y][threadIdx.x][0] += sh[threadIdx.y + half][threadIdx.x][0];
      sh[threadIdx.y][threadIdx.x][1] += sh[threadIdx.y + half][threadIdx.x][1];
    }
    __syncthreads();
  }
  s1 = sh[0][threadIdx.x][0];
  s2 = sh[0][threadIdx.x][1];
  return threadIdx.y == 0 && c < C;
}

// Forward finalize. gamma and beta may be null (a BatchNorm with no Scale folded in).
// Running sums as BatchNorm's Python path updates them: s = maf * s + batch (two roundings),
// count = maf * count + 1, the variance unbiased (m / (m - 1)).
template <typename T>
__global__ void __launch_bounds__(1024)
bn_stats_finalize(const float* part, int rows, const T* x, const float* gamma, const float* beta,
                  int64_t M, int64_t C, float eps, float maf, float* coef, float* mean_sum,
                  float* var_sum, float* count) {
  double s1, s2;
  if (!channel_sums(part, rows, C, s1, s2)) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const double m = static_cast<double>(M);
  const double d = s1 / m;
  const double var = fmax(s2 / m - d * d, 0.0);
  const float mean = static_cast<float>(static_cast<double>(static_cast<float>(x[c])) + d);
  const float rstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  const float a = gamma ? gamma[c] * rstd : rstd;
  coef[kA * C + c] = a;
  coef[kB * C + c] = (beta ? beta[c] : 0.0f) - mean * a;
  coef[kMean * C + c] = mean;
  coef[kRstd * C + c] = rstd;
  const float unbiased = static_cast<float>(var * m / (m - 1.0));
  mean_sum[c] = __fadd_rn(__fmul_rn(maf, mean_sum[c]), mean);
  var_sum[c] = __fadd_rn(__fmul_rn(maf, var_sum[c]), unbiased);
  if (c == 0) count[0] = __fadd_rn(__fmul_rn(maf, count[0]), 1.0f);
}

// Backward finalize: the parameter gradients and dx's coefficients k and d.
__global__ void __launch_bounds__(1024)
bn_grad_finalize(const float* part, int rows, const float* coef, int64_t M, int64_t C,
                 float* grad) {
  double s1, s2;
  if (!channel_sums(part, rows, C, s1, s2)) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const double m = static_cast<double>(M);
  const double a = coef[kA * C + c];
  const double rstd = coef[kRstd * C + c];
  grad[kDgamma * C + c] = static_cast<float>(rstd * s2);
  grad[kDbeta * C + c] = static_cast<float>(s1);
  grad[kK * C + c] = static_cast<float>(-a * rstd * rstd * s2 / m);
  grad[kD * C + c] = static_cast<float>(-a * s1 / m);
}

// Forward apply: y = relu_p(x * a + b [+ r]).
template <typename T, int V, bool R>
__global__ void __launch_bounds__(kBlock, R ? kFwdResidualBlocks : kFwdBlocks)
bn_apply(const T* x, const T* r, const float* coef, T* y, int64_t M, int64_t C, float p) {
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t cp = C / V;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cp) return;
  const P* xv = reinterpret_cast<const P*>(x);
  const P* rv = reinterpret_cast<const P*>(r);
  P* yv = reinterpret_cast<P*>(y);
  float a[V], b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    a[k] = coef[kA * C + col * V + k];
    b[k] = coef[kB * C + col * V + k];
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < M;
       r0 += step * U) {
    P in[U], rin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (row < M) {
        in[u] = xv[row * cp + col];
        if constexpr (R) rin[u] = rv[row * cp + col];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (row < M) {
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float rk = R ? static_cast<float>(rin[u].v[k]) : 0.0f;
          out.v[k] = static_cast<T>(
              relu_fwd(pre_act<R>(static_cast<float>(in[u].v[k]), a[k], b[k], rk), p));
        }
        yv[row * cp + col] = out;
      }
    }
  }
}

// Backward apply: dx = a * dz + k * (x - mean) + d, and dr = dz with a residual.
template <typename T, int V, bool R>
__global__ void __launch_bounds__(kBlock, kBwdBlocks)
bn_grad_apply(const T* g, const T* x, const T* r, const float* coef, const float* grad, T* dx,
              T* dr, int64_t M, int64_t C, float p) {
  using P = Pack<T, V>;
  constexpr int U = Unroll<T>::value;
  const int64_t cp = C / V;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cp) return;
  const P* gv = reinterpret_cast<const P*>(g);
  const P* xv = reinterpret_cast<const P*>(x);
  const P* rv = reinterpret_cast<const P*>(r);
  P* dv = reinterpret_cast<P*>(dx);
  P* drv = reinterpret_cast<P*>(dr);
  float a[V], b[V], mean[V], kk[V], d[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = col * V + k;
    a[k] = coef[kA * C + c];
    b[k] = coef[kB * C + c];
    mean[k] = coef[kMean * C + c];
    kk[k] = grad[kK * C + c];
    d[k] = grad[kD * C + c];
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < M;
       r0 += step * U) {
    P gin[U], xin[U], rin[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (row < M) {
        gin[u] = gv[row * cp + col];
        xin[u] = xv[row * cp + col];
        if constexpr (R) rin[u] = rv[row * cp + col];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = r0 + u * step;
      if (row < M) {
        P out, rout;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xk = static_cast<float>(xin[u].v[k]);
          const float rk = R ? static_cast<float>(rin[u].v[k]) : 0.0f;
          const float dz = relu_bwd(static_cast<float>(gin[u].v[k]),
                                    pre_act<R>(xk, a[k], b[k], rk), p);
          out.v[k] = static_cast<T>(fmaf(a[k], dz, fmaf(kk[k], xk - mean[k], d[k])));
          if constexpr (R) rout.v[k] = static_cast<T>(dz);
        }
        dv[row * cp + col] = out;
        if constexpr (R) drv[row * cp + col] = rout;
      }
    }
  }
}

// The channel is x's fastest axis: an (N, C) matrix, or channels_last with C = size(1).
void check_rows(const at::Tensor& x, int64_t C, const char* what) {
  TORCH_CHECK(x.is_cuda(), what, ": x must be a CUDA tensor");
  TORCH_CHECK(x.dim() >= 2 && x.size(1) == C, what,
              ": x must have " + num(C) + " channels on axis 1");
  TORCH_CHECK((C == 1 || x.stride(1) == 1) && x.is_non_overlapping_and_dense() &&
                  (x.dim() == 2 ? x.is_contiguous()
                   : x.dim() == 4 ? x.is_contiguous(at::MemoryFormat::ChannelsLast)
                   : x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d)),
              what, ": x must be an (N, C) matrix or channels_last");
  TORCH_CHECK(x.numel() / C >= 2, what, ": batch statistics need at least 2 values a channel");
}

void check_float(const at::Tensor& t, int64_t n, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == x.device(), name, " must be on x's device");
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, name,
              " must be a contiguous float tensor of " + num(n) + " elements, got ",
              t.scalar_type(), " " + shape(t.sizes()));
}

// Every tensor's pointer 16-byte aligned and whole packs per row: the vector kernels apply.
template <typename T>
bool packs_fit(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % pack_width<T>() != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

template <typename T, int V, bool R>
void forward_v(const at::Tensor& x, const T* r, const float* gamma, const float* beta,
               at::Tensor& y, at::Tensor& coef, at::Tensor& mean_sum, at::Tensor& var_sum,
               at::Tensor& count, double eps, double maf, double p) {
  const int64_t C = x.size(1);
  const int64_t M = x.numel() / C;
  const Grid shape = bn_grid<T>(M, C / V);
  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor part = at::empty({static_cast<int64_t>(shape.grid.y), 2, C},
                              x.options().dtype(at::kFloat));
  const size_t smem = sizeof(float) * 2 * kBlock * V;
  bn_stats<T, V><<<shape.grid, shape.block, smem, stream>>>(
      x.const_data_ptr<T>(), part.mutable_data_ptr<float>(), M, C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const unsigned fin = static_cast<unsigned>((C + 31) / 32);
  bn_stats_finalize<T><<<fin, dim3(32, 32), 0, stream>>>(
      part.const_data_ptr<float>(), static_cast<int>(shape.grid.y), x.const_data_ptr<T>(), gamma,
      beta, M, C, static_cast<float>(eps), static_cast<float>(maf),
      coef.mutable_data_ptr<float>(), mean_sum.mutable_data_ptr<float>(),
      var_sum.mutable_data_ptr<float>(), count.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  bn_apply<T, V, R><<<shape.grid, shape.block, 0, stream>>>(
      x.const_data_ptr<T>(), r, coef.const_data_ptr<float>(), y.mutable_data_ptr<T>(), M, C,
      static_cast<float>(p));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int V, bool R>
void backward_v(const at::Tensor& g, const at::Tensor& x, const T* r, const at::Tensor& coef,
                at::Tensor& grad, at::Tensor& dx, T* dr, double p) {
  const int64_t C = x.size(1);
  const int64_t M = x.numel() / C;
  const Grid shape = bn_grid<T>(M, C / V);
  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor part = at::empty({static_cast<int64_t>(shape.grid.y), 2, C},
                              x.options().dtype(at::kFloat));
  const size_t smem = sizeof(float) * 2 * kBlock * V;
  bn_grad_sums<T, V, R><<<shape.grid, shape.block, smem, stream>>>(
      g.const_data_ptr<T>(), x.const_data_ptr<T>(), r, coef.const_data_ptr<float>(),
      part.mutable_data_ptr<float>(), M, C, static_cast<float>(p));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const unsigned fin = static_cast<unsigned>((C + 31) / 32);
  bn_grad_finalize<<<fin, dim3(32, 32), 0, stream>>>(
      part.const_data_ptr<float>(), static_cast<int>(shape.grid.y), coef.const_data_ptr<float>(),
      M, C, grad.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  bn_grad_apply<T, V, R><<<shape.grid, shape.block, 0, stream>>>(
      g.const_data_ptr<T>(), x.const_data_ptr<T>(), r, coef.const_data_ptr<float>(),
      grad.const_data_ptr<float>(), dx.mutable_data_ptr<T>(), dr, M, C, static_cast<float>(p));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The launches for x's pack width (or one element when C or a pointer does not fit the
// packs), with or without the residual.
template <typename T, typename Launch>
void by_width(int64_t C, bool residual, std::initializer_list<const void*> ptrs, Launch launch) {
  constexpr int V = pack_width<T>();
  const bool vec = packs_fit<T>(C, ptrs);
  if (vec && residual)
    launch(std::integral_constant<int, V>{}, std::true_type{});
  else if (vec)
    launch(std::integral_constant<int, V>{}, std::false_type{});
  else if (residual)
    launch(std::integral_constant<int, 1>{}, std::true_type{});
  else
    launch(std::integral_constant<int, 1>{}, std::false_type{});
}

}  // namespace

// Writes y and updates the running sums; returns the coefficients [4, C] (a, b, mean, rstd)
// that the backward reads. gamma and beta: both float [C], or both absent; the residual, when
// given, has x's shape, dtype and layout and is added before the activation.
at::Tensor bn_relu_forward(const at::Tensor& x, const c10::optional<at::Tensor>& gamma,
                           const c10::optional<at::Tensor>& beta,
                           const c10::optional<at::Tensor>& residual, at::Tensor& y,
                           at::Tensor& mean_sum, at::Tensor& var_sum, at::Tensor& count,
                           double eps, double maf, double p) {
  const int64_t C = x.dim() >= 2 ? x.size(1) : 0;
  check_rows(x, C, "bn_relu_forward");
  check_same(y, x, "y");
  if (residual.has_value()) check_same(*residual, x, "residual");
  TORCH_CHECK(gamma.has_value() == beta.has_value(), "bn_relu_forward: give gamma and beta "
              "together");
  if (gamma.has_value()) {
    check_float(*gamma, C, x, "gamma");
    check_float(*beta, C, x, "beta");
  }
  check_float(mean_sum, C, x, "mean_sum");
  check_float(var_sum, C, x, "var_sum");
  check_float(count, 1, x, "count");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor coef = at::empty({kCoefRows, C}, x.options().dtype(at::kFloat));
  const float* gp = gamma.has_value() ? gamma->const_data_ptr<float>() : nullptr;
  const float* bp = beta.has_value() ? beta->const_data_ptr<float>() : nullptr;
  CAFFE_PY_DISPATCH_BN(x.scalar_type(), "bn_relu_fwd", [&] {
    const scalar_t* rp = residual.has_value() ? residual->const_data_ptr<scalar_t>() : nullptr;
    by_width<scalar_t>(C, rp != nullptr, {x.const_data_ptr(), y.const_data_ptr(), rp},
                       [&](auto v, auto r) {
                         forward_v<scalar_t, decltype(v)::value, decltype(r)::value>(
                             x, rp, gp, bp, y, coef, mean_sum, var_sum, count, eps, maf, p);
                       });
  });
  return coef;
}

// Writes dx (and dr, the residual's gradient, when the forward had one); returns [4, C] float
// whose rows 0 and 1 are dgamma and dbeta.
at::Tensor bn_relu_backward(const at::Tensor& g, const at::Tensor& x,
                            const c10::optional<at::Tensor>& residual, const at::Tensor& coef,
                            at::Tensor& dx, const c10::optional<at::Tensor>& dr, double p) {
  const int64_t C = x.dim() >= 2 ? x.size(1) : 0;
  check_rows(x, C, "bn_relu_backward");
  check_same(g, x, "grad_out");
  check_same(dx, x, "dx");
  TORCH_CHECK(residual.has_value() == dr.has_value(), "bn_relu_backward: give the residual and "
              "its gradient together");
  if (residual.has_value()) {
    check_same(*residual, x, "residual");
    check_same(*dr, x, "dr");
  }
  check_float(coef, kCoefRows * C, x, "coef");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor grad = at::empty({kGradRows, C}, x.options().dtype(at::kFloat));
  CAFFE_PY_DISPATCH_BN(x.scalar_type(), "bn_relu_bwd", [&] {
    const scalar_t* rp = residual.has_value() ? residual->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* drp = dr.has_value() ? dr->data_ptr<scalar_t>() : nullptr;
    by_width<scalar_t>(C, rp != nullptr,
                       {g.const_data_ptr(), x.const_data_ptr(), dx.const_data_ptr(), rp, drp},
                       [&](auto v, auto r) {
                         backward_v<scalar_t, decltype(v)::value, decltype(r)::value>(
                             g, x, rp, coef, grad, dx, drp, p);
                       });
  });
  return grad;
}

}  // namespace caffe_py
