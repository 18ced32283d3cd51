#include "fl_report.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include "xsilo/transport/compression.h"

namespace xsilo::cli {

using namespace xsilo::fl;

namespace {

// A metric, or null where it is NaN (not measured, not stamped).
nlohmann::json FiniteOrNull(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}

nlohmann::json TimelineJson(const std::vector<UpdateTiming>& timeline) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : timeline) {
    out.push_back({{"rank", t.rank},
                   {"model_at_s", FiniteOrNull(t.model_at_s)},
                   {"train_s", FiniteOrNull(t.train_s)},
                   {"sent_at_s", FiniteOrNull(t.sent_at_s)},
                   {"arrived_s", FiniteOrNull(t.arrived_s)}});
  }
  return out;
}

nlohmann::json RoundJson(const RoundReport& r) {
  return {{"round", r.round},
          {"selected", r.selected},
          {"received", r.received},
          {"required", r.required},
          {"discarded", r.discarded},
          {"completed", r.completed},
          {"contributors", r.contributors},
          {"eval_loss", FiniteOrNull(r.eval_loss)},
          {"eval_accuracy", FiniteOrNull(r.eval_accuracy)},
          {"train_loss", FiniteOrNull(r.train_loss)},
          {"bytes_sent", r.bytes_sent},
          {"bytes_received", r.bytes_received},
          {"seconds", r.seconds},
          {"started_unix_s", r.started_unix_s},
          {"broadcast_s", FiniteOrNull(r.broadcast_s)},
          {"timeline", TimelineJson(r.timeline)}};
}

}  // namespace

std::string Mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

void PrintRoundHeader() {
  std::printf("%-7s %9s %9s %9s %11s %12s %9s\n", "round", "clients", "loss", "accuracy",
              "train_loss", "moved", "time");
  std::fflush(stdout);
}

void PrintRound(const RoundReport& r, uint64_t rounds) {
  char round[32], clients[32];
  std::snprintf(round, sizeof round, "%lld/%llu", static_cast<long long>(r.round + 1),
                static_cast<unsigned long long>(rounds));
  std::snprintf(clients, sizeof clients, "%u/%u", r.received, r.selected);
  std::printf("%-7s %9s %9.4f %9.4f %11.4f %12s %8.2fs%s\n", round, clients, r.eval_loss,
              r.eval_accuracy, r.train_loss, Mb(r.bytes_sent + r.bytes_received).c_str(), r.seconds,
              r.completed ? "" : "  below quorum: model kept");
  std::fflush(stdout);
}

void PrintFinal(const FinalEvaluation& f, int clients) {
  char c[32];
  std::snprintf(c, sizeof c, "%u/%d", f.clients, clients);
  std::printf("%-7s %9s %9.4f %9.4f\n", "final", c, f.loss, f.accuracy);
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) return NotFound("cannot write " + path);
  out << j.dump(2) << "\n";
  return out ? Status::OK() : Internal("write to " + path + " failed");
}

nlohmann::json JobJson(const std::string& transport, const std::string& tier, const MlpShape& shape,
                       const JobReport& job, const std::vector<PartyTimes>& times) {
  nlohmann::json j;
  j["transport"] = transport;
  j["tier"] = tier;
  j["model"] = {{"layers", shape.ToString()}, {"parameters", shape.ParameterCount()}};
  for (const auto& r : job.rounds) j["rounds"].push_back(RoundJson(r));
  const auto& f = job.final_evaluation;
  j["final"] = {{"clients", f.clients},
                {"loss", FiniteOrNull(f.loss)},
                {"accuracy", FiniteOrNull(f.accuracy)}};
  j["late_updates_discarded"] = job.late_updates_discarded;
  j["state_seconds"] = nlohmann::json::parse(StateTableJson(times));
  return j;
}

nlohmann::json ReportCompression(const Transport& t, const std::string& party) {
  auto s = CompressionSummaryOf(t);
  if (!s) return nullptr;
  const double ratio =
      s->raw_bytes ? static_cast<double>(s->encoded_bytes) / static_cast<double>(s->raw_bytes) : 1;
  std::printf(
      "%s compression: %llu of %llu messages compressed, %llu B of tensors sent as %llu B "
      "(ratio %.3f), encode %.2f s, decode %.2f s\n",
      party.c_str(), static_cast<unsigned long long>(s->messages_compressed),
      static_cast<unsigned long long>(s->messages_sent),
      static_cast<unsigned long long>(s->raw_bytes),
      static_cast<unsigned long long>(s->encoded_bytes), ratio, s->encode_seconds,
      s->decode_seconds);
  return {{"messages_sent", s->messages_sent},
          {"messages_compressed", s->messages_compressed},
          {"raw_bytes", s->raw_bytes},
          {"encoded_bytes", s->encoded_bytes},
          {"ratio", ratio},
          {"encode_s", s->encode_seconds},
          {"decode_s", s->decode_seconds},
          {"references_kept", s->references_kept},
          {"references_skipped", s->references_skipped},
          {"last_choice", s->last_choice}};
}

}  // namespace xsilo::cli
