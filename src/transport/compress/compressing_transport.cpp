#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "transport/compress/chooser.h"
#include "xsilo/core/cpus.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/core/log.h"
#include "xsilo/transport/compression.h"
#include "xsilo/transport/forwarding.h"

namespace xsilo {

namespace {

using Clock = std::chrono::steady_clock;
using compression_internal::Fixed;
using compression_internal::RecipeName;

// Each choice at debug, a message dropped at warn.
constinit LogComponent kLog("compression");

int EffectiveThreads(int threads) {
  if (threads > 0) return threads;
  return DefaultPoolThreads();
}

// Goodput of the sends to one peer (bytes on the wire over the time from
// the inner SendAsync to its completion), smoothed.
struct LinkRate {
  double Bps = 0;
  int samples = 0;
  void Add(double x) {
    Bps = samples == 0 ? x : 0.5 * Bps + 0.5 * x;
    ++samples;
  }
};

// Runnable threads per core right now (/proc/stat's procs_running, which
// counts the caller), at least 1; 1 where it cannot be read. A codec on a
// machine this busy gets about one core in that many. Both figures are the
// host's: a container's quota or a taskset limits how many threads a codec
// runs (EffectiveThreads, from UsableCpus), not how many others compete for
// the cores beneath it.
double CoreContention() {
  std::ifstream stat("/proc/stat");
  std::string key;
  double running = 0;
  while (stat >> key) {
    if (key == "procs_running") {
      stat >> running;
      break;
    }
    stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1.0, running / cores);
}

std::shared_ptr<const TensorMap> CopyTensors(const TensorMap& tensors) {
  auto copy = std::make_shared<TensorMap>();
  for (const auto& [name, t] : tensors) {
    (*copy)[name] = *Tensor::Make(t.dtype, t.shape, Buffer::CopyFrom(t.data.data(), t.nbytes()));
  }
  return copy;
}

// A link whose round trip is this long or longer is long: the auto
// backend never probes it (AutoRouter::kProbeMaxRtt), so its throughput is
// unknown until a payload crossed it, and an unmeasured one is bounded by
// compression.long_link_MBps instead.
constexpr double kLongRttS = 0.020;
// Sends of fewer bytes are mostly round trips: they say little about the
// link's throughput.
constexpr uint64_t kMinMeasuredBytes = 256 << 10;
// References (kDeltaRefParam) kept: the newest ones.
constexpr size_t kReferencesKept = 2;
// Param (int) the decorator adds to an update (a delta base and no
// reference key of its own) whose base it holds a copy of, and the
// receiving decorator takes off before delivery: the receiver learns that
// the sender holds it. A model goes as a delta only to peers that said so
// (Prepare).
constexpr const char* kHeldRefParam = "xsilo.delta_held";

class CompressingTransport final : public ForwardingTransport {
 public:
  CompressingTransport(std::unique_ptr<Transport> inner, CompressionPolicy policy)
      : ForwardingTransport(std::move(inner)), policy_(std::move(policy)) {}
  ~CompressingTransport() override { Stop(); }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Send({peer}, std::move(message), std::move(done), /*broadcast=*/false);
  }
  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    Send(std::move(peers), std::move(message), std::move(done), /*broadcast=*/true);
  }

  CompressionSummary Summary() const {
    std::lock_guard<std::mutex> lock(mu_);
    return summary_;
  }

 private:
  // What a send leaves for its completion.
  struct Prepared {
    std::optional<int64_t> reference_key;  // kDeltaRefParam of the message
    // Held as the reference (under mu_ once held: OwnReference replaces it).
    std::shared_ptr<const TensorMap> reference;
    std::shared_ptr<const TensorMap> original;  // before a lossy cast
    // `reference` shares the caller's Buffers: our own copy is made after
    // the message went to the inner transport (OwnReference).
    bool borrowed = false;
  };

  // A send's completion and the copy of its reference: whichever comes
  // last calls the caller's callback, so that the caller, free to reuse
  // its Buffers from then on, never does so while we read them.
  struct InFlight {
    Prepared prepared;
    SendCallback done;
    std::atomic<int> left{1};  // 2 with a borrowed reference
    Status status;             // the inner send's, written before its decrement
    void Arrive() {
      if (left.fetch_sub(1, std::memory_order_acq_rel) == 1 && done) done(status);
    }
  };

