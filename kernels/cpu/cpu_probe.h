// What this CPU's cores do, measured: the clock they run at and the FLOPs a cycle of each multiply unit. The bf16
// kernel is chosen from these rates (kernels/cpu/gemm.h's bf16_kernel), and the training log's meter states its peak
// from them (train/speed.cpp), so neither depends on a vendor's name nor on a table of models.
#pragma once

#include <string>

#include "gemm.h"  // Bf16Kernel

namespace tinygpt::cpu {

/// One multiply unit's loop of independent multiply-adds on registers only (no memory traffic): FLOPs done in
/// `reps` rounds. Run only where the CPU has the unit (bf16_kernels_available; f32 FMA: AVX2 and FMA, or AVX-512F).
enum class ProbeUnit { FmaYmm, FmaZmm, Dpbf16Zmm, AmxTiles };
double probe_unit(ProbeUnit unit, long reps);
/// Cycles of a chain of `reps` x 64 dependent integer adds (one cycle each on every x86-64 core): the clock probe.
double probe_chain_cycles(long reps);

struct UnitRates {
  double ghz = 0;          // the clock the cores run at: the chain of dependent adds on every thread at once
  double f32 = 0;          // FLOPs a cycle of one core's f32 FMAs at f32_lanes() lanes
  double avx512_bf16 = 0;  // vdpbf16ps (0 where absent)
  double amx = 0;          // tdpbf16ps (0 where absent)
  bool cached = false;     // set_unit_rates gave them (read from a cache) rather than measured now
};

/// The rates, measured by the first call (about 0.1 s, every thread at once: the clock as the best of 7 timings of
/// the chain; each unit's FLOPs a cycle as the median of 7 ratios of the unit's rate to the chain's, the two timed one
/// right after the other, so a core shared with another process for a while slows both alike; rounded to a power of
/// two, the steps between microarchitectures), unless set_unit_rates gave them first.
const UnitRates& unit_rates();
/// Uses `rates` (as read from a cache) instead of measuring them: before the first unit_rates() or bf16_kernel().
/// Throws Error when either was already called, or a rate is not a positive power of two where its unit exists.
void set_unit_rates(const UnitRates& rates);
/// FLOPs a cycle of one core of `kernel`'s unit (F32Units: the f32 FMAs).
double flops_per_cycle(Bf16Kernel kernel);
/// "AMD EPYC 9R14 96-Core Processor (family 25, model 17)": CPUID's brand string, family and model.
std::string cpu_model_name();

}  // namespace tinygpt::cpu
