// The user-model example of docs/fl.md, compiled and run: a trainer the
// runtime knows nothing about, federated over the inproc transport.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <future>

#include "xsilo/fl/fedavg.h"
#include "xsilo/transport/registry.h"

namespace {

using namespace xsilo;

// y = a * x + b fitted by gradient descent on local data.
class LineTrainer : public fl::Trainer {
 public:
  explicit LineTrainer(std::vector<std::pair<float, float>> data) : data_(std::move(data)) {}

  Result<TensorMap> GetParameters() override {
    auto t = Tensor::Make(DType::kF32, {2}, Buffer::CopyFrom(ab_, sizeof ab_));
    if (!t.ok()) return t.status();
    return TensorMap{{"ab", *t}};
  }
  Status SetParameters(const TensorMap& p) override {
    auto it = p.find("ab");
    if (it == p.end() || it->second.nbytes() != sizeof ab_) return InvalidArgument("want ab[2]");
    std::memcpy(ab_, it->second.data.data(), sizeof ab_);  // read, never write, the shared model
    return Status::OK();
  }
  Result<fl::TrainResult> Train(const fl::LocalWork& work) override {
    uint64_t steps = work.steps ? work.steps : work.epochs;  // one step = one pass here
    for (uint64_t s = 0; s < steps; ++s) {
      float ga = 0, gb = 0;
      for (auto [x, y] : data_) {
        float e = ab_[0] * x + ab_[1] - y;
        ga += e * x;
        gb += e;
      }
      ab_[0] -= 0.01f * ga / data_.size();
      ab_[1] -= 0.01f * gb / data_.size();
    }
    return fl::TrainResult{data_.size(), {{"steps", double(steps)}}};  // weight = local samples
  }
  Result<fl::EvalResult> Evaluate() override {
    double loss = 0;
    for (auto [x, y] : data_) loss += std::pow(ab_[0] * x + ab_[1] - y, 2);
    return fl::EvalResult{loss / data_.size(), 0.0, data_.size()};
  }

 private:
  std::vector<std::pair<float, float>> data_;
  float ab_[2] = {0, 0};
};

TEST(TrainerExample, AUserModelFederatesOverATransportByName) {
  // Three silos see different x ranges of the same line y = 2x + 1.
  const int clients = 3;
  std::vector<std::unique_ptr<Transport>> parties;
  for (int r = 0; r <= clients; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = clients + 1;
    o.address = "fl-trainer-example";
    auto t = TransportRegistry::Global().Create("inproc", o);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE((*t)->Start().ok());
    parties.push_back(std::move(t).value());
  }
  std::vector<std::unique_ptr<LineTrainer>> trainers;
  std::vector<std::future<Result<fl::ClientReport>>> runs;
  for (int r = 1; r <= clients; ++r) {
    std::vector<std::pair<float, float>> points;
    for (int i = 0; i < 20 * r; ++i) {
      float x = static_cast<float>(r) + 0.05f * i;
      points.push_back({x, 2 * x + 1});
    }
    trainers.push_back(std::make_unique<LineTrainer>(std::move(points)));
    runs.push_back(std::async(std::launch::async, [&parties, &trainers, r] {
      return fl::FedAvgClient(*parties[r], *trainers[r - 1]).Run();
    }));
  }
  fl::FedAvgServer server(*parties[0], {.rounds = 40, .local_work = {0, 5}});
  auto initial = Tensor::Make(DType::kF32, {2}, *Buffer::AllocateZeroed(8));
  auto job = server.Run({{"ab", *initial}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_LT(job->final_evaluation.loss, 0.05 * job->rounds.front().eval_loss);
  for (auto& r : runs) EXPECT_TRUE(r.get().ok());
  for (auto& p : parties) p->Stop();
}

}  // namespace
