#include <future>
#include <optional>

#include "fl/progress.h"
#include "fl/protocol.h"
#include "xsilo/core/compress.h"
#include "xsilo/fl/fedavg.h"

namespace xsilo::fl {

namespace {

using protocol::Clock;
using protocol::Interval;
using namespace std::chrono_literals;

}  // namespace

FedAvgClient::FedAvgClient(Transport& transport, Trainer& trainer, ClientOptions options)
    : transport_(transport), trainer_(trainer), options_(std::move(options)) {}

Result<ClientReport> FedAvgClient::Run() {
  if (transport_.rank() <= 0) return FailedPrecondition("a FedAvg client runs on a rank > 0");
  ClientReport report;
  int64_t last_round = -1;
  std::optional<int64_t> session;  // the server run whose rounds last_round counts

  // Sends `m` and waits for the transport to report it done.
  auto send = [&](Message m, const std::string& what) -> Status {
    StateTimers::Scope t(timers_, PartyState::kCommunication);
    ProgressLine progress(
        options_.show_progress,
        "sending " + what + " " + HumanBytes(static_cast<double>(m.payload_bytes())));
    auto done = std::make_shared<std::promise<Status>>();
    auto future = done->get_future();
    protocol::StampSentAt(m);
    transport_.SendAsync(0, std::move(m), [done](const Status& s) { done->set_value(s); });
    const auto deadline = Clock::now() + options_.send_timeout;
    while (future.wait_for(200ms) != std::future_status::ready) {
      if (Clock::now() >= deadline) {
        return Timeout("send of " + what + " did not complete within the send timeout");
      }
      progress.Update("in flight");
    }
    return future.get();
  };

  for (;;) {
    const auto waited_from = Clock::now();
    auto got = transport_.Receive(options_.idle_timeout);
    if (!got.ok()) {
      protocol::ChargeBlocked(timers_, waited_from, Clock::now(), {});
      if (got.status().code() == StatusCode::kTimeout) {
        return Timeout("no message from the server within the idle timeout");
      }
      return got.status().WithContext("FedAvg client " + std::to_string(transport_.rank()));
    }
    Message m = std::move(got).value();
    const auto arrived = Clock::now();
    const int64_t arrived_ns = protocol::SystemNowNs();
    std::optional<Interval> transfer;
    if (auto s = protocol::SentAt(m)) transfer = Interval{*s, arrived};
    protocol::ChargeBlocked(timers_, waited_from, arrived, {transfer});
    // A client that fell behind finds several models queued: only the
    // newest matters, the older rounds are over.
    for (;;) {
      auto next = transport_.Receive(0ms);
      if (!next.ok()) break;
      if (next->type == protocol::kModel || next->type == protocol::kFinish ||
          next->type == protocol::kAbort) {
        if (m.type == protocol::kModel) ++report.stale_models_skipped;
        m = std::move(next).value();
      }
    }
    if (m.type == protocol::kAbort) {
      return Unavailable("the server aborted the job: " +
                         m.GetString(protocol::kReason).value_or("no reason given"));
    }
    if (m.type != protocol::kModel && m.type != protocol::kFinish) continue;
    if (auto s = m.GetInt(protocol::kSession); s.ok() && session != *s) {
      // A new server run (restarted from its checkpoint): its rounds are new
      // even where their numbers are not.
      session = *s;
      last_round = -1;
    }
    if (m.type == protocol::kModel && m.round <= last_round) {
      ++report.stale_models_skipped;
      continue;
    }
    {
      StateTimers::Scope t(timers_, PartyState::kSerialization);
      XSILO_RETURN_IF_ERROR(trainer_.SetParameters(m.tensors));
    }
    m.tensors.clear();  // drop our reference to the broadcast payload
    const auto train_start = Clock::now();
    EvalResult eval;
    {
      StateTimers::Scope t(timers_, PartyState::kTrain);
      XSILO_ASSIGN_OR_RETURN(eval, trainer_.Evaluate());
    }

    if (m.type == protocol::kFinish) {
      report.finished = true;
      report.final_evaluation = eval;
      Message reply;
      reply.type = std::string(protocol::kEvaluation);
      reply.round = m.round;
      reply.params[protocol::kEvalLoss] = eval.loss;
      reply.params[protocol::kEvalAccuracy] = eval.accuracy;
      reply.params[protocol::kEvalSamples] = static_cast<int64_t>(eval.samples);
      // Timers as of now; the send itself is the last thing this client does.
      timers_.ToParams(reply);
      if (!send(std::move(reply), "evaluation").ok()) ++report.failed_sends;
      report.seconds = timers_.Snapshot();
      return report;
    }

    last_round = m.round;
    LocalWork work = options_.default_work;
    auto steps = m.GetInt(protocol::kLocalSteps);
    auto epochs = m.GetInt(protocol::kLocalEpochs);
    if (steps.ok() && epochs.ok() && (*steps > 0 || *epochs > 0)) {
      work.steps = static_cast<uint64_t>(std::max<int64_t>(0, *steps));
      work.epochs = static_cast<uint64_t>(std::max<int64_t>(0, *epochs));
    }
    TrainResult trained;
    {
      StateTimers::Scope t(timers_, PartyState::kTrain);
      XSILO_ASSIGN_OR_RETURN(trained, trainer_.Train(work));
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - train_start).count();
    Message update;
    {
      StateTimers::Scope t(timers_, PartyState::kSerialization);
      XSILO_ASSIGN_OR_RETURN(update.tensors, trainer_.GetParameters());
    }
    update.type = std::string(protocol::kUpdate);
    update.round = m.round;
    // A delta from the round's model where the transport compresses.
    update.params[kDeltaBaseParam] = m.round;
    update.params[protocol::kSamples] = static_cast<int64_t>(trained.samples);
    if (auto it = trained.metrics.find("loss"); it != trained.metrics.end()) {
      update.params[protocol::kTrainLoss] = it->second;
    }
    update.params[protocol::kEvalLoss] = eval.loss;
    update.params[protocol::kEvalAccuracy] = eval.accuracy;
    update.params[protocol::kEvalSamples] = static_cast<int64_t>(eval.samples);
    update.params[protocol::kModelAt] = arrived_ns;
    update.params[protocol::kRoundTrain] = train_s;
    timers_.ToParams(update);
    ++report.rounds_trained;
    if (!send(std::move(update), "update round " + std::to_string(m.round)).ok()) {
      ++report.failed_sends;
    }
  }
}

}  // namespace xsilo::fl
