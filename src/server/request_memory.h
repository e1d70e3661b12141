// The server's working memory for requests, a pool of bytes charged in the plan
// (serve --request-memory). What a request holds besides the model's state is taken from it
// before it is allocated: the transport takes a body's bytes (as received and as the request's
// copy) before reading it; a handler takes the bound of its parsed JSON (text/json_cost.h) and
// its own working memory before parsing. What is not free now is refused with 503 and
// Retry-After (another request holds it); what is more than the whole pool with 413 (the
// request is too large for this server, whatever else runs).
#pragma once
#include <cstdint>
#include <mutex>

namespace sluice::server {

class RequestMemory {
 public:
  // Bytes taken from the pool, given back when it goes.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(o.pool_), bytes_(o.bytes_) { o.pool_ = nullptr, o.bytes_ = 0; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }
    uint64_t bytes() const { return bytes_; }
    void release();

   private:
    friend class RequestMemory;
    RequestMemory* pool_ = nullptr;
    uint64_t bytes_ = 0;
  };
  enum class Take { Ok, Busy, TooLarge };

  explicit RequestMemory(uint64_t capacity) : capacity_(capacity) {}
  // Adds `bytes` to `lease` (empty or from this pool) when they are free now.
  Take take(uint64_t bytes, Lease& lease);
  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const;
  uint64_t peak() const;
  uint64_t refused() const;  // takes refused (Busy or TooLarge) since the start

 private:
  void give_back(uint64_t bytes);

  const uint64_t capacity_;
  mutable std::mutex mu_;
  uint64_t used_ = 0, peak_ = 0, refused_ = 0;
};

}  // namespace sluice::server
