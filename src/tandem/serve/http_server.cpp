#include "tandem/serve/http_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "tandem/core/connection_pool.h"
#include "tandem/core/error.h"
#include "tandem/core/http_listener.h"
#include "tandem/monitor/prometheus.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>
#endif

namespace tandem {

#ifdef TANDEM_WITH_HTTP

namespace {

// One request's output, handed from the backend's thread to the connection's thread.
struct RequestStream {
  std::mutex mutex;
  std::condition_variable ready;
  std::string pending;  // text generated and not yet sent
  std::optional<FinishReason> finish;
  Usage usage;
  std::optional<std::string> error;
  bool cut = false;  // ended by the drain's timeout (Note [Graceful drain])
  bool ended() const { return finish.has_value() || error.has_value(); }
};

// The answer to a request that the drain cut or that came while draining.
ApiError shutting_down(const std::string& what) {
  return ApiError(503, "server_error", what + "; send it again to another replica or once the server is back");
}

CompletionBackend::Sink sink_into(const std::shared_ptr<RequestStream>& s) {
  CompletionBackend::Sink sink;
  sink.on_text = [s](const std::string& text) {
    const std::lock_guard<std::mutex> lock(s->mutex);
    s->pending += text;
    s->ready.notify_all();
  };
  sink.on_finish = [s](FinishReason reason, const Usage& usage) {
    const std::lock_guard<std::mutex> lock(s->mutex);
    s->finish = reason;
    s->usage = usage;
    s->ready.notify_all();
  };
  sink.on_error = [s](const std::string& message) {
    const std::lock_guard<std::mutex> lock(s->mutex);
    s->error = message;
    s->ready.notify_all();
  };
  return sink;
}

// What a streamed response has sent so far.
struct StreamState {
  std::shared_ptr<RequestStream> stream;
  CompletionRequest request;
  ResponseHeader header;
  uint64_t id = 0;
  bool first = true;
  bool ended = false;
};

bool same_key(const std::string& a, const std::string& b) {  // constant time in the key's length
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ (i < b.size() ? b[i] : 0);
  return diff == 0;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* route_of(ApiEndpoint endpoint) {
  return endpoint == ApiEndpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
}

// The path of a request line's target, for a request cpp-httplib refused to parse (its path unset).
std::string target_path(const httplib::Request& req) {
  const std::string& t = req.path.empty() ? req.target : req.path;
  return t.substr(0, t.find('?'));
}

}  // namespace

// Note [Graceful drain]
// SIGTERM or SIGINT (serve_command) first refuses new requests: 503 with Retry-After, and /health
// answers 503 "draining" so that a load balancer sends no more. Every request admitted before that
// is counted until its answer is written (a stream: until its last event, in the response's
// releaser), and drain() waits for the count to reach zero, up to --drain-timeout. What still runs
// then is cancelled in the backend and ended with an answer, never a reset: a whole answer gets
// 503, a stream an error event and [DONE]. A request submitted while the cut runs is cancelled at
// once with 503. Only then does the listener stop; the process exits 0. A second signal ends the
// process at once (core/interrupt).
struct HttpServer::Impl {
  CompletionBackend& backend;
  HttpServerOptions options;
  httplib::Server server;
  int64_t started = unix_now();
  std::mutex counts_mutex;
  std::map<std::pair<std::string, int>, int64_t> responses;  // (route, status) -> count
  // Note [Graceful drain]: requests admitted and not yet answered, and the streams of those submitted.
  std::mutex active_mutex;
  std::condition_variable idle;
  bool draining = false, cutting = false;
  int64_t admitted = 0;
  std::map<uint64_t, std::shared_ptr<RequestStream>> active;
  std::unique_ptr<HttpListener> listener;  // last: stopped and joined before the state above goes

  Impl(CompletionBackend& b, HttpServerOptions o) : backend(b), options(std::move(o)) {}

  // A request comes in: refused with 503 while draining, else counted until leave().
  void admit() {
    const std::lock_guard<std::mutex> lock(active_mutex);
    if (draining) throw shutting_down("the server is shutting down and takes no new requests");
    ++admitted;
  }
  // Registers a submitted request; false once the drain cuts (the caller cancels and answers 503).
  bool track(uint64_t id, const std::shared_ptr<RequestStream>& stream) {
    const std::lock_guard<std::mutex> lock(active_mutex);
    if (cutting) return false;
    active[id] = stream;
    return true;
  }
  void leave(std::optional<uint64_t> id) {
    const std::lock_guard<std::mutex> lock(active_mutex);
    if (id) active.erase(*id);
    --admitted;
    idle.notify_all();
  }
  bool wait_idle(std::chrono::steady_clock::time_point until) {
    std::unique_lock<std::mutex> lock(active_mutex);
    return idle.wait_until(lock, until, [&] { return admitted == 0; });
  }
  int64_t cut_active();

