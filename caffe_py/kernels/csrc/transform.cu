// Caffe's data transform of a batch on the GPU in one kernel, float32 out:
//
// - whole records (crop_transform): each record's crop window at its own offset, mirrored
//   where its flip says, channels reversed for a decoder's RGB, the mean subtracted and the
//   scale applied;
//
//     out[b, c, y, x] = (in[b, c', h0 + y, w0 + x'] - mean[c, h0 + y, w0 + x']) * scale
//     x' = flip ? w - 1 - x : x        c' = reverse ? C - 1 - c : c
//
// - records cropped on the host (cropped_transform): the window is the whole input, mirrored
//   here only where the host left the flip to the device; the mean is still read where the
//   window lay in the record,
//
//     out[b, c, y, x] = (in[b, c, y, x''] - mean[c, h0 + y, w0 + x']) * scale
//     x'' = flip && flip_pixels ? w - 1 - x : x
//
// where (h0, w0, flip) is record b's row of `where`. The mean is read at the source pixel, as
// Caffe's data_transformer.cpp reads mean[data_index]; a per-channel mean (mean_value) is one
// value per output channel. The arithmetic is the reference's (Transformer.device_crop, then
// Transformer.device: a float32 subtraction, then a float32 multiply, each rounded once), so
// the results are the same bits; the intrinsics keep the compiler from fusing the two.
//
// Before these kernels the feed ran an advanced-indexing gather, the mean's own gather, the
// subtraction and the scale: four passes and about 1.6 ms of GPU time a ResNet-50 batch of
// whole records, 0.9 ms of crops, taken from the training kernels they run beside.
#include "common.cuh"

