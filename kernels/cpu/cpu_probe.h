// The probes of what this CPU's cores do: the clock they run at and the FLOPs a cycle of each multiply unit. The bf16
// kernel is chosen from the rates they give (kernels/device.h: bf16_kernel, unit_rates), and the training log's meter
// states its peak from them (train/speed.cpp), so neither depends on a vendor's name nor on a table of models.
#pragma once

#include <string>

#include "../device.h"  // Bf16Kernel, UnitRates

namespace tinygpt::cpu {

/// One multiply unit's loop of independent multiply-adds on registers only (no memory traffic): FLOPs done in
/// `reps` rounds. Run only where the CPU has the unit (bf16_kernels_available; f32 FMA: AVX2 and FMA, or AVX-512F).
enum class ProbeUnit { FmaYmm, FmaZmm, Dpbf16Zmm, AmxTiles };
double probe_unit(ProbeUnit unit, long reps);
/// Cycles of a chain of `reps` x 64 dependent register-to-register integer adds (one cycle each on every x86-64 core):
/// the clock probe.
double probe_chain_cycles(long reps);

// The rates these loops give (UnitRates, unit_rates, flops_per_cycle): kernels/device.h, for the layers above.

}  // namespace tinygpt::cpu
