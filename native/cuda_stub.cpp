// The CUDA seam in a CPU-only build: no GPUs, and a clear error for --device cuda.
#include <stdexcept>
#include "cuda_backend.h"

namespace weft {

bool cudaBuilt() { return false; }

std::vector<CudaDevice> cudaDevices() { return {}; }

std::unique_ptr<Backend> loadCudaModel(ModelConfig, Weights) {
  throw std::runtime_error("this build of the addon has no CUDA backend (rebuild with nvcc on PATH or WEFT_CUDA=1)");
}

}  // namespace weft
