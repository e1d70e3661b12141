// A prompt as a template renders it: the text, and the byte ranges of it that came from outside
// (message content, tool results, tool schemas, documents). Text inside those ranges is data:
// the tokenizer never reads an added token (a control token such as <｜User｜>, or any other
// token the vocabulary adds beside BPE) inside one, so a web page an agent reads that spells
// "<｜User｜>" stays ordinary letters and cannot open a turn. The template's own markers, outside
// the ranges, stay the control tokens the model was trained on. docs/server.md, "Trust model".
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::text {

struct TextRange {
  size_t begin = 0, end = 0;  // bytes [begin, end)
  bool operator==(const TextRange&) const = default;
};

struct PromptText {
  std::string text;
  std::vector<TextRange> data;  // sorted, disjoint, non-empty, never adjacent

  void markup(std::string_view s) { text += s; }
  void add_data(std::string_view s);   // joins a data range that ends where s starts
  void append(const PromptText& p);    // p's markup stays markup, its data stays data
};

// The data ranges of `r` from byte `from` on, clipped and shifted so `from` is 0 (for encoding
// the tail of a prompt whose head is already tokens).
std::vector<TextRange> data_from(std::span<const TextRange> r, size_t from);

// Whether byte range [b, e) overlaps a data range of `r`.
bool overlaps_data(std::span<const TextRange> r, size_t b, size_t e);

}  // namespace sluice::text
