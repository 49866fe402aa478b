#pragma once
// The threads that serve an HTTP server's connections, one connection each (Note [Connection
// pool]). Only built with cpp-httplib (TANDEM_WITH_HTTP).

#include <cstddef>

namespace httplib {
class TaskQueue;
}

namespace tandem {

/// A cpp-httplib task queue (Server::new_task_queue) that starts with `threads` workers and adds
/// one whenever a connection arrives with none idle, up to `max_threads`; past that, connections
/// wait for a worker. Its shutdown serves what waits, then joins every worker.
httplib::TaskQueue* new_connection_pool(size_t threads, size_t max_threads);

}  // namespace tandem
