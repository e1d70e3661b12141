// Expert parallelism (issue 17, docs/scale-out.md) in one process: the ranks of a LocalFabric are
// threads, each peer an ExpertHost serving its experts, rank 0 a Session whose routed experts partly
// come over the fabric. The logits equal a single process's bit for bit (2 and 3 ranks, balanced
// and an interleaved placement, streamed and resident experts, chunked prefill and decode); the
// traffic counters equal the frame formula over the traced routing; a peer that stops answering
// is an Error naming it within the timeout; a handshake mismatch names the field; malformed frames
// are refused with their cause. The same job under mpirun is tests/fabric/mpi_job.sh.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fabric/frames.h"
#include "fabric/local_fabric.h"
#include "fabric/placement.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/deepseek41/primitives.h"
#include "runtime/expert_host.h"
#include "runtime/expert_parallel.h"
#include "runtime/session.h"
#include "storage/expert_store.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ExpertParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-expert-parallel-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    for (int seed : {1, 2}) {
      const std::string p = (dir_ / ("tiny" + std::to_string(seed) + ".gguf")).string();
      const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny --seed " +
                              std::to_string(seed) + " -o " + p + " > /dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string model(int seed = 1) { return (dir_ / ("tiny" + std::to_string(seed) + ".gguf")).string(); }
  static SessionOptions opts(bool stream, uint32_t chunk = 8, int seed = 1) {
    SessionOptions so;
    so.model_path = model(seed);
    so.ctx = 256;
    so.chunk = chunk;
    so.threads = 1;
    so.stream_experts = stream;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;
    return so;
  }
  static std::vector<uint32_t> tokens(uint32_t n, uint64_t seed) {
    std::vector<uint32_t> t(n);
    uint64_t x = seed;
    for (uint32_t i = 0; i < n; ++i) {
      x = splitmix64(x);
      t[i] = 3 + (uint32_t)(x % 500);
    }
    return t;
  }
  static fs::path dir_;
};
fs::path ExpertParallel::dir_;

// Every layer's routed sum (f32, before it is rounded: a change in the order terms are added in
// shows here even where BF16 rounding would hide it), by name and position.
struct RoutedSums final : TensorObserver {
  std::map<std::string, std::map<uint32_t, std::vector<float>>> rows;
  bool wants(std::string_view name) const override { return name.ends_with(".ffn_routed"); }
  void observe(std::string_view name, uint32_t p0, uint32_t n, const float* data, size_t width, size_t stride) override {
    for (uint32_t i = 0; i < n; ++i) rows[std::string(name)][p0 + i].assign(data + i * stride, data + i * stride + width);
  }
};

// Every row of logits, by position, and each pass's routing.
struct Seen {
  std::map<uint32_t, std::vector<float>> rows;
  std::vector<std::vector<TokenTrace>> passes;
  EvalObserver observer(uint32_t V) {
    EvalObserver o;
    o.want_trace = true;
    o.on_eval = [this, V](uint32_t first, std::span<const uint32_t> toks, const float* logits,
                          const std::vector<TokenTrace>* tr) {
      for (size_t i = 0; i < toks.size(); ++i) rows[first + (uint32_t)i].assign(logits + i * V, logits + (i + 1) * V);
      passes.push_back(*tr);
    };
    return o;
  }
};

GenerateRequest request(std::vector<uint32_t> prompt, uint32_t max_tokens, const EvalObserver* obs) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.observer = obs;
  return r;
}

// `rows`: the most rows per exchange the rank's admission holds (a peer's plan's chunk).
fabric::Hello hello_for(const SessionOptions& so, const fabric::Placement& p, int rank, uint32_t rows) {
  const ModelHeader h = open_model_header(so.model_path);
  fabric::Hello me = own_hello(so.model_path, h.config, p);
  me.owned_experts = p.owned_by(rank);
  me.resident = !so.stream_experts;
  me.rows = rows;
  return me;
}

