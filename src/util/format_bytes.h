// Byte counts for people to read, shared by every layer's messages.
#pragma once
#include <cstdint>
#include <string>

namespace sluice {

// "9.37 GiB", "400.0 MiB", "512 B": three significant figures, binary units.
std::string format_bytes(uint64_t bytes);

}  // namespace sluice
