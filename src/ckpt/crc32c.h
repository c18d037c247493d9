// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of iSCSI, ext4
// and Google's storage formats, over checkpoint files and the manifest. Standard parameters:
// initial value and final xor 0xFFFFFFFF, so crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace lattice {

// Continues a running checksum: crc32c_extend(crc32c_extend(0, a), b) == crc32c(a ++ b).
uint32_t crc32c_extend(uint32_t crc, std::span<const std::byte> bytes);
inline uint32_t crc32c(std::span<const std::byte> bytes) {
  return crc32c_extend(0, bytes);
}
inline uint32_t crc32c(std::string_view text) {
  return crc32c({reinterpret_cast<const std::byte*>(text.data()), text.size()});
}

}  // namespace lattice
