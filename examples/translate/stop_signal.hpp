// Ctrl-C and SIGTERM during training: the first one asks the trainer to stop after the current
// update and write a checkpoint (no work lost); a second one of either ends the process at once.
#pragma once

namespace attn::translate {

/// Installs the SIGINT and SIGTERM handlers.
void install_stop_handlers();

/// Once the final checkpoint is on disk: from now on SIGINT and SIGTERM end the process at once
/// (exit status 130 / 143 by the signal), and so does one that came since the last update, which
/// nothing looks for any more. The averaging, model and test report, which ran on for minutes
/// with the first signal ignored, are cut short; train --resume then writes the model.
void end_stop_handling();

/// The signal that asked to stop (SIGINT or SIGTERM), or 0.
int stop_requested();

/// Sets or clears the request as a signal would (tests).
void set_stop_request(int signal);

}  // namespace attn::translate
