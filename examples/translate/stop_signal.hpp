// Ctrl-C and SIGTERM during training: the first one asks the trainer to stop after the current
// update and write a checkpoint (no work lost); a second one of either ends the process at once.
#pragma once

namespace attn::translate {

/// Installs the SIGINT and SIGTERM handlers.
void install_stop_handlers();

/// The signal that asked to stop (SIGINT or SIGTERM), or 0.
int stop_requested();

/// Sets or clears the request as a signal would (tests).
void set_stop_request(int signal);

}  // namespace attn::translate