  void count(const std::string& route, int status) {
    const std::lock_guard<std::mutex> lock(counts_mutex);
    ++responses[{route, status}];
  }
  void send_error(const std::string& route, httplib::Response& res, const ApiError& e) {
    res.status = e.status();
    if (e.status() == 429 || e.status() == 503) res.set_header("Retry-After", "1");
    res.set_content(error_json(e), "application/json");
    count(route, e.status());
  }
  void check_key(const httplib::Request& req) const {
    if (options.api_key.empty()) return;
    const std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (auth.compare(0, bearer.size(), bearer) != 0 || !same_key(auth.substr(bearer.size()), options.api_key))
      throw ApiError(401, "invalid_request_error", "incorrect or missing API key: send 'Authorization: Bearer <key>'",
                     "", "invalid_api_key");
  }
  bool read_body(const httplib::Request& req, const httplib::ContentReader& read, httplib::Response& res,
                 std::string& body);
  void generation(ApiEndpoint endpoint, const httplib::Request& req, const std::string& body, httplib::Response& res);
  bool respond(ApiEndpoint endpoint, const std::string& body, httplib::Response& res, std::optional<uint64_t>& id);
  void not_served(const httplib::Request& req, httplib::Response& res);
  void whole(const StreamState& st, httplib::Response& res);
  void streamed(std::shared_ptr<StreamState> st, httplib::Response& res);
  bool send_chunk(StreamState& st, httplib::DataSink& sink);
  std::string metrics();
};

void HttpServer::Impl::generation(ApiEndpoint endpoint, const httplib::Request& req, const std::string& body,
                                  httplib::Response& res) {
  const std::string route = route_of(endpoint);
  try {
    check_key(req);
    admit();
  } catch (const ApiError& e) {
    send_error(route, res, e);
    return;
  }
  std::optional<uint64_t> id;
  bool streaming = false;
  try {
    streaming = respond(endpoint, body, res, id);
    count(route, res.status);
  } catch (const ApiError& e) {
    send_error(route, res, e);
  } catch (const UserError& e) {
    send_error(route, res, ApiError(400, "invalid_request_error", e.what()));
  }
  if (!streaming) leave(id);  // a stream leaves when its last event is written (streamed())
}

// Submits the request and answers it: whole, or as a stream (returns true: the stream's releaser
// ends it). `id` is set once the backend holds the request.
bool HttpServer::Impl::respond(ApiEndpoint endpoint, const std::string& body, httplib::Response& res,
                               std::optional<uint64_t>& id) {
  auto st = std::make_shared<StreamState>();
  st->request = parse_completion_request(endpoint, body);
  const std::string model = backend.model_id();
  if (!st->request.model.empty() && st->request.model != model)
    throw ApiError(404, "invalid_request_error",
                   "the model '" + st->request.model + "' does not exist; this server serves '" + model + "'", "model",
                   "model_not_found");
  st->stream = std::make_shared<RequestStream>();
  st->id = backend.submit(st->request, sink_into(st->stream));
  if (!track(st->id, st->stream)) {
    backend.cancel(st->id);
    throw shutting_down("the server is shutting down and takes no new requests");
  }
  id = st->id;
  st->header = {(endpoint == ApiEndpoint::kCompletions ? "cmpl-" : "chatcmpl-") + std::to_string(st->id), unix_now(),
                model};
  res.status = 200;  // httplib would set it only after this handler returns, past the count in generation()
  if (!st->request.stream) {
    whole(*st, res);
    return false;
  }
  streamed(st, res);
  return true;
}

// Waits for the whole answer on this connection's thread.
void HttpServer::Impl::whole(const StreamState& st, httplib::Response& res) {
  auto& s = *st.stream;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.ready.wait(lock, [&] { return s.ended(); });
  if (s.error && s.cut) throw shutting_down("the server's drain timeout ended this request");
  if (s.error) throw ApiError(500, "server_error", "generation failed: " + *s.error);
  res.set_content(completion_response_json(st.request.endpoint, st.header, s.pending, *s.finish, s.usage),
                  "application/json");
}

// Server-sent events: one chunk per batch of new text; a comment line every second while none
// comes, so that a client that went away is noticed (the write fails) and its request cancelled.
void HttpServer::Impl::streamed(std::shared_ptr<StreamState> st, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, st](size_t, httplib::DataSink& sink) { return send_chunk(*st, sink); },
      [this, st](bool) {
        if (!st->ended) backend.cancel(st->id);  // the client went away mid-stream
        leave(st->id);
      });
}

