// The one type of a token id, from the tokenizer through sampling and the session to the
// APIs and the command line. Unsigned: an id indexes the vocabulary and the logits, and the
// model's embedding rows; "no such token" is an empty std::optional, never a negative id.
#pragma once
#include <cstdint>

namespace sluice {

using TokenId = uint32_t;

}  // namespace sluice
