// Python bindings of the activation kernels and the fused SoftmaxWithLoss. Every function writes into tensors the caller
// allocated (so tests can poison them with NaN and see any element a kernel leaves unwritten);
// the backward of a per-channel op returns the parameter's gradient as a new [C] tensor.
#include <torch/extension.h>

namespace caffe_py {
void act_forward(const at::Tensor& x, at::Tensor& out, int64_t kind, double p);
void act_backward(const at::Tensor& g, const at::Tensor& s, at::Tensor& grad_in, int64_t kind,
                  double p, bool from_output);
void prelu_forward(const at::Tensor& x, const at::Tensor& slope, at::Tensor& out, int64_t C,
                   int64_t inner);
at::Tensor prelu_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& slope,
                          at::Tensor& grad_x, int64_t C, int64_t inner);
void bias_act_forward(const at::Tensor& x, const at::Tensor& bias, at::Tensor& out, int64_t C,
                      int64_t inner, int64_t kind, double p);
at::Tensor bias_act_backward(const at::Tensor& g, const at::Tensor& y, const at::Tensor& bias,
                             at::Tensor& grad_x, int64_t C, int64_t inner, int64_t kind,
                             double p);
void softmax_loss_forward(const at::Tensor& x, const at::Tensor& label, at::Tensor& prob,
                          at::Tensor& work, at::Tensor& done, at::Tensor& loss,
                          at::Tensor& div, const c10::optional<at::Tensor>& seen, int64_t ignore,
                          bool has_ignore, double divisor, bool count_valid);
void softmax_loss_backward(const at::Tensor& prob, const at::Tensor& label,
                           const at::Tensor& grad, const at::Tensor& div, at::Tensor& dx,
                           int64_t ignore, bool has_ignore);
}  // namespace caffe_py

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "caffe-py's CUDA activation kernels (see caffe_py/kernels/functions.py)";
  m.def("act_forward", &caffe_py::act_forward, "out = f(x); out may be x", py::arg("x"),
        py::arg("out"), py::arg("kind"), py::arg("p"));
  m.def("act_backward", &caffe_py::act_backward, "grad_in = f'(grad_out, saved)",
        py::arg("grad_out"), py::arg("saved"), py::arg("grad_in"), py::arg("kind"), py::arg("p"),
        py::arg("from_output"));
  m.def("prelu_forward", &caffe_py::prelu_forward, "out = prelu(x, slope)", py::arg("x"),
        py::arg("slope"), py::arg("out"), py::arg("C"), py::arg("inner"));
  m.def("prelu_backward", &caffe_py::prelu_backward, "writes grad_x, returns dslope [C]",
        py::arg("grad_out"), py::arg("x"), py::arg("slope"), py::arg("grad_x"), py::arg("C"),
        py::arg("inner"));
  m.def("bias_act_forward", &caffe_py::bias_act_forward, "out = f(x + bias[c]); out may be x",
        py::arg("x"), py::arg("bias"), py::arg("out"), py::arg("C"), py::arg("inner"),
        py::arg("kind"), py::arg("p"));
  m.def("bias_act_backward", &caffe_py::bias_act_backward, "writes grad_x, returns dbias [C]",
        py::arg("grad_out"), py::arg("y"), py::arg("bias"), py::arg("grad_x"), py::arg("C"),
        py::arg("inner"), py::arg("kind"), py::arg("p"));
  m.def("softmax_loss_forward", &caffe_py::softmax_loss_forward,
        "Caffe's SoftmaxWithLoss on (N, C): prob, loss, div (the divisor); seen = [min, max] "
        "label", py::arg("x"), py::arg("label"), py::arg("prob"), py::arg("work"),
        py::arg("done"), py::arg("loss"), py::arg("div"), py::arg("seen"), py::arg("ignore"),
        py::arg("has_ignore"), py::arg("divisor"), py::arg("count_valid"));
  m.def("softmax_loss_backward", &caffe_py::softmax_loss_backward,
        "dx = (prob - onehot) * grad / divisor", py::arg("prob"), py::arg("label"),
        py::arg("grad"), py::arg("div"), py::arg("dx"), py::arg("ignore"),
        py::arg("has_ignore"));
}
