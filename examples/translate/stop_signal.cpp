#include "stop_signal.hpp"

#include <signal.h>

#include <csignal>

namespace attn::translate {

namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop != 0) {
    // The second request: the default action, now (the process ends by this signal).
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop = sig;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress continue
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

void end_stop_handling() {
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  if (g_stop != 0) ::raise(g_stop);  // one that came after the last update looked for it
}

int stop_requested() { return g_stop; }

void set_stop_request(int signal) { g_stop = signal; }

}  // namespace attn::translate
