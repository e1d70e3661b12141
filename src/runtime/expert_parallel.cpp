#include "runtime/expert_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kernels/cpu.h"
#include "model/model.h"
#include "runtime/state_disk.h"
#include "storage/expert_store.h"
#include "util/error.h"

namespace sluice {

namespace {

using fabric::Clock;
constexpr size_t kLatencyRing = 4096;

// A peer's Failed answer: that exchange failed, the job goes on.
struct ComputeFailed : Error {
  using Error::Error;
};

std::string rank_name(int r) { return "rank " + std::to_string(r); }

// A Result, or a Failed of at most kMaxTextBytes.
size_t answer_limit(uint64_t triples, uint32_t hidden) {
  return (size_t)std::max<uint64_t>(fabric::result_frame_bytes(triples, hidden), fabric::kHeaderBytes + fabric::kMaxTextBytes);
}

double percentile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, (size_t)(q * (double)(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + (ptrdiff_t)k, v.end());
  return v[k];
}

}  // namespace

fabric::Hello own_hello(const std::string& model_path, const ModelConfig& c,
                        const fabric::Placement& p) {
  fabric::Hello h;
  h.build = std::string("sluice " SLUICE_VERSION " ") + __VERSION__;
  h.isa = std::string(isa_name(active_isa()));
  h.model = model_file_identity(model_path, 0.0f);
  h.placement = p.hash();
  h.ranks = p.ranks;
  h.layers = c.num_hidden_layers;
  h.experts = c.n_routed_experts;
  h.hidden = c.hidden_size;
  return h;
}

std::vector<fabric::Hello> start_job(fabric::Fabric& f, const fabric::Hello& mine, uint64_t nonce, uint32_t max_rows,
                                     std::chrono::milliseconds timeout) {
  const int R = f.size();
  std::vector<fabric::Hello> all(R);
  all[0] = mine;
  std::string why;
  const Clock::time_point deadline = fabric::deadline_in(timeout);
  for (int r = 1; r < R && why.empty(); ++r) {
    try {
      std::optional<std::vector<uint8_t>> m = f.recv(r, fabric::kTagToCoordinator, 1024, deadline);
      if (!m) {
        why = rank_name(r) + " did not say Hello within " + std::to_string(timeout.count()) + " ms";
        break;
      }
      all[r] = fabric::decode_hello(*m, r);
      const std::string d = fabric::hello_mismatch(mine, all[r]);
      if (!d.empty()) why = rank_name(r) + " differs from rank 0 in its " + d;
      else if (all[r].rows < max_rows)
        why = rank_name(r) + " holds exchanges of at most " + std::to_string(all[r].rows) + " rows (its plan's chunk) and rank 0 sends up to " +
              std::to_string(max_rows) + ": give every rank the same --chunk, or rank " + std::to_string(r) +
              " a larger --mem-budget";
    } catch (const Error& e) {
      why = e.what();
    }
  }
  for (int r = 1; r < R; ++r)
    f.send(r, fabric::kTagToPeer,
           why.empty() ? fabric::encode_welcome(nonce, max_rows) : fabric::encode_text(fabric::Kind::Refuse, 0, 0, why));
  f.flush(fabric::deadline_in(timeout));
  if (!why.empty()) throw Error("fabric: the job does not start: " + why);
  return all;
}

JobStart join_job(fabric::Fabric& f, const fabric::Hello& mine, std::chrono::milliseconds timeout) {
  f.send(0, fabric::kTagToCoordinator, fabric::encode_hello(mine));
  std::optional<std::vector<uint8_t>> m =
      f.recv(0, fabric::kTagToPeer, fabric::kHeaderBytes + fabric::kMaxTextBytes, fabric::deadline_in(timeout));
  if (!m) throw Error("fabric: rank 0 did not answer this rank's Hello within " + std::to_string(timeout.count()) + " ms");
  const fabric::Header h = fabric::decode_header(*m, 0);
  if (h.kind == fabric::Kind::Refuse) throw Error("fabric: the job does not start: " + fabric::decode_text(*m, 0));
  if (h.kind != fabric::Kind::Welcome || h.nonce == 0 || h.rows == 0)
    throw Error(std::string("fabric: rank 0 answered Hello with a ") + fabric::kind_name(h.kind) + " frame");
  return JobStart{h.nonce, h.rows};
}

std::string fabric_metrics(const std::vector<PeerTraffic>& t) {
  std::string s;
  auto line = [&](const char* name, size_t r, const char* extra, double v) {
    char b[200];
    std::snprintf(b, sizeof b, "%s{rank=\"%zu\"%s} %.17g\n", name, r, extra, v);
    s += b;
  };
  s += "# HELP sluice_fabric_ranks Ranks of the expert-parallel job.\n# TYPE sluice_fabric_ranks gauge\n";
  s += "sluice_fabric_ranks " + std::to_string(t.size()) + "\n";
  const struct {
    const char* name;
    const char* help;
    uint64_t PeerTraffic::*field;
  } counters[] = {
      {"sluice_fabric_exchanges_total", "Work frames sent to the rank (each answered once).", &PeerTraffic::exchanges},
      {"sluice_fabric_expert_terms_total", "(expert, token) terms the rank computed.", &PeerTraffic::triples},
      {"sluice_fabric_sent_bytes_total", "Bytes of Work frames sent to the rank.", &PeerTraffic::work_bytes},
      {"sluice_fabric_received_bytes_total", "Bytes of Result frames received from the rank.", &PeerTraffic::result_bytes},
      {"sluice_fabric_stale_answers_total", "Answers to exchanges a failed pass abandoned, dropped.", &PeerTraffic::stale},
      {"sluice_fabric_hints_total", "Hint frames sent to the rank (its predicted experts of the coming layer).", &PeerTraffic::hints},
      {"sluice_fabric_hint_bytes_total", "Bytes of those Hint frames.", &PeerTraffic::hint_bytes},
      {"sluice_fabric_expert_requests_total", "Experts the rank's store was asked for (0: resident experts), as its latest answer said.",
       &PeerTraffic::store_requests},
      {"sluice_fabric_expert_hits_total", "Of those, found in the rank's expert cache.", &PeerTraffic::store_hits},
  };
  for (const auto& c : counters) {
    s += std::string("# HELP ") + c.name + " " + c.help + "\n# TYPE " + c.name + " counter\n";
    for (size_t r = 1; r < t.size(); ++r) line(c.name, r, "", (double)(t[r].*c.field));
  }
  s += "# HELP sluice_fabric_exchange_latency_us Work sent to Result received, over the last 4096 exchanges.\n"
       "# TYPE sluice_fabric_exchange_latency_us gauge\n";
  for (size_t r = 1; r < t.size(); ++r) {
    line("sluice_fabric_exchange_latency_us", r, ",quantile=\"0.5\"", t[r].p50_us);
    line("sluice_fabric_exchange_latency_us", r, ",quantile=\"0.99\"", t[r].p99_us);
  }
  return s;
}

// --- coordinator --------------------------------------------------------------------------------

FabricExperts::FabricExperts(fabric::Fabric& f, fabric::Placement p, uint32_t hidden, std::chrono::milliseconds timeout)
    : f_(f), p_(std::move(p)), hidden_(hidden), timeout_(timeout),
      done_seq_(f.size(), 0), traffic_(f.size()), lat_us_(f.size()) {
  if (f.rank() != 0) throw Error("fabric: only rank 0 coordinates");
  if ((int)p_.ranks != f.size())
    throw Error("fabric: a placement for " + std::to_string(p_.ranks) + " ranks in a job of " + std::to_string(f.size()));
}

void FabricExperts::start(uint64_t nonce, uint32_t max_rows) {
  nonce_ = nonce;
  max_rows_ = max_rows;
}

bool FabricExperts::local(uint32_t layer, uint32_t expert) const { return p_.owner_of(layer, expert) == 0; }

void FabricExperts::begin(uint32_t layer, std::span<const ExpertTriple> triples, CMat x) const {
  if (nonce_ == 0) throw Error("fabric: an exchange before the job started");
  if (x.width != hidden_) throw Error("fabric: rows of width " + std::to_string(x.width));
  // Answers a failed pass left behind are recognised by their exchange number and dropped.
  out_.clear();
  layer_ = layer;
  const int R = f_.size();
  std::vector<std::vector<uint32_t>> by_rank(R);
  for (uint32_t j = 0; j < triples.size(); ++j) {
    const int r = p_.owner_of(layer, triples[j].expert);
    if (r == 0) throw Error("fabric: a local expert was handed to the fabric");
    by_rank[r].push_back(j);
  }
  std::vector<int32_t> row_of(x.n, -1);
  for (int r = 1; r < R; ++r) {
    if (by_rank[r].empty()) continue;
    // The rows this rank needs, ascending, as exact BF16 (the FFN input is BF16-rounded, so
    // nothing is lost and the peer quantizes exactly what this process would have).
    std::vector<uint32_t> rows;
    for (uint32_t j : by_rank[r]) rows.push_back(triples[j].token);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    if (rows.size() > max_rows_) throw Error("fabric: " + std::to_string(rows.size()) + " rows in one exchange");
    std::vector<uint16_t> bits(rows.size() * hidden_);
    for (size_t i = 0; i < rows.size(); ++i) {
      row_of[rows[i]] = (int32_t)i;
      const float* v = x.row(rows[i]);
      for (uint32_t k = 0; k < hidden_; ++k) {
        uint32_t u;
        std::memcpy(&u, &v[k], 4);
        if (u & 0xffffu) throw Error("fabric: an FFN input value is not BF16 (layer " + std::to_string(layer) + ")");
        bits[i * hidden_ + k] = (uint16_t)(u >> 16);
      }
    }
    std::vector<fabric::WorkTriple> wt;
    for (uint32_t j : by_rank[r]) wt.push_back({triples[j].expert, (uint32_t)row_of[triples[j].token], triples[j].weight});
    Outstanding o;
    o.rank = r;
    o.seq = ++seq_;
    o.at = by_rank[r];
    o.rows = (uint32_t)rows.size();
    std::vector<uint8_t> frame = fabric::encode_work(nonce_, o.seq, layer, hidden_, bits, wt);
    {
      std::lock_guard<std::mutex> lk(stats_mu_);
      traffic_[r].exchanges += 1;
      traffic_[r].work_bytes += frame.size();
      traffic_[r].triples += wt.size();
    }
    o.sent = Clock::now();
    f_.send(r, fabric::kTagToPeer, std::move(frame));
    out_.push_back(std::move(o));
  }
  // A large frame (a prefill chunk's rows) moves only while this process makes MPI progress:
  // it leaves now, so the peers compute while this process does.
  if (!out_.empty()) {
    uint32_t rows = 1;
    for (const Outstanding& o : out_) rows = std::max(rows, o.rows);
    if (!f_.flush(fabric::deadline_in(timeout_ * rows))) {
      broken_ = true;
      throw Error("fabric: layer " + std::to_string(layer) + " work did not leave for the ranks within " +
                  std::to_string((timeout_ * rows).count()) + " ms");
    }
  }
}

void FabricExperts::finish(uint32_t layer, Mat terms) const {
  if (layer != layer_) throw Error("fabric: finish of layer " + std::to_string(layer) + " after begin of " + std::to_string(layer_));
  try {
    finish_all(layer, terms);
  } catch (const ComputeFailed& e) {
    out_.clear();
    throw Error(e.what());
  } catch (const Error&) {
    out_.clear();
    broken_ = true;
    throw;
  }
}

void FabricExperts::finish_all(uint32_t layer, Mat terms) const {
  for (const Outstanding& o : out_) {
    // A decode exchange (one row) has the timeout; a prefill chunk's, which may read every
    // expert it names from the peer's disk, has it per row.
    const std::chrono::milliseconds allowed = timeout_ * std::max<uint32_t>(o.rows, 1);
    const Clock::time_point deadline = o.sent + allowed;
    fabric::Expect ex;
    ex.from = o.rank;
    ex.nonce = nonce_;
    ex.width = hidden_;
    for (;;) {
      std::optional<std::vector<uint8_t>> m = f_.recv(o.rank, fabric::kTagToCoordinator, answer_limit(o.at.size(), hidden_), deadline);
      if (!m)
        throw Error("fabric: " + rank_name(o.rank) + " did not return layer " + std::to_string(layer) + " outputs (exchange " +
                    std::to_string(o.seq) + ") within " + std::to_string(allowed.count()) + " ms");
      const fabric::Header h = fabric::decode_header(*m, o.rank);
      if (h.nonce != nonce_) throw Error("fabric: " + rank_name(o.rank) + " sent a frame with another job's nonce");
      if ((h.kind == fabric::Kind::Result || h.kind == fabric::Kind::Failed) && h.seq < o.seq && h.seq > done_seq_[o.rank]) {
        std::lock_guard<std::mutex> lk(stats_mu_);
        traffic_[o.rank].stale += 1;  // an abandoned exchange's answer
        done_seq_[o.rank] = h.seq;
        continue;
      }
      if (h.kind == fabric::Kind::Failed) {
        done_seq_[o.rank] = std::max(done_seq_[o.rank], h.seq);
        throw ComputeFailed("fabric: " + rank_name(o.rank) + " could not compute layer " + std::to_string(layer) + ": " +
                            fabric::decode_text(*m, o.rank));
      }
      const std::span<const uint8_t> rows = fabric::decode_result(*m, ex, o.seq, layer, (uint32_t)o.at.size());
      done_seq_[o.rank] = o.seq;
      for (size_t j = 0; j < o.at.size(); ++j) std::memcpy(terms.row(o.at[j]), rows.data() + j * hidden_ * 4, hidden_ * 4);
      std::lock_guard<std::mutex> lk(stats_mu_);
      PeerTraffic& t = traffic_[o.rank];
      t.result_bytes += m->size();
      t.store_requests = h.store_requests;
      t.store_hits = h.store_hits;
      std::vector<float>& lat = lat_us_[o.rank];
      const float us = (float)std::chrono::duration<double, std::micro>(Clock::now() - o.sent).count();
      if (lat.size() < kLatencyRing) lat.push_back(us);
      else lat[(t.exchanges - 1) % kLatencyRing] = us;
      break;
    }
  }
  out_.clear();
}

void FabricExperts::hint(uint32_t layer, std::span<const uint32_t> experts) const {
  if (nonce_ == 0 || broken_) return;
  const int R = f_.size();
  std::vector<std::vector<uint32_t>> by_rank(R);
  for (uint32_t e : experts) {
    const int r = p_.owner_of(layer, e);
    if (r != 0) by_rank[r].push_back(e);
  }
  for (int r = 1; r < R; ++r) {
    if (by_rank[r].empty()) continue;
    std::vector<uint8_t> frame = fabric::encode_hint(nonce_, layer, by_rank[r]);
    {
      std::lock_guard<std::mutex> lk(stats_mu_);
      traffic_[r].hints += 1;
      traffic_[r].hint_bytes += frame.size();
    }
    f_.send(r, fabric::kTagToPeer, std::move(frame));
  }
}

uint64_t FabricExperts::exchange_bytes(uint64_t rows, uint64_t triples) const {
  // Every rank's Work frame may be queued at once, each with up to every row; one rank's rows
  // and triples are being built beside them; the answers come in one at a time (the largest
  // carries every term); per triple its rank's list, its place and its Work record twice.
  const uint64_t R = (uint64_t)std::max(f_.size(), 2) - 1;
  const uint64_t row = (uint64_t)hidden_ * 2;
  return R * (fabric::kHeaderBytes + rows * row) + rows * row + rows * 4 + triples * (2 * 12 + 2 * 4) +
         fabric::result_frame_bytes(triples, hidden_);
}

void FabricExperts::end() const {
  for (int r = 1; r < f_.size(); ++r) f_.send(r, fabric::kTagToPeer, fabric::encode_bye(nonce_));
  f_.flush(fabric::deadline_in(timeout_));
}

std::vector<PeerTraffic> FabricExperts::traffic() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  std::vector<PeerTraffic> t = traffic_;
  for (size_t r = 1; r < t.size(); ++r) {
    t[r].p50_us = percentile(lat_us_[r], 0.50);
    t[r].p99_us = percentile(lat_us_[r], 0.99);
  }
  return t;
}