// A peer thread: an ExpertHost of its own (its experts only), Hello, then serving until Bye.
// `error` gets what ended it.
struct Peer {
  std::thread t;
  std::string error;
  ServeStats stats;
  uint64_t loaded_bytes = 0;
  storage::LayerStats store;  // its expert store's totals when serving ended (streamed)
  void run(fabric::Fabric& f, SessionOptions so, fabric::Placement p) {
    t = std::thread([this, &f, so, p] {
      try {
        const ExpertHost host(so, open_model_header(so.model_path), p, f.rank());
        loaded_bytes = host.model().loaded_bytes;
        const JobStart job = join_job(f, hello_for(so, p, f.rank(), host.plan().chunk), 20s);
        stats = serve_experts(f, host.backend(), host.model(), host.experts(), p, job, {}, host.store());
        if (host.store()) store = host.store()->stats().total();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
};

// Owner rank e % ranks: every rank's experts interleave, so the merge of local and remote terms
// is tested in the general order, not only as one block after another.
fabric::Placement interleaved(uint32_t ranks, uint32_t layers, uint32_t experts) {
  std::string text = "# interleaved\n";
  for (uint32_t l = 0; l < layers; ++l) {
    text += std::to_string(l) + ":";
    for (uint32_t e = 0; e < experts; ++e) {
      text += ' ';
      text += std::to_string(e % ranks);
    }
    text += "\n";
  }
  return fabric::parse_placement(text, ranks, layers, experts);
}

struct JobResult {
  Seen seen;
  RoutedSums sums;
  std::vector<uint32_t> generated;
  std::vector<PeerTraffic> traffic;
  std::vector<ServeStats> served;
  std::vector<storage::LayerStats> stores;  // each peer's, when it stopped
};

// The request run by rank 0 of a job of `ranks` ranks (peers as threads).
// How the experts are placed: balanced, interleaved, or local-first from a routing profile.
enum class Layout { Balanced, Interleaved, LocalFirst };

// The routing profile of a run's traced passes.
fabric::RoutingProfile profile_of(const Seen& s, const ModelConfig& c) {
  fabric::RoutingProfile prof{c.num_hidden_layers, c.n_routed_experts, {}};
  prof.count.assign((size_t)c.num_hidden_layers * c.n_routed_experts, 0);
  for (const std::vector<TokenTrace>& pass : s.passes)
    for (const TokenTrace& t : pass)
      for (uint32_t L = 0; L < c.num_hidden_layers; ++L)
        for (uint32_t e : t.experts[L]) prof.count[(size_t)L * c.n_routed_experts + e] += 1;
  return prof;
}

JobResult run_job(uint32_t ranks, uint32_t chunk, bool interleave, const std::vector<uint32_t>& prompt,
                  uint32_t gen, SessionOptions base, const fabric::Placement* given = nullptr) {
  fabric::LocalHub hub((int)ranks);
  std::vector<std::unique_ptr<fabric::LocalFabric>> fab;
  for (uint32_t r = 0; r < ranks; ++r) fab.push_back(std::make_unique<fabric::LocalFabric>(hub, (int)r));
  const ModelHeader h = open_model_header(base.model_path);
  const ModelConfig& c = h.config;
  const fabric::Placement p = given        ? *given
                              : interleave ? interleaved(ranks, c.num_hidden_layers, c.n_routed_experts)
                                           : fabric::balanced_placement(ranks, c.num_hidden_layers, c.n_routed_experts);
  std::vector<Peer> peers(ranks);
  for (uint32_t r = 1; r < ranks; ++r) peers[r].run(*fab[r], base, p);
  JobResult out;
  {
    FabricExperts fx(*fab[0], p, c.hidden_size, 5000ms);
    SessionOptions so = base;
    so.remote = &fx;
    so.tensors = &out.sums;
    Session s(so);
    start_job(*fab[0], hello_for(so, p, 0, 0), 0x1234, std::max(chunk, 16u), 20s);
    fx.start(0x1234, std::max(chunk, 16u));
    const EvalObserver obs = out.seen.observer(c.vocab_size);
    out.generated = s.generate(request(prompt, gen, &obs), {}, {}).tokens;
    out.traffic = fx.traffic();
    fx.end();
  }
  for (uint32_t r = 1; r < ranks; ++r) {
    peers[r].t.join();
    EXPECT_EQ(peers[r].error, "") << "rank " << r;
    out.served.push_back(peers[r].stats);
    out.stores.push_back(peers[r].store);
  }
  return out;
}

TEST_F(ExpertParallel, LogitsEqualOneProcessBitForBit) {
  const std::vector<uint32_t> prompt = tokens(37, 7);
  for (bool stream : {true, false}) {
    RoutedSums want_sums;
    SessionOptions so = opts(stream);
    so.tensors = &want_sums;
    Session single(so);
    Seen want;
    const EvalObserver wobs = want.observer(single.config().vocab_size);
    const std::vector<uint32_t> want_tokens = single.generate(request(prompt, 12, &wobs), {}, {}).tokens;
    const fabric::RoutingProfile prof = profile_of(want, single.config());
    for (uint32_t ranks : {2u, 3u}) {
      uint64_t remote_terms[3] = {0, 0, 0};
      for (Layout layout : {Layout::Balanced, Layout::Interleaved, Layout::LocalFirst}) {
        const char* names[3] = {"balanced", "interleaved", "local-first"};
        SCOPED_TRACE(std::string(stream ? "streamed" : "resident") + ", " + std::to_string(ranks) + " ranks, " +
                     names[(int)layout]);
        const fabric::Placement local_first = fabric::local_first_placement(prof, ranks);
        const JobResult got = run_job(ranks, 8, layout == Layout::Interleaved, prompt, 12, opts(stream),
                                      layout == Layout::LocalFirst ? &local_first : nullptr);
        for (uint32_t r = 1; r < ranks; ++r) remote_terms[(int)layout] += got.traffic[r].triples;
        EXPECT_EQ(got.generated, want_tokens);
        ASSERT_EQ(got.seen.rows.size(), want.rows.size());
        for (const auto& [pos, row] : want.rows) {
          ASSERT_TRUE(got.seen.rows.count(pos));
          EXPECT_EQ(std::memcmp(row.data(), got.seen.rows.at(pos).data(), row.size() * sizeof(float)), 0)
              << "logits at position " << pos;
        }
        ASSERT_EQ(got.sums.rows.size(), want_sums.rows.size());
        for (const auto& [name, by_pos] : want_sums.rows)
          for (const auto& [pos, row] : by_pos)
            ASSERT_EQ(std::memcmp(row.data(), got.sums.rows.at(name).at(pos).data(), row.size() * sizeof(float)), 0)
                << name << " at position " << pos;
        for (uint32_t r = 1; r < ranks; ++r) EXPECT_GT(got.traffic[r].triples, 0u) << "rank " << r << " computed nothing";
      }
      // Rank 0 keeping the experts this prompt chooses most leaves fewer terms to the fabric
      // (the profile is this very run's, with the rank's even share of experts).
      EXPECT_LT(remote_terms[(int)Layout::LocalFirst], remote_terms[(int)Layout::Balanced]) << ranks << " ranks";
    }
  }
}

// Bytes per exchange: header + BF16 rows + 12 per triple out, header + f32 per triple back; one
// exchange per (pass, layer, rank) with work. Summed over the traced routing of every pass.
TEST_F(ExpertParallel, TrafficEqualsTheFrameFormulaOverTheTracedRouting) {
  const std::vector<uint32_t> prompt = tokens(29, 9);
  const JobResult got = run_job(3, 8, false, prompt, 6, opts(true));
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = fabric::balanced_placement(3, c.num_hidden_layers, c.n_routed_experts);
  std::vector<uint64_t> out(3, 0), back(3, 0), exchanges(3, 0), terms(3, 0);
  for (const std::vector<TokenTrace>& pass : got.seen.passes)
    for (uint32_t L = 0; L < c.num_hidden_layers; ++L)
      for (int r = 1; r < 3; ++r) {
        uint64_t rows = 0, triples = 0;
        for (const TokenTrace& t : pass) {
          uint64_t k = 0;
          for (uint32_t e : t.experts[L]) k += p.owner_of(L, e) == r;
          rows += k > 0;
          triples += k;
        }
        if (!triples) continue;
        exchanges[r] += 1;
        terms[r] += triples;
        out[r] += fabric::work_frame_bytes(rows, triples, c.hidden_size);
        back[r] += fabric::result_frame_bytes(triples, c.hidden_size);
      }
  const std::string metrics = fabric_metrics(got.traffic);
  EXPECT_NE(metrics.find("sluice_fabric_ranks 3\n"), std::string::npos) << metrics;
  for (int r = 1; r < 3; ++r) {
    const std::string label = "{rank=\"" + std::to_string(r) + "\"}";
    EXPECT_NE(metrics.find("sluice_fabric_sent_bytes_total" + label + " " + std::to_string(out[r]) + "\n"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("sluice_fabric_expert_terms_total" + label + " " + std::to_string(terms[r]) + "\n"),
              std::string::npos);
    EXPECT_GT(exchanges[r], 0u);
    EXPECT_EQ(got.traffic[r].exchanges, exchanges[r]) << "rank " << r;
    EXPECT_EQ(got.traffic[r].triples, terms[r]) << "rank " << r;
    EXPECT_EQ(got.traffic[r].work_bytes, out[r]) << "rank " << r;
    EXPECT_EQ(got.traffic[r].result_bytes, back[r]) << "rank " << r;
    EXPECT_EQ(got.served[r - 1].triples, terms[r]) << "rank " << r;
    // Each answer carries the peer's store counters: rank 0 saw the last ones.
    EXPECT_GT(got.traffic[r].store_requests, 0u) << "rank " << r;
    EXPECT_EQ(got.traffic[r].store_requests, got.stores[r - 1].requests) << "rank " << r;
    EXPECT_EQ(got.traffic[r].store_hits, got.stores[r - 1].hits) << "rank " << r;
    EXPECT_NE(metrics.find("sluice_fabric_expert_requests_total" + label + " " + std::to_string(got.stores[r - 1].requests) + "\n"),
              std::string::npos);
    // The next layer's predicted experts reach their rank as Hints, which its store reads ahead.
    EXPECT_GT(got.traffic[r].hints, 0u) << "rank " << r;
    EXPECT_EQ(got.served[r - 1].hints, got.traffic[r].hints) << "rank " << r;
    EXPECT_GT(got.stores[r - 1].prefetch_issued, 0u) << "rank " << r;
  }
}

// A peer that stops answering (as under SIGSTOP): the pass fails with an Error naming the rank,
// the layer and the timeout, within the timeout and a little.
TEST_F(ExpertParallel, APeerThatStopsAnsweringIsAnErrorWithinTheTimeout) {
  fabric::LocalHub hub(2);
  fabric::LocalFabric f0(hub, 0), f1(hub, 1);
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = fabric::balanced_placement(2, c.num_hidden_layers, c.n_routed_experts);
  std::atomic<bool> quit{false};
  std::thread silent([&] {
    join_job(f1, hello_for(opts(true), p, 1, 16), 20s);
    while (!quit) std::this_thread::sleep_for(5ms);  // takes the Work frames in, never answers
  });
  FabricExperts fx(f0, p, c.hidden_size, 300ms);
  SessionOptions so = opts(true);
  so.remote = &fx;
  Session s(so);
  start_job(f0, hello_for(so, p, 0, 0), 77, 16, 20s);
  fx.start(77, 16);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.generate(request(tokens(1, 3), 2, nullptr), {}, {});  // one row: the decode deadline
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 did not return layer "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("within 300 ms"), std::string::npos) << e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 0.3 + 2.0);
  EXPECT_GE(secs, 0.3);
  quit = true;
  silent.join();
}

// A 2-rank handshake that must not start: rank 1 says `peer`, rank 0 `mine` with `max_rows`.
// Returns each side's Error (a job that started is a failure).
struct Refusal {
  std::string coordinator, peer;
};
Refusal refused_start(const fabric::Hello& peer, const fabric::Hello& mine, uint32_t max_rows) {
  fabric::LocalHub hub(2);
  fabric::LocalFabric f0(hub, 0), f1(hub, 1);
  Refusal r;
  std::thread t([&] {
    try {
      join_job(f1, peer, 20s);
    } catch (const Error& e) {
      r.peer = e.what();
    }
  });
  try {
    start_job(f0, mine, 5, max_rows, 20s);
    ADD_FAILURE() << "the job started";
  } catch (const Error& e) {
    r.coordinator = e.what();
  }
  t.join();
  return r;
}

// The handshake compares what each rank is: another model file, or another placement, and the job
// does not start, on either side, naming the field.
TEST_F(ExpertParallel, AHandshakeMismatchIsRefusedNamingTheField) {
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement balanced = fabric::balanced_placement(2, c.num_hidden_layers, c.n_routed_experts);
  const fabric::Placement other = interleaved(2, c.num_hidden_layers, c.n_routed_experts);
  struct Case {
    int seed;
    const fabric::Placement* peer_placement;
    const char* field;
  };
  for (const Case& k : {Case{2, &balanced, "model file identity"}, Case{1, &other, "placement"}}) {
    SCOPED_TRACE(k.field);
    const Refusal r = refused_start(hello_for(opts(true, 8, k.seed), *k.peer_placement, 1, 16),
                                    hello_for(opts(true), balanced, 0, 0), 16);
    EXPECT_NE(r.coordinator.find(std::string("rank 1 differs from rank 0 in its ") + k.field), std::string::npos)
        << r.coordinator;
    const std::string& peer_error = r.peer;
    EXPECT_NE(peer_error.find("the job does not start"), std::string::npos) << peer_error;
    EXPECT_NE(peer_error.find(k.field), std::string::npos) << peer_error;
  }
}

// A Work frame for an expert the peer does not own is answered with Failed naming it, and the
// peer stops serving with the same Error.
TEST_F(ExpertParallel, APeerRefusesWorkForAnExpertItDoesNotOwn) {
  fabric::LocalHub hub(2);
  fabric::LocalFabric f0(hub, 0), f1(hub, 1);
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = fabric::balanced_placement(2, c.num_hidden_layers, c.n_routed_experts);
  Peer peer;
  peer.run(f1, opts(true), p);
  start_job(f0, hello_for(opts(true), p, 0, 0), 99, 16, 20s);
  const std::vector<uint16_t> row(c.hidden_size, 0x3f80);  // 1.0
  const fabric::WorkTriple t{0, 0, 0.5f};                  // expert 0 is rank 0's
  f0.send(1, fabric::kTagToPeer, fabric::encode_work(99, 1, 0, c.hidden_size, row, std::span(&t, 1)));
  const std::optional<std::vector<uint8_t>> m = f0.recv(1, fabric::kTagToCoordinator, 1 << 16, fabric::deadline_in(20s));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(fabric::decode_header(*m, 1).kind, fabric::Kind::Failed);
  EXPECT_NE(fabric::decode_text(*m, 1).find("expert 0 of layer 0, which rank 1 does not own"), std::string::npos);
  peer.t.join();
  EXPECT_NE(peer.error.find("does not own"), std::string::npos) << peer.error;
}

// A peer holds the experts the placement gives it and nothing else: the loaded bytes are its
// owned slices, packed; each equals the whole model's bytes of that expert; asking for another
// rank's expert is an Error; its plan has no dense weights or sequence state, an exchange of
// exchange_rows(--chunk) rows, and (streamed) a cache of at most the owned experts.
TEST_F(ExpertParallel, APeerLoadsOnlyTheExpertsItOwns) {
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = interleaved(3, c.num_hidden_layers, c.n_routed_experts);
  const ExpertHost host(opts(false), h, p, 1);
  LoadOptions whole;
  whole.resident_experts = true;
  const std::unique_ptr<Model> full = load_model(model(), whole);
  uint64_t want = 0;
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    uint64_t n = 0;
    for (uint32_t e = 0; e < c.n_routed_experts; ++e) n += p.owner_of(L, e) == 1;
    const ExpertLayout& g = full->experts.layouts[L];
    for (uint64_t slice : {g.gate_bytes, g.up_bytes, g.down_bytes}) want += aligned_tensor_bytes(n * slice);
  }
  EXPECT_EQ(host.owned_experts(), p.owned_by(1));
  EXPECT_EQ(host.model().loaded_bytes, want);
  const ExpertSource& mine = host.experts();
  const ExpertSource& all = resident_expert_source(*full);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const ExpertLayout& g = full->experts.layouts[L];
    for (uint32_t e = 0; e < c.n_routed_experts; ++e) {
      if (p.owner_of(L, e) != 1) {
        try {
          mine.get(L, e);
          ADD_FAILURE() << "expert " << e << " of layer " << L << " is another rank's";
        } catch (const Error& err) {
          EXPECT_NE(std::string(err.what()).find("is not loaded in this process"), std::string::npos) << err.what();
        }
        continue;
      }
      const ExpertWeights a = mine.get(L, e), b = all.get(L, e);
      ASSERT_EQ(std::memcmp(a.gate, b.gate, g.gate_bytes), 0) << "layer " << L << " expert " << e;
      ASSERT_EQ(std::memcmp(a.up, b.up, g.up_bytes), 0) << "layer " << L << " expert " << e;
      ASSERT_EQ(std::memcmp(a.down, b.down, g.down_bytes), 0) << "layer " << L << " expert " << e;
    }
  }
  const Plan& pl = host.plan();
  EXPECT_TRUE(pl.admitted);
  EXPECT_EQ(pl.chunk, exchange_rows(8, 1));
  bool owned_line = false, scratch_line = false;
  for (const PlanLine& l : pl.mandatory) {
    EXPECT_NE(l.name, "resident weights");
    EXPECT_NE(l.name, "sequence state");
    if (l.name == "owned experts") {
      owned_line = true;
      EXPECT_EQ(l.bytes, want);
    }
    if (l.name == "exchange scratch") {
      scratch_line = true;
      EXPECT_EQ(l.bytes, exchange_scratch_bytes(c, pl.chunk));
    }
  }
  EXPECT_TRUE(owned_line && scratch_line) << format_plan(pl);
  const ExpertHost streamed(opts(true), h, p, 1);
  EXPECT_EQ(streamed.model().loaded_bytes, 0u);
  EXPECT_GT(streamed.plan().cache_slots, 0u);
  EXPECT_LE(streamed.plan().cache_slots, p.owned_by(1));
  // A peer owning fewer experts of a layer than top_k needs a cache of only those: rank 0 keeps
  // 14 of 16 per layer, each peer holds one per layer, in a cache of one slot per layer.
  fabric::RoutingProfile flat{c.num_hidden_layers, c.n_routed_experts, {}};
  flat.count.assign((size_t)c.num_hidden_layers * c.n_routed_experts, 1);
  const fabric::Placement lean = fabric::local_first_placement(flat, 3, c.n_routed_experts - 2);
  SessionOptions small = opts(true);
  small.max_cache_experts = c.num_hidden_layers;
  const ExpertHost one(small, h, lean, 2);
  EXPECT_TRUE(one.plan().admitted);
  EXPECT_EQ(one.plan().cache_slots, c.num_hidden_layers);
}

// Rank 0's plan charges one layer's exchange of a chunk: the frames to every rank, the answers
// and the split terms, on top of what one process would plan.
TEST_F(ExpertParallel, RankZerosPlanChargesTheExchange) {
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = fabric::balanced_placement(3, c.num_hidden_layers, c.n_routed_experts);
  fabric::LocalHub hub(3);
  fabric::LocalFabric f0(hub, 0);
  FabricExperts fx(f0, p, c.hidden_size, 1000ms);
  SessionOptions so = opts(true);
  so.remote = &fx;
  const Session with(so);
  const Session alone(opts(true));
  const Plan& a = with.plan();
  const Plan& b = alone.plan();
  ASSERT_EQ(a.chunk, b.chunk);
  const uint64_t triples = (uint64_t)a.chunk * c.num_experts_per_tok;
  const uint64_t want = fx.exchange_bytes(a.chunk, triples) + split_moe_bytes(c, triples);
  EXPECT_GT(fx.exchange_bytes(a.chunk, triples), 2 * fabric::work_frame_bytes(a.chunk, 0, c.hidden_size));
  uint64_t got = 0;
  for (const PlanLine& l : a.mandatory)
    if (l.name == "fabric exchange") got = l.bytes;
  for (const PlanLine& l : b.mandatory) EXPECT_NE(l.name, "fabric exchange");
  EXPECT_EQ(got, want) << format_plan(a);
  // Everything else as one process plans it (but the measured overhead, which is this process's
  // resident set at the time).
  const auto sum_but_overhead = [](const Plan& q) {
    uint64_t t = 0;
    for (const PlanLine& l : q.mandatory)
      if (l.name != "runtime overhead") t += l.bytes;
    return t;
  };
  EXPECT_EQ(sum_but_overhead(a), sum_but_overhead(b) + want);
}

// Rank 0 sends exchanges of up to its max_rows; a peer whose admission holds fewer is refused at
// the handshake, naming both figures, and the peer is told why.
TEST_F(ExpertParallel, APeerHoldingFewerRowsThanRankZeroSendsIsRefused) {
  const ModelHeader h = open_model_header(model());
  const ModelConfig& c = h.config;
  const fabric::Placement p = fabric::balanced_placement(2, c.num_hidden_layers, c.n_routed_experts);
  const Refusal r = refused_start(hello_for(opts(true), p, 1, 8), hello_for(opts(true), p, 0, 0), 16);
  EXPECT_NE(r.coordinator.find("rank 1 holds exchanges of at most 8 rows"), std::string::npos) << r.coordinator;
  EXPECT_NE(r.coordinator.find("rank 0 sends up to 16"), std::string::npos) << r.coordinator;
  const std::string& peer_error = r.peer;
  EXPECT_NE(peer_error.find("at most 8 rows"), std::string::npos) << peer_error;
}

// Every field a receiver checks, broken one at a time.
TEST(FabricFrames, MalformedWorkFramesAreRefusedWithTheirCause) {
  const uint32_t W = 8;
  std::vector<uint16_t> rows(2 * W, 0x3f80);
  const std::vector<fabric::WorkTriple> ok = {{3, 0, 0.25f}, {3, 1, 0.5f}, {7, 1, 0.125f}};
  fabric::Expect ex;
  ex.from = 0;
  ex.nonce = 42;
  ex.layers = 4;
  ex.experts = 16;
  ex.width = W;
  ex.max_rows = 4;
  ex.max_triples = 24;
  const std::vector<uint8_t> good = fabric::encode_work(42, 9, 2, W, rows, ok);
  const fabric::Work w = fabric::decode_work(good, ex);
  EXPECT_EQ(w.h.seq, 9u);
  EXPECT_EQ(w.h.layer, 2u);
  EXPECT_EQ(w.h.rows, 2u);
  ASSERT_EQ(w.triples.size(), 3u);
  EXPECT_EQ(w.triples[2].expert, 7u);
  EXPECT_EQ(w.triples[1].weight, 0.5f);
  EXPECT_EQ(good.size(), fabric::work_frame_bytes(2, 3, W));

  const auto refused = [&](std::vector<uint8_t> m, const std::string& cause) {
    try {
      fabric::decode_work(m, ex);
      ADD_FAILURE() << "accepted: " << cause;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fabric: rank 0 sent"), std::string::npos) << e.what();
    }
  };
  const auto poke32 = [&](size_t at, uint32_t v) {
    std::vector<uint8_t> m = good;
    std::memcpy(m.data() + at, &v, 4);
    return m;
  };
  refused(std::vector<uint8_t>(good.begin(), good.begin() + 10), "shorter than its header");
  refused(poke32(0, 0xdeadbeef), "bad magic");
  refused(poke32(48, 1), "reserved header bytes");
  {
    std::vector<uint8_t> m = good;
    m[4] = 9;
    refused(m, "protocol version 9");
  }
  {
    std::vector<uint8_t> m = good;
    m[6] = 99;
    refused(m, "unknown kind 99");
  }
  refused(fabric::encode_work(43, 9, 2, W, rows, ok), "another job's nonce");
  refused(fabric::encode_work(42, 9, 4, W, rows, ok), "layer 4");
  std::vector<uint16_t> wide(2 * (W + 1), 0);
  refused(fabric::encode_work(42, 9, 2, W + 1, wide, ok), "width 9");
  std::vector<uint16_t> many(5 * W, 0);
  refused(fabric::encode_work(42, 9, 2, W, many, ok), "5 rows");
  {
    std::vector<uint8_t> m = good;
    m.push_back(0);
    refused(m, "payload bytes");
  }
  refused(poke32(32, 9), "payload bytes");  // the header's triple count no longer fits the size
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{{16, 0, 1.0f}}), "expert 16");
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{{3, 2, 1.0f}}), "row 2 of 2");
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{{7, 0, 1.0f}, {3, 0, 1.0f}}),
          "not in ascending order");
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{{3, 0, 1.0f}, {3, 0, 1.0f}}),
          "not in ascending order");
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{{3, 0, NAN}}), "not finite");
  refused(fabric::encode_work(42, 9, 2, W, rows, std::vector<fabric::WorkTriple>{}), "0 experts");
  refused(fabric::encode_bye(42), "where Work was due");
}

