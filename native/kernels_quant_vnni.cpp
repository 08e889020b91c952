// The quantized matmul with AVX512-VNNI's vpdpbusd (on 256-bit registers, so its
// lanes and order are the AVX2 build's): the same source, compiled for VNNI.
#define WEFT_QUANT_VNNI
#include "kernels_quant_avx2.cpp"
