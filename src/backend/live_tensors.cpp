#include "backend/live_tensors.h"

#include <algorithm>

namespace sluice {

Tensor LiveTensors::make(const std::shared_ptr<LiveTensors>& self, size_t n, size_t width) {
  const size_t count = std::max<size_t>(n * width, 1);
  float* p = new float[count]();
  {
    const std::lock_guard<std::mutex> lk(self->mu_);
    self->live_[p] = Span{p + count, self->next_id_++};
  }
  // The deleter unregisters under the registry's lock, so a writer holding lock() never writes
  // into memory being freed.
  std::shared_ptr<float[]> mem(p, [reg = self](float* q) {
    {
      const std::lock_guard<std::mutex> lk(reg->mu_);
      reg->live_.erase(q);
    }
    delete[] q;
  });
  return Tensor(std::move(mem), n, width);
}

LiveTensors::Held LiveTensors::holder_locked(const float* p, size_t count) const {
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return {};
  --it;
  if (p >= it->first && p < it->second.end && count <= (size_t)(it->second.end - p)) return {it->second.id, it->first};
  return {};
}

LiveTensors::Held LiveTensors::holder(const float* p, size_t count) const {
  const std::lock_guard<std::mutex> lk(mu_);
  return holder_locked(p, count);
}

bool LiveTensors::alive(uint64_t id) const {
  // Few tensors live at once (the workspace's list), so a scan is enough.
  return id != 0 && std::any_of(live_.begin(), live_.end(), [&](const auto& kv) { return kv.second.id == id; });
}

size_t LiveTensors::count() const {
  const std::lock_guard<std::mutex> lk(mu_);
  return live_.size();
}

}  // namespace sluice