namespace caffe_py {
namespace {

enum MeanKind : int { kNoMean = 0, kChannelMean = 1, kPixelMean = 2 };

// The input's plane is H x W (a record, or with `cropped` a crop of h x w); a per-pixel
// mean's is MH x MW (the record's).
template <typename T>
__global__ void crop_transform_kernel(const T* __restrict__ in, const int* __restrict__ where,
                                      const float* __restrict__ mean, float* __restrict__ out,
                                      int C, int H, int W, int MH, int MW, int h, int w,
                                      int mean_kind, float scale, bool apply_scale, bool reverse,
                                      bool cropped, bool flip_pixels) {
  const int64_t bc = blockIdx.x;  // record b, output channel c
  const int y = blockIdx.y;
  const int64_t b = bc / C;
  const int c = static_cast<int>(bc - b * C);
  const int h0 = where[3 * b], w0 = where[3 * b + 1];
  const bool flip = where[3 * b + 2] != 0;
  const bool flip_in = flip && (!cropped || flip_pixels);
  const int src_c = reverse ? C - 1 - c : c;
  const T* row = in + ((b * C + src_c) * H + (cropped ? y : h0 + y)) * static_cast<int64_t>(W) +
                 (cropped ? 0 : w0);
  const float* mean_row =
      mean_kind == kPixelMean ? mean + (static_cast<int64_t>(c) * MH + h0 + y) * MW + w0
                              : nullptr;
  const float channel_mean = mean_kind == kChannelMean ? mean[c] : 0.f;
  float* dst = out + (bc * h + y) * static_cast<int64_t>(w);
  for (int x = threadIdx.x; x < w; x += blockDim.x) {
    const int xs = flip ? w - 1 - x : x;      // where the value lay in the record
    float v = static_cast<float>(row[flip_in ? w - 1 - x : x]);
    if (mean_kind == kPixelMean) {
      v = __fsub_rn(v, mean_row[xs]);
    } else if (mean_kind == kChannelMean) {
      v = __fsub_rn(v, channel_mean);
    }
    dst[x] = apply_scale ? __fmul_rn(v, scale) : v;
  }
}

}  // namespace

namespace {

// Checks the arguments and launches the kernel; `cropped` as in the kernel.
void launch(const char* name, const at::Tensor& in, const at::Tensor& where,
            const c10::optional<at::Tensor>& mean, double scale, bool reverse, bool cropped,
            bool flip_pixels, at::Tensor& out) {
  const std::string fn(name);
  TORCH_CHECK(in.is_cuda() && in.dim() == 4 && in.is_contiguous(),
              fn + ": records must be a contiguous (B, C, H, W) CUDA tensor");
  TORCH_CHECK(in.scalar_type() == at::kByte || in.scalar_type() == at::kFloat,
              fn + ": records must be uint8 or float32");
  TORCH_CHECK(out.is_cuda() && out.dim() == 4 && out.is_contiguous() &&
                  out.scalar_type() == at::kFloat && out.device() == in.device(),
              fn + ": out must be a contiguous float32 (B, C, h, w) tensor on the records' "
                   "device");
  const int64_t B = in.size(0), C = in.size(1), H = in.size(2), W = in.size(3);
  const int64_t h = out.size(2), w = out.size(3);
  TORCH_CHECK(out.size(0) == B && out.size(1) == C && h <= H && w <= W,
              fn + ": out must be (B, C, h, w) with h <= H and w <= W");
  TORCH_CHECK(!cropped || (h == H && w == W), fn + ": out must be the crops' shape");
  TORCH_CHECK(where.is_cuda() && where.scalar_type() == at::kInt && where.is_contiguous() &&
                  where.dim() == 2 && where.size(0) == B && where.size(1) == 3 &&
                  where.device() == in.device(),
              fn + ": where must be a contiguous (B, 3) int32 tensor of (h0, w0, flip) on the "
                   "records' device");
  TORCH_CHECK(h <= 65535, fn + ": crop height above 65535");
  int kind = kNoMean;
  const float* mp = nullptr;
  int64_t MH = H, MW = W;
  if (mean.has_value()) {
    const at::Tensor& m = *mean;
    TORCH_CHECK(m.is_cuda() && m.scalar_type() == at::kFloat && m.is_contiguous() &&
                    m.device() == in.device(),
                fn + ": mean must be a contiguous float32 tensor on the records' device");
    if (m.numel() == C) {
      kind = kChannelMean;
    } else if (cropped) {
      TORCH_CHECK(m.dim() == 3 && m.size(0) == C && m.size(1) >= h && m.size(2) >= w,
                  fn + ": mean must hold C values or be C x MH x MW with MH >= h and MW >= w");
      MH = m.size(1);
      MW = m.size(2);
      kind = kPixelMean;
    } else {
      TORCH_CHECK(m.numel() == C * H * W, fn + ": mean must hold C or C * H * W values");
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
  const int dims[] = {static_cast<int>(C),  static_cast<int>(H), static_cast<int>(W),
                      static_cast<int>(MH), static_cast<int>(MW), static_cast<int>(h),
                      static_cast<int>(w)};
  if (in.scalar_type() == at::kByte) {
    crop_transform_kernel<uint8_t><<<grid, threads, 0, stream>>>(
        in.data_ptr<uint8_t>(), where.data_ptr<int>(), mp, out.data_ptr<float>(), dims[0],
        dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], kind, s, apply, reverse, cropped,
        flip_pixels);
  } else {
    crop_transform_kernel<float><<<grid, threads, 0, stream>>>(
        in.data_ptr<float>(), where.data_ptr<int>(), mp, out.data_ptr<float>(), dims[0],
        dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], kind, s, apply, reverse, cropped,
        flip_pixels);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void crop_transform(const at::Tensor& in, const at::Tensor& where,
                    const c10::optional<at::Tensor>& mean, double scale, bool reverse,
                    at::Tensor& out) {
  launch("crop_transform", in, where, mean, scale, reverse, false, false, out);
}

void cropped_transform(const at::Tensor& in, const at::Tensor& where,
                       const c10::optional<at::Tensor>& mean, double scale, bool flip_pixels,
                       at::Tensor& out) {
  launch("cropped_transform", in, where, mean, scale, false, true, flip_pixels, out);
}

}  // namespace caffe_py
