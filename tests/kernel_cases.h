// Ties a test suite's cases to the kernel list (kernels/kernel_list.h). A suite that compares kernels (the CPU-GPU
// comparisons under the emulator and on a GPU, the f64 gradient checks) defines
//
//   constexpr std::string_view case_of(test::Kernel k) { switch (k) { case test::Kernel::fill: return "..."; ... } }
//
// naming, for every kernel of the list, the test case that checks it there, or "none: " and why it has none in this
// suite, and ends with TINYGPT_EVERY_KERNEL_HAS_A_CASE(). A kernel added to the list without its row fails to build
// the suite: the switch has no case for it, case_of returns "", and the static_assert names the kernel.
#pragma once

#include <string_view>

#include "kernels/kernel_list.h"

namespace tinygpt::test {

#define TINYGPT_KERNEL_ENUMERATOR(name, takes, gpu) name,
/// One enumerator per kernel of kernels/kernel_list.h, in its order.
enum class Kernel { TINYGPT_KERNELS(TINYGPT_KERNEL_ENUMERATOR) };
#undef TINYGPT_KERNEL_ENUMERATOR

}  // namespace tinygpt::test

#define TINYGPT_KERNEL_HAS_A_CASE(name, takes, gpu)                                           \
  static_assert(!case_of(::tinygpt::test::Kernel::name).empty(),                              \
                "kernel " #name                                                               \
                " (kernels/kernel_list.h) has no row in this suite's case_of: name the test " \
                "case that checks it, or \"none: \" and why");
/// The suite's check, after its case_of: every kernel of the list has a row.
#define TINYGPT_EVERY_KERNEL_HAS_A_CASE() TINYGPT_KERNELS(TINYGPT_KERNEL_HAS_A_CASE)
