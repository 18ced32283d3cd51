#include "endpoint/punch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <nice/agent.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "net/socket.h"

namespace xsilo::endpoint {

namespace {

// How long a path whose local side has finished waits for the peer to go
// silent before it is torn down (docs/endpoint.md "Paths").
constexpr int64_t kLingerMs = 2000;

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> Unhex(const std::string& hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return InvalidArgument("punch description: odd length");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("punch description: not hex");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

// The numeric address of `host` (libnice wants an address for its STUN server).
Result<std::string> NumericHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return Unavailable("cannot resolve STUN host " + host);
  }
  char text[INET6_ADDRSTRLEN] = {};
  getnameinfo(res->ai_addr, res->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  return std::string(text);
}

// Sets a property the agent has (some depend on how libnice was built).
void SetUint(NiceAgent* agent, const char* name, guint value) {
  if (g_object_class_find_property(G_OBJECT_GET_CLASS(agent), name)) {
    g_object_set(G_OBJECT(agent), name, value, nullptr);
  }
}
void SetBool(NiceAgent* agent, const char* name, bool value) {
  if (g_object_class_find_property(G_OBJECT_GET_CLASS(agent), name)) {
    g_object_set(G_OBJECT(agent), name, value ? TRUE : FALSE, nullptr);
  }
}

}  // namespace

struct PunchedPath::Link {
  PunchOptions o;
  GMainContext* ctx = nullptr;
  NiceAgent* agent = nullptr;
  guint stream = 0;
  GIOStream* io = nullptr;
  GCancellable* cancel = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  bool gathered = false, failed = false, ice_ready = false, writable = false;
  std::atomic<bool> done{false};
  // What the agent did, for the error when no path forms: each component
  // state with the milliseconds since the agent was made, and the types of
  // the selected pair. Guarded by mu.
  int64_t born_ms = SteadyMillis();
  std::string history, selected;

  // Ends the main loop (from any thread, before or after it started).
  void Quit() {
    done = true;
    g_main_context_wakeup(ctx);
  }
  std::atomic<int64_t> last_io_ms{0};  // the local side's last bytes out
  std::atomic<int64_t> last_in_ms{0};  // the peer's last bytes in
  std::atomic<bool> out_done{false};   // the local side finished (PumpOut ended)
  int sp = -1;  // the path's end of the socketpair (the caller has the other)

