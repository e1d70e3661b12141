// State files (--kv-disk-dir, docs/state.md) at the published model's shapes: how long writing a
// snapshot (with fdatasync) and reading it back with every check take, against what the disk
// and the memory do in the same run:
//   write      write_state_file + fdatasync       vs  a raw write + fdatasync of as many bytes
//   cold read  read_state_file, page cache dropped vs a raw pread of the same file, dropped too
//   warm read  read_state_file from the page cache vs memcpy, and the MAC (SipHash-2-4) alone
// Median of --runs with min and max. The restore a hit then does (Engine::restore: a copy into
// the sequence state) is not included; a prefill of the same tokens is what a hit saves.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_timing.h"
#include "cli/bench_stats.h"
#include "model/deepseek41/config.h"
#include "runtime/state_disk.h"
#include "runtime/state_file.h"
#include "util/error.h"

using namespace sluice;

namespace {

const SipKey kBenchKey = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

SequenceSnapshot random_snapshot(const StateShape& s, uint32_t pos, std::mt19937_64& rng) {
  SequenceSnapshot snap;
  snap.ck.pos = pos;
  auto fill = [&](auto& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = (std::remove_reference_t<decltype(x)>)rng();
  };
  fill(snap.ck.window_kv, (size_t)s.layers * std::min(pos, s.window) * s.head_dim);
  for (const StateShape::Source& src : s.sources) {
    snap.ck.carry_k.emplace_back((size_t)(src.ratio - 1) * s.head_dim, 0.25f);
    snap.ck.carry_s.emplace_back((size_t)(src.ratio - 1) * s.head_dim, -1.0f);
    snap.kv.emplace_back();
    fill(snap.kv.back(), (size_t)(pos / src.ratio) * src.kv_row_bytes);
    snap.index_k.emplace_back();
    fill(snap.index_k.back(), (size_t)(pos / src.ratio) * src.index_row_bytes);
  }
  fill(snap.ck.engram_tail, s.engram_tail);
  return snap;
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open");
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("State file write and read throughput at the published model's shapes");
  std::string dir = "/var/tmp/sluice-bench-states";
  std::vector<uint32_t> positions = {2048, 8192, 32768};
  uint32_t ctx = 65536;
  int runs = 5;
  app.add_option("--dir", dir, "directory for the files (created; its bench files are removed at the end)");
  app.add_option("--positions", positions, "state positions (tokens)")->delimiter(',');
  app.add_option("--ctx", ctx, "the context the shapes are for");
  app.add_option("--runs", runs, "timed runs per figure")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    std::filesystem::create_directories(dir);
    const ModelConfig c = published_config();
    const StateShape shape = state_shape(c, ctx);
    Digest128 id{};
    id[0] = 1;
    std::mt19937_64 rng(42);
    std::printf("state files at the published shapes (ctx %u), median of %d runs [min, max]\n", ctx, runs);
    for (const uint32_t pos : positions) {
      if (pos == 0 || pos > ctx) throw Error("--positions: each in 1..ctx");
      const SequenceSnapshot snap = random_snapshot(shape, pos, rng);
      std::vector<TokenId> tokens(pos);
      for (auto& t : tokens) t = (TokenId)(rng() % c.vocab_size);
      std::vector<float> logits(c.vocab_size, 0.5f);
      const uint64_t bytes = state_file_bytes(shape, pos, true);
      const double mb = (double)bytes / 1e6;
      const std::string path = dir + "/bench.sstate", raw = dir + "/bench.raw";
      std::vector<uint8_t> buf(bytes, 7);
      std::vector<double> w, wr, cr, crr, hr, mr;
      for (int r = 0; r < runs; ++r) {
        std::filesystem::remove(path);
        std::filesystem::remove(raw);
        double t0 = now_s();
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        write_state_file(fd, path, shape, id, kBenchKey, tokens, snap, logits);
        ::fdatasync(fd);
        ::close(fd);
        w.push_back(now_s() - t0);
        t0 = now_s();
        fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        for (uint64_t off = 0; off < bytes;) {
          const ssize_t n = ::pwrite(fd, buf.data() + off, std::min<uint64_t>(bytes - off, 1u << 24), (off_t)off);
          if (n <= 0) throw Error(raw + ": write failed");
          off += (uint64_t)n;
        }
        ::fdatasync(fd);
        ::close(fd);
        wr.push_back(now_s() - t0);

        drop_cache(path);
        t0 = now_s();
        fd = ::open(path.c_str(), O_RDONLY);
        LoadedState ls;
        const StateCheck ok = read_state_file(fd, shape, id, kBenchKey, &ls);
        ::close(fd);
        cr.push_back(now_s() - t0);
        if (!ok) throw Error(path + ": " + ok.why);
        drop_cache(path);
        t0 = now_s();
        fd = ::open(path.c_str(), O_RDONLY);
        for (uint64_t off = 0; off < bytes;) {
          const ssize_t n = ::pread(fd, buf.data() + off, std::min<uint64_t>(bytes - off, 1u << 24), (off_t)off);
          if (n <= 0) throw Error(path + ": read failed");
          off += (uint64_t)n;
        }
        ::close(fd);
        crr.push_back(now_s() - t0);

        t0 = now_s();  // warm: the file is in the page cache now
        fd = ::open(path.c_str(), O_RDONLY);
        (void)read_state_file(fd, shape, id, kBenchKey, &ls);
        ::close(fd);
        hr.push_back(now_s() - t0);
        t0 = now_s();
        SipHash128 h(kBenchKey);  // the MAC the reader computes
        h.update(buf.data(), buf.size());
        volatile uint8_t sink = h.digest()[0];
        (void)sink;
        mr.push_back(now_s() - t0);
      }
      const double memcpy_gbs = bench::memcpy_gbs(std::min<uint64_t>(bytes, 256u << 20), 5);
      using cli::figure;
      const cli::Figure W = figure(w), WR = figure(wr), CR = figure(cr), CRR = figure(crr), HR = figure(hr), H = figure(mr);
      std::printf("\npos %u: %.1f MB per file (%.0f B per token)\n", pos, mb, (double)bytes / pos);
      std::printf("  write+sync  %7.1f ms [%.1f, %.1f]  %7.0f MB/s | raw write+sync %7.0f MB/s  ratio %.2f\n", W.median * 1e3,
                  W.min * 1e3, W.max * 1e3, mb / W.median, mb / WR.median, WR.median / W.median);
      std::printf("  cold read   %7.1f ms [%.1f, %.1f]  %7.0f MB/s | raw cold read  %7.0f MB/s  ratio %.2f\n", CR.median * 1e3,
                  CR.min * 1e3, CR.max * 1e3, mb / CR.median, mb / CRR.median, CRR.median / CR.median);
      std::printf("  warm read   %7.1f ms [%.1f, %.1f]  %7.0f MB/s | MAC hash alone %6.0f MB/s, memcpy %6.0f MB/s\n",
                  HR.median * 1e3, HR.min * 1e3, HR.max * 1e3, mb / HR.median, mb / H.median, memcpy_gbs * 1e3);
      std::printf("  a hit restores %u tokens in %.1f ms from disk (cold): %.0f tokens/ms\n", pos, CR.median * 1e3,
                  pos / (CR.median * 1e3));
      std::filesystem::remove(path);
      std::filesystem::remove(raw);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_state_disk: %s\n", e.what());
    return 1;
  }
  return 0;
}
