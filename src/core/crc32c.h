// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of iSCSI, ext4
// and Google's storage formats, over checkpoint files, the manifest and
// the training data (a resume's identity of the token file). Standard parameters:
// initial value and final xor 0xFFFFFFFF, so crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace lattice {

// Continues a running checksum: crc32c_extend(crc32c_extend(0, a), b) == crc32c(a ++ b). On a
// CPU with SSE4.2 (checked at run time) its crc32 instruction, 8 bytes a step (~4x the tables:
// an elastic snapshot checksums every rank's shard every step); otherwise the portable tables.
uint32_t crc32c_extend(uint32_t crc, std::span<const std::byte> bytes);
// The two paths, for their test.
uint32_t crc32c_extend_portable(uint32_t crc, std::span<const std::byte> bytes);
// nullopt when this CPU has no crc32 instruction.
std::optional<uint32_t> crc32c_extend_hardware(uint32_t crc, std::span<const std::byte> bytes);
// Copies `from` to `to` (from.size() bytes, not overlapping) and extends `crc` over them in the
// same pass: each block is checksummed while the copy has it in cache, so a snapshot's
// checksum costs no second sweep over memory. Returns crc32c_extend(crc, from).
uint32_t copy_with_crc32c(uint32_t crc, std::span<const std::byte> from, std::byte* to);
inline uint32_t crc32c(std::span<const std::byte> bytes) {
  return crc32c_extend(0, bytes);
}
inline uint32_t crc32c(std::string_view text) {
  return crc32c({reinterpret_cast<const std::byte*>(text.data()), text.size()});
}

}  // namespace lattice
