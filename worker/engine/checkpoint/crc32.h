// CRC-32 (IEEE 802.3, the zlib/PNG polynomial) for checkpoint file checksums.
// Incremental: Crc32(Crc32(0, a), b) == Crc32(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::engine {

uint32_t Crc32(uint32_t crc, const void* data, size_t size);

}  // namespace loom::engine