  static void OnGathered(NiceAgent*, guint, gpointer self) {
    auto* l = static_cast<Link*>(self);
    std::lock_guard<std::mutex> lock(l->mu);
    l->gathered = true;
    l->cv.notify_all();
  }
  static void OnState(NiceAgent*, guint, guint, guint state, gpointer self) {
    auto* l = static_cast<Link*>(self);
    std::lock_guard<std::mutex> lock(l->mu);
    l->history += std::string(l->history.empty() ? "" : ", ") +
                  nice_component_state_to_string(static_cast<NiceComponentState>(state)) + "@" +
                  std::to_string(SteadyMillis() - l->born_ms) + "ms";
    if (state == NICE_COMPONENT_STATE_READY || state == NICE_COMPONENT_STATE_CONNECTED) {
      l->ice_ready = true;
      l->cv.notify_all();
    }
    if (state != NICE_COMPONENT_STATE_FAILED) return;
    l->failed = true;
    l->cv.notify_all();
    g_cancellable_cancel(l->cancel);
  }
  static void OnSelected(NiceAgent*, guint, guint, NiceCandidate* local, NiceCandidate* remote,
                         gpointer self) {
    auto* l = static_cast<Link*>(self);
    std::lock_guard<std::mutex> lock(l->mu);
    l->selected =
        std::string(CandidateTypeName(local->type)) + "->" + CandidateTypeName(remote->type);
  }
  static const char* CandidateTypeName(NiceCandidateType t) {
    switch (t) {
      case NICE_CANDIDATE_TYPE_HOST:
        return "host";
      case NICE_CANDIDATE_TYPE_SERVER_REFLEXIVE:
        return "srflx";
      case NICE_CANDIDATE_TYPE_PEER_REFLEXIVE:
        return "prflx";
      case NICE_CANDIDATE_TYPE_RELAYED:
        return "relay";
    }
    return "?";
  }
  // What the agent did so far (the caller holds mu).
  std::string Story() const {
    return "states: " + (history.empty() ? std::string("none") : history) +
           "; selected pair: " + (selected.empty() ? std::string("none") : selected);
  }
  static void OnWritable(NiceAgent*, guint, guint, gpointer self) {
    auto* l = static_cast<Link*>(self);
    std::lock_guard<std::mutex> lock(l->mu);
    l->writable = true;
    l->cv.notify_all();
  }
  // The peer's bytes, on the loop's thread: into the socketpair. A blocking
  // write holds the loop while the local reader is behind, which is the
  // back-pressure (pseudo-TCP's window closes meanwhile).
  static void OnRecv(NiceAgent*, guint, guint, guint len, gchar* buf, gpointer self) {
    auto* l = static_cast<Link*>(self);
    l->last_in_ms = SteadyMillis();
    if (len > 0 && l->sp >= 0) (void)net::SendAll(l->sp, buf, len);
  }
  // Every second: the path ends once the local side has finished and the
  // peer has been silent for kLingerMs (libnice reports no end of the
  // peer's stream to a receive callback, so silence is the signal), or
  // when nothing moved either way for io_timeout.
  static gboolean OnTick(gpointer self) {
    auto* l = static_cast<Link*>(self);
    const int64_t now = SteadyMillis();
    if (l->out_done.load() && now - l->last_in_ms.load() > kLingerMs) {
      l->Quit();
      return G_SOURCE_REMOVE;
    }
    const int64_t last = std::max(l->last_in_ms.load(), l->last_io_ms.load());
    if (last > 0 && now - last > l->o.io_timeout.count()) {
      g_cancellable_cancel(l->cancel);
      if (l->out_done.load()) l->Quit();
    }
    return G_SOURCE_CONTINUE;
  }

  // Runs the main loop; frees the agent once it is quit.
  static void Run(std::shared_ptr<Link> l) {
    g_main_context_push_thread_default(l->ctx);
    while (!l->done.load()) g_main_context_iteration(l->ctx, TRUE);
    if (l->io) {
      g_io_stream_close(l->io, nullptr, nullptr);
      g_object_unref(l->io);
    }
    g_object_unref(l->agent);
    g_main_context_pop_thread_default(l->ctx);
    g_main_context_unref(l->ctx);
    g_object_unref(l->cancel);
    if (l->sp >= 0) ::close(l->sp);
  }

