// The float32 instances of fwd_variants.cuh's ReLU grid.
#include "fwd_variants.cuh"

namespace caffe_py {
namespace sweep {
void relu_f32(int64_t id, const at::Tensor& x, at::Tensor& y) { relu_variant<float>(id, x, y); }
}  // namespace sweep
}  // namespace caffe_py
