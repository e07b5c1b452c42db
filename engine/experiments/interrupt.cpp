#include "engine/experiments/interrupt.h"

#include <atomic>
#include <csignal>

namespace remat::experiments {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_signal_count{0};
// The first SIGINT/SIGTERM/SIGHUP asks the loop to stop after the current step (and write a
// checkpoint); the handler then steps aside, so a second one ends the process at once. A
// checkpoint being written at that moment is left as a .tmp folder, never as a step_* one.
extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  ++g_signal_count;
  std::signal(sig, SIG_DFL);
}
// The same for a parent of trials, which must outlive every signal to stop its child.
extern "C" void on_stop_signal_counted(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  ++g_signal_count;
}

}  // namespace

bool interrupted() {
  return g_signal != 0;
}
int interrupt_signal() {
  return g_signal;
}
int interrupt_count() {
  return g_signal_count;
}
void request_stop(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  ++g_signal_count;
}

void install_interrupt_handler(bool second_signal_exits) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    std::signal(sig, second_signal_exits ? on_stop_signal : on_stop_signal_counted);
}

}  // namespace remat::experiments
