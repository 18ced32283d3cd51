// A program outside the xsilo tree, built against an installed xsilo
// (README "Use xsilo from your C++ project"; tests/install runs it).
//
// It puts an object into a Store over the in-memory connector and reads it
// back, then sends a tensor between two in-process parties over
// "inproc+memory", where the tensor travels through the connector by key.
// Every step prints one line; the last is "ok".
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "xsilo/core/message.h"
#include "xsilo/store/connector.h"
#include "xsilo/store/store.h"
#include "xsilo/transport/registry.h"
#include "xsilo/version.h"

namespace {

using namespace std::chrono_literals;

int Fail(const std::string& what, const xsilo::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  std::printf("xsilo %s\n", xsilo::kVersion);

  // A Store: put a string, get it back by its key.
  auto connector = xsilo::MakeConnector({"memory", {{"name", "consumer"}}});
  if (!connector.ok()) return Fail("memory connector", connector.status());
  auto store = xsilo::Store::Create("consumer", std::move(*connector));
  if (!store.ok()) return Fail("store", store.status());
  auto key = (*store)->Put(std::string("hello from a Store"));
  if (!key.ok()) return Fail("put", key.status());
  auto value = (*store)->Get<std::string>(*key);
  if (!value.ok()) return Fail("get", value.status());
  if (!value->has_value()) return Fail("get", xsilo::NotFound("the object just put"));
  std::printf("store: %s\n", (*value)->c_str());
  (*store)->Close();

  // Two parties: rank 1 sends rank 0 a tensor 0, 1, ..., 1023, offloaded to
  // the memory connector whatever its size (threshold=always).
  auto& registry = xsilo::TransportRegistry::Global();
  std::vector<std::unique_ptr<xsilo::Transport>> parties;
  for (int32_t rank = 0; rank < 2; ++rank) {
    xsilo::TransportOptions options{.rank = rank, .world_size = 2, .address = "consumer"};
    options.backend = {{"threshold", "always"}};
    auto transport = registry.Create("inproc+memory", options);
    if (!transport.ok()) return Fail("inproc+memory", transport.status());
    if (auto s = (*transport)->Start(); !s.ok()) return Fail("start", s);
    parties.push_back(std::move(*transport));
  }
  constexpr int64_t kCount = 1024;
  std::vector<float> values(kCount);
  for (int64_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i);
  auto tensor = xsilo::Tensor::Make(xsilo::DType::kF32, {kCount},
                                    xsilo::Buffer::CopyFrom(values.data(), kCount * sizeof(float)));
  if (!tensor.ok()) return Fail("tensor", tensor.status());
  xsilo::Message update{.type = "update", .round = 1};
  update.tensors.emplace("w", std::move(*tensor));
  if (auto s = parties[1]->Send(0, std::move(update), 30s); !s.ok()) return Fail("send", s);
  auto received = parties[0]->Receive(30s);
  if (!received.ok()) return Fail("receive", received.status());
  auto w = received->tensors.find("w");
  if (w == received->tensors.end()) return Fail("receive", xsilo::NotFound("tensor w"));
  std::vector<float> got(w->second.nbytes() / sizeof(float));
  std::memcpy(got.data(), w->second.data.data(), got.size() * sizeof(float));
  double sum = 0;
  for (float v : got) sum += v;
  std::printf("inproc+memory: rank 0 got '%s' from rank %d: %zu F32, sum %.0f\n",
              received->type.c_str(), received->sender, got.size(), sum);
  for (auto& party : parties) party->Stop();

  std::printf("ok\n");
  return 0;
}
