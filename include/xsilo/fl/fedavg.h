// FedAvg over any registered Transport.
//
// Each round the server selects clients, broadcasts the global model to
// them with one BroadcastAsync (the model's Buffers are shared by every
// receiver, never copied per client), and folds the returned updates into
// a sample-weighted mean as they arrive. A round ends when every selected
// client answered or the round deadline passed; it counts if at least the
// quorum answered, otherwise the global model stays as it was. An update
// for an older round is discarded. A client that stopped answering keeps
// being offered the model, so when it comes back it skips the models it
// missed and rejoins at the round in progress.
//
// Protocol (Message.type; every message carries param "sent_at_ns"):
//   fl.model      server -> client  round r, the global model, local work
//   fl.update     client -> server  round r, the local model, "samples",
//                                   train/eval metrics, the client's timers,
//                                   "model_at_ns" and "round_train_s"
//   fl.finish     server -> client  the final model; evaluate and stop
//   fl.evaluation client -> server  evaluation of the final model, timers
//   fl.abort      server -> client  the job failed ("reason"); stop
// Server messages carry "fl.session", random per FedAvgServer::Run: a
// client that sees a new session (a restarted server resuming from its
// checkpoint) takes the next model even if it trained that round before.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "xsilo/fl/aggregator.h"
#include "xsilo/fl/timers.h"
#include "xsilo/fl/trainer.h"
#include "xsilo/transport/transport.h"

namespace xsilo::fl {

inline constexpr double kNoMetric = std::numeric_limits<double>::quiet_NaN();

// When one contributor's update of a round moved, in seconds since the
// round's broadcast started (on the server's clock; the client's stamps
// assume synchronized system clocks, as "sent_at_ns" does). NaN where the
// client did not stamp it.
struct UpdateTiming {
  int32_t rank = 0;
  double model_at_s = kNoMetric;  // the client had the model (decoded)
  double train_s = kNoMetric;     // its evaluation and training of the round
  double sent_at_s = kNoMetric;   // it started sending the update
  double arrived_s = kNoMetric;   // the server received it (decoded)
};

struct RoundReport {
  int64_t round = 0;
  uint32_t selected = 0;              // clients sent the model
  uint32_t received = 0;              // updates aggregated
  uint32_t required = 0;              // the quorum for this round
  uint32_t discarded = 0;             // late, duplicate or malformed messages seen this round
  bool completed = false;             // received >= required: the global model moved
  std::vector<int32_t> contributors;  // ranks aggregated, ascending
  // Sample-weighted means over the contributors; NaN when none.
  double train_loss = kNoMetric;
  // The global model this round started from, evaluated by the
  // contributors on their held-out data (weighted by evaluated samples).
  double eval_loss = kNoMetric;
  double eval_accuracy = kNoMetric;
  uint64_t eval_samples = 0;
  uint64_t bytes_sent = 0;      // model payload x clients selected
  uint64_t bytes_received = 0;  // update payloads received (discarded ones too)
  double seconds = 0;           // broadcast start to aggregation end
  // The wall clock at the broadcast's start, seconds since the epoch: where
  // the round lies in another process's timeline (bench e2e's CPU samples).
  double started_unix_s = 0;
  // When the transport reported the broadcast done, seconds after its
  // start (its SendAsync callback: for a hybrid backend once the model is
  // stored and every stub sent, while the clients may still be fetching);
  // NaN when it had not by the round's end.
  double broadcast_s = kNoMetric;
  std::vector<UpdateTiming> timeline;  // aggregated updates, in arrival order
};

struct FinalEvaluation {
  uint32_t clients = 0;  // clients that evaluated the final model
  double loss = kNoMetric;
  double accuracy = kNoMetric;
  uint64_t samples = 0;
};

struct JobReport {
  std::vector<RoundReport> rounds;
  FinalEvaluation final_evaluation;
  uint64_t late_updates_discarded = 0;
  // The server first, then each client that reported its timers (its
  // latest report), by rank.
  std::vector<PartyTimes> times;
  TensorMap model;  // the final global model
};

struct ServerOptions {
  // Rounds to run. Default 3.
  uint64_t rounds = 3;
  // Clients selected per round, uniformly at random; 0 = every client.
  // Default 0.
  uint32_t clients_per_round = 0;
  // The quorum of a round is max(quorum_count, ceil(quorum_fraction x
  // selected)), capped at the number selected and at least 1.
  // Defaults 0.5 and 0.
  double quorum_fraction = 0.5;
  uint32_t quorum_count = 0;
  // How long a round waits for updates after its broadcast. Default 600 s.
  Duration round_deadline = std::chrono::seconds(600);
  // How long the final evaluation waits for answers. Default 60 s.
  Duration finish_deadline = std::chrono::seconds(60);
  // Local work each client does per round (sent with the model).
  // Default 10 steps.
  LocalWork local_work{0, 10};
  // The job fails (Unavailable) after this many consecutive rounds below
  // quorum. Default 3.
  uint32_t max_failed_rounds = 3;
  // Broadcast the final model for evaluation (fl.finish) and stop clients.
  // Default true.
  bool finish = true;
  // Seeds client selection. Default 1.
  uint64_t seed = 1;
  AggregatorOptions aggregator;
  // A stderr progress line while a round runs longer than a second.
  // Default false.
  bool show_progress = false;
  // Called on the server thread after each round. Default none.
  std::function<void(const RoundReport&)> on_round;
  // When set, the global model and the next round number are written here
  // after every round (xsilo/fl/checkpoint.h), and Run resumes from a
  // checkpoint found here: it starts at the round after the last finished
  // one, from that round's model. Default empty (no checkpoints).
  std::string checkpoint_dir;
};

class FedAvgServer {
 public:
  // `transport` must be started, with rank 0; clients are ranks
  // 1..world_size-1. It must outlive the server.
  FedAvgServer(Transport& transport, ServerOptions options);

