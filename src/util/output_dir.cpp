#include "util/output_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "util/error.h"

namespace sluice {

OutputDir::OutputDir(std::string dir, Existing existing, std::string_view role, std::string_view force_note)
    : dir_(std::move(dir)) {
  const std::string r(role);
  if (dir_.empty()) throw Error("the " + r + " path is empty");
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw Error("refusing to use " + dir_ + " as the " + r + ": it is " + file_kind(st.st_mode) + ", not a directory");
    std::error_code ec;
    const bool empty = std::filesystem::is_empty(dir_, ec);
    if (ec) throw Error("cannot read " + r + " " + dir_ + ": " + ec.message());
    if (existing == Existing::Refuse && !empty)
      throw Error("refusing to use " + dir_ + " as the " + r + ": it is not empty (--force writes " +
                  std::string(force_note) + " into it)");
  } else if (errno != ENOENT) {
    throw Error("cannot check " + r + " " + dir_ + ": " + std::strerror(errno));
  } else if (::mkdir(dir_.c_str(), 0777) != 0) {
    throw Error("cannot create " + r + " " + dir_ + ": " + std::strerror(errno));
  } else {
    created_ = true;
  }
}

OutputDir::~OutputDir() {
  if (created_ && !kept_) ::rmdir(dir_.c_str());  // fails, and so keeps DIR, unless it is empty
}

std::string OutputDir::file(std::string_view name) const {
  return (std::filesystem::path(dir_) / std::string(name)).string();
}

}  // namespace sluice
