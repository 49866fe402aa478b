#pragma once
// `tandem serve`'s HTTP front: OpenAI's /v1/completions and /v1/chat/completions (whole or
// streamed as server-sent events), /v1/models, /health and Prometheus /metrics, on cpp-httplib,
// loopback by default, with an optional API key. The model is behind CompletionBackend; the body
// format is serve/openai_api.h.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tandem/serve/openai_api.h"

namespace tandem {

/// What the server asks of the model behind it (serve/completion_service.h is the real one).
class CompletionBackend {
 public:
  virtual ~CompletionBackend() = default;

  /// Where a request's output goes, called from the backend's thread.
  struct Sink {
    std::function<void(const std::string& text)> on_text;                    ///< the next piece of text
    std::function<void(FinishReason reason, const Usage& usage)> on_finish;  ///< the end; nothing follows
    std::function<void(const std::string& message)> on_error;                ///< a failure mid-way; nothing follows
  };

  /// Starts a request; returns its id. ApiError for a refusal, before any callback: 400 (a prompt
  /// longer than the context, say), 429 (the queue is full).
  virtual uint64_t submit(const CompletionRequest& request, Sink sink) = 0;
  /// Stops a request whose client went away and frees what it held. No callback runs after this
  /// returns; an id that has finished is ignored.
  virtual void cancel(uint64_t id) = 0;
  /// The model's name in /v1/models and in responses.
  virtual std::string model_id() const = 0;
  /// The backend's Prometheus lines (queue, batch, cache pages, tokens), newline-terminated.
  virtual std::string metrics_text() const = 0;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  ///< loopback unless told (--host 0.0.0.0 exposes it)
  int port = 8000;                 ///< 0 = any free port (tests)
  std::string api_key;             ///< "" = none; else every /v1 request needs "Authorization: Bearer <key>"
  int threads = 64;                ///< workers to start with (a stream holds one); up to 4x as connections come
  int64_t max_body_bytes = int64_t{16} << 20;  ///< a larger request body is answered 413 (--max-body-mib)
};

/// The server, listening from construction until destruction.
class HttpServer {
 public:
  /// Binds and serves on a thread; UserError when the port is taken or the build has no HTTP support.
  HttpServer(CompletionBackend& backend, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  int port() const;
  /// Blocks until stop() is called from another thread (or a signal handler's thread).
  void wait();
  /// Note [Graceful drain]: stops taking requests (503 with Retry-After; /health says "draining")
  /// and waits up to `timeout` for those in flight to finish. What still runs then is cut: a stream
  /// gets an error event and [DONE], a whole answer a 503. Returns how many were cut.
  int64_t drain(std::chrono::milliseconds timeout);
  /// The drain's first part alone: from now on new requests get 503.
  void refuse_new();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
