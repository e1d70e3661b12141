// A model file's identity: what state files are keyed by (runtime/state_file.h) and what the ranks
// of an expert-parallel job compare before working together (fabric Hello). It covers every byte
// that affects the output: a hash of the whole file (header, metadata, tensor table, all tensor
// data), plus the numerics options that change a state (a lossy route bias). Not the path: a copied
// or moved model finds its states.
//
// Hashing every byte of a 365 GB file takes minutes at disk speed, so the file's digest is
// computed once per version of the file and cached in the user's cache directory
// ($SLUICE_CACHE_DIR, else $XDG_CACHE_HOME/sluice, else $HOME/.cache/sluice, file
// model-identity), keyed by device, inode, size, mtime and ctime: a write changes mtime and ctime,
// a replaced file has a new inode, so any change is hashed again. A cache directory another user
// owns or others can write is not used (the digest is computed each time); nor is an entry that
// does not parse. At most kIdentityCacheEntries are kept, the newest.
#pragma once
#include <cstddef>
#include <string>

#include "util/hash.h"

namespace sluice {

inline constexpr size_t kIdentityCacheEntries = 64;

// The digest of every byte of the file (no cache). Throws Error naming the path and the cause.
Digest128 model_content_digest(const std::string& path);

// The identity (cached content digest + route bias). Throws Error naming the path and the cause;
// cache problems are not errors (the digest is computed afresh).
Digest128 model_file_identity(const std::string& path, float route_bias);

// The cache directory the rules above pick ("" when none can be named).
std::string identity_cache_dir();

}  // namespace sluice
