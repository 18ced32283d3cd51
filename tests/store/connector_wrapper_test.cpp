// ConnectorWrapper forwards every call, capabilities included; the faulty
// connector (a wrapper) keeps its inner connector's capabilities and still
// draws a fault per object of a batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "xsilo/s3/server.h"
#include "xsilo/store/connector_wrapper.h"

namespace xsilo {
namespace {

// Records each call by name; has both URL capabilities.
class Recording final : public Connector, public PresignedAccess, public PresignedMultipartAccess {
 public:
  std::vector<std::string> calls;

  std::string_view type() const override { return "recording"; }
  ConnectorConfig config() const override { return {"recording", {{"k", "v"}}}; }
  Result<Key> Put(const GatherList&) override { return Note("put", Key{"recording", "p", 1, {}}); }
  Result<std::optional<Buffer>> Get(const Key&) override {
    return Note("get", std::optional<Buffer>(Buffer::CopyFrom(std::string("x"))));
  }
  Result<bool> Exists(const Key&) override { return Note("exists", true); }
  Status Evict(const Key&) override { return Note("evict", Status::OK()); }
  Result<Key> NewKey() override { return Note("new_key", Key{"recording", "n", 0, {}}); }
  Status Set(const Key&, const GatherList&) override { return Note("set", Status::OK()); }
  Result<std::vector<Key>> PutBatch(const std::vector<Buffer>& objects) override {
    return Note("put_batch", std::vector<Key>(objects.size()));
  }
  Result<std::vector<std::optional<Buffer>>> GetBatch(const std::vector<Key>& keys) override {
    return Note("get_batch", std::vector<std::optional<Buffer>>(keys.size()));
  }
  Status EvictBatch(const std::vector<Key>&) override { return Note("evict_batch", Status::OK()); }
  PresignedAccess* presigned() override { return this; }
  PresignedMultipartAccess* presigned_multipart() override { return this; }
  Result<std::string> PresignGet(const Key&, std::chrono::seconds) override {
    return Note("presign_get", std::string("http://get"));
  }
  Result<std::string> PresignPut(const Key&, std::chrono::seconds) override {
    return Note("presign_put", std::string("http://put"));
  }
  Result<MultipartGrant> PresignMultipartPut(const Key&, int, std::chrono::seconds) override {
    return Note("presign_multipart", MultipartGrant{"u", {"a"}, "c"});
  }
  Status AbortMultipartPut(const Key&, const std::string&) override {
    return Note("abort_multipart", Status::OK());
  }
  void Close() override { calls.push_back("close"); }

 private:
  template <typename T>
  T Note(const char* name, T value) {
    calls.push_back(name);
    return value;
  }
};

// A decorator that overrides nothing.
class Plain final : public ConnectorWrapper {
 public:
  using ConnectorWrapper::ConnectorWrapper;
};

TEST(ConnectorWrapper, ForwardsEveryCallAndEveryCapability) {
  auto inner = std::make_shared<Recording>();
  Plain w(inner);
  const Key k{"recording", "id", 1, {}};
  const GatherList bytes;
  EXPECT_EQ(w.type(), "recording");
  EXPECT_EQ(w.config().options.at("k"), "v");
  EXPECT_EQ(w.Put(bytes)->id, "p");
  EXPECT_EQ(w.Put(Buffer::CopyFrom(std::string("y")))->id, "p");  // Connector::Put(Buffer)
  EXPECT_EQ((*w.Get(k))->size(), 1u);
  EXPECT_TRUE(*w.Exists(k));
  EXPECT_TRUE(w.Evict(k).ok());
  EXPECT_EQ(w.NewKey()->id, "n");
  EXPECT_TRUE(w.Set(k, bytes).ok());
  EXPECT_EQ(w.PutBatch({Buffer(), Buffer()})->size(), 2u);
  EXPECT_EQ(w.GetBatch({k, k, k})->size(), 3u);
  EXPECT_TRUE(w.EvictBatch({k}).ok());
  // The capabilities are the inner connector's own objects.
  ASSERT_EQ(w.presigned(), static_cast<PresignedAccess*>(inner.get()));
  ASSERT_EQ(w.presigned_multipart(), static_cast<PresignedMultipartAccess*>(inner.get()));
  EXPECT_EQ(*w.presigned()->PresignGet(k, std::chrono::seconds(1)), "http://get");
  EXPECT_EQ(*w.presigned()->PresignPut(k, std::chrono::seconds(1)), "http://put");
  EXPECT_EQ(w.presigned_multipart()->PresignMultipartPut(k, 2, std::chrono::seconds(1))->upload_id,
            "u");
  EXPECT_TRUE(w.presigned_multipart()->AbortMultipartPut(k, "u").ok());
  w.Close();
  // Batches went to the inner connector's batch calls, not a loop of singles.
  EXPECT_EQ(inner->calls, (std::vector<std::string>{
                              "put", "put", "get", "exists", "evict", "new_key", "set", "put_batch",
                              "get_batch", "evict_batch", "presign_get", "presign_put",
                              "presign_multipart", "abort_multipart", "close"}));
}

TEST(ConnectorWrapper, AConnectorWithoutCapabilitiesStaysWithout) {
  auto inner = MakeConnector({"memory", {}});
  ASSERT_TRUE(inner.ok());
  Plain w(std::shared_ptr<Connector>(std::move(inner).value()));
  EXPECT_EQ(w.presigned(), nullptr);
  EXPECT_EQ(w.presigned_multipart(), nullptr);
}

// The faulty connector over S3 (the embedded server) presigns through the
// inner connector: a URL it hands out reaches an object put through it.
TEST(FaultyConnectorCapabilities, KeepsTheInnerConnectorsUrlCapabilities) {
  S3ServerOptions o;
  o.access_key = "wrapper-ak";
  o.secret_key = "wrapper-sk";
  auto server = S3Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto c = MakeConnector({"faulty",
                          {{"inner", "s3"},
                           {"inner.endpoint", (*server)->endpoint()},
                           {"inner.bucket", "wrapped"},
                           {"inner.access_key", "wrapper-ak"},
                           {"inner.secret_key", "wrapper-sk"},
                           {"inner.addressing", "path"}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_NE((*c)->presigned(), nullptr);
  ASSERT_NE((*c)->presigned_multipart(), nullptr);
  auto key = (*c)->Put(Buffer::CopyFrom(std::string("through a url")));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto url = (*c)->presigned()->PresignGet(*key, std::chrono::seconds(60));
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_NE(url->find("X-Amz-Signature"), std::string::npos) << *url;
  auto grant = (*c)->presigned_multipart()->PresignMultipartPut(*key, 2, std::chrono::seconds(60));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->part_urls.size(), 2u);
  EXPECT_TRUE((*c)->presigned_multipart()->AbortMultipartPut(*key, grant->upload_id).ok());
}

// Batches are not handed to the inner connector's batch calls: each object
// meets the faults.
TEST(FaultyConnectorCapabilities, BatchesMeetTheFaults) {
  auto c = MakeConnector({"faulty", {{"inner", "memory"}, {"fault.fail", "1"}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->PutBatch({Buffer::CopyFrom(std::string("a"))}).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ((*c)->GetBatch({Key{"memory", "x", 0, {}}}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*c)->EvictBatch({Key{"memory", "x", 0, {}}}).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace xsilo