bool HttpServer::Impl::send_chunk(StreamState& st, httplib::DataSink& sink) {
  auto& s = *st.stream;
  std::unique_lock<std::mutex> lock(s.mutex);
  const bool woke = s.ready.wait_for(lock, std::chrono::seconds(1), [&] { return !s.pending.empty() || s.ended(); });
  const std::string text = std::move(s.pending);
  s.pending.clear();
  const auto finish = s.finish;
  const auto error = s.error;
  const bool cut = s.cut;
  const Usage usage = s.usage;
  lock.unlock();
  const auto endpoint = st.request.endpoint;
  std::string out;
  if (!woke) out = ": waiting\n\n";
  if (st.first && endpoint == ApiEndpoint::kChatCompletions) {
    out += sse_event(completion_chunk_json(endpoint, st.header, "", true, std::nullopt));
    st.first = false;
  }
  if (!text.empty()) {
    out += sse_event(completion_chunk_json(endpoint, st.header, text, st.first, std::nullopt));
    st.first = false;
  }
  if (error)
    out += sse_event(error_json(cut ? shutting_down("the server's drain timeout ended this stream")
                                    : ApiError(500, "server_error", "generation failed: " + *error)));
  if (finish) {
    out += sse_event(completion_chunk_json(endpoint, st.header, "", false, finish));
    if (st.request.include_usage) out += sse_event(usage_chunk_json(endpoint, st.header, usage));
  }
  if (error || finish) {
    out += sse_done();
    st.ended = true;
  }
  if (!sink.write(out.data(), out.size())) return false;  // the releaser cancels
  if (st.ended) sink.done();
  return true;
}

int64_t HttpServer::Impl::cut_active() {
  std::vector<std::pair<uint64_t, std::shared_ptr<RequestStream>>> running;
  {
    const std::lock_guard<std::mutex> lock(active_mutex);
    cutting = true;
    running.assign(active.begin(), active.end());
  }
  int64_t cut = 0;
  for (const auto& [id, s] : running) {
    backend.cancel(id);  // no callback runs after this returns
    const std::lock_guard<std::mutex> lock(s->mutex);
    if (s->ended()) continue;
    s->error = "drain timeout";
    s->cut = true;
    s->ready.notify_all();
    ++cut;
  }
  return cut;
}

// Note [Body limit]
// A body over --max-body-mib is answered 413 and never held. A client that asks first (Expect:
// 100-continue, as curl does for large bodies) never sends it. A Content-Length over the limit is
// discarded by cpp-httplib as it is read, without a handler. A chunked body carries no length, so
// the generation routes read their bodies themselves: past the limit, what arrives is counted and
// dropped, and the answer is 413 once the body has ended, so that the connection stays in step for
// its next request (cpp-httplib 0.11 gives a handler no way to close it; a Content-Length body
// over the limit is read to its end in the same way).
bool HttpServer::Impl::read_body(const httplib::Request& req, const httplib::ContentReader& read,
                                 httplib::Response& res, std::string& body) {
  const auto limit = static_cast<size_t>(options.max_body_bytes);
  bool over = false;
  const bool ended = read([&](const char* data, size_t n) {
    if (!over && body.size() + n <= limit) {
      body.append(data, n);
    } else if (!over) {
      over = true;
      std::string().swap(body);
    }
    return true;
  });
  if (ended && !over) return true;
  res.status = over || res.status == 413 ? 413 : 400;
  if (res.status == 413) {
    not_served(req, res);
  } else {
    send_error(target_path(req), res, ApiError(400, "invalid_request_error", "the request body could not be read"));
  }
  return false;
}

// What no handler answered, as an OpenAI error body: an unknown route (404), a known route with
// another method (405 with Allow; also a method cpp-httplib does not know, which it refuses as
// 400), a body over --max-body-mib (413, Note [Body limit]).
void HttpServer::Impl::not_served(const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty()) return;
  static const std::map<std::string, std::string> kAllowed = {{"/v1/completions", "POST"},
                                                              {"/v1/chat/completions", "POST"},
                                                              {"/v1/models", "GET"},
                                                              {"/health", "GET"},
                                                              {"/metrics", "GET"}};
  const auto route = kAllowed.find(target_path(req));
  static const std::set<std::string> kParsed = {"GET",     "HEAD",    "POST",  "PUT",   "DELETE",
                                                "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI"};
  if (res.status == 400 && route != kAllowed.end() && !req.method.empty() && kParsed.count(req.method) == 0)
    res.status = 404;  // an unknown method on a served path: answered as a wrong one
  std::string what;
  if (res.status == 404 && route != kAllowed.end()) {
    res.status = 405;
    res.set_header("Allow", route->second);
    what = req.method + " is not served on " + req.path + "; use " + route->second;
  } else if (res.status == 404) {
    what = "no route " + req.method + " " + req.path +
           "; this server has /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics";
  } else if (res.status == 413) {
    what = "the request body is over the server's limit of " + std::to_string(options.max_body_bytes >> 20) +
           " MiB (--max-body-mib); send a shorter prompt or raise the limit";
  } else {
    what = "HTTP " + std::to_string(res.status);
  }
  res.set_content(error_json(ApiError(res.status, "invalid_request_error", what)), "application/json");
  count(route != kAllowed.end() ? route->first : "other", res.status);
}

