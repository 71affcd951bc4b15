// CPU kernels (OpenMP), templated for float and double, and for bf16 storage where the list takes it (f32 arithmetic
// inside: compute_t<T>). Each kernel's parameters and what it computes: kernels/kernel_list.h, whose list declares
// them here; explicit instantiations live beside each definition (TINYGPT_INSTANTIATE).
#pragma once

#include "../kernel_list.h"
#include "gemm.h"

namespace tinygpt::cpu {

TINYGPT_KERNELS(TINYGPT_DECLARE_CPU)

}  // namespace tinygpt::cpu
