// A CUPTI activity tracer for the GPU host, which has no Nsight Systems: loaded into any CUDA process
// through CUDA_INJECTION64_PATH (scripts/cuda-trace.sh builds and loads it), it records every kernel's
// and memcpy's start and end on the GPU, kernels replayed inside CUDA graphs included, and writes them
// as tab-separated lines to $WEFT_TRACE_OUT: start ns, end ns, stream, grid x/y/z or bytes, block x, name.
// Records reach the file when CUPTI hands back a buffer; a background thread forces that every 100 ms,
// and nothing is flushed at exit (CUPTI may be gone by then), so a traced program should idle briefly
// before it exits. KernelRecord/MemcpyRecord: the newest record versions the host's headers define.
#include <cupti.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace {

std::mutex mutex;
FILE* out = nullptr;

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
  *size = 1 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *maxRecords = 0;
}

const char* copyName(uint8_t kind) {
  return kind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD ? "memcpyHtoD" : kind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "memcpyDtoH" : "memcpy";
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mutex);
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const KernelRecord*>(r);
      fprintf(out, "%llu\t%llu\t%u\t%d\t%d\t%d\t%d\t%s\n", static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
              k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const MemcpyRecord*>(r);
      fprintf(out, "%llu\t%llu\t%u\t%llu\t0\t0\t0\t%s\n", static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end),
              m->streamId, static_cast<unsigned long long>(m->bytes), copyName(m->copyKind));
    }
  }
  fflush(out);
  free(buffer);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = getenv("WEFT_TRACE_OUT");
  out = fopen(path ? path : "cuda-trace.tsv", "w");
  if (!out || cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS || cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
    fprintf(stderr, "cuda-trace: cannot start CUPTI activity tracing\n");
    return 0;
  }
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      cuptiActivityFlushAll(1);
    }
  }).detach();
  return 1;
}
