#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "fl/progress.h"
#include "fl/protocol.h"
#include "xsilo/core/compress.h"
#include "xsilo/fl/checkpoint.h"
#include "xsilo/fl/fedavg.h"

namespace xsilo::fl {

namespace {

using protocol::Clock;
using protocol::Interval;
using namespace std::chrono_literals;

constexpr Duration kTick = 200ms;

// Completion of one BroadcastAsync, shared with its callback (which may
// fire after the round, or the server, is gone).
struct BroadcastState {
  std::mutex mu;
  bool done = false;
  Status status;
  Clock::time_point started, done_at;

  std::optional<Interval> InFlight(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu);
    return Interval{started, done ? done_at : now};
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  std::optional<Clock::time_point> DoneAt() {
    std::lock_guard<std::mutex> lock(mu);
    if (!done) return std::nullopt;
    return done_at;
  }
};

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Where an update's stamps put it in the round that started at `start`.
UpdateTiming Timing(const Message& m, Clock::time_point start, Clock::time_point arrived) {
  UpdateTiming t;
  t.rank = m.sender;
  if (auto at = protocol::SentAt(m, protocol::kModelAt)) t.model_at_s = SecondsBetween(start, *at);
  if (auto train = m.GetDouble(protocol::kRoundTrain); train.ok()) t.train_s = *train;
  if (auto at = protocol::SentAt(m)) t.sent_at_s = SecondsBetween(start, *at);
  t.arrived_s = SecondsBetween(start, arrived);
  return t;
}

std::shared_ptr<BroadcastState> StartBroadcast(Transport& t, std::vector<int32_t> peers,
                                               Message m) {
  auto state = std::make_shared<BroadcastState>();
  state->started = Clock::now();
  protocol::StampSentAt(m);
  t.BroadcastAsync(std::move(peers), std::move(m), [state](const Status& s) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->status = s;
    state->done_at = Clock::now();
  });
  return state;
}

// Weighted mean helper that ignores absent metrics.
struct Mean {
  double sum = 0, weight = 0;
  void Add(double v, double w) {
    if (std::isfinite(v) && w > 0) {
      sum += v * w;
      weight += w;
    }
  }
  double value() const { return weight > 0 ? sum / weight : kNoMetric; }
};

}  // namespace

FedAvgServer::FedAvgServer(Transport& transport, ServerOptions options)
    : transport_(transport), options_(std::move(options)) {}

