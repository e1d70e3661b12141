// Who may write the state directory (--kv-disk-dir), and the key its files are signed with.
// A state file read back becomes the model's memory of a prompt, so only this server may have
// written it: the directory and every file used must belong to this user and be writable by no
// one else, and each file carries a MAC (util/siphash.h) under a key that lives beside them in
// DIR/.key, mode 0600, made from the system's random source the first time. A file that another
// user could have written is left alone and not read; one whose MAC fails is deleted and its
// state recomputed. docs/state.md, "Trust".
#pragma once
#include <sys/stat.h>

#include <optional>
#include <string>

#include "util/siphash.h"

namespace sluice {

// Why a directory with this status may not hold states ("owned by uid 0, not this user (uid
// 1000)", "others can write to it (mode 0777)"), or nullopt when it may.
std::optional<std::string> untrusted_dir_problem(const struct stat& st);
// Whether a state file with this status is one only this user could have written: a regular
// file owned by this user, writable by no one else.
bool trusted_state_file(const struct stat& st);
// DIR/.key: read when it is there (a regular file of 16 bytes owned by this user with no group
// or other permissions), else made. Throws Error naming the path and the cause. The caller holds
// the directory's lock, so two servers never race to make it.
SipKey state_dir_key(const std::string& dir);

}  // namespace sluice
