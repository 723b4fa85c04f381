// Caffe's SoftmaxWithLoss on (N, C) float scores in one kernel each way (a launch-bound step
// paid for seven: the label check's three, the clamp, log_softmax, nll_loss, the clamp and the
// mean forward; exp, scatter and the scale backward).
//
// Forward: one warp per row computes Caffe's probabilities (x - max, exp, / sum) into `prob`
// (kept for the backward), the row's loss -log(max(p_label, FLT_MIN)) and whether the row
// counts (its label is not ignore_label); a label outside [0, C) is clamped for the read and
// its value folded into seen = [min, max] (atomics: the order does not matter for a min or a
// max), which the solver reads every few iterations. The last block to finish (a counter the
// blocks increment after a fence) sums the rows' losses and counts in a fixed order, so the
// result is the same on every run, writes loss / divisor and the divisor, and resets the
// counter for the next launch (or graph replay). The divisor is the host's (FULL, BATCH_SIZE,
// NONE, or VALID without an ignore_label) or the count of rows that count (VALID), at least 1.
//
// Backward: dx = (prob - onehot(label)) * (grad / divisor), zero on ignored rows: Caffe's
// gradient, also where the FLT_MIN floor holds.
//
// The autograd Function around the two launches is C++ (bindings.cpp, SoftmaxLossFunction):
// a Python Function's own overhead each way cost more host time than the kernels saved.
#include "common.cuh"

namespace caffe_py {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kFwdThreads = kRowsPerBlock * 32;
constexpr float kFltMin = 1.17549435e-38f;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int64_t clamped(int64_t t, int64_t C) {
  return t < 0 ? 0 : (t >= C ? C - 1 : t);
}

__global__ void __launch_bounds__(kFwdThreads)
softmax_loss_fwd_kernel(const float* __restrict__ x, const int64_t* __restrict__ label,
                        float* __restrict__ prob, float* __restrict__ row_loss,
                        float* __restrict__ row_count, long long* __restrict__ seen,
                        unsigned int* __restrict__ done, float* __restrict__ loss_out,
                        float* __restrict__ div_out, int64_t N,
                        int64_t C, int64_t ignore, bool has_ignore, float divisor,
                        bool count_valid) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row < N) {
    const float* xr = x + row * C;
    float m = -__int_as_float(0x7f800000);  // -inf
    for (int64_t c = lane; c < C; c += 32) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float s = 0.f;
    for (int64_t c = lane; c < C; c += 32) s += expf(xr[c] - m);
    s = warp_sum(s);
    float* pr = prob + row * C;
    for (int64_t c = lane; c < C; c += 32) pr[c] = expf(xr[c] - m) / s;
    if (lane == 0) {
      const int64_t t = label[row];
      const bool counts = !(has_ignore && t == ignore);
      float loss = 0.f;
      if (counts) {
        if (seen != nullptr) {
          atomicMin(seen, static_cast<long long>(t));
          atomicMax(seen + 1, static_cast<long long>(t));
        }
        loss = -logf(fmaxf(expf(xr[clamped(t, C)] - m) / s, kFltMin));
      }
      row_loss[row] = loss;
      row_count[row] = counts ? 1.f : 0.f;
    }
  }
  __shared__ bool last;
  __threadfence();  // this block's rows are visible before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __shared__ float sum_loss[kFwdThreads], sum_count[kFwdThreads];
  float l = 0.f, n = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += kFwdThreads) {
    l += __ldcg(row_loss + i);  // past L1: other blocks wrote these
    n += __ldcg(row_count + i);
  }
  sum_loss[threadIdx.x] = l;
  sum_count[threadIdx.x] = n;
  __syncthreads();
  for (int o = kFwdThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      sum_loss[threadIdx.x] += sum_loss[threadIdx.x + o];
      sum_count[threadIdx.x] += sum_count[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float d = count_valid ? fmaxf(sum_count[0], 1.f) : divisor;
    *loss_out = sum_loss[0] / d;
    *div_out = d;
    *done = 0u;
  }
}

