// The quantized matmul with AVX512-VNNI's vpdpbusd on 512-bit registers, two panel
// columns per register (each half keeps the 256-bit lanes and order): the same
// source as the AVX2 build, compiled for VNNI.
#define WEFT_QUANT_VNNI
#include "kernels_quant_avx2.cpp"