TEST(FabricFrames, ResultsMustAnswerTheExchangeAsked) {
  fabric::Expect ex;
  ex.from = 2;
  ex.nonce = 5;
  ex.width = 4;
  std::vector<uint8_t> r = fabric::result_frame(5, 11, 3, 2, 4);
  r.resize(r.size() + 2 * 4 * 4, 0);
  EXPECT_EQ(fabric::decode_result(r, ex, 11, 3, 2).size(), 32u);
  EXPECT_THROW(fabric::decode_result(r, ex, 12, 3, 2), Error);  // another exchange
  EXPECT_THROW(fabric::decode_result(r, ex, 11, 4, 2), Error);  // another layer
  EXPECT_THROW(fabric::decode_result(r, ex, 11, 3, 3), Error);  // another count
  ex.nonce = 6;
  EXPECT_THROW(fabric::decode_result(r, ex, 11, 3, 2), Error);
  // The sender's store counters ride in the header; more hits than requests is refused.
  std::vector<uint8_t> c = fabric::result_frame(5, 11, 3, 2, 4, 1000, 900);
  c.resize(c.size() + 2 * 4 * 4, 0);
  const fabric::Header h = fabric::decode_header(c, 2);
  EXPECT_EQ(h.store_requests, 1000u);
  EXPECT_EQ(h.store_hits, 900u);
  std::vector<uint8_t> bad = fabric::result_frame(5, 11, 3, 2, 4, 10, 11);
  bad.resize(bad.size() + 2 * 4 * 4, 0);
  try {
    fabric::decode_header(bad, 2);
    ADD_FAILURE() << "accepted 11 hits of 10 requests";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more hits (11) than requests (10)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fabric::decode_header(fabric::result_frame(5, 11, 3, 0, 4), 2).store_requests, 0u);
}

