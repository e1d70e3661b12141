// `sluice run --dump-tensors DIR [--dump-filter REGEX]`: the engine's named intermediates
// (model/deepseek41/forward.h TensorObserver), one raw f32 file per tensor holding [position][width] in
// position order, and DIR/index.json describing them (docs/numerics.md, "Tensor dumps").
//
// Bounded: each chunk the engine shows is written to its file at once (nothing is held in
// memory but one open file and a few counters per tensor). The files are AtomicOutputFiles in
// an OutputDir (util/output_dir.h): they appear under their names only when finish() runs, and a
// failed run leaves DIR as it was (or removes it when it created it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/deepseek41/forward.h"
#include "util/linear_regex.h"
#include "util/output_dir.h"
#include "util/output_file.h"

namespace sluice::cli {

class TensorDump final : public TensorObserver {
 public:
  // filter: a regular expression (util/linear_regex.h: an ECMAScript subset matched in linear
  // time) searched for in each name (it may match anywhere; anchor it with ^...$ for whole
  // names); empty dumps every tensor. Throws UsageError for a filter outside the subset (before
  // DIR is touched), Error for a DIR that may not be used.
  TensorDump(const std::string& dir, const std::string& filter, Existing existing);

  bool wants(std::string_view name) const override;
  void observe(std::string_view name, uint32_t p0, uint32_t n, const float* data, size_t width,
               size_t stride) override;

  // Writes DIR/index.json (`info` merged into its top level) and renames every file into
  // place, index.json last. Returns the number of tensors written.
  size_t finish(nlohmann::json info);
  uint64_t bytes_written() const { return bytes_; }

 private:
  struct Tensor {
    std::string name, file;
    size_t width = 0;
    uint32_t first = 0;
    uint64_t count = 0;
    std::unique_ptr<AtomicOutputFile> out;
  };
  std::string file_name_for(std::string_view name);

  std::string filter_text_;
  LinearRegex filter_;  // before dir_: an invalid filter is refused before DIR is created
  OutputDir dir_;      // before the files: destroyed after them, so a DIR this run created is empty again
  Existing existing_;
  AtomicOutputFile index_;  // created up front, so a refused DIR/index.json costs no load time
  std::vector<Tensor> tensors_;                          // in the order first shown
  std::map<std::string, size_t, std::less<>> by_name_;   // name -> index in tensors_
  std::set<std::string> files_;                          // file names taken
  // Names the engine offered that the filter left out (index.json "not_dumped"), so a user
  // sees what a filter could select. Filled by wants(), which the engine calls for every name.
  mutable std::set<std::string, std::less<>> skipped_;
  uint64_t bytes_ = 0;
};

}  // namespace sluice::cli
