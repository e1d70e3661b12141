#include "util/format_bytes.h"

#include <cstdio>

namespace sluice {

std::string format_bytes(uint64_t bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  long double v = (long double)bytes;
  int u = 0;
  // Switch units at 1000 so no figure needs four digits before the point ("0.99 GiB").
  while (v >= 1000 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.1Lf %s" : "%.2Lf %s", v, names[u]);
  return buf;
}

}  // namespace sluice