  // Checks the peers, encodes, and hands the message to the inner
  // transport with a completion that measures the link. A reference the
  // message establishes is copied only then: the copy (265 MB for the
  // FedAvg Big model) delayed every broadcast on a LAN, where it is most
  // of what compression=auto costs when it sends nothing smaller.
  void Send(std::vector<int32_t> peers, Message message, SendCallback done, bool broadcast) {
    for (int32_t p : peers) {
      if (Status s = CheckPeer(p); !s.ok()) {
        if (done) done(s);
        return;
      }
    }
    auto flight = std::make_shared<InFlight>();
    flight->done = std::move(done);
    // To one peer whose transport takes a message still being encoded
    // (the hybrid's grant uploads): the stream starts with the encode, and
    // its first parts are on the wire while the rest is encoded.
    std::shared_ptr<EncodeStream> stream;
    StreamStart start_stream;
    StreamSink* sink =
        policy_.stream && !broadcast && peers.size() == 1 ? inner().stream_sink() : nullptr;
    if (sink != nullptr && sink->StreamsSends(peers.front())) {
      start_stream = [&, sink](uint64_t expected) {
        stream = std::make_shared<EncodeStream>(expected);
        // Two arrivals, the inner send's and ours once the stream is
        // finished (and a borrowed reference copied): the caller's
        // callback never runs while we still encode or read its Buffers,
        // even when the inner send fails at once. No link sample: most of
        // its bytes went while the encode ran.
        flight->left.store(2);
        sink->SendStreamAsync(peers.front(), stream, Finisher(peers, 0, Clock::now(), flight));
        return stream.get();
      };
    }
    auto prepared = Prepare(peers, &message, start_stream);
    if (!prepared.ok()) {
      if (stream) {
        stream->Finish(prepared.status());  // the inner send fails with it
        flight->Arrive();
      } else if (flight->done) {
        flight->done(prepared.status());
      }
      return;
    }
    flight->prepared = *std::move(prepared);
    const bool borrowed = flight->prepared.borrowed;
    if (stream) {
      stream->Finish(std::move(message));
      if (borrowed) OwnReference(*flight);
      flight->Arrive();
      return;
    }
    if (borrowed) flight->left.store(2);
    const uint64_t wire = message.payload_bytes();
    auto finish = Finisher(peers, wire, Clock::now(), flight);
    if (broadcast) {
      inner().BroadcastAsync(std::move(peers), std::move(message), std::move(finish));
    } else {
      inner().SendAsync(peers.front(), std::move(message), std::move(finish));
    }
    if (borrowed) {
      OwnReference(*flight);
      flight->Arrive();
    }
  }

