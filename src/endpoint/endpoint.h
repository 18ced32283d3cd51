// Private: an object endpoint (`xsilo endpoint start`, docs/endpoint.md).
//
// It owns objects (ObjectTable) and serves them on two listeners:
// - the LOCAL API, plain HTTP on the embedded S3 server's HttpServer
//   (loopback by default), for this site's processes (the endpoint
//   connector): PUT/GET/HEAD/DELETE /objects/<id>[?endpoint=<uuid>],
//   GET /uuid, GET /status. An object of another endpoint is fetched from
//   its owner and passed through; X-Xsilo-Path says which path served it.
// - the PEER API, TLS only, one request per session, for the endpoints the
//   relay vouched for (tickets, endpoint/ticket.h):
//     request  "XSP/1 <GET|HEAD|PUT|DELETE> <id> <body bytes> <ticket>\n"
//     reply    "XSP/1 <status> <bytes> <message>\n" [body: GET only]
//   A PUT's body follows an interim "XSP/1 100 0 continue" reply (sent once
//   the ticket checked out and the space is reserved), then the final reply.
//   The same session runs over a direct connection to the peer listener or
//   over a pipe of the relay, so both paths share every line of this code.
//
// Threads: the HttpServer's workers serve local calls (a remote call runs
// in the worker that received it); one acceptor thread for the peer
// listener and one thread per peer session; one thread keeps the
// registration with the relay and starts a thread per relayed session.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/object_table.h"
#include "endpoint/punch.h"
#include "net/tls.h"
#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"

namespace xsilo::net {
class HttpServer;
class BodyReader;
struct HttpRequest;
struct HttpResponse;
}  // namespace xsilo::net

namespace xsilo::endpoint {

// Read access to this endpoint's objects for a peer endpoint: `reader` (a
// UUID, or "*" for every peer the relay vouches for) may GET and HEAD every
// object whose id starts with `prefix` ("" : every object).
struct ReadGrant {
  std::string reader;
  std::string prefix;
};

struct EndpointOptions {
  std::string listen = "127.0.0.1:0";  // local API
  // The local API's token: when set, every call must carry
  // "Authorization: Bearer <token>" (else 401). A listen address that is not
  // loopback is refused without one: whoever reaches the local API acts
  // with this site's identity on other sites.
  std::string token;
  std::string peer_listen;  // "" : no peer listener (reachable only through the relay)
  // Addresses peers should dial; default: the peer listener's own address.
  std::vector<std::string> advertise;
  std::string relay;       // host:port; "" : no relay (local objects only)
  std::string relay_ca;    // PEM file to verify the relay with ("" : system CAs)
  std::string dir;         // persistence (objects, uuid, TLS identity); "" : memory only
  uint64_t max_bytes = 0;  // 0: unbounded
  std::string uuid_file;   // default <dir>/uuid when dir is set
  std::chrono::milliseconds connect_timeout{1000};  // a direct dial; the relay
  std::chrono::milliseconds io_timeout{60000};      // each blocked send/recv
  // Start waits this long for the first registration with the relay.
  std::chrono::milliseconds register_timeout{10000};
  // A path to an owner that could not be made (a dial timed out, no dial
  // back came) is not tried again for this long: the next calls go straight
  // to the path after it instead of paying the same timeout each time.
  std::chrono::milliseconds path_memory{60000};
  // Try a hole-punched UDP path (ICE through the relay's STUN port) before
  // the relay's pipe, when neither side can dial the other.
  bool punch = true;
  // How long the ICE checks and the stream's handshake may take before the
  // call falls back to the relay's pipe.
  std::chrono::milliseconds punch_timeout{5000};
  // Peer sessions served at once (each is a thread: accepted, relayed,
  // dialled back or punched); past it a new one is refused (its socket
  // closed, or the relay's request to serve ignored).
  int max_sessions = 256;
  // Which peers may read which objects besides those the objects name
  // themselves (a local PUT's readers=, docs/endpoint.md "Trust"). A peer
  // reads an object only when it wrote it, the object names it as a
  // reader, or a grant here covers it.
  std::vector<ReadGrant> read_grants;
  // Test hook: a peer GET calls it after each chunk it sent (may block).
  std::function<void(uint64_t sent)> on_peer_send;
};

// How a call reached the owner (docs/endpoint.md "Paths"): kDirect, this
// endpoint dialled the owner; kReverse, the owner dialled this endpoint's
// peer listener when asked through the relay; kPunched, a UDP path both
// sides opened through their NATs; kRelayed, the relay's pipe.
enum class Path { kLocal, kDirect, kReverse, kPunched, kRelayed };
inline constexpr int kPaths = 5;
const char* PathName(Path p);

// A peer session's reply.
struct PeerReply {
  int status = 0;
  std::string message;
  uint64_t bytes = 0;
  Buffer body;
  Path path = Path::kDirect;
};

class Endpoint {
 public:
  static Result<std::unique_ptr<Endpoint>> Start(EndpointOptions options);
  ~Endpoint();
  // Stops the listeners and the relay link, breaks open sessions, joins.
  void Stop();
  // Breaks every connection now without waiting (an endpoint that dies).
  void Abort();

