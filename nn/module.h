// Module: a named collection of parameters and child modules, as in PyTorch. Parameter names are
// dotted paths ("h.0.attn.c_attn.weight"). Modules are neither copied nor moved: children register
// themselves by address.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../autograd/ops.h"
#include "../autograd/tensor.h"
#include "../kernels/numerics.h"

namespace tinygpt::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Every parameter with its dotted name, in registration order (children after own parameters).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  void zero_grad();
  /// Moves every parameter to `device`, in place (see Tensor::move_to_).
  void to(Device device);
  /// The device of the parameters (CPU for a module without any).
  Device device() const;
  /// Training mode turns dropout on; eval mode off. Applies to every child.
  void train(bool on = true);
  bool training() const { return training_; }
  /// How the GPU computes this module's products (TF32 matmuls, the flash attention operand format); applies to
  /// every child. The default is full f32; the CPU always computes in full precision.
  void set_numerics(const Numerics& numerics);
  const Numerics& numerics() const { return numerics_; }
  /// A parameter as an op that also reads `like` takes it: the parameter's bf16 working copy (working_copy) when
  /// `like` is a bf16 activation, else the parameter itself (or an undefined one: a layer without bias).
  static Tensor stored(const Tensor& param, const Tensor& like) {
    return param.defined() && like.dtype() == DType::BF16 && param.dtype() == DType::F32 ? working_copy(param) : param;
  }
  /// Writes the bf16 working copy of every parameter (with bf16 storage; set_numerics does): after changing the
  /// parameters outside an optimizer step (which writes them itself), so the layers read the new values.
  void write_bf16_copies();

 protected:
  /// Marks t as a trainable leaf and records it under `name`; returns t.
  Tensor register_parameter(std::string name, Tensor t);
  void register_module(std::string name, Module& child);

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
  Numerics numerics_;
};

}  // namespace tinygpt::nn