  // Replaces a borrowed reference by our own copy of it, holders kept.
  void OwnReference(InFlight& flight) {
    Prepared& p = flight.prepared;
    std::shared_ptr<const TensorMap> borrowed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      borrowed = p.reference;
    }
    std::shared_ptr<const TensorMap> copy = CopyTensors(*borrowed);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = references_.find(*p.reference_key);
        it != references_.end() && it->second.tensors == borrowed) {
      it->second.tensors = copy;
      it->second.borrowed = false;
    }
    p.reference = std::move(copy);
    p.borrowed = false;
    owned_cv_.notify_all();
  }

  // Starts a streamed send of a message about to be encoded to
  // `expected` bytes; the stream the encoder appends to.
  using StreamStart = std::function<EncodeStream*(uint64_t expected)>;

  // Chooses, encodes (into the stream `start_stream` starts, when given
  // and the message is to be compressed), and notes the reference the
  // message establishes.
  Result<Prepared> Prepare(const std::vector<int32_t>& peers, Message* m,
                           const StreamStart& start_stream = nullptr) {
    Prepared p;
    std::optional<int64_t> base;
    // Left on the message: the receiver corrects the update by it (OnDelivery).
    if (auto v = m->GetInt(kDeltaBaseParam); v.ok()) base = *v;
    if (auto v = m->GetInt(kDeltaRefParam); v.ok()) p.reference_key = *v;
    // A message that is to be a reference itself is a model: with a base
    // it is the next model after that one (a FedAvg server's), whose
    // values may be cast as a whole. Without one, a message with a base is
    // an update (Choose).
    const bool model = p.reference_key.has_value();
    const bool update = base.has_value() && !model;
    std::shared_ptr<const TensorMap> reference;
    if (base) {
      // A model is the next reference: sent as a delta, every receiver
      // must decode it, so every one must have said it holds the base (a
      // restarted process, or one that kept no copy, does not).
      reference = ReferenceHeldBy(*base, peers, /*confirmed=*/model);
      if (!model && Holds(*base)) m->params[kHeldRefParam] = *base;
    }

    const CompressOptions& o = policy_.codec;
    const uint64_t bytes = m->payload_bytes();
    CompressionChoice choice;
    if (bytes == 0) {
      choice.reason = "nothing to compress";
    } else if (policy_.always) {
      choice.compress = true;
      choice.recipe = Strongest(reference != nullptr, update);
      if (update && !reference) choice.recipe.quant = Quant::kNone;  // see Choose
      choice.reason = RecipeName(choice.recipe) + " (compression.when=always)";
    } else if (bytes < policy_.min_message_bytes) {
      choice.reason =
          "none: " + std::to_string(bytes) + " B is under compression.min_message_bytes";
    } else {
      choice = Choose(peers, *m, reference.get(), update);
    }

    // A model no update could come back against for less than whole is
    // not worth a copy here and at every receiver: its key is not sent.
    // Not for a lossy cast: the updates against it are corrected by the
    // reference and what we had (CorrectUpdate), whatever way they come.
    if (p.reference_key && !(choice.compress && choice.recipe.quant != Quant::kNone)) {
      if (std::string why; DeltaCannotPay(peers, *m, /*sample=*/true, &why)) {
        m->params.erase(kDeltaRefParam);
        NoteSkipped(" -> " + PeersText(peers) + ": reference " + std::to_string(*p.reference_key) +
                    " not kept, its key not sent: " + why);
        p.reference_key.reset();
      }
    }
    TensorMap original;  // shares the Buffers until CopyTensors below
    if (p.reference_key) original = m->tensors;
    CompressStats st;
    EncodeStream* stream = nullptr;
    if (choice.compress) {
      // Top-k's error feedback: what the last update to these peers left
      // out is added to this one (one update at a time per peer set).
      std::unique_lock<std::mutex> ef;
      TensorMap* residual = nullptr;
      if (choice.recipe.topk > 0) {
        ef = std::unique_lock<std::mutex>(residual_mu_);
        residual = &residuals_[peers];
      }
      if (start_stream) {
        const double ratio = choice.ratio > 0 && choice.ratio < 1 ? choice.ratio : 1.0;
        stream = start_stream(static_cast<uint64_t>(static_cast<double>(bytes) * ratio));
      }
      XSILO_RETURN_IF_ERROR(CompressMessage(m, choice.recipe, o,
                                            choice.recipe.delta ? reference.get() : nullptr,
                                            base.value_or(0), &st, residual, stream)
                                .WithContext("compressing the message"));
      if (st.tensors > 0) {
        choice.reason += "; sent " + Fixed(st.ratio(), 3) + " of " + std::to_string(st.raw_bytes) +
                         " B, encoded in " + Fixed(st.seconds * 1e3, 1) + " ms";
      }
      if (stream) choice.reason += ", streamed";
    }
    XSILO_LOG(kLog, kDebug,
              "rank " << rank() << " -> " << PeersText(peers) << ": " << choice.reason);
    {
      const bool streamed = stream != nullptr;
      std::lock_guard<std::mutex> lock(mu_);
      ++summary_.messages_sent;
      if (st.tensors > 0) ++summary_.messages_compressed;
      if (streamed) ++summary_.messages_streamed;
      summary_.raw_bytes += st.raw_bytes;
      summary_.encoded_bytes += st.encoded_bytes;
      summary_.encode_seconds += st.seconds;
      summary_.last_choice = choice.reason;
    }
    if (p.reference_key) {
      // Receivers will hold what they decode: for a lossy codec that is not
      // what we had, so decode our own frame to hold the same. Held from
      // now on, as a receiver's update against it may arrive before this
      // send's completion; the peers count as holders once it completes.
      if (m->params.count(kCodecParam) && choice.recipe.quant != Quant::kNone) {
        Message copy = *m;
        std::shared_ptr<const TensorMap> pin;
        // A delta's base is the one pinned above (another send may have
        // evicted it from references_ since).
        ReferenceLookup lookup = [&, others = Lookup(&pin)](int64_t key) -> const TensorMap* {
          if (base && key == *base && reference) return reference.get();
          return others(key);
        };
        XSILO_RETURN_IF_ERROR(DecompressMessage(&copy, lookup, o));
        p.reference = std::make_shared<const TensorMap>(std::move(copy.tensors));
        p.original = CopyTensors(original);
      } else {
        // The caller's Buffers, until Send copies them (OwnReference): the
        // caller may reuse them once the send completed (the FedAvg server
        // recycles the old global model's).
        p.reference = std::make_shared<const TensorMap>(std::move(original));
        p.borrowed = true;
      }
      std::lock_guard<std::mutex> lock(mu_);
      Keep(*p.reference_key, p.reference, {});
      // Keep may have dropped it at once (a key older than the two kept).
      if (auto it = references_.find(*p.reference_key); it != references_.end()) {
        it->second.original = p.original;
        it->second.borrowed = p.borrowed;
      }
    }
    return p;
  }

  // A send's completion: times `wire` bytes from `start` as a sample of
  // the link (none under kMinMeasuredBytes: 0 for none), keeps the
  // reference it established, and arrives.
  SendCallback Finisher(std::vector<int32_t> peers, uint64_t wire, Clock::time_point start,
                        std::shared_ptr<InFlight> flight) {
    return [this, peers = std::move(peers), wire, start, flight](const Status& s) {
      if (s.ok()) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        std::lock_guard<std::mutex> lock(mu_);
        if (wire >= kMinMeasuredBytes && seconds > 0) {
          for (int32_t p : peers) rates_[p].Add(static_cast<double>(wire) / seconds);
        }
        const Prepared& prepared = flight->prepared;
        if (prepared.reference_key && prepared.reference) {
          Keep(*prepared.reference_key, prepared.reference, peers);
        }
      }
      flight->status = s;
      flight->Arrive();
    };
  }

  // The strongest recipe allowed (compression.when=always); top-k only
  // for an update.
  TensorRecipe Strongest(bool delta, bool update) const {
    TensorRecipe r;
    r.quant = policy_.allowed;
    r.zstd = true;
    r.delta = delta;
    if (delta && update) r.topk = policy_.topk;
    r.value_scale = delta && !update && r.quant != Quant::kNone;
    return r;
  }

  // `update`: the message names a delta base (kDeltaBaseParam). Its
  // values are then the receiver's reference plus small changes (a
  // client's trained weights), and a lossy cast of the values would bury
  // the changes under the cast's error (int8 updates cost the FedAvg MLP
  // 0.10 of accuracy in three rounds): lossy codecs go only on the delta,
  // and not at all when the peers do not hold the reference.
  // The link to `peers`, bytes/s: per peer the inner transport's own
  // figure where it measures (the hybrid's receivers report their pulls: a
  // send's completion there times only the upload), else the completions
  // we timed, else the prior. The slowest peer decides; 0 when one is
  // unknown.
  double LinkBps(const std::vector<int32_t>& peers) {
    double link = 0;
    for (int32_t p : peers) {
      const double r = PeerBps(p);
      if (!(r > 0)) return 0;
      link = link == 0 ? r : std::min(link, r);
    }
    return link;
  }

  // The inner transport's round trip to `p`; < 0 when unmeasured.
  double RttS(int32_t p) {
    LinkObserver* observer = inner().link_observer();
    return observer != nullptr ? observer->MeasuredRttS(p) : -1;
  }

  double PeerBps(int32_t p) {
    LinkObserver* observer = inner().link_observer();
    double r = observer != nullptr ? observer->MeasuredGoodputBps(p) : 0;
    if (!(r > 0)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = rates_.find(p);
      r = it != rates_.end() && it->second.samples > 0 ? it->second.Bps : policy_.link_Bps_prior;
    }
    return r;
  }

  // LinkBps, or where it is unknown because a peer's link is long
  // (kLongRttS or more) and unmeasured, a ceiling on the slowest peer's
  // link: compression.long_link_MBps for such a peer, or a lower figure
  // measured to another. The slowest peer decides a broadcast and is no
  // faster than any peer, so the unknown short links do not matter then.
  struct LinkFigure {
    double Bps = 0;        // 0: unknown
    bool ceiling = false;  // Bps bounds the link from above; it is no estimate
    std::string note;      // why, for a ceiling
  };
  LinkFigure Link(const std::vector<int32_t>& peers) {
    LinkFigure f;
    double lowest = 0, longest = -1;
    int unknown = 0, unmeasured_long = 0;
    for (int32_t p : peers) {
      if (const double r = PeerBps(p); r > 0) {
        lowest = lowest == 0 ? r : std::min(lowest, r);
      } else if (const double rtt = policy_.long_link_Bps > 0 ? RttS(p) : -1; rtt >= kLongRttS) {
        ++unmeasured_long;
        longest = std::max(longest, rtt);
      } else {
        ++unknown;
      }
    }
    if (unmeasured_long == 0) {
      f.Bps = unknown == 0 ? lowest : 0;  // LinkBps
      return f;
    }
    f.ceiling = true;
    f.Bps = lowest > 0 ? std::min(lowest, policy_.long_link_Bps) : policy_.long_link_Bps;
    f.note =
        std::to_string(unmeasured_long) + " of " + std::to_string(peers.size()) +
        " links long and unmeasured, round trip up to " + Fixed(longest * 1e3, 1) +
        " ms: at most " + Fixed(f.Bps / 1e6, 1) + " MB/s" +
        (f.Bps < policy_.long_link_Bps ? " (a measured one)" : " (compression.long_link_MBps)");
    return f;
  }

  // The recipes the policy allows for a message: `whole` ones (no delta),
  // and delta ones when a reference is held. `update`: see Choose.
  std::vector<TensorRecipe> Recipes(bool whole, bool delta_too, bool update) const {
    std::vector<TensorRecipe> recipes;
    for (bool delta : {false, true}) {
      if (delta ? !delta_too : !whole) continue;
      recipes.push_back({Quant::kNone, true, delta});
      if (policy_.allowed != Quant::kNone && (delta || !update)) {
        // A next model's lossy delta need only be as exact as a whole cast
        // of it (TensorRecipe::value_scale).
        const bool value_scale = delta && !update;
        recipes.push_back({policy_.allowed, false, delta, 0, value_scale});
        recipes.push_back({policy_.allowed, true, delta, 0, value_scale});
      }
      // Top-k goes on the deltas of updates only (it drops changes, not
      // values; a model's receivers would hold what it kept, which the
      // sender does not track).
      if (delta && update && policy_.topk > 0) {
        recipes.push_back({Quant::kNone, true, true, policy_.topk});
        if (policy_.allowed != Quant::kNone)
          recipes.push_back({policy_.allowed, true, true, policy_.topk});
      }
    }
    return recipes;
  }

  CompressionChoice Choose(const std::vector<int32_t>& peers, const Message& m,
                           const TensorMap* reference, bool update) {
    // The round trips the inner transport learns before its first send
    // (the auto backend's echoes) are waited for before the choice.
    if (LinkObserver* observer = inner().link_observer()) {
      observer->LearnLink(peers, m.payload_bytes());
    }
    const LinkFigure figure = Link(peers);
    const double link = figure.Bps;
    if (link <= 0) {
      CompressionChoice c;
      c.reason = "none: the link is not measured yet (compression.link_MBps gives a prior)";
      return c;
    }
    const std::vector<TensorRecipe> recipes = Recipes(true, reference != nullptr, update);
    const int threads = EffectiveThreads(policy_.codec.threads);
    const double bytes = static_cast<double>(m.payload_bytes());
    std::vector<CodecCandidate> candidates;
    std::string skipped;
    double contention = 0;  // read once, under a ceiling (ByCpuTime)
    for (const auto& r : recipes) {
      CodecCandidate c;
      c.eligible_bytes = CompressibleBytes(m.tensors, r, policy_.codec);
      if (c.eligible_bytes == 0) continue;
      // Under a ceiling a recipe slower than the fastest link could be may
      // still be the safest choice: every one is sampled.
      if (!figure.ceiling && CannotPay(r, c.eligible_bytes, bytes, link, threads)) {
        skipped += (skipped.empty() ? "" : ", ") + RecipeName(r);
        continue;
      }
      c.estimate = EstimateCodec(m.tensors, r, policy_.codec, r.delta ? reference : nullptr);
      Remember(r, c.estimate);
      if (figure.ceiling) {
        // Noise only slows a sample: the fastest of a few is the codec's.
        ByCpuTime(&c.estimate, &contention);
        for (int i = 1; i < kCeilingSamples; ++i) {
          CodecEstimate again =
              EstimateCodec(m.tensors, r, policy_.codec, r.delta ? reference : nullptr);
          ByCpuTime(&again, &contention);
          if (again.sampled_bytes > 0 && CodecSeconds(again) < CodecSeconds(c.estimate)) {
            c.estimate = again;
          }
        }
      }
      candidates.push_back(c);
    }
    CompressionChoice choice =
        figure.ceiling
            ? ChooseCompressionUnderCeiling(m.payload_bytes(), link, threads, candidates,
                                            policy_.margin)
            : ChooseCompression(m.payload_bytes(), link, threads, candidates, policy_.margin);
    if (figure.ceiling) {
      choice.reason += " [" + figure.note +
                       (contention > 0 ? "; codec speeds from CPU time, " + Fixed(contention, 1) +
                                             " runnable threads a core"
                                       : "") +
                       "]";
    }
    if (!skipped.empty()) {
      choice.reason += (candidates.empty() ? " (" : "; ") + skipped +
                       " not sampled: slower than the link even at ratio 0" +
                       (candidates.empty() ? ")" : "");
    }
    return choice;
  }

  // Under a ceiling the choice turns on the codec's time against a send of
  // well under a second at the ceiling, and a sample's wall time (a few
  // ms) is at the scheduler's mercy on a busy machine: a speed is taken
  // as its CPU time's shared by the threads runnable now (CoreContention,
  // read into *contention once), unless the wall time was better. With a
  // measured link the wall time stands: there the codec is small against
  // a slow link, and on a fast one a slow sample errs towards sending as
  // it is.
  // And each recipe is sampled kCeilingSamples times, the fastest kept:
  // at the first broadcast of the geo-distributed job, while seven clients
  // set up, even the CPU time of one sample put a bf16 cast of the Big
  // model at 1.2 s for what takes 0.25-0.37 s. That costs a few ms per
  // sample, once per job on a long link.
  static constexpr int kCeilingSamples = 3;
  static void ByCpuTime(CodecEstimate* e, double* contention) {
    if (*contention == 0) *contention = CoreContention();
    if (e->encode_cpu_Bps > 0)
      e->encode_Bps = std::max(e->encode_Bps, e->encode_cpu_Bps / *contention);
    if (e->decode_cpu_Bps > 0)
      e->decode_Bps = std::max(e->decode_Bps, e->decode_cpu_Bps / *contention);
  }
  // Seconds per byte to encode and decode on one thread; inf when unknown.
  static double CodecSeconds(const CodecEstimate& e) {
    if (!(e.encode_Bps > 0) || !(e.decode_Bps > 0)) return std::numeric_limits<double>::infinity();
    return 1 / e.encode_Bps + 1 / e.decode_Bps;
  }

  // Whether `r` cannot beat sending as it is even if it shrank its bytes to
  // nothing (to a cast's own size, without zstd), at the codec speeds last
  // sampled on this machine: then sampling it again (2 MiB encoded and
  // decoded on one thread, ~10 ms for zstd) would only slow the send. On a
  // LAN that cost a 20 MB message 15-30 ms per send. Speeds older than
  // kSpeedMemo are sampled again.
  // `speeds_of`: another recipe whose speeds bound r's (DeltaCannotPay).
  bool CannotPay(const TensorRecipe& r, uint64_t eligible, double bytes, double link_Bps,
                 int threads, bool any_age = false, const TensorRecipe* speeds_of = nullptr) {
    SpeedMemo memo;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = speeds_.find(RecipeName(speeds_of ? *speeds_of : r));
      if (it == speeds_.end()) return false;
      if (!any_age && Clock::now() - it->second.at > kSpeedMemo) return false;
      memo = it->second;
    }
    return CompressionCannotPay(
        eligible, static_cast<uint64_t>(bytes), link_Bps, threads, memo.encode_Bps, memo.decode_Bps,
        r.zstd || r.topk > 0 ? 0.0 : QuantFloorRatio(r.quant), policy_.margin);
  }

  // The encoded size of a float32 value cast by `q` without zstd, over 4.
  static double QuantFloorRatio(Quant q) {
    switch (q) {
      case Quant::kBF16:
      case Quant::kFP16:
        return 0.5;
      case Quant::kInt8:
        return 0.25;
      case Quant::kNone:
        break;
    }
    return 0;
  }

  // Whether we keep the reference of `key`.
  bool Holds(int64_t key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = references_.find(key);
    return it != references_.end() && it->second.tensors != nullptr;
  }

  // The reference of `key` when every one of `peers` holds it too; with
  // `confirmed`, when every one said so itself (kHeldRefParam).
  std::shared_ptr<const TensorMap> ReferenceHeldBy(int64_t key, const std::vector<int32_t>& peers,
                                                   bool confirmed = false) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = references_.find(key);
    if (it == references_.end()) return nullptr;
    const std::set<int32_t>& known = confirmed ? it->second.confirmed : it->second.holders;
    for (int32_t p : peers) {
      if (!known.count(p)) return nullptr;
    }
    return it->second.tensors;
  }

  // Caller holds mu_.
  void Keep(int64_t key, std::shared_ptr<const TensorMap> tensors,
            const std::vector<int32_t>& holders) {
    Reference& r = references_[key];
    if (r.tensors != tensors) {
      r.tensors = std::move(tensors);
      r.holders.clear();
      r.confirmed.clear();
      r.original.reset();
      r.borrowed = false;
    }
    r.holders.insert(holders.begin(), holders.end());
    while (references_.size() > kReferencesKept) references_.erase(references_.begin());
  }

  // Looks references up for a decode; *pin keeps the one found alive
  // while the decode runs, whatever Keep evicts meanwhile. A borrowed one
  // is waited for until our copy replaced it: the caller may reuse its
  // Buffers as soon as the send is done, mid-decode.
  ReferenceLookup Lookup(std::shared_ptr<const TensorMap>* pin) {
    return [this, pin](int64_t key) -> const TensorMap* {
      std::unique_lock<std::mutex> lock(mu_);
      auto it = references_.find(key);
      owned_cv_.wait(lock, [&] {
        it = references_.find(key);
        return it == references_.end() || !it->second.borrowed;
      });
      if (it == references_.end()) return nullptr;
      *pin = it->second.tensors;
      return pin->get();
    };
  }

  Status OnDelivery(Message m, const std::function<bool()>& abandon) override {
    if (auto held = m.GetInt(kHeldRefParam); held.ok()) {
      m.params.erase(kHeldRefParam);
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = references_.find(*held); it != references_.end() && it->second.tensors) {
        it->second.confirmed.insert(m.sender);
      }
    }
    std::vector<std::string> decoded;  // into Buffers of their own
    std::vector<std::string> moved;    // of them, lossy changes added to our own tensors
    const auto base = m.GetInt(kDeltaBaseParam);
    // An update (a model names its own key too: it is no update).
    const bool update = base.ok() && !m.params.count(kDeltaRefParam);
    // The base's cast and our own tensors as the decode found them: the
    // correction after uses the same pair even if the base was dropped
    // meanwhile (all of the update moved, or none).
    std::shared_ptr<const TensorMap> cast, ours;
    if (m.params.count(kCodecParam)) {
      const auto start = Clock::now();
      std::shared_ptr<const TensorMap> pin;
      // A lossy change made from the cast we sent goes onto our own
      // tensors as it is decoded (CorrectUpdate's sum in the same pass).
      ReferenceLookup onto;
      if (update) {
        onto = [this, &cast, &ours, key_of_base = *base](int64_t key) -> const TensorMap* {
          if (key != key_of_base) return nullptr;
          std::lock_guard<std::mutex> lock(mu_);
          auto it = references_.find(key);
          if (it == references_.end() || !it->second.tensors || !it->second.original) {
            return nullptr;
          }
          cast = it->second.tensors;
          ours = it->second.original;
          return ours.get();
        };
      }
      Status s = DecompressMessage(&m, Lookup(&pin), policy_.codec, &decoded, onto, &moved);
      if (!s.ok()) {
        XSILO_LOG(kLog, kWarn,
                  "rank " << rank() << ": dropping message from rank " << m.sender << ": "
                          << s.ToString());
        return Status::OK();
      }
      std::lock_guard<std::mutex> lock(mu_);
      summary_.decode_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (update) CorrectUpdate(&m, *base, decoded, moved, std::move(cast), std::move(ours));
    if (auto key = m.GetInt(kDeltaRefParam); key.ok()) {
      if (std::string why; DeltaCannotPay({m.sender}, m, /*sample=*/false, &why)) {
        NoteSkipped(": reference " + std::to_string(*key) + " from rank " +
                    std::to_string(m.sender) + " not kept: " + why);
      } else {
        // Our own copy: the receiver may change the tensors it was given.
        auto copy = CopyTensors(m.tensors);
        std::lock_guard<std::mutex> lock(mu_);
        Keep(*key, std::move(copy), {m.sender});
        ++summary_.references_kept;
      }
    }
    return Deliver(std::move(m), abandon);
  }

  // Whether no update against the model `m` could come back from (or go
  // to) `peers` as a delta for less than as it is, by the link to them as
  // measured and the delta codecs' speeds last sampled here (of any age:
  // they were sampled on this machine). Then keeping it as a reference (a
  // copy of the model: 265 MB for FedAvg Big, made by the server and by
  // every client at once as the broadcast lands) would cost and never pay:
  // on lan those copies were most of what compression=auto cost. With
  // `sample` a delta codec never sampled here is sampled against the
  // newest reference we own (the previous model: a FedAvg server that has
  // sent no model as a delta has no other figure). False while the link
  // is unknown, and under compression.when=always.
  //
  // A delta codec not sampled yet (no reference to sample it against, or
  // a receiver, which does not sample deltas) is bounded by the same codec
  // on whole values, sampled on `m` itself when it was not: a delta encode
  // reads the reference besides the values and a delta decode adds it
  // back, so the pair is no faster (bench/compress_speed on a Big tensor,
  // idle: lossless 178-463 ms to encode as a delta, 166-185 ms whole;
  // int8+zstd 258-263 against 186-213; decodes 63-112 against 53-57; a
  // top-k delta's decode alone, 51-52 ms, beats the whole model's, its
  // encode, 384-423 ms, does not). Without that bound the first model of a
  // job was always kept, by the server and by every client at once, which
  // on lan cost each a 265 MB copy in round 1.
  bool DeltaCannotPay(const std::vector<int32_t>& peers, const Message& m, bool sample,
                      std::string* why) {
    if (policy_.always) return false;
    const double link = LinkBps(peers);
    if (!(link > 0)) return false;
    const int threads = EffectiveThreads(policy_.codec.threads);
    const uint64_t bytes = m.payload_bytes();
    std::shared_ptr<const TensorMap> base;  // to sample against
    for (const auto& r : Recipes(false, true, true)) {
      const uint64_t eligible = CompressibleBytes(m.tensors, r, policy_.codec);
      if (eligible == 0) continue;
      if (sample && !HasSpeed(r)) {
        if (!base) base = NewestOwnedReference();
        if (base) (void)Remember(r, EstimateCodec(m.tensors, r, policy_.codec, base.get()));
      }
      const TensorRecipe* speeds_of = &r;
      TensorRecipe whole = r;
      if (!HasSpeed(r)) {
        whole.delta = false;
        whole.topk = 0;
        if (!HasSpeed(whole) &&
            !Remember(whole, EstimateCodec(m.tensors, whole, policy_.codec, nullptr))) {
          return false;
        }
        speeds_of = &whole;
      }
      if (!CannotPay(r, eligible, static_cast<double>(bytes), link, threads, /*any_age=*/true,
                     speeds_of)) {
        return false;
      }
    }
    *why = "no delta codec could beat the link (" + Fixed(link / 1e6, 1) + " MB/s)";
    return true;
  }

  // Counts a model not kept as a reference (sent or received) and logs
  // `what` after our rank.
  void NoteSkipped(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++summary_.references_skipped;
    }
    XSILO_LOG(kLog, kDebug, "rank " << rank() << what);
  }

  // Keeps a sample's speeds as the recipe's (CannotPay); false when it
  // measured nothing, or, for a delta recipe, not the delta: sampled
  // without its reference (other tensor names) it timed the codec on
  // whole values, right for that message but not the delta's speed.
  bool Remember(const TensorRecipe& r, const CodecEstimate& e) {
    if (e.sampled_bytes == 0 || (r.delta && !e.delta_sampled)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    speeds_[RecipeName(r)] = {e.encode_Bps, e.decode_Bps, Clock::now()};
    return true;
  }

  bool HasSpeed(const TensorRecipe& r) const {
    std::lock_guard<std::mutex> lock(mu_);
    return speeds_.count(RecipeName(r)) > 0;
  }

  // The newest reference that is our own copy (not a caller's Buffers).
  std::shared_ptr<const TensorMap> NewestOwnedReference() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = references_.rbegin(); it != references_.rend(); ++it) {
      if (it->second.tensors && !it->second.borrowed) return it->second.tensors;
    }
    return nullptr;
  }

  // An update whose base this party sent lossily was made from the cast
  // (what the peer held), not from our tensors: every F32 tensor becomes
  // update + (ours - cast), so that what reaches the application is our
  // own model plus the peer's change. Without it a FedAvg server's model
  // took each round's cast error on for good. In place for the tensors we
  // decoded (`decoded`: their Buffers are ours alone), into fresh Buffers
  // for the others: received ones may be read-only mappings. Tensors in
  // `moved` were decoded onto ours already (DecompressMessage's `onto`),
  // which found `cast` and `ours` (else null: looked up here).
  void CorrectUpdate(Message* m, int64_t base, const std::vector<std::string>& decoded,
                     const std::vector<std::string>& moved, std::shared_ptr<const TensorMap> cast,
                     std::shared_ptr<const TensorMap> ours) {
    if (!cast || !ours) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = references_.find(base);
      if (it == references_.end() || !it->second.tensors || !it->second.original) return;
      cast = it->second.tensors;
      ours = it->second.original;
    }
    int corrected = 0;
    for (auto& [name, t] : m->tensors) {
      if (std::find(moved.begin(), moved.end(), name) != moved.end()) {
        ++corrected;
        continue;
      }
      auto c = cast->find(name);
      auto o = ours->find(name);
      if (t.dtype != DType::kF32 || c == cast->end() || o == ours->end() ||
          c->second.shape != t.shape || o->second.shape != t.shape ||
          c->second.dtype != DType::kF32 || o->second.dtype != DType::kF32) {
        continue;
      }
      Buffer out = t.data;
      if (std::find(decoded.begin(), decoded.end(), name) == decoded.end()) {
        auto fresh = Buffer::Allocate(t.nbytes());
        if (!fresh.ok()) continue;  // left as it came: the change is still right
        out = *std::move(fresh);
      }
      AddDifference(reinterpret_cast<const float*>(t.data.data()),
                    reinterpret_cast<const float*>(o->second.data.data()),
                    reinterpret_cast<const float*>(c->second.data.data()),
                    reinterpret_cast<float*>(out.mutable_data()), t.nbytes() / 4,
                    policy_.codec.threads);
      t.data = std::move(out);
      ++corrected;
    }
    if (corrected > 0) {
      XSILO_LOG(kLog, kDebug,
                "rank " << rank() << ": update from rank " << m->sender
                        << " moved onto our own tensors of reference " << base << " (" << corrected
                        << " tensors; it was made from their lossy cast)");
    }
  }

  static std::string PeersText(const std::vector<int32_t>& peers) {
    std::string s = peers.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < peers.size(); ++i) s += (i ? "," : "") + std::to_string(peers[i]);
    return s;
  }

  struct Reference {
    std::shared_ptr<const TensorMap> tensors;
    std::set<int32_t> holders;  // peers known to hold the same tensors
    // Those of them that said so themselves (kHeldRefParam): a model goes
    // as a delta from this reference only to these.
    std::set<int32_t> confirmed;
    // The sender's own tensors when `tensors` is their lossy cast (what
    // the receivers hold): updates against it are corrected by the
    // difference (CorrectUpdate).
    std::shared_ptr<const TensorMap> original;
    // `tensors` are the sender's caller's Buffers until OwnReference.
    bool borrowed = false;
  };

  const CompressionPolicy policy_;
  mutable std::mutex mu_;
  std::condition_variable owned_cv_;  // a borrowed reference was replaced
  std::map<int32_t, LinkRate> rates_;
  std::map<int64_t, Reference> references_;
  CompressionSummary summary_;
  // Codec speeds sampled, by RecipeName (CannotPay).
  struct SpeedMemo {
    double encode_Bps = 0;
    double decode_Bps = 0;
    Clock::time_point at;
  };
  static constexpr auto kSpeedMemo = std::chrono::seconds(10);
  std::map<std::string, SpeedMemo> speeds_;
  // Top-k's error feedback, per set of destinations: what the updates sent
  // to them so far left out (CompressMessage's `residual`).
  std::mutex residual_mu_;
  std::map<std::vector<int32_t>, TensorMap> residuals_;
};

}  // namespace

std::unique_ptr<Transport> MakeCompressingTransport(std::unique_ptr<Transport> inner,
                                                    CompressionPolicy policy) {
  return std::make_unique<CompressingTransport>(std::move(inner), std::move(policy));
}

std::optional<CompressionSummary> CompressionSummaryOf(const Transport& t) {
  if (const auto* c = dynamic_cast<const CompressingTransport*>(&t)) return c->Summary();
  return std::nullopt;
}

}  // namespace xsilo
