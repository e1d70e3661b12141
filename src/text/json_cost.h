// What a JSON text costs once parsed: an upper bound, read from the text alone, on the heap
// nlohmann::json takes to hold it (and to build it), so a server can charge a body before it
// parses it. The bound follows the library's layout on a 64-bit libstdc++ with glibc's malloc
// (each block rounded up to 16 bytes plus an 8-byte header): a value is 16 bytes; an object
// allocates its std::map (64) and a 96-byte node per member; an array its std::vector (32) and
// up to 3 x 16 bytes per element while it doubles (old and new storage at once); a string its
// std::string (48) and its characters. Text lengths bound decoded lengths (escapes only
// shrink). Malformed text still gets a bound for what a parser reads before it fails.
#pragma once
#include <cstdint>
#include <string_view>

namespace sluice::text {

uint64_t json_tree_bound(std::string_view text);

}  // namespace sluice::text
