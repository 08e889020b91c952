#include "weights.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstring>
#include <stdexcept>

namespace weft {

float Tensor::at(size_t i) const {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::F16: return f16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::BF16: return bf16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

void Tensor::rowToF32(int r, float* out) const {
  size_t base = static_cast<size_t>(r) * cols;
  for (int c = 0; c < cols; c++) out[c] = at(base + c);
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