  // Runs every round from `initial_model` (float32 tensors). Fails with
  // Unavailable after max_failed_rounds rounds below quorum (and sends
  // fl.abort to every client), Cancelled if the transport stops.
  Result<JobReport> Run(TensorMap initial_model);

  const StateTimers& timers() const { return timers_; }

 private:
  Transport& transport_;
  ServerOptions options_;
  StateTimers timers_;
};

struct ClientOptions {
  // Longest wait for the server's next message; then Run fails with
  // Timeout. Default 1 h.
  Duration idle_timeout = std::chrono::hours(1);
  // Longest wait for an update send to complete. Default 10 min.
  Duration send_timeout = std::chrono::minutes(10);
  // Used when a model message carries no local work. Default 10 steps.
  LocalWork default_work{0, 10};
  // A stderr progress line for sends longer than a second. Default false.
  bool show_progress = false;
};

struct ClientReport {
  uint64_t rounds_trained = 0;
  uint64_t stale_models_skipped = 0;  // models superseded before this client got to them
  uint64_t failed_sends = 0;
  bool finished = false;  // the server sent fl.finish
  EvalResult final_evaluation;
  std::array<double, kPartyStateCount> seconds{};
};

class FedAvgClient {
 public:
  // `transport` must be started, with a rank > 0; it and `trainer` must
  // outlive the client.
  FedAvgClient(Transport& transport, Trainer& trainer, ClientOptions options = {});

  // Serves rounds until the server sends fl.finish (OK) or fl.abort
  // (Unavailable), the transport stops (Cancelled) or nothing arrives for
  // idle_timeout (Timeout).
  Result<ClientReport> Run();

  const StateTimers& timers() const { return timers_; }

 private:
  Transport& transport_;
  Trainer& trainer_;
  ClientOptions options_;
  StateTimers timers_;
};

}  // namespace xsilo::fl