Result<JobReport> FedAvgServer::Run(TensorMap global) {
  if (transport_.rank() != 0) return FailedPrecondition("the FedAvg server runs on rank 0");
  const int32_t world = transport_.world_size();
  if (world < 2) return InvalidArgument("a federation needs at least one client");
  if (global.empty()) return InvalidArgument("the initial model has no tensors");
  for (const auto& [name, t] : global) {
    if (t.dtype != DType::kF32) return InvalidArgument("tensor '" + name + "' is not F32");
  }
  if (options_.local_work.steps == 0 && options_.local_work.epochs == 0) {
    return InvalidArgument("local work needs steps or epochs > 0");
  }
  std::vector<int32_t> all(world - 1);
  std::iota(all.begin(), all.end(), 1);

  uint64_t first_round = 0;
  if (!options_.checkpoint_dir.empty()) {
    XSILO_ASSIGN_OR_RETURN(std::optional<Checkpoint> cp, ReadCheckpoint(options_.checkpoint_dir));
    if (cp) {
      for (const auto& [name, t] : global) {
        auto it = cp->model.find(name);
        if (it == cp->model.end() || it->second.dtype != t.dtype || it->second.shape != t.shape ||
            cp->model.size() != global.size()) {
          return InvalidArgument("the checkpoint in " + options_.checkpoint_dir +
                                 " holds a different model (tensor '" + name + "')");
        }
      }
      global = std::move(cp->model);
      first_round = cp->next_round;
    }
  }
  // Random per run: tells clients that a restarted server's rounds are new.
  const int64_t session =
      static_cast<int64_t>(std::random_device{}() * 0x100000000ull ^ std::random_device{}());

  JobReport job;
  std::map<int32_t, std::array<double, kPartyStateCount>> client_times;
  FedAvgAggregator aggregator(options_.aggregator);
  std::mt19937_64 rng(options_.seed);
  uint32_t failed_streak = 0;
  const uint64_t model_bytes = TotalBytes(global);

  auto record_times = [&](const Message& m) {
    if (m.params.count("timer.train")) {
      client_times[m.sender] = StateTimers::SecondsFromParams(m);
    }
  };

  for (uint64_t r = 0; r < options_.rounds; ++r) {
    std::vector<int32_t> selected = all;
    if (options_.clients_per_round > 0 && options_.clients_per_round < selected.size()) {
      std::shuffle(selected.begin(), selected.end(), rng);
      selected.resize(options_.clients_per_round);
      std::sort(selected.begin(), selected.end());
    }
    if (r < first_round) continue;  // finished before the restart (same selections)
    RoundReport rep;
    rep.round = static_cast<int64_t>(r);
    rep.selected = static_cast<uint32_t>(selected.size());
    const uint32_t by_fraction = static_cast<uint32_t>(
        std::ceil(std::clamp(options_.quorum_fraction, 0.0, 1.0) * rep.selected));
    rep.required =
        std::clamp<uint32_t>(std::max(options_.quorum_count, by_fraction), 1, rep.selected);

    Message model;
    model.type = std::string(protocol::kModel);
    model.round = rep.round;
    model.params[protocol::kLocalSteps] = static_cast<int64_t>(options_.local_work.steps);
    model.params[protocol::kLocalEpochs] = static_cast<int64_t>(options_.local_work.epochs);
    model.params[protocol::kSession] = session;
    model.tensors = global;  // shares the Buffers
    // Under compression (transport/compression.h) the clients' updates of
    // this round travel as deltas from this model, which both sides hold,
    // and the model itself may travel as a delta from the last round's, to
    // the clients that said they hold that one.
    model.params[kDeltaRefParam] = rep.round;
    if (r > first_round) model.params[kDeltaBaseParam] = rep.round - 1;
    rep.bytes_sent = model_bytes * rep.selected;

    const auto round_start = Clock::now();
    rep.started_unix_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const auto deadline = round_start + options_.round_deadline;
    auto bcast = StartBroadcast(transport_, selected, std::move(model));
    {
      StateTimers::Scope t(timers_, PartyState::kAggregate);
      XSILO_RETURN_IF_ERROR(aggregator.Reset(global));
    }
    std::set<int32_t> pending(selected.begin(), selected.end());
    Mean train_loss, eval_loss, eval_acc;
    ProgressLine progress(options_.show_progress, "round " + std::to_string(r));
    Clock::time_point blocked_since = Clock::now();

    while (!pending.empty()) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      progress.Update("model " + HumanBytes(static_cast<double>(model_bytes)) + " to " +
                      std::to_string(rep.selected) + " clients " +
                      (bcast->finished() ? "sent" : "sending") + ", updates " +
                      std::to_string(rep.selected - pending.size()) + "/" +
                      std::to_string(rep.selected));
      auto got = transport_.Receive(
          std::min<Duration>(kTick, std::chrono::duration_cast<Duration>(deadline - now) + 1ms));
      if (!got.ok()) {
        if (got.status().code() == StatusCode::kTimeout) continue;
        return got.status().WithContext("FedAvg server, round " + std::to_string(r));
      }
      Message m = std::move(got).value();
      const auto arrived = Clock::now();
      std::optional<Interval> transfer;
      if (auto s = protocol::SentAt(m)) transfer = Interval{*s, arrived};
      protocol::ChargeBlocked(timers_, blocked_since, arrived,
                              {bcast->InFlight(arrived), transfer});

      if (m.type == protocol::kUpdate) {
        rep.bytes_received += m.payload_bytes();
        record_times(m);
        auto samples = m.GetInt(protocol::kSamples);
        if (m.round != rep.round) {
          ++rep.discarded;
          ++job.late_updates_discarded;
        } else if (!pending.count(m.sender) || !samples.ok() || *samples <= 0) {
          ++rep.discarded;
        } else {
          pending.erase(m.sender);
          Status added;
          {
            StateTimers::Scope t(timers_, PartyState::kAggregate);
            added = aggregator.Add(m.tensors, static_cast<uint64_t>(*samples));
          }
          if (!added.ok()) {
            ++rep.discarded;
          } else {
            rep.contributors.push_back(m.sender);
            rep.timeline.push_back(Timing(m, round_start, arrived));
            const double w = static_cast<double>(*samples);
            train_loss.Add(m.GetDouble(protocol::kTrainLoss).value_or(kNoMetric), w);
            const double ew = static_cast<double>(m.GetInt(protocol::kEvalSamples).value_or(0));
            eval_loss.Add(m.GetDouble(protocol::kEvalLoss).value_or(kNoMetric), ew);
            eval_acc.Add(m.GetDouble(protocol::kEvalAccuracy).value_or(kNoMetric), ew);
            rep.eval_samples += static_cast<uint64_t>(ew);
          }
        }
      } else {
        ++rep.discarded;  // e.g. a late fl.evaluation; nothing else is expected
      }
      blocked_since = Clock::now();
    }
    const auto end_wait = Clock::now();
    protocol::ChargeBlocked(timers_, blocked_since, end_wait, {bcast->InFlight(end_wait)});
    progress.Done();
    if (auto done = bcast->DoneAt()) rep.broadcast_s = SecondsBetween(round_start, *done);

    rep.received = aggregator.updates();
    rep.completed = rep.received >= rep.required;
    std::sort(rep.contributors.begin(), rep.contributors.end());
    rep.train_loss = train_loss.value();
    rep.eval_loss = eval_loss.value();
    rep.eval_accuracy = eval_acc.value();
    if (rep.completed) {
      StateTimers::Scope t(timers_, PartyState::kAggregate);
      XSILO_ASSIGN_OR_RETURN(TensorMap next, aggregator.Finish());
      aggregator.Recycle(std::exchange(global, std::move(next)));
      failed_streak = 0;
    } else {
      ++failed_streak;
    }
    if (!options_.checkpoint_dir.empty()) {
      StateTimers::Scope t(timers_, PartyState::kSerialization);
      XSILO_RETURN_IF_ERROR(
          WriteCheckpoint(options_.checkpoint_dir, r + 1, global)
              .WithContext("FedAvg server checkpoint after round " + std::to_string(r)));
    }
    rep.seconds = SecondsBetween(round_start, Clock::now());
    job.rounds.push_back(rep);
    if (options_.on_round) options_.on_round(rep);
    if (failed_streak >= options_.max_failed_rounds) {
      Status failed =
          Unavailable(std::to_string(failed_streak) + " consecutive rounds below quorum (round " +
                      std::to_string(r) + ": " + std::to_string(rep.received) + " of " +
                      std::to_string(rep.required) + " required updates)");
      // Tell every client, so none waits out its idle timeout.
      Message abort;
      abort.type = std::string(protocol::kAbort);
      abort.round = rep.round;
      abort.params[protocol::kReason] = failed.message();
      abort.params[protocol::kSession] = session;
      StartBroadcast(transport_, all, std::move(abort));
      return failed;
    }
  }

  if (options_.finish) {
    Message fin;
    fin.type = std::string(protocol::kFinish);
    fin.round = static_cast<int64_t>(options_.rounds);
    fin.params[protocol::kSession] = session;
    fin.tensors = global;
    const auto deadline = Clock::now() + options_.finish_deadline;
    auto bcast = StartBroadcast(transport_, all, std::move(fin));
    std::set<int32_t> pending(all.begin(), all.end());
    Mean loss, acc;
    ProgressLine progress(options_.show_progress, "final evaluation");
    Clock::time_point blocked_since = Clock::now();
    while (!pending.empty()) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      progress.Update("evaluations " + std::to_string(all.size() - pending.size()) + "/" +
                      std::to_string(all.size()));
      auto got = transport_.Receive(
          std::min<Duration>(kTick, std::chrono::duration_cast<Duration>(deadline - now) + 1ms));
      if (!got.ok()) {
        if (got.status().code() == StatusCode::kTimeout) continue;
        return got.status().WithContext("FedAvg server, final evaluation");
      }
      Message m = std::move(got).value();
      const auto arrived = Clock::now();
      std::optional<Interval> transfer;
      if (auto s = protocol::SentAt(m)) transfer = Interval{*s, arrived};
      protocol::ChargeBlocked(timers_, blocked_since, arrived,
                              {bcast->InFlight(arrived), transfer});
      record_times(m);
      if (m.type == protocol::kEvaluation && pending.erase(m.sender)) {
        const double ew = static_cast<double>(m.GetInt(protocol::kEvalSamples).value_or(0));
        loss.Add(m.GetDouble(protocol::kEvalLoss).value_or(kNoMetric), ew);
        acc.Add(m.GetDouble(protocol::kEvalAccuracy).value_or(kNoMetric), ew);
        job.final_evaluation.samples += static_cast<uint64_t>(ew);
        ++job.final_evaluation.clients;
      } else if (m.type == protocol::kUpdate) {
        ++job.late_updates_discarded;
      }
      blocked_since = Clock::now();
    }
    const auto end_wait = Clock::now();
    protocol::ChargeBlocked(timers_, blocked_since, end_wait, {bcast->InFlight(end_wait)});
    job.final_evaluation.loss = loss.value();
    job.final_evaluation.accuracy = acc.value();
  }

  job.times.push_back({"server", 0, timers_.Snapshot()});
  for (const auto& [rank, secs] : client_times) {
    job.times.push_back({"client " + std::to_string(rank), rank, secs});
  }
  job.model = std::move(global);
  return job;
}

}  // namespace xsilo::fl
