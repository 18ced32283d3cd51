#include "xsilo/bench/model.h"

#include "xsilo/core/codec.h"

namespace xsilo::bench {

Result<Message> MakeModel(uint64_t params, uint64_t seed) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(params * 4));
  auto* p = reinterpret_cast<float*>(b.mutable_data());
  for (uint64_t i = 0; i < params; ++i)
    p[i] = static_cast<float>((i * 2654435761u + seed) % 1000) * 1e-3f;
  Message m;
  m.type = "model";
  m.params["xxh3"] = static_cast<int64_t>(Checksum(b.span()));
  XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Make(DType::kF32, {static_cast<int64_t>(params)}, b));
  m.tensors.emplace("w", std::move(t));
  return m;
}

void StampModel(Message* m, int64_t stamp) {
  Tensor& t = m->tensors.at("w");
  auto* p = reinterpret_cast<float*>(t.data.mutable_data());
  p[0] = static_cast<float>(stamp) + 0.5f;
  m->params["xxh3"] = static_cast<int64_t>(Checksum(t.data.span()));
  m->params["stamp"] = stamp;
}

bool ModelIntact(const Message& m) {
  auto it = m.tensors.find("w");
  auto sum = m.GetInt("xxh3");
  return it != m.tensors.end() && sum.ok() &&
         static_cast<int64_t>(Checksum(it->second.data.span())) == *sum;
}

}  // namespace xsilo::bench
