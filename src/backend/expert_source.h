// Where the forward pass gets routed-expert weights. The backend's routed_ffn touches routed
// experts only through this interface, once per layer per chunk: prepare() with the distinct
// experts it reads from the source (ascending), then get() for each of them in that order. A
// streaming store can therefore replace the resident weights without the engine knowing, and may
// hold a long chunk's union a window at a time (model/streamed_experts.h); a backend with copies
// of its own (the Vulkan backend's expert slots) prepares only the experts it lacks.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace sluice {

// Raw rows of one expert in its tensors' formats (ffn_{gate,up,down}_exps of the layer):
// gate/up: moe_intermediate_size rows of hidden_size; down: hidden_size rows of moe_intermediate_size.
struct ExpertWeights {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Called before get() for a layer with the experts about to be used (ascending, distinct).
  // Pointers returned by get() stay valid until the next prepare(), or until get() is asked for
  // a later expert (a windowed source then moves on): callers finish with one expert's weights
  // before they ask for the next. May throw Error.
  virtual void prepare(uint32_t layer, std::span<const uint32_t> experts) const {
    (void)layer;
    (void)experts;
  }
  virtual ExpertWeights get(uint32_t layer, uint32_t expert) const = 0;
  // A guess at the experts a later prepare() of `layer` will ask for (the next layer's router
  // applied to the current hidden state). Sources may start reading them in the background; a
  // wrong guess must cost only I/O, never change a result.
  virtual void hint(uint32_t layer, std::span<const uint32_t> experts) const {
    (void)layer;
    (void)experts;
  }
  // Calls use(e, weights) for each of `experts` whose bytes the source holds in memory now,
  // without reading, waiting or moving on from what prepare() leased; the pointers are valid
  // during the call only. For a backend that copies hinted experts ahead of their layer (the
  // Vulkan backend's slots on a card with memory of its own). A source that cannot tell shows none.
  using UseExpert = std::function<void(uint32_t expert, const ExpertWeights& w)>;
  virtual void at_hand(uint32_t layer, std::span<const uint32_t> experts, const UseExpert& use) const {
    (void)layer;
    (void)experts;
    (void)use;
  }
  // The experts of `layer` a prepare() would get without a new read (held in memory or already
  // being read), ascending. Only cache-aware routing asks (EngineOptions::route_bias); a source
  // that cannot tell returns none.
  virtual std::vector<uint32_t> cached(uint32_t layer) const {
    (void)layer;
    return {};
  }

  // True when every pointer get() hands out after a prepare() stays valid until the next
  // prepare() and get() may be asked in any order (the source holds the whole union at once). A
  // windowed source's pointers die when it moves on, so a caller that keeps one expert's bytes
  // while asking for the next, or asks for a later expert first, must know.
  virtual bool holds_union() const { return false; }

  // Where get()'s pointers lie, for a device that shares the host's memory and maps it once
  // instead of copying each expert (the Vulkan backend's --gpu-experts in-place): spans of
  // memory the source keeps, unchanged in address, from the first get() for as long as it lives,
  // each made of whole `unit`-byte pieces (from `base` on) of which no expert's slice straddles
  // two. A backend that mapped them lets go before the source's memory is freed
  // (release_gpu_imports). Empty: the source does not say, and its experts are copied or run on
  // the CPU.
  struct HeldMemory {
    const uint8_t* base = nullptr;
    uint64_t bytes = 0, unit = 0;
  };
  virtual std::vector<HeldMemory> held_memory() const { return {}; }

  // Distinct for every source this process makes (a new one at a freed one's address too), so a
  // backend may key copies of an expert's bytes by (id, layer, expert): a source's experts never
  // change while it lives.
  const uint64_t id = next_id();

 private:
  static uint64_t next_id() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
};

}  // namespace sluice
