#pragma once
#include <functional>

namespace weft {

// Runs `job` on the addon's one compute thread and returns when it has finished (rethrowing what it
// threw). Every OpenMP region of the CPU model starts there (a CUDA step runs on the libuv worker
// that took it: Backend::needsComputeThread): libgomp keeps a team of threads per calling thread, and
// once it manages more threads than there are CPUs (steps had run on any of libuv's pool threads, each
// with its own team) it spins only ~100 times at a barrier before sleeping in the kernel, so each of a
// step's few hundred parallel regions put a thread to sleep and woke it again.
void runOnComputeThread(const std::function<void()>& job);

}  // namespace weft
