// Writes a few valid frames and safetensors payloads as a seed corpus.
#include <cstdio>
#include <fstream>
#include <string>

#include "xsilo/core/codec.h"

namespace {

void Write(const std::string& path, const xsilo::GatherList& bytes) {
  xsilo::Buffer flat = *bytes.Flatten();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data()), static_cast<std::streamsize>(flat.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  std::string dir = argv[1];
  xsilo::Message m;
  m.type = "model";
  m.round = 1;
  m.receivers = {1, 2};
  m.params["lr"] = 0.1;
  m.params["b"] = xsilo::Bytes{1, 2};
  Write(dir + "/empty.frame", xsilo::EncodeMessage(m).bytes);
  m.tensors.emplace("w", *xsilo::Tensor::Zeros(xsilo::DType::kF32, {3, 2}));
  m.tensors.emplace("b", *xsilo::Tensor::Zeros(xsilo::DType::kI8, {5}));
  m.tensors.emplace("h", *xsilo::Tensor::Zeros(xsilo::DType::kBF16, {1, 1, 2}));
  Write(dir + "/three.frame", xsilo::EncodeMessage(m).bytes);
  Write(dir + "/three.safetensors", xsilo::EncodeSafetensors(m.tensors, {{"format", "pt"}}).bytes);
  return 0;
}
