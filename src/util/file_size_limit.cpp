#include "util/file_size_limit.h"

#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace sluice {
namespace {

struct sigaction g_before {};
bool g_saved = false;

}  // namespace

void ignore_file_size_signal() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  g_saved = ::sigaction(SIGXFSZ, &ignore, &g_before) == 0;
}

void restore_file_size_signal() {
  if (g_saved) ::sigaction(SIGXFSZ, &g_before, nullptr);
}

std::string write_error_text(int err) {
  std::string text = std::strerror(err);
  if (err != EFBIG) return text;
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    return text + " (the file size limit, ulimit -f, is " + std::to_string((unsigned long long)lim.rlim_cur) + " bytes)";
  return text + " (larger than the file system allows)";
}

}  // namespace sluice
