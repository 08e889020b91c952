#include "weights.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include "mlx_quant.h"
#include "quant.h"
#include "kquant_rows.h"
#include "quant_panels.h"

namespace weft {

float Tensor::at(size_t i) const {
  if (isMlx(dtype)) {  // not a vector type: dequantize the element's row
    std::vector<float> row(cols);
    rowToF32(static_cast<int>(i / cols), row.data());
    return row[i % cols];
  }
  if (isQuantized(dtype)) {  // rare (small vectors are float in GGUF): dequantize the element's row
    std::vector<float> row(cols);
    dequantRow(dtype, data, cols, static_cast<int>(i / cols), row.data());
    return row[i % cols];
  }
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::F16: return f16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::BF16: return bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    default: break;  // quantized: above
  }
  return 0.0f;
}

void Tensor::rowToF32(int r, float* out) const {
  if (isMlx(dtype)) return mlxDequantRow(dtype, data, scales, biases, paramDtype, group, cols, r, out);
  if (isQuantized(dtype)) return dequantRow(dtype, data, cols, r, out);
  size_t base = static_cast<size_t>(r) * cols;
  for (int c = 0; c < cols; c++) out[c] = at(base + c);
}

PackedStore::~PackedStore() {
  for (auto& r : regions_) munmap(r.addr, r.size);
}

PackedMatrix PackedStore::pack(const Tensor& t, int chunk) {
  PackedMatrix p;
  p.dtype = t.dtype;
  p.N = t.rows;
  p.K = t.cols;
  p.Np = (t.rows + kPackCols - 1) / kPackCols * kPackCols;
  p.Kp = (t.cols + chunk - 1) / chunk * chunk;
  const size_t elem = dtypeBytes(t.dtype);
  void* mem = reserve(static_cast<size_t>(p.Np) * p.Kp * elem);
  const auto* src = static_cast<const unsigned char*>(t.data);
  auto* dst = static_cast<unsigned char*>(mem);
  const int chunks = p.Kp / chunk;
  // [N/4][K/L][4][L]: element (n, k) of group g = n / 4, column c = n % 4, chunk j = k / L, lane k % L.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < p.N; n++) {
    const int g = n / kPackCols, c = n % kPackCols;
    for (int j = 0; j < chunks; j++) {
      const int len = std::min(chunk, p.K - j * chunk);
      if (len <= 0) break;
      const size_t at = ((static_cast<size_t>(g) * chunks + j) * kPackCols + c) * chunk;
      std::memcpy(dst + at * elem, src + (static_cast<size_t>(n) * p.K + static_cast<size_t>(j) * chunk) * elem, len * elem);
    }
  }
  p.data = mem;
  return p;
}

PackedMatrix PackedStore::packQuantized(const Tensor& t, const Kernels& k) {
  PackedMatrix p;
  p.dtype = p.panelType = t.dtype;
  p.N = p.Np = t.rows;
  p.K = p.Kp = t.cols;
  if (k.quantPanels()) {
    p.panelType = panelTypeOf(t.dtype, k.wideQ6Panels());
    p.Np = (t.rows + kPanelCols - 1) / kPanelCols * kPanelCols;
    auto* mem = static_cast<uint8_t*>(reserve(panelBytes(p.panelType, t.rows, t.cols)));
    packQuantPanels(p.panelType, static_cast<const uint8_t*>(t.data), t.rows, t.cols, mem);
    p.data = mem;
    return p;
  }
  if (k.decodedKRows() && decodedRowsOf(t.dtype) != t.dtype) {
    p.panelType = decodedRowsOf(t.dtype);
    auto* mem = static_cast<uint8_t*>(reserve(decodedRowBytes(p.panelType, t.cols) * t.rows));
    packDecodedRows(p.panelType, static_cast<const uint8_t*>(t.data), t.rows, t.cols, mem);
    p.data = mem;
    return p;
  }
  const size_t bytes = tensorBytes(t.dtype, t.rows, t.cols);
  void* mem = reserve(bytes);
  std::memcpy(mem, t.data, bytes);
  p.data = mem;
  return p;
}

