#include "server/request_memory.h"

#include <algorithm>

namespace sluice::server {

RequestMemory::Lease& RequestMemory::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_, bytes_ = o.bytes_;
    o.pool_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void RequestMemory::Lease::release() {
  if (pool_ && bytes_) pool_->give_back(bytes_);
  pool_ = nullptr, bytes_ = 0;
}

RequestMemory::Take RequestMemory::take(uint64_t bytes, Lease& lease) {
  std::lock_guard lk(mu_);
  if (bytes > capacity_ || lease.bytes_ > capacity_ - bytes) {
    ++refused_;
    return Take::TooLarge;
  }
  if (bytes > capacity_ - used_) {
    ++refused_;
    return Take::Busy;
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  lease.pool_ = this;
  lease.bytes_ += bytes;
  return Take::Ok;
}

void RequestMemory::give_back(uint64_t bytes) {
  std::lock_guard lk(mu_);
  used_ -= std::min(used_, bytes);
}

uint64_t RequestMemory::in_use() const {
  std::lock_guard lk(mu_);
  return used_;
}

uint64_t RequestMemory::peak() const {
  std::lock_guard lk(mu_);
  return peak_;
}

uint64_t RequestMemory::refused() const {
  std::lock_guard lk(mu_);
  return refused_;
}

}  // namespace sluice::server
