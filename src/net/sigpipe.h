// Net layer: keeping SIGPIPE from killing the process, without touching its
// disposition (which belongs to the application).
//
// A write to a peer that hung up raises SIGPIPE where the call cannot be
// told MSG_NOSIGNAL: sendfile, OpenSSL's writes, libuv's writev inside
// TensorPipe. The signal is directed at the writing thread, so a thread
// that blocks it gets EPIPE instead and the signal stays pending on it.
#pragma once

#include <signal.h>
#include <cerrno>
#include <ctime>

namespace xsilo::net {

// Takes a SIGPIPE pending on this thread, if any, so that it is not
// delivered when the thread unblocks it.
inline void DrainSigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  const timespec zero{0, 0};
  while (::sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
  }
}

// Blocks SIGPIPE on this thread (and the threads it starts from now on);
// the mask before goes to *old when given.
inline void BlockSigpipe(sigset_t* old = nullptr) {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, old);
}

// Blocks SIGPIPE on this thread for its scope, then drains what it raised
// and restores the mask. Threads started inside the scope inherit the
// blocked mask for their whole life (how a library's own I/O threads are
// kept from raising it).
class SigpipeBlock {
 public:
  SigpipeBlock() { BlockSigpipe(&old_); }
  ~SigpipeBlock() {
    DrainSigpipe();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace xsilo::net
