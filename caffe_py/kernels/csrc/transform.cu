// Caffe's data transform of a batch of whole records on the GPU in one kernel: each record's
// crop window at its own offset, mirrored where its flip says, channels reversed for a decoder's
// RGB, the mean subtracted and the scale applied, into a float32 batch.
//
//   out[b, c, y, x] = (in[b, c', h0 + y, w0 + x'] - mean[c, h0 + y, w0 + x']) * scale
//   x' = flip ? w - 1 - x : x        c' = reverse ? C - 1 - c : c
//
// where (h0, w0, flip) is record b's row of `where`. The mean is read at the source pixel, as
// Caffe's data_transformer.cpp reads mean[data_index]; a per-channel mean (mean_value) is one
// value per output channel. The arithmetic is the reference's (Transformer.device_crop, then
// Transformer.device: a float32 subtraction, then a float32 multiply, each rounded once), so
// the results are the same bits; the intrinsics keep the compiler from fusing the two.
//
// Before this kernel the feed ran an advanced-indexing gather, the mean's own gather, the
// subtraction and the scale: four passes and about 1.6 ms of GPU time a ResNet-50 batch,
// taken from the training kernels it runs beside.
#include "common.cuh"

namespace caffe_py {
namespace {

enum MeanKind : int { kNoMean = 0, kChannelMean = 1, kPixelMean = 2 };

template <typename T>
__global__ void crop_transform_kernel(const T* __restrict__ in, const int* __restrict__ where,
                                      const float* __restrict__ mean, float* __restrict__ out,
                                      int C, int H, int W, int h, int w, int mean_kind,
                                      float scale, bool apply_scale, bool reverse) {
  const int64_t bc = blockIdx.x;  // record b, output channel c
  const int y = blockIdx.y;
  const int64_t b = bc / C;
  const int c = static_cast<int>(bc - b * C);
  const int h0 = where[3 * b], w0 = where[3 * b + 1];
  const bool flip = where[3 * b + 2] != 0;
  const int src_c = reverse ? C - 1 - c : c;
  const T* row = in + ((b * C + src_c) * H + h0 + y) * static_cast<int64_t>(W) + w0;
  const float* mean_row =
      mean_kind == kPixelMean ? mean + (static_cast<int64_t>(c) * H + h0 + y) * W + w0 : nullptr;
  const float channel_mean = mean_kind == kChannelMean ? mean[c] : 0.f;
  float* dst = out + (bc * h + y) * static_cast<int64_t>(w);
  for (int x = threadIdx.x; x < w; x += blockDim.x) {
    const int xs = flip ? w - 1 - x : x;
    float v = static_cast<float>(row[xs]);
    if (mean_kind == kPixelMean) {
      v = __fsub_rn(v, mean_row[xs]);
    } else if (mean_kind == kChannelMean) {
      v = __fsub_rn(v, channel_mean);
    }
    dst[x] = apply_scale ? __fmul_rn(v, scale) : v;
  }
}

}  // namespace

void crop_transform(const at::Tensor& in, const at::Tensor& where,
                    const c10::optional<at::Tensor>& mean, double scale, bool reverse,
                    at::Tensor& out) {
  TORCH_CHECK(in.is_cuda() && in.dim() == 4 && in.is_contiguous(),
              "records must be a contiguous (B, C, H, W) CUDA tensor");
  TORCH_CHECK(in.scalar_type() == at::kByte || in.scalar_type() == at::kFloat,
              "records must be uint8 or float32, got ", in.scalar_type());
  TORCH_CHECK(out.is_cuda() && out.dim() == 4 && out.is_contiguous() &&
                  out.scalar_type() == at::kFloat,
              "out must be a contiguous float32 (B, C, h, w) CUDA tensor");
  const int64_t B = in.size(0), C = in.size(1), H = in.size(2), W = in.size(3);
  const int64_t h = out.size(2), w = out.size(3);
  TORCH_CHECK(out.size(0) == B && out.size(1) == C && h <= H && w <= W,
              "out must be (B, C, h, w) with h <= H and w <= W");
  TORCH_CHECK(where.is_cuda() && where.scalar_type() == at::kInt && where.is_contiguous() &&
                  where.dim() == 2 && where.size(0) == B && where.size(1) == 3,
              "where must be a contiguous (B, 3) int32 CUDA tensor of (h0, w0, flip)");
  TORCH_CHECK(h <= 65535, "crop height above 65535");
  int kind = kNoMean;
  const float* mp = nullptr;
  if (mean.has_value()) {
    const at::Tensor& m = *mean;
    TORCH_CHECK(m.is_cuda() && m.scalar_type() == at::kFloat && m.is_contiguous(),
                "mean must be a contiguous float32 CUDA tensor");
    if (m.numel() == C) {
      kind = kChannelMean;
    } else {
      TORCH_CHECK(m.numel() == C * H * W, "mean must hold C or C * H * W values");
      kind = kPixelMean;
    }
    mp = m.data_ptr<float>();
  }
  if (B == 0 || h == 0 || w == 0) return;
  const c10::cuda::CUDAGuard guard(in.device());
  const dim3 grid(static_cast<unsigned>(B * C), static_cast<unsigned>(h));
  const int threads = static_cast<int>(std::min<int64_t>(256, (w + 31) / 32 * 32));
  const float s = static_cast<float>(scale);
  const bool apply = s != 1.f;
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (in.scalar_type() == at::kByte) {
    crop_transform_kernel<uint8_t><<<grid, threads, 0, stream>>>(
        in.data_ptr<uint8_t>(), where.data_ptr<int>(), mp, out.data_ptr<float>(),
        static_cast<int>(C), static_cast<int>(H), static_cast<int>(W), static_cast<int>(h),
        static_cast<int>(w), kind, s, apply, reverse);
  } else {
    crop_transform_kernel<float><<<grid, threads, 0, stream>>>(
        in.data_ptr<float>(), where.data_ptr<int>(), mp, out.data_ptr<float>(),
        static_cast<int>(C), static_cast<int>(H), static_cast<int>(W), static_cast<int>(h),
        static_cast<int>(w), kind, s, apply, reverse);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace caffe_py
