// UTF-8 helpers shared by the tokenizer, the streaming decoder and the chat/DSML code.
// Invalid input is never an error here: each function says what it does with bad bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::text {

// Appends the UTF-8 form of `cp` (callers pass cp <= 0x10FFFF).
void append_utf8(std::string& out, uint32_t cp);

// Length (1..4) of the well-formed UTF-8 sequence starting at s[i], with its code point in
// `cp`; 0 when the bytes there are not a complete well-formed sequence (stray continuation
// byte, overlong form, surrogate, > U+10FFFF, truncated).
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp);

// Copies `s` to `out` with every ill-formed part replaced by U+FFFD, one per maximal
// subpart (the Unicode / WHATWG rule). With final = false it stops before a sequence that is
// incomplete at the end of `s` but could still be completed by more bytes. Returns the number
// of bytes of `s` consumed. Because the decision at any byte only looks at the next <= 3
// bytes, feeding a string in pieces (keeping the unconsumed tail) gives exactly the output
// of one final call on the whole string.
size_t utf8_sanitize_append(std::string_view s, bool final, std::string& out);

// utf8_sanitize_append over the whole string, final.
std::string utf8_sanitize(std::string_view s);

bool utf8_valid(std::string_view s);

// Text that arrives in pieces (a token's bytes may end inside a character) made into valid
// UTF-8 for a terminal or a pipe: push() returns what is complete, holding back an incomplete
// tail for the next piece; every ill-formed part becomes a visible U+FFFD. finish() flushes a
// tail still incomplete at the end as U+FFFD. The output is the same however the text is cut.
class Utf8Stream {
 public:
  std::string push(std::string_view piece);
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace sluice::text
