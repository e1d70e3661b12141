// A directory a command writes its files into (run --trace DIR, run --dump-tensors DIR), under
// the rule of util/output_file.h: sluice never destroys a path it did not create.
//
//   - DIR must be absent (it is created; its parent must exist) or an empty directory; with
//     Existing::Replace any existing directory. A link (even to a directory), a file, a device
//     or a FIFO at DIR is refused, forced or not.
//   - The files inside are AtomicOutputFiles, each checked on its own.
//   - Unless keep() was called, the destructor removes DIR when this object created it, and then
//     only when it is empty again (rmdir): destroy the files' AtomicOutputFiles first.
#pragma once
#include <string>
#include <string_view>

#include "util/output_file.h"

namespace sluice {

class OutputDir {
 public:
  // `role` names the directory in messages ("--trace directory"); `force_note` says what
  // --force would write into a non-empty one ("trace.jsonl"). Throws Error naming DIR.
  OutputDir(std::string dir, Existing existing, std::string_view role, std::string_view force_note);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& path() const { return dir_; }
  std::string file(std::string_view name) const;  // DIR/name
  bool created() const { return created_; }
  void keep() { kept_ = true; }  // the command succeeded: DIR stays whatever it holds

 private:
  std::string dir_;
  bool created_ = false, kept_ = false;
};

}  // namespace sluice