PackedMatrix PackedStore::packMlx(const Tensor& t) {
  PackedMatrix p;
  p.dtype = t.dtype;
  p.N = p.Np = t.rows;
  p.K = p.Kp = t.cols;
  p.group = t.group;
  p.paramDtype = t.paramDtype;
  const size_t words = mlxWordBytes(t.dtype, t.rows, t.cols);
  const size_t params = mlxParamBytes(t.paramDtype, t.rows, t.cols, t.group);
  auto* mem = static_cast<unsigned char*>(reserve(words + 2 * params));
  std::memcpy(mem, t.data, words);
  std::memcpy(mem + words, t.scales, params);
  std::memcpy(mem + words + params, t.biases, params);
  p.data = mem;
  p.scales = mem + words;
  p.biases = mem + words + params;
  return p;
}

PackedMatrix PackedStore::packPairTiles(const Tensor& t) {
  PackedMatrix p;
  p.dtype = DType::BF16;
  p.pairTiles = true;
  p.N = t.rows;
  p.K = t.cols;
  p.Np = (t.rows + kTileCols - 1) / kTileCols * kTileCols;
  p.Kp = (t.cols + kTileK - 1) / kTileK * kTileK;
  auto* dst = static_cast<uint16_t*>(reserve(static_cast<size_t>(p.Np) * p.Kp * 2));
  // Column tile g = n / 16 holds its Kp / 2 input pairs in order, each as 16 columns × 2 halves.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < p.N; n++) {
    uint16_t* col = dst + static_cast<size_t>(n / kTileCols) * p.Kp * kTileCols + (n % kTileCols) * 2;
    const size_t row = static_cast<size_t>(n) * p.K;
    for (int k = 0; k < p.K; k++) {
      const uint16_t v = t.dtype == DType::BF16 ? static_cast<const uint16_t*>(t.data)[row + k] : f32ToBf16(t.at(row + k));
      col[static_cast<size_t>(k / 2) * 2 * kTileCols + k % 2] = v;
    }
  }
  p.data = dst;
  return p;
}

// Matrices are carved from 2 MiB-aligned chunks of at least kChunkBytes: a mapping of its own per
// matrix shares its first and last 2 MiB with its neighbours, which the kernel then backs with
// 4 KiB pages, and the streamed weights of qwen3-0.6b were half on small pages.
void* PackedStore::reserve(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20, kChunkBytes = size_t{64} << 20, kAlign = 4096;
  if (regions_.empty() || regions_.back().size - used_ < bytes) {
    const size_t size = std::max(kChunkBytes, (bytes + kHuge - 1) / kHuge * kHuge);
    auto* raw = static_cast<char*>(mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (raw == MAP_FAILED) throw std::runtime_error("out of memory packing a weight matrix");
    char* mem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
    if (mem > raw) munmap(raw, mem - raw);  // the unaligned head and tail go back
    if (raw + kHuge > mem) munmap(mem + size, raw + kHuge - mem);
    madvise(mem, size, MADV_HUGEPAGE);  // fewer TLB misses while streaming; zero-filled
    regions_.push_back({mem, size});
    used_ = 0;
  }
  void* at = static_cast<char*>(regions_.back().addr) + used_;
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
  bytes_ += bytes;
  return at;
}

namespace {

void releaseRange(const void* data, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + bytes;
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace

void releasePages(const Tensor& t) {
  if (!isMlx(t.dtype)) return releaseRange(t.data, tensorBytes(t.dtype, t.rows, t.cols));
  const size_t params = mlxParamBytes(t.paramDtype, t.rows, t.cols, t.group);
  releaseRange(t.data, mlxWordBytes(t.dtype, t.rows, t.cols));
  releaseRange(t.scales, params);
  releaseRange(t.biases, params);
}

MappedFiles::~MappedFiles() {
  for (auto& [path, m] : maps_) munmap(m.addr, m.size);
}

const unsigned char* MappedFiles::map(const std::string& path, size_t* size) {
  auto it = maps_.find(path);
  if (it == maps_.end()) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
      close(fd);
      throw std::runtime_error("cannot stat or empty file " + path);
    }
    void* addr = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) throw std::runtime_error("cannot mmap " + path + ": " + std::strerror(errno));
    it = maps_.emplace(path, Mapping{addr, static_cast<size_t>(st.st_size)}).first;
  }
  *size = it->second.size;
  return static_cast<const unsigned char*>(it->second.addr);
}

}  // namespace weft
