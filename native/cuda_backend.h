// The CUDA backend's seam: the only CUDA-facing declarations the rest of the addon sees.
// A CPU-only build links cuda_stub.cpp instead of native/cuda/*.cu (see binding.gyp).
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "step.h"
#include "weights.h"

namespace weft {

struct CudaDevice {
  std::string name;
  double totalBytes = 0, freeBytes = 0;
  int major = 0, minor = 0;  // compute capability
};

// Whether this addon was built with the CUDA backend (nvcc on PATH at install, or WEFT_CUDA=1).
bool cudaBuilt();

// The GPUs this process can use; empty in a CPU-only build or where no driver or GPU is visible.
std::vector<CudaDevice> cudaDevices();

// Uploads the weights (as bf16) to GPU 0 and reserves the KV pools there; throws in a CPU-only build.
std::unique_ptr<Backend> loadCudaModel(ModelConfig cfg, Weights w);

}  // namespace weft
