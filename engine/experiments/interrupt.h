// Stopping a run cleanly on SIGINT, SIGTERM or SIGHUP: the handlers only record the signal;
// loops that run steps (train, compare, bench) or trials (fit --measure, sweep) poll
// interrupted() between steps and wind down (a checkpoint, the finished points, a summary).
#pragma once

namespace remat::experiments {

/// Whether a stop signal has arrived. interrupt_signal() is the first one (0: none), for the
/// 128+signal exit code; interrupt_count() how many arrived.
bool interrupted();
int interrupt_signal();
int interrupt_count();
/// With `second_signal_exits` (train), a second signal ends the process at once; without it
/// (sweep, fit --measure: parents of trials), every signal is only counted, so the parent can stop
/// its child and clean up (engine/experiments/trial.cpp).
void install_interrupt_handler(bool second_signal_exits = true);
/// Asks the loop to stop as signal `sig` would (the first stop wins): train uses it when its
/// output's reader is gone (SIGPIPE, which the process ignores to see EPIPE instead of dying).
void request_stop(int sig);

}  // namespace remat::experiments
