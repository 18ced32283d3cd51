#include "s3/s3_test_util.h"

namespace xsilo::testing {

Result<S3ServerAndClient> StartS3ServerAndClient(const std::string& access_key,
                                                 const std::string& secret_key,
                                                 const std::string& bucket) {
  S3ServerOptions so;
  so.access_key = access_key;
  so.secret_key = secret_key;
  so.buckets = {bucket};
  S3ServerAndClient out;
  XSILO_ASSIGN_OR_RETURN(out.server, S3Server::Start(so));
  S3ClientOptions co;
  co.endpoint = out.server->endpoint();
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({access_key, secret_key});
  XSILO_ASSIGN_OR_RETURN(out.client, S3Client::Create(co));
  return out;
}

}  // namespace xsilo::testing
