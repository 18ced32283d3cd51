// Upload grants (HybridOptions::grant_uploads): a party that can presign
// sends each receiver a fresh key and presigned PUT (or multipart) URLs;
// a receiver without storage access spends one on its next big send.
#include <algorithm>

#include "hybrid/hybrid_internal.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/s3/client.h"

namespace xsilo::hybrid_detail {

namespace {

constexpr size_t kGrantsPerPeer = 2;

}  // namespace

std::optional<Grant> HybridTransport::TakeGrant(int32_t peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& held = grants_[peer];
  while (!held.empty()) {
    Grant g = std::move(held.front());
    held.pop_front();
    if (g.usable_until > Clock::now()) return g;
  }
  return std::nullopt;
}

namespace {

UrlUploadArgs GrantUpload(const Grant& grant, const HybridOptions& hybrid) {
  UrlUploadArgs up;
  up.part_urls = grant.part_urls;
  up.complete_url = grant.complete_url;
  up.connections = hybrid.url_connections;
  up.min_part_bytes = grant.min_part_bytes;
  up.tls.ca_file = hybrid.url_ca_file;
  return up;
}

}  // namespace

Status HybridTransport::PutThroughGrant(const Grant& grant, const Prepared& prepared,
                                        int32_t peer) {
  const EncodedPayload& payload = prepared.payload;
  Status put;
  uint64_t parts = 1;
  int used = 1;  // connections
  const auto start = Clock::now();
  if (grant.part_urls.empty()) {
    put = HttpPutUrl(grant.url, payload.bytes, std::chrono::minutes(10),
                     UrlTlsOptions{.ca_file = hybrid_.url_ca_file});
  } else {
    UrlUploadArgs up = GrantUpload(grant, hybrid_);
    up.body = payload.bytes;
    auto uploaded = HttpPutUrlParts(up);
    put = uploaded.status();
    if (uploaded.ok()) {
      parts = *uploaded;
      used = static_cast<int>(std::min<uint64_t>(parts, hybrid_.url_connections));
    }
  }
  if (!put.ok()) return put;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (router_) router_->OnTransfer(peer, payload.bytes.size, seconds, used);
  XSILO_LOG(kLog, kDebug,
            name_ << " rank " << rank() << " -> rank " << peer << ": uploaded "
                  << payload.bytes.size << " bytes through a grant in " << seconds * 1e3 << " ms, "
                  << parts << " part(s) over " << used << " connection(s)");
  return Status::OK();
}

Message HybridTransport::GrantStub(Message m, TensorMap big, const Grant& grant,
                                   const Prepared& prepared, const Status& put, int32_t peer) {
  if (put.ok()) {
    Key key = grant.key;
    key.size = prepared.payload.bytes.size;
    MakeStub(&m, key, prepared.payload.checksum, prepared.blocks, "");
    return m;
  }
  XSILO_LOG(kLog, kWarn,
            name_ << ": upload through a grant of rank " << peer
                  << " failed, sending inline: " << put.ToString());
  for (auto& [name, t] : big) m.tensors.insert_or_assign(name, std::move(t));
  return m;
}

Message HybridTransport::OffloadThroughGrant(Message m, TensorMap big, int32_t peer,
                                             std::optional<Grant> grant) {
  if (!grant) grant = TakeGrant(peer);
  if (!grant) {
    for (auto& [name, t] : big) m.tensors.insert_or_assign(name, std::move(t));
    return m;
  }
  Prepared prepared = Prepare(big);
  const Status put = PutThroughGrant(*grant, prepared, peer);
  return GrantStub(std::move(m), std::move(big), *grant, prepared, put, peer);
}

Result<Message> HybridTransport::OffloadStream(EncodeStream& stream, int32_t peer, int* stripe) {
  const std::vector<int32_t> peers{peer};
  // Routed by what the stream expects to come to: the encoder has only
  // begun.
  std::optional<Route> route =
      router_ ? ChooseRoute(stream.Estimate(), peers, /*wait=*/true) : Route{.store = true};
  if (route) *stripe = route->stripe;
  std::optional<Grant> grant;
  if (route && route->store) grant = TakeGrant(peer);
  if (!grant || grant->part_urls.empty()) {  // the ordinary way, once encoded
    XSILO_ASSIGN_OR_RETURN(Message m, stream.TakeMessage());
    if (!grant) return Offload(std::move(m), peers, route, stripe);
    TensorMap big = TakeTensors(&m, 1);
    if (big.empty()) return m;
    return OffloadThroughGrant(std::move(m), std::move(big), peer, std::move(grant));
  }

  // The message, once final (the head's maker takes it), and its object.
  std::optional<Message> m;
  TensorMap big;
  Status encoded;  // the encoder's failure
  Clock::time_point encoded_at;
  auto take = [&]() -> Status {
    if (m || !encoded.ok()) return encoded;
    auto final_message = stream.TakeMessage();
    encoded_at = Clock::now();
    if (!final_message.ok()) return encoded = final_message.status();
    m = std::move(final_message).value();
    big = TakeTensors(&*m, 1);
    return Status::OK();
  };
  UrlStreamUpload up;
  up.upload = GrantUpload(*grant, hybrid_);
  up.body = &stream;
  up.head = [&]() -> Result<GatherList> {
    XSILO_RETURN_IF_ERROR(take());
    std::vector<const Tensor*> order;
    for (const auto* e : PayloadOrder(big)) order.push_back(&e->second);
    if (!stream.Holds(order)) {
      return FailedPrecondition("the encoded message is not the bytes streamed");
    }
    GatherList head;
    head.Append(EncodeSafetensors(big, {}, /*checksum=*/false).bytes.segments.front());
    return head;
  };
  const auto start = Clock::now();
  auto streamed = HttpPutUrlStream(up);
  XSILO_RETURN_IF_ERROR(take());  // the encoder failed: so does the send
  if (big.empty()) return std::move(*m);
  Prepared prepared = Prepare(big);
  Status put = streamed.status();
  if (streamed.ok()) {
    const auto now = Clock::now();
    XSILO_LOG(kLog, kDebug,
              name_ << " rank " << rank() << " -> rank " << peer << ": streamed "
                    << prepared.payload.bytes.size << " bytes through a grant in "
                    << std::chrono::duration<double, std::milli>(now - start).count() << " ms, "
                    << std::chrono::duration<double, std::milli>(now - encoded_at).count()
                    << " ms after the encode ended, " << streamed->parts << " part(s); "
                    << streamed->early_bytes << " bytes went before it ended");
  }
  if (!streamed.ok() && (streamed.status().code() == StatusCode::kCancelled ||
                         streamed.status().code() == StatusCode::kFailedPrecondition)) {
    // Abandoned, or not the bytes streamed: the same grant, whole (its
    // parts replace those sent).
    XSILO_LOG(kLog, kDebug,
              name_ << " rank " << rank() << " -> rank " << peer
                    << ": uploading whole: " << streamed.status().ToString());
    put = PutThroughGrant(*grant, prepared, peer);
  }
  return GrantStub(std::move(*m), std::move(big), *grant, prepared, put, peer);
}

bool HybridTransport::GrantsDueLocked(const std::vector<int32_t>& peers) {
  if (!IssuesGrants()) return false;
  for (int32_t p : peers) {
    if (issued_per_peer_[p] < kGrantsPerPeer) return true;
  }
  return false;
}

void HybridTransport::SendGrants(const std::vector<int32_t>& peers) {
  if (!IssuesGrants()) return;
  for (int32_t p : peers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (issued_per_peer_[p] >= kGrantsPerPeer) continue;
    }
    auto key = connector_->NewKey();
    if (!key.ok()) return;
    Message g;
    g.type = kGrantType;
    g.params["key"] = key->ToJson();
    std::string upload_id;
    // Several connections: a multipart grant, so the upload runs in
    // parallel like the downloads do.
    PresignedMultipartAccess* multipart = connector_->presigned_multipart();
    auto multi =
        hybrid_.url_connections > 1 && multipart != nullptr
            ? multipart->PresignMultipartPut(*key, hybrid_.url_connections, hybrid_.presign_expiry)
            : Result<PresignedMultipartAccess::MultipartGrant>(
                  Unimplemented("one connection, or no multipart uploads"));
    if (multi.ok()) {
      upload_id = multi->upload_id;
      std::string parts;
      for (const auto& u : multi->part_urls) parts += (parts.empty() ? "" : "\n") + u;
      g.params["parts"] = parts;
      g.params["complete"] = multi->complete_url;
      g.params["min_part"] = static_cast<int64_t>(hybrid_.min_part_bytes);
    } else {
      auto url = connector_->presigned()->PresignPut(*key, hybrid_.presign_expiry);
      if (!url.ok()) return;
      g.params["url"] = *url;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      issued_[key->id] = {p, *key, upload_id, Clock::now() + hybrid_.presign_expiry};
      ++issued_per_peer_[p];
    }
    g.params["expires_s"] = static_cast<int64_t>(hybrid_.presign_expiry.count());
    inner().SendAsync(p, std::move(g), [](const Status&) {});
  }
}

