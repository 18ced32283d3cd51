#include "transport/builtin.h"
#include "transport/mpi/mpi_engine.h"

namespace xsilo {

// mpi-generic's and mpi-buffer's keys; the defaults are MpiSettings' (mpi_transport.cpp).
// Compiled without MPI too, so every build documents them.
const OptionTable& MpiOptionTable() {
  using T = OptionType;
  static const OptionTable table(
      "mpi",
      {
          {"chunk_bytes", T::kBytes, "1073741824", 1, static_cast<int64_t>(mpi::kMaxChunkBytes), "",
           "largest single MPI message; larger tensors and mpi-generic frames go as several"},
          {"inline_bytes", T::kBytes, "16384", 0, int64_t{1} << 30, "",
           "mpi-generic: frames up to this size travel inside the envelope, as one MPI message"},
          {"verify_checksum", T::kFlag, "1", 0, 0, "",
           "the receiver verifies the payload checksum"},
          {"poll_max_us", T::kMicros, "1000", 1, 1000000, "",
           "longest sleep between receive probes while idle"},
      });
  return table;
}

}  // namespace xsilo