TEST(FabricFrames, HintsAreCheckedLikeWork) {
  fabric::Expect ex;
  ex.from = 0;
  ex.nonce = 9;
  ex.layers = 4;
  ex.experts = 16;
  const std::vector<uint32_t> ok = {1, 5, 15};
  const std::vector<uint8_t> good = fabric::encode_hint(9, 3, ok);
  EXPECT_EQ(good.size(), fabric::hint_frame_bytes(3));
  const fabric::Hint h = fabric::decode_hint(good, ex);
  EXPECT_EQ(h.layer, 3u);
  EXPECT_EQ(h.experts, ok);
  const auto refused = [&](const std::vector<uint8_t>& m, const std::string& cause) {
    try {
      fabric::decode_hint(m, ex);
      ADD_FAILURE() << "accepted: " << cause;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
    }
  };
  refused(fabric::encode_hint(8, 3, ok), "another job's nonce");
  refused(fabric::encode_hint(9, 4, ok), "layer 4");
  refused(fabric::encode_hint(9, 3, std::vector<uint32_t>{1, 16}), "expert 16");
  refused(fabric::encode_hint(9, 3, std::vector<uint32_t>{5, 5}), "not strictly ascending");
  refused(fabric::encode_hint(9, 3, std::vector<uint32_t>{}), "a Hint of 0 experts");
  std::vector<uint8_t> cut = good;
  cut.resize(cut.size() - 4);
  refused(cut, "payload bytes");
  refused(fabric::encode_bye(9), "a Bye frame where a Hint was due");
}