std::string HttpServer::Impl::metrics() {
  PrometheusText out;
  out.family("tandem_serve_http_responses_total", "counter", "HTTP responses by route and status.");
  const std::lock_guard<std::mutex> lock(counts_mutex);
  for (const auto& [key, n] : responses)
    out.sample("tandem_serve_http_responses_total", double(n),
               "route=\"" + prometheus_label(key.first) + "\",status=\"" + std::to_string(key.second) + "\"");
  return backend.metrics_text() + out.str();
}

HttpServer::HttpServer(CompletionBackend& backend, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(backend, std::move(options))) {
  auto& im = *impl_;
  // Note [Connection pool]: every connection is read as it comes, up to four times the threads.
  const size_t threads = static_cast<size_t>(std::max(4, im.options.threads));
  im.server.new_task_queue = [threads] { return new_connection_pool(threads, std::min<size_t>(4 * threads, 4096)); };
  for (const auto endpoint : {ApiEndpoint::kCompletions, ApiEndpoint::kChatCompletions})
    im.server.Post(route_of(endpoint), [&im, endpoint](const httplib::Request& req, httplib::Response& res,
                                                       const httplib::ContentReader& read) {
      std::string body;
      if (im.read_body(req, read, res, body)) im.generation(endpoint, req, body, res);
    });
  im.server.Get("/v1/models", [&im](const httplib::Request& req, httplib::Response& res) {
    try {
      im.check_key(req);
      res.set_content(models_json(im.backend.model_id(), im.started), "application/json");
      im.count("/v1/models", 200);
    } catch (const ApiError& e) {
      im.send_error("/v1/models", res, e);
    }
  });
  im.server.Get("/health", [&im](const httplib::Request&, httplib::Response& res) {
    const std::lock_guard<std::mutex> lock(im.active_mutex);
    if (im.draining) res.status = 503;  // a load balancer sends no more here
    res.set_content(im.draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}", "application/json");
  });
  im.server.Get("/metrics", [&im](const httplib::Request&, httplib::Response& res) {
    res.set_content(im.metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  im.server.set_error_handler([&im](const httplib::Request& req, httplib::Response& res) { im.not_served(req, res); });
  // Note [Body limit]: a Content-Length over the limit is discarded as read, or never sent when asked first.
  im.server.set_payload_max_length(static_cast<size_t>(im.options.max_body_bytes));
  im.server.set_expect_100_continue_handler([&im](const httplib::Request& req, httplib::Response& res) {
    const auto length = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
    if (length <= static_cast<uint64_t>(im.options.max_body_bytes)) return 100;
    res.status = 413;  // the final answer: the body is never sent
    return 413;
  });
  im.listener = std::make_unique<HttpListener>(im.server, im.options.host, im.options.port,
                                               "pick another --port or --host");
}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->listener->port(); }

void HttpServer::wait() { impl_->listener->wait(); }

void HttpServer::refuse_new() {
  const std::lock_guard<std::mutex> lock(impl_->active_mutex);
  impl_->draining = true;
}

int64_t HttpServer::drain(std::chrono::milliseconds timeout) {
  auto& im = *impl_;
  refuse_new();
  const auto start = std::chrono::steady_clock::now();
  if (im.wait_idle(start + timeout)) return 0;
  const int64_t cut = im.cut_active();
  im.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(5));  // the cut ones send their last event
  return cut;
}

void HttpServer::stop() { impl_->listener->stop(); }

#else  // no cpp-httplib at build time

struct HttpServer::Impl {};

HttpServer::HttpServer(CompletionBackend&, HttpServerOptions) {
  TANDEM_CHECK(false,
               "this tandem was built without cpp-httplib, so it cannot serve; install Debian's libcpp-httplib-dev "
               "and rebuild (scripts/setup.sh)");
}
HttpServer::~HttpServer() = default;
int HttpServer::port() const { return 0; }
void HttpServer::wait() {}
int64_t HttpServer::drain(std::chrono::milliseconds) { return 0; }
void HttpServer::refuse_new() {}
void HttpServer::stop() {}

#endif

}  // namespace tandem