// --- expert server ------------------------------------------------------------------------------

ServeStats serve_experts(fabric::Fabric& f, const Backend& be, const Model& m, const ExpertSource& src,
                         const fabric::Placement& p, const JobStart& job, const std::function<void()>& idle,
                         const storage::ExpertStore* store) {
  const ModelConfig& c = m.config;
  const int me = f.rank();
  fabric::Expect ex;
  ex.from = 0;
  ex.nonce = job.nonce;
  ex.layers = c.num_hidden_layers;
  ex.experts = c.n_routed_experts;
  ex.width = c.hidden_size;
  ex.max_rows = job.max_rows;
  ex.max_triples = job.max_rows * c.num_experts_per_tok;
  const size_t limit = std::max<size_t>(fabric::work_frame_bytes(ex.max_rows, ex.max_triples, ex.width),
                                       fabric::hint_frame_bytes(ex.experts));
  const uint32_t H = c.hidden_size;
  ServeStats st;
  uint64_t last_seq = 0;
  for (;;) {
    std::optional<std::vector<uint8_t>> msg = f.recv(0, fabric::kTagToPeer, limit, fabric::deadline_in(std::chrono::seconds(1)));
    if (!msg) {  // rank 0 has nothing for us: an idle server waits as long as the job lasts
      if (idle) idle();
      continue;
    }
    fabric::Work w;
    try {
      const fabric::Header h = fabric::decode_header(*msg, 0);
      if (h.kind == fabric::Kind::Bye && h.nonce == job.nonce) return st;
      if (h.kind == fabric::Kind::Hint) {
        const fabric::Hint hn = fabric::decode_hint(*msg, ex);
        for (uint32_t e : hn.experts)
          if (p.owner_of(hn.layer, e) != me)
            throw Error("fabric: rank 0 sent a Hint for expert " + std::to_string(e) + " of layer " +
                        std::to_string(hn.layer) + ", which " + rank_name(me) + " does not own");
        try {
          src.hint(hn.layer, hn.experts);
        } catch (const Error&) {
          // Advisory: a read ahead that fails shows again when Work asks for the expert.
        }
        st.hints += 1;
        continue;
      }
      w = fabric::decode_work(*msg, ex);
      if (w.h.seq <= last_seq)
        throw Error("fabric: rank 0 sent exchange " + std::to_string(w.h.seq) + " after " + std::to_string(last_seq));
      for (const fabric::WorkTriple& t : w.triples)
        if (p.owner_of(w.h.layer, t.expert) != me)
          throw Error("fabric: rank 0 sent Work for expert " + std::to_string(t.expert) + " of layer " +
                      std::to_string(w.h.layer) + ", which " + rank_name(me) + " does not own");
    } catch (const Error& e) {
      f.send(0, fabric::kTagToCoordinator, fabric::encode_text(fabric::Kind::Failed, job.nonce, 0, e.what()));
      f.flush(fabric::deadline_in(std::chrono::milliseconds(2000)));
      throw;
    }
    last_seq = w.h.seq;
    st.frames += 1;
    try {
      const Tensor x = be.tensor(w.h.rows, H);
      const Mat xm = x.m();
      for (uint32_t i = 0; i < w.h.rows; ++i)
        for (uint32_t k = 0; k < H; ++k) {
          uint16_t b;
          std::memcpy(&b, w.rows.data() + ((size_t)i * H + k) * 2, 2);
          const uint32_t u = (uint32_t)b << 16;
          std::memcpy(&xm.row(i)[k], &u, 4);
        }
      std::vector<ExpertTriple> tr(w.triples.size());
      for (size_t j = 0; j < tr.size(); ++j)
        tr[j] = ExpertTriple{w.triples[j].expert, w.triples[j].row, w.triples[j].weight};
      const Tensor terms = be.tensor(tr.size(), H);
      const ExpertLayout& lay = m.layers[w.h.layer].experts;
      be.routed_ffn_rows(ExpertTensors{&lay.gate, &lay.up, &lay.down}, src, w.h.layer, tr, c.swiglu_limit, x.c(),
                         terms.m());
      be.sync();
      const storage::RequestCounts counts = store ? store->request_counts() : storage::RequestCounts{};
      std::vector<uint8_t> out =
          fabric::result_frame(job.nonce, w.h.seq, w.h.layer, (uint32_t)tr.size(), H, counts.requests, counts.hits);
      const size_t o = out.size();
      out.resize(o + tr.size() * H * 4);
      for (size_t j = 0; j < tr.size(); ++j) std::memcpy(out.data() + o + j * H * 4, terms.c().row(j), H * 4);
      st.triples += tr.size();
      f.send(0, fabric::kTagToCoordinator, std::move(out));
    } catch (const Error& e) {
      st.failed += 1;
      f.send(0, fabric::kTagToCoordinator, fabric::encode_text(fabric::Kind::Failed, job.nonce, w.h.seq, e.what()));
    }
  }
}

}  // namespace sluice