void HybridTransport::DropIssued(const Issued& g) {
  (void)connector_->Evict(g.key);
  if (!g.upload_id.empty() && connector_->presigned_multipart() != nullptr) {
    (void)connector_->presigned_multipart()->AbortMultipartPut(g.key, g.upload_id);
  }
}

void HybridTransport::OnGrant(const Message& m) {
  auto key_json = m.GetString("key");
  auto expires = m.GetInt("expires_s");
  if (!key_json.ok() || !expires.ok()) return;
  auto key = Key::FromJson(*key_json);
  if (!key.ok()) return;
  Grant grant{.key = *key};
  if (auto url = m.GetString("url"); url.ok()) {
    grant.url = *url;
  } else {
    auto parts = m.GetString("parts");
    auto complete = m.GetString("complete");
    if (!parts.ok() || !complete.ok() || parts->empty() || complete->empty()) return;
    for (size_t a = 0; a <= parts->size();) {
      size_t b = std::min(parts->find('\n', a), parts->size());
      grant.part_urls.push_back(parts->substr(a, b - a));
      a = b + 1;
    }
    grant.complete_url = *complete;
    // From an issuer that predates it: S3's own minimum.
    if (auto min_part = m.GetInt("min_part"); min_part.ok() && *min_part > 0) {
      grant.min_part_bytes = static_cast<uint64_t>(*min_part);
    }
  }
  // Keep a margin for the upload itself and for clock drift.
  auto life = std::chrono::seconds(*expires);
  auto until = Clock::now() + life - std::min<Clock::duration>(life / 4, std::chrono::minutes(1));
  std::lock_guard<std::mutex> lock(mu_);
  grant.usable_until = until;
  auto& held = grants_[m.sender];
  held.push_back(std::move(grant));
  while (held.size() > 2 * kGrantsPerPeer) held.pop_front();
}

bool HybridTransport::TakeIssued(const std::string& id, Issued* issued) {
  auto it = issued_.find(id);
  if (it == issued_.end()) return false;
  *issued = it->second;
  --issued_per_peer_[it->second.peer];
  issued_.erase(it);
  return true;
}

}  // namespace xsilo::hybrid_detail
