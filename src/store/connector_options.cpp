// Every built-in connector type's option keys, one OptionTable each: the
// parsers in <type>/<type>_connector.cpp read their options through these,
// and `xsilo backends --keys` (docs/backend-options.md) prints them. They
// are all compiled in every build (the ucx one too), so the docs are the
// same whatever this build has.
#include <cstdint>

#include "store/builtin.h"

namespace xsilo {

namespace {

using T = OptionType;
constexpr int64_t kMaxInt = INT64_MAX;

}  // namespace

const OptionTable& MemoryConnectorOptionTable() {
  static const OptionTable t("memory connector",
                             {
                                 {"name", T::kString, "default", 0, 0, "",
                                  "the store of this process to use: connectors of one name "
                                  "share their objects"},
                             },
                             "connector option");
  return t;
}

const OptionTable& FileConnectorOptionTable() {
  static const OptionTable t(
      "file connector",
      {
          {"dir", T::kString, "", 0, 0, "", "the directory objects are files in (required)"},
          {"fsync", T::kFlag, "0", 0, 0, "", "fsync each object before its put returns"},
      },
      "connector option");
  return t;
}

const OptionTable& RedisConnectorOptionTable() {
  static const OptionTable t(
      "redis connector",
      {
          {"host", T::kString, "127.0.0.1", 0, 0, "", "the redis server's host"},
          {"port", T::kInt, "6379", 1, 65535, "", "the redis server's port"},
          {"password", T::kString, "", 0, 0, "",
           "AUTH password (or password_file); kept out of config()", true},
          {"password_file", T::kString, "", 0, 0, "",
           "a file holding the AUTH password (mode 600)"},
          {"prefix", T::kString, "xsilo", 0, 0, "", "the prefix of every key"},
          {"part_bytes", T::kBytes, "268435456", 1, int64_t{512} << 20, "",
           "largest value of one key; a larger object is several"},
          {"timeout_ms", T::kMillis, "30000", 1, 3600000, "", "one command's timeout"},
          {"pool", T::kInt, "4", 1, 1024, "", "connections kept to the server"},
      },
      "connector option");
  return t;
}

const OptionTable& S3ConnectorOptionTable() {
  static const OptionTable t(
      "s3 connector",
      {
          {"bucket", T::kString, "", 0, 0, "", "the bucket (required)"},
          {"endpoint", T::kString, "", 0, 0, "", "the service's URL; empty: AWS for the region"},
          {"region", T::kString, "us-east-1", 0, 0, "", "the SigV4 region"},
          {"access_key", T::kString, "", 0, 0, "", "the access key id; empty: anonymous"},
          {"secret_key", T::kString, "", 0, 0, "",
           "its secret; kept out of config() (else secret_key_file, this process's "
           "connectors for the same scope, or the AWS credentials chain)",
           true},
          {"secret_key_file", T::kString, "", 0, 0, "", "a file holding the secret (mode 600)"},
          {"prefix", T::kString, "xsilo/", 0, 0, "", "the prefix of every object key"},
          {"addressing", T::kEnum, "auto", 0, 0, "auto|path|virtual",
           "path- or virtual-host-style URLs; auto: as the endpoint suits"},
          {"connections", T::kInt, "8", 1, 256, "", "parallel connections of one transfer"},
          {"concurrency", T::kInt, "8", 1, 256, "", "parts in flight of one transfer"},
          {"part_bytes", T::kBytes, "67108864", int64_t{5} << 20, int64_t{5} << 30, "",
           "multipart part size"},
          {"create_bucket", T::kFlag, "1", 0, 0, "", "create the bucket when it is missing"},
          {"local_dir", T::kString, "", 0, 0, "",
           "the directory of an S3 server on this machine: puts write there directly"},
          {"local_etags", T::kEnum, "md5", 0, 0, "md5|xxh3",
           "the ETags that server computes (its md5_etags)"},
          {"ca_file", T::kString, "", 0, 0, "", "CA bundle for an https endpoint"},
      },
      "connector option");
  return t;
}

const OptionTable& EndpointConnectorOptionTable() {
  static const OptionTable t(
      "endpoint connector",
      {
          {"address", T::kString, "", 0, 0, "",
           "host:port of the site's endpoint (its local API; required)"},
          {"timeout_ms", T::kMillis, "60000", 1, 86400000, "", "one call's timeout"},
          {"put_to", T::kString, "", 0, 0, "",
           "the uuid of another site's endpoint to put objects on; absent: this site's"},
          {"readers", T::kString, "*", 0, 0, "",
           "comma-separated endpoint uuids that may read what this puts; *: any admitted "
           "site; empty: this site only"},
          {"token_file", T::kString, "", 0, 0, "",
           "a file holding the local API's token (mode 600)"},
      },
      "connector option");
  return t;
}

const OptionTable& ZmqConnectorOptionTable() {
  static const OptionTable t(
      "zmq connector",
      {
          {"host", T::kString, "127.0.0.1", 0, 0, "", "the object server's address"},
          {"port", T::kInt, "0", 0, 65535, "", "its port; 0: an ephemeral one (server role)"},
          {"role", T::kEnum, "server", 0, 0, "server|client",
           "server: this process serves its objects; client: it only reads"},
          {"timeout_ms", T::kMillis, "30000", 1, 3600000, "", "one request's timeout"},
          {"max_bytes", T::kBytes, "0", 0, kMaxInt, "", "the objects served at most; 0: no limit"},
          {"chunk_bytes", T::kBytes, "1048576", 1, int64_t{1} << 30, "", "one reply's size"},
      },
      "connector option");
  return t;
}

const OptionTable& UcxConnectorOptionTable() {
  static const OptionTable t(
      "ucx connector",
      {
          {"host", T::kString, "127.0.0.1", 0, 0, "", "the address this process serves on"},
          {"port", T::kInt, "0", 0, 65535, "", "its port; 0: an ephemeral one"},
          {"serve", T::kEnum, "now", 0, 0, "now|on_put",
           "start serving at once or at the first put"},
          {"timeout_ms", T::kMillis, "30000", 1, 3600000, "", "one transfer's timeout"},
          {"max_bytes", T::kBytes, "0", 0, kMaxInt, "", "the objects served at most; 0: no limit"},
          {"chunk_bytes", T::kBytes, "67108864", 4096, int64_t{1} << 30, "",
           "one UCP message's size"},
          {"tls", T::kString, "tcp", 0, 0, "", "UCX_TLS of its context; empty: UCX's choice"},
      },
      "connector option");
  return t;
}

const OptionTable& MultiConnectorOptionTable() {
  static const OptionTable t("multi connector",
                             {
                                 {"connectors", T::kString, "", 0, 0, "",
                                  "the members and their policies, a JSON array (required; "
                                  "docs/store.md)"},
                             },
                             "connector option");
  return t;
}

const OptionTable& FaultyConnectorOptionTable() {
  static const OptionTable t(
      "faulty connector",
      {
          {"inner", T::kString, "", 0, 0, "", "the wrapped connector's type (required)"},
          {"inner.*", T::kString, "", 0, 0, "", "the wrapped connector's options"},
          {"fault.seed", T::kU64, "0", 0, 0, "", "seed of the fault draws"},
          {"fault.fail", T::kFraction, "0", 0, 0, "", "probability an operation fails"},
          {"fault.drop", T::kFraction, "0", 0, 0, "", "probability a put is lost"},
          {"fault.corrupt", T::kFraction, "0", 0, 0, "", "probability a get is corrupted"},
          {"fault.truncate", T::kFraction, "0", 0, 0, "", "probability a get is cut short"},
          {"fault.corrupt_put", T::kFraction, "0", 0, 0, "",
           "probability a put stores corrupted bytes"},
          {"fault.delay", T::kFraction, "0", 0, 0, "", "probability an operation is delayed"},
          {"fault.delay_ms", T::kMillis, "10", 0, 600000, "", "how long a delay lasts"},
      },
      "connector option");
  return t;
}

std::vector<const OptionTable*> ConnectorOptionTables() {
  return {&MemoryConnectorOptionTable(),   &FileConnectorOptionTable(),
          &RedisConnectorOptionTable(),    &S3ConnectorOptionTable(),
          &EndpointConnectorOptionTable(), &ZmqConnectorOptionTable(),
          &UcxConnectorOptionTable(),      &MultiConnectorOptionTable(),
          &FaultyConnectorOptionTable()};
}

}  // namespace xsilo
