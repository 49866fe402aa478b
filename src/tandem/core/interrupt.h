#pragma once
// A stop request from outside (SIGINT, SIGTERM): the CLI's signal handler sets it, the step loop
// reads it between steps, finishes cleanly and writes a checkpoint (Note [Stopping on a signal]).

namespace tandem {

/// True once a stop was requested.
bool stop_requested();
/// Requests a stop (async-signal-safe: one atomic store).
void request_stop();
/// Clears the request (tests; a new run in the same process).
void clear_stop_request();

/// Installs SIGINT and SIGTERM handlers: the first signal requests a stop and prints `first_notice`
/// (a string literal: the handler keeps the pointer), a second one ends the process at once with
/// status 128 + signal (files are only ever renamed into place complete, so an abrupt end leaves
/// nothing half-written behind).
void install_stop_handlers(
    const char* first_notice = "\ntandem: stopping after this step (a second Ctrl-C stops at once)\n");

}  // namespace tandem
