// Prefill and decode throughput of the CPU forward pass on a given model:
//   bench_decode MODEL.gguf [--prompt N] [--gen N] [--threads T] [--chunk C] [--ctx N]
// Prefill evaluates a pseudo-random prompt in chunks of C; decode then feeds back the argmax
// token one position at a time. Prints tokens per second for both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/primitives.h"

using namespace sluice;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [--prompt N] [--gen N] [--threads T] [--chunk C] [--ctx N]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  uint32_t prompt = 128, gen = 32;
  EngineOptions o;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (k == "--prompt") prompt = (uint32_t)v;
    else if (k == "--gen") gen = (uint32_t)v;
    else if (k == "--threads") o.threads = (int)v;
    else if (k == "--chunk") o.chunk = (uint32_t)v;
    else if (k == "--ctx") o.ctx = (uint32_t)v;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  o.ctx = std::max(o.ctx, prompt + gen);
  using clock = std::chrono::steady_clock;
  try {
    const auto t0 = clock::now();
    auto model = load_model(path);
    const ModelConfig& c = model_config(*model);
    const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
    Engine e(*model, o);
    SequenceState s = e.new_sequence();
    std::vector<uint32_t> toks(prompt);
    uint64_t x = 1;
    for (auto& t : toks) t = (uint32_t)((x = splitmix64(x)) % c.vocab_size);
    std::vector<float> logits(c.vocab_size);
    const auto t1 = clock::now();
    // Prefill as a caller should: no logits for the prompt except its last position (the split
    // does not change any result: evaluation is chunking-invariant).
    if (prompt > 1) e.eval(s, std::span<const uint32_t>(toks.data(), prompt - 1), nullptr);
    if (prompt) e.eval(s, std::span<const uint32_t>(toks.data() + prompt - 1, 1), logits.data());
    const double pre_s = std::chrono::duration<double>(clock::now() - t1).count();
    const float* last = logits.data();
    uint32_t next = (uint32_t)(std::max_element(last, last + c.vocab_size) - last);
    const auto t2 = clock::now();
    for (uint32_t i = 0; i < gen; ++i) {
      e.eval(s, std::span<const uint32_t>(&next, 1), logits.data());
      next = (uint32_t)(std::max_element(logits.data(), logits.data() + c.vocab_size) - logits.data());
    }
    const double dec_s = std::chrono::duration<double>(clock::now() - t2).count();
    std::printf("model %s: %u layers, hidden %u, %u experts; isa %s, threads %d, chunk %u\n", path.c_str(),
                c.num_hidden_layers, c.hidden_size, c.n_routed_experts, std::string(isa_name(active_isa())).c_str(),
                o.threads, o.chunk);
    std::printf("load    %.2f s\n", load_s);
    std::printf("prefill %u tokens in %.3f s: %.2f tok/s\n", prompt, pre_s, prompt / pre_s);
    std::printf("decode  %u tokens in %.3f s: %.2f tok/s (last token %u)\n", gen, dec_s, gen / dec_s, next);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