// `parse` (a placement or profile parser on `text`) throws an Error whose message holds `cause`.
template <class Parse>
void expect_refused(Parse&& parse, const std::string& text, const std::string& cause) {
  try {
    parse();
    ADD_FAILURE() << "accepted " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
  }
}

TEST(FabricPlacement, BalancedSplitsContiguousRangesAndFilesAreChecked) {
  const fabric::Placement p = fabric::balanced_placement(2, 40, 384);
  EXPECT_EQ(p.owned_by(0), 40u * 192);
  EXPECT_EQ(p.owned_by(1), 40u * 192);
  EXPECT_EQ(p.owner_of(0, 191), 0);
  EXPECT_EQ(p.owner_of(39, 192), 1);
  const fabric::Placement q = fabric::balanced_placement(3, 40, 384);
  EXPECT_EQ(q.owned_by(0), 40u * 128);
  EXPECT_EQ(q.owner_of(5, 255), 1);
  EXPECT_EQ(q.owner_of(5, 256), 2);
  EXPECT_NE(p.hash(), q.hash());
  EXPECT_EQ(fabric::parse_placement("0: 0 1 1\n1: 1 0 0\n", 2, 2, 3).owner_of(1, 0), 1);
  const auto refused = [](const std::string& text, const std::string& cause) {
    expect_refused([&] { fabric::parse_placement(text, 2, 2, 3); }, text, cause);
  };
  refused("0: 0 1 1\n", "no line for layer 1");
  refused("0: 0 1 1\n0: 0 1 1\n", "given twice");
  refused("0: 0 1 2\n1: 0 0 0\n", "rank 2");
  refused("0: 0 1\n1: 0 0 0\n", "expert 2");
  refused("0: 0 1 1 1\n1: 0 0 0\n", "more than 3 owners");
  refused("2: 0 1 1\n", "layer 2");
  refused("zero: 0\n", "expected");
  EXPECT_THROW(fabric::balanced_placement(4, 2, 3), Error);  // more ranks than experts
}