__global__ void softmax_loss_bwd_kernel(const float* __restrict__ prob,
                                        const int64_t* __restrict__ label,
                                        const float* __restrict__ grad,
                                        const float* __restrict__ div, float* __restrict__ dx,
                                        int64_t N, int64_t C, int64_t ignore, bool has_ignore) {
  const float scale = grad[0] / div[0];
  const int64_t n = N * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t row = i / C;
    const int64_t t = label[row];
    float v = 0.f;
    if (!(has_ignore && t == ignore))
      v = (prob[i] - (i - row * C == clamped(t, C) ? 1.f : 0.f)) * scale;
    dx[i] = v;
  }
}

void check(const at::Tensor& t, at::ScalarType type, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == type, name, " must be ", type, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

void softmax_loss_forward(const at::Tensor& x, const at::Tensor& label, at::Tensor& prob,
                          at::Tensor& work, at::Tensor& done, at::Tensor& loss,
                          at::Tensor& div, const c10::optional<at::Tensor>& seen, int64_t ignore,
                          bool has_ignore, double divisor, bool count_valid) {
  check(x, at::kFloat, "x");
  check(label, at::kLong, "label");
  check(prob, at::kFloat, "prob");
  check(work, at::kFloat, "work");
  check(done, at::kInt, "done");
  check(loss, at::kFloat, "loss");
  check(div, at::kFloat, "div");
  TORCH_CHECK(x.dim() == 2 && label.numel() == x.size(0), "x must be (N, C) with N labels");
  const int64_t N = x.size(0), C = x.size(1);
  TORCH_CHECK(N > 0 && C > 0, "x must not be empty");
  TORCH_CHECK(prob.numel() == N * C && work.numel() >= 2 * N && loss.numel() == 1 &&
              div.numel() == 1 && done.numel() == 1, "prob, work, loss, div or done has the "
              "wrong size");
  long long* seen_p = nullptr;
  if (seen.has_value()) {
    check(*seen, at::kLong, "seen");
    TORCH_CHECK(seen->numel() == 2, "seen must hold [min, max]");
    seen_p = reinterpret_cast<long long*>(seen->data_ptr<int64_t>());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
  float* w = work.data_ptr<float>();
  softmax_loss_fwd_kernel<<<blocks, kFwdThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), label.data_ptr<int64_t>(), prob.data_ptr<float>(), w, w + N, seen_p,
      reinterpret_cast<unsigned int*>(done.data_ptr<int32_t>()), loss.data_ptr<float>(),
      div.data_ptr<float>(), N, C,
      ignore, has_ignore, static_cast<float>(divisor), count_valid);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void softmax_loss_backward(const at::Tensor& prob, const at::Tensor& label,
                           const at::Tensor& grad, const at::Tensor& div, at::Tensor& dx,
                           int64_t ignore, bool has_ignore) {
  check(prob, at::kFloat, "prob");
  check(label, at::kLong, "label");
  check(grad, at::kFloat, "grad");
  check(div, at::kFloat, "div");
  check(dx, at::kFloat, "dx");
  TORCH_CHECK(grad.numel() == 1 && div.numel() == 1, "grad and div must hold one value");
  TORCH_CHECK(prob.dim() == 2 && dx.sizes() == prob.sizes(), "dx must match prob (N, C)");
  const int64_t N = prob.size(0), C = prob.size(1);
  const c10::cuda::CUDAGuard guard(prob.device());
  const int threads = 256;
  const int64_t want = (N * C + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, 4096)));
  softmax_loss_bwd_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      prob.data_ptr<float>(), label.data_ptr<int64_t>(), grad.data_ptr<float>(),
      div.data_ptr<float>(), dx.data_ptr<float>(), N, C, ignore, has_ignore);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace caffe_py