  // The local side's bytes onto the stream; at its end, the stream's write
  // side is shut (the peer reads an end of stream).
  void PumpOut() {
    GOutputStream* out = g_io_stream_get_output_stream(io);
    std::vector<char> buf(256 << 10);
    while (true) {
      ssize_t n = ::recv(sp, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      gsize written = 0;
      if (!g_output_stream_write_all(out, buf.data(), static_cast<gsize>(n), &written, cancel,
                                     nullptr)) {
        g_cancellable_cancel(cancel);
        break;
      }
      last_io_ms = SteadyMillis();
    }
    g_output_stream_close(out, nullptr, nullptr);
    out_done = true;
  }
};

Result<std::unique_ptr<PunchedPath>> PunchedPath::Gather(PunchOptions o) {
  XSILO_ASSIGN_OR_RETURN(std::string stun, NumericHost(o.stun_host));
  auto l = std::make_shared<Link>();
  l->o = std::move(o);
  l->ctx = g_main_context_new();
  l->cancel = g_cancellable_new();
  l->agent = nice_agent_new_reliable(l->ctx, NICE_COMPATIBILITY_RFC5245);
  g_object_set(G_OBJECT(l->agent), "stun-server", stun.c_str(), nullptr);
  SetUint(l->agent, "stun-server-port", static_cast<guint>(l->o.stun_port));
  SetBool(l->agent, "controlling-mode", l->o.controlling);
  SetBool(l->agent, "upnp", false);
  SetBool(l->agent, "ice-tcp", false);  // UDP candidates only: this is the UDP path
  SetUint(l->agent, "stun-max-retransmissions", 4);
  g_signal_connect(G_OBJECT(l->agent), "candidate-gathering-done", G_CALLBACK(&Link::OnGathered),
                   l.get());
  g_signal_connect(G_OBJECT(l->agent), "component-state-changed", G_CALLBACK(&Link::OnState),
                   l.get());
  g_signal_connect(G_OBJECT(l->agent), "reliable-transport-writable", G_CALLBACK(&Link::OnWritable),
                   l.get());
  g_signal_connect(G_OBJECT(l->agent), "new-selected-pair-full", G_CALLBACK(&Link::OnSelected),
                   l.get());
  GSource* tick = g_timeout_source_new(1000);
  g_source_set_callback(tick, &Link::OnTick, l.get(), nullptr);
  g_source_attach(tick, l->ctx);
  g_source_unref(tick);
  std::unique_ptr<PunchedPath> path(new PunchedPath(l));
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return Internal("socketpair: " + std::string(strerror(errno)));
  }
  l->sp = pair[1];
  path->fd_ = pair[0];
  std::thread(&Link::Run, l).detach();  // ended by ~PunchedPath or Link::OnTick