// local-first: rank 0 keeps each layer's most chosen experts (ties: lower id); the tail goes to
// the peers hottest first, to the one with the least routing mass below its even share. The
// profile's text round-trips and its errors name the line.
TEST(FabricPlacement, LocalFirstKeepsTheHottestExpertsOnRankZero) {
  fabric::RoutingProfile prof{2, 8, {}};
  // layer 0: experts 5, 2, 7 hottest; 1 and 3 tie; layer 1: all equal.
  prof.count = {1, 4, 50, 4, 0, 90, 2, 30, /**/ 3, 3, 3, 3, 3, 3, 3, 3};
  const fabric::Placement p = fabric::local_first_placement(prof, 3, 2);
  EXPECT_EQ(p.name, "local-first");
  EXPECT_EQ(p.owner_of(0, 5), 0);
  EXPECT_EQ(p.owner_of(0, 2), 0);
  // Tail, hottest first: 7 (30) -> rank 1, 1 (4) -> rank 2, 3 (4) -> rank 2 (mass 4 < 30),
  // 6 (2) -> rank 2 (6 < 30), 0 (1) -> rank 1 (rank 2 holds its 3), 4 (0) -> rank 1.
  const int want0[8] = {1, 2, 0, 2, 1, 0, 2, 1};
  for (uint32_t e = 0; e < 8; ++e) EXPECT_EQ(p.owner_of(0, e), want0[e]) << "expert " << e;
  // Equal counts: id order, rank 0 the first two.
  EXPECT_EQ(p.owner_of(1, 0), 0);
  EXPECT_EQ(p.owner_of(1, 1), 0);
  EXPECT_EQ(p.owned_by(1), p.owned_by(2));
  // Default: rank 0 keeps its even share (8 / 2 = 4 at two ranks).
  EXPECT_EQ(fabric::local_first_placement(prof, 2).owned_by(0), 8u);
  EXPECT_THROW(fabric::local_first_placement(prof, 3, 7), Error);  // one expert for two peers
  const fabric::RoutingProfile back = fabric::parse_routing_profile(fabric::format_routing_profile(prof), 2, 8);
  EXPECT_EQ(back.count, prof.count);
  const auto refused = [](const std::string& text, const std::string& cause) {
    expect_refused([&] { fabric::parse_routing_profile(text, 2, 3); }, text, cause);
  };
  refused("0: 1 2 3\n", "routing profile: no line for layer 1");
  refused("0: 1 2 3\n1: 1 2\n", "routing profile line 2: expert 2: expected a count");
  refused("0: 1 2 3 4\n1: 1 2 3\n", "more than 3 counts");
  refused("0: 1 -2 3\n1: 1 2 3\n", "expert 1: expected a count");
}

TEST(LocalFabric, DeadlinesSizeLimitsAndAbort) {
  fabric::LocalHub hub(2);
  fabric::LocalFabric a(hub, 0), b(hub, 1);
  EXPECT_FALSE(b.recv(0, 1, 100, fabric::deadline_in(20ms)).has_value());
  a.send(1, 1, std::vector<uint8_t>(10, 7));
  EXPECT_THROW(b.recv(0, 1, 9, fabric::deadline_in(20ms)), Error);
  EXPECT_EQ(b.recv(0, 1, 10, fabric::deadline_in(20ms))->size(), 10u);
  EXPECT_EQ(a.counters().sent_bytes, 10u);
  EXPECT_EQ(b.counters().received_bytes, 10u);
  EXPECT_THROW(a.send(2, 1, {}), Error);
  std::thread waiter([&] { EXPECT_THROW(b.recv(0, 1, 10, fabric::Clock::time_point::max()), Error); });
  std::this_thread::sleep_for(10ms);
  a.abort(75);
  waiter.join();
}

}  // namespace
}  // namespace sluice
