// The machine's measured limits (see roofline.cpp); 0 where the CPU lacks the unit.
#pragma once

namespace weft {

struct Rooflines {
  double readBytesPerSecond = 0;
  double fp32Flops = 0;     // fp32 FMAs, widest vectors the CPU has
  double bf16DotFlops = 0;  // vdpbf16ps (AVX512_BF16)
  double amxFlops = 0;      // TDPBF16PS (AMX-BF16)
};

// Takes a few seconds; runs on every OpenMP thread.
Rooflines measureRooflines();

}  // namespace weft
