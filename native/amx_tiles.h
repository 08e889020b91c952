// AMX tile configuration, shared by the AMX kernels. Include after a
// `#pragma GCC target` that enables amx-tile.
//
// A kernel call loads its own configuration and, on return, gives the thread back
// the one it found: other code in the process (llama.cpp's AMX kernels, as the
// bench's peer) configures a thread once and keeps using it, and would fault on
// a released configuration or compute with ours.
#pragma once
#include <immintrin.h>
#include <cstdint>

namespace weft {

// Palette 1: up to 8 tiles of up to 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, startRow = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int rowCount, int bytesPerRow) {
    rows[tile] = static_cast<uint8_t>(rowCount);
    colsb[tile] = static_cast<uint16_t>(rowCount ? bytesPerRow : 0);
  }
};

// The thread's tile configuration for one kernel call (see above).
// The instructions are written as asm with the whole 64-byte configuration as a memory
// operand: through GCC 12's _tile_loadconfig the stores that build a configuration were
// found dropped (tiles left unconfigured, then #UD), as if the builtin did not read them.
class TileScope {
 public:
  TileScope() { asm volatile("sttilecfg %0" : "=m"(saved_)); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
  ~TileScope() {
    if (saved_.palette) load(saved_);
    else _tile_release();  // none before: no tile state left for context switches to save
  }
  void load(const TileConfig& c) { asm volatile("ldtilecfg %0" : : "m"(c)); }

 private:
  TileConfig saved_;
};

}  // namespace weft