  l->stream = nice_agent_add_stream(l->agent, 1);
  if (l->stream == 0 ||
      !nice_agent_attach_recv(l->agent, l->stream, 1, l->ctx, &Link::OnRecv, l.get()) ||
      !nice_agent_gather_candidates(l->agent, l->stream)) {
    return Unavailable("ICE: cannot gather local candidates");
  }
  l->io = nice_agent_get_io_stream(l->agent, l->stream, 1);
  if (l->io == nullptr) return Unavailable("ICE: no reliable stream");
  {
    std::unique_lock<std::mutex> lock(l->mu);
    l->cv.wait_for(lock, l->o.gather_timeout, [&] { return l->gathered; });
  }
  gchar* sdp = nice_agent_generate_local_sdp(l->agent);
  if (sdp == nullptr) return Unavailable("ICE: no local description");
  // Without a reflexive candidate the peer can only try this host's own
  // addresses, which a NAT hides: the path is still tried (on one network
  // the host candidates suffice), and a failure says why it likely failed.
  path->reflexive_ = std::string_view(sdp).find(" typ srflx") != std::string_view::npos;
  path->description_ = Hex(sdp);
  g_free(sdp);
  return path;
}

PunchedPath::~PunchedPath() {
  if (fd_ < 0) return;  // connected: the path ends by itself (Link::OnTick)
  ::close(fd_);
  link_->Quit();
}

Result<int> PunchedPath::Connect(const std::string& remote_description) {
  Link& l = *link_;
  XSILO_ASSIGN_OR_RETURN(std::string sdp, Unhex(remote_description));
  if (fd_ < 0) return FailedPrecondition("ICE: Connect called twice");
  if (nice_agent_parse_remote_sdp(l.agent, sdp.c_str()) <= 0) {
    return InvalidArgument("ICE: the peer's description holds no candidate");
  }
  const bool remote_reflexive = sdp.find(" typ srflx") != std::string::npos;
  {
    // Two stages, each with connect_timeout: ICE finds a working pair, then
    // pseudo-TCP's handshake runs over it. The handshake retransmits on its
    // own (much longer) timer, so a lost first segment must not eat into
    // the time the checks had.
    std::unique_lock<std::mutex> lock(l.mu);
    l.cv.wait_for(lock, l.o.connect_timeout, [&] { return l.ice_ready || l.failed; });
    if (l.ice_ready && !l.failed) {
      l.cv.wait_for(lock, l.o.connect_timeout, [&] { return l.writable || l.failed; });
    }
    if (!l.writable) {
      std::string why = l.failed      ? "every candidate pair failed"
                        : l.ice_ready ? "a pair worked but the stream's handshake did not finish"
                                      : "no candidate pair worked";
      return Unavailable("ICE: " + why + " within " + std::to_string(l.o.connect_timeout.count()) +
                         " ms (" + l.Story() +
                         "; reflexive candidate here: " + (reflexive_ ? "yes" : "no") +
                         ", at the peer: " + (remote_reflexive ? "yes" : "no") + ")");
    }
  }
  l.last_io_ms = SteadyMillis();
  std::thread([link = link_] { link->PumpOut(); }).detach();
  return std::exchange(fd_, -1);
}

std::string StunBindingResponse(const std::string& req, const void* from, size_t from_len) {
  constexpr uint32_t kCookie = 0x2112A442;
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(req[i]); };
  auto u16 = [&](size_t i) { return static_cast<uint16_t>(u8(i) << 8 | u8(i + 1)); };
  if (req.size() < 20 || u16(0) != 0x0001 || size_t{u16(2)} + 20 != req.size()) return "";
  // RFC 5389 requests carry the magic cookie; RFC 3489 ones (libnice's
  // discovery sends these) a 16-byte transaction id in its place, and get
  // a plain MAPPED-ADDRESS and no FINGERPRINT back.
  const bool rfc5389 =
      (uint32_t{u8(4)} << 24 | uint32_t{u8(5)} << 16 | uint32_t{u8(6)} << 8 | u8(7)) == kCookie;
  const uint32_t xor32 = rfc5389 ? kCookie : 0;
  const uint16_t xor16 = static_cast<uint16_t>(xor32 >> 16);
  std::string attr;
  auto put16 = [](std::string& s, uint16_t v) {
    s.push_back(static_cast<char>(v >> 8));
    s.push_back(static_cast<char>(v & 0xff));
  };
  const uint16_t type = rfc5389 ? 0x0020 : 0x0001;  // XOR-MAPPED-ADDRESS : MAPPED-ADDRESS
  const auto* sa = static_cast<const sockaddr*>(from);
  if (sa->sa_family == AF_INET && from_len >= sizeof(sockaddr_in)) {
    const auto* a = static_cast<const sockaddr_in*>(from);
    put16(attr, type);
    put16(attr, 8);
    put16(attr, 0x0001);
    put16(attr, static_cast<uint16_t>(ntohs(a->sin_port) ^ xor16));
    uint32_t x = ntohl(a->sin_addr.s_addr) ^ xor32;
    put16(attr, static_cast<uint16_t>(x >> 16));
    put16(attr, static_cast<uint16_t>(x & 0xffff));
  } else if (sa->sa_family == AF_INET6 && from_len >= sizeof(sockaddr_in6)) {
    const auto* a = static_cast<const sockaddr_in6*>(from);
    put16(attr, type);
    put16(attr, 20);
    put16(attr, 0x0002);
    put16(attr, static_cast<uint16_t>(ntohs(a->sin6_port) ^ xor16));
    for (int i = 0; i < 16; ++i) {  // XORed with the cookie and the transaction id
      attr.push_back(static_cast<char>(a->sin6_addr.s6_addr[i] ^ (rfc5389 ? u8(4 + i) : 0)));
    }
  } else {
    return "";
  }
  std::string msg;
  put16(msg, 0x0101);  // Binding success response
  put16(msg, static_cast<uint16_t>(attr.size() + (rfc5389 ? 8 : 0)));
  msg.append(req, 4, 16);  // cookie and transaction id, or the old 16-byte id
  msg += attr;
  if (!rfc5389) return msg;
  uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(msg.data()),
                                             static_cast<uInt>(msg.size()))) ^
                 0x5354554e;
  put16(msg, 0x8028);  // FINGERPRINT
  put16(msg, 4);
  put16(msg, static_cast<uint16_t>(crc >> 16));
  put16(msg, static_cast<uint16_t>(crc & 0xffff));
  return msg;
}

}  // namespace xsilo::endpoint