  const std::string& uuid() const { return uuid_; }
  int port() const;
  int peer_port() const { return peer_port_; }
  const std::string& fingerprint() const { return identity_->fingerprint(); }
  bool registered() const;
  uint64_t served(Path p) const { return served_[static_cast<int>(p)]; }
  // Why the last paths tried before the one that served failed, newest
  // last ("punched to <owner>: ICE: ..."), and why the paths peers asked
  // this endpoint to open failed on its side ("serving punched: ..."); at
  // most kFailuresKept.
  std::vector<std::string> path_failures() const;
  const ObjectTable& table() const { return table_; }
  std::string StatusJson() const;

  // A call on the owner's PEER API (direct or relayed). 5xx/4xx replies are
  // returned as replies; a broken path is Unavailable.
  // One request line to the relay and its one-line answer (relay.h).
  Result<std::string> AskRelay(const std::string& line);
  const net::TlsIdentity& identity() const { return *identity_; }

  Result<PeerReply> CallPeer(const std::string& owner, const std::string& method,
                             const std::string& id, const GatherList* body);

 private:
  explicit Endpoint(EndpointOptions o);
  Status Init();
  void HandleLocal(const net::HttpRequest& req, net::BodyReader& body, net::HttpResponse* resp);
  // Peer API
  void PeerAcceptLoop();
  void ServePeerSession(std::unique_ptr<net::TlsStream> s);
  // Runs fn on a session thread; false (fn not run) once stopping.
  bool RunSession(std::function<void()> fn);
  // Relay link
  void RelayLoop();
  Status RegisterOnce(std::shared_ptr<net::TlsStream>* control);
  // The owner's side of a session on a socket it dials: to the relay
  // ("JOIN <token> owner") or back to a requester ("DIALED <token>").
  void ServeRelayed(const std::string& token);
  void ServeDialBack(const std::string& token, const std::string& addrs);
  void ServeDialled(int fd, const std::string& hello);
  // The owner's side of a punch the relay passed on: gathers, answers
  // through the relay, connects and serves the session on the stream.
  void ServePunch(const std::string& token, const std::string& description);
  // The requester's side: a socket on a punched path to `owner`.
  Result<int> Punch(const std::string& owner);
  PunchOptions PunchOptionsFor(bool controlling) const;
  // The requester's side of the reverse path: asks the owner, through the
  // relay, to dial this endpoint's peer listener; the accepted socket, or
  // Unavailable when none came in time.
  Result<int> AwaitDialBack(const std::string& owner);
  // A TCP connection to the first of `addrs` ("host:port,host:port") that
  // accepts one within connect_timeout; Unavailable when none does.
  Result<int> DialFirst(const std::string& addrs) const;
  // A peer-listener connection that starts with "DIALED <token>\n" instead
  // of a TLS record: handed to the AwaitDialBack waiting for the token.
  void HandDialBack(int fd);
  // Whether peer `peer` (identity: UUID@fingerprint) may read object id:
  // a read grant covers it, or the object table says so.
  bool MayPeerRead(const std::string& id, const std::string& peer,
                   const std::string& identity) const;
  bool RecentlyFailed(const std::string& owner, Path path);
  void NoteFailed(const std::string& owner, Path path, const Status& why);
  void NoteServeFailed(Path path, const Status& why);
  void KeepFailureLocked(std::string what);  // into failures_; mu_ held
  Result<std::unique_ptr<net::TlsStream>> DialRelay();

  EndpointOptions o_;
  ObjectTable table_;
  std::string uuid_;
  std::shared_ptr<net::TlsIdentity> identity_;
  std::unique_ptr<net::HttpServer> local_;
  int peer_fd_ = -1;
  int peer_port_ = 0;
  std::string addrs_;  // advertised, comma-separated, or "-"
  std::thread peer_acceptor_, relay_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> served_[kPaths] = {};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string secret_;  // from the relay; "" while unregistered
  bool register_tried_ = false;
  std::shared_ptr<net::TlsStream> control_;
  int sessions_ = 0;
  std::set<int> session_fds_;
  // Reverse path: tokens AwaitDialBack waits for; -1 until the owner's
  // connection came in.
  std::map<std::string, int> dial_backs_;
  std::map<std::pair<std::string, Path>, std::chrono::steady_clock::time_point> failed_paths_;
  static constexpr size_t kFailuresKept = 16;
  std::deque<std::string> failures_;
};

}  // namespace xsilo::endpoint
