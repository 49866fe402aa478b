#include "tandem/cli/serve_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "tandem/cli/model_options.h"
#include "tandem/core/interrupt.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"

namespace tandem {

ServeCommand::ServeCommand(CLI::App& app) {
  command_ = app.add_subcommand("serve", "an OpenAI-compatible HTTP API over a checkpoint or an HF model folder");
  auto* c = command_;
  add_model_options(c, service_.model);
  c->add_option("--model-name", service_.model_name, "the model's id in the API (default: the folder's name)");
  c->add_option("--max-batch", service_.model.max_batch,
                "sequences decoded together at most (default: from memory, as many as the KV cache holds at 512 "
                "tokens each, at most 256; a number also sizes the cache for that many full contexts)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--max-queue", service_.max_queue,
                "requests waiting beyond the batch's places at most (0: none wait); more get HTTP 429")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--max-step-tokens", service_.max_step_tokens,
                "prompt tokens prefilled in one step at most (default 2048); a longer prompt is prefilled in chunks "
                "while the running requests go on decoding")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_flag_callback(
      "--no-prefix-cache", [this] { service_.prefix_cache = false; },
      "prefill every prompt whole (default: requests sharing a prompt prefix share its KV cache pages)");
  c->add_option("--kv-cache-gib", service_.model.kv_cache_gib, "KV cache size (default: from the memory plan)")
      ->check(CLI::Range(0.0, 1e6));
  c->add_option("--host", http_.host, "address to listen on (default 127.0.0.1: this machine only)");
  c->add_option("--port", http_.port, "TCP port (0: any free one)")->check(CLI::Range(0, 65535));
  c->add_option("--api-key", http_.api_key, "require 'Authorization: Bearer KEY' (default: $TANDEM_API_KEY, or none)");
  c->add_option("--max-body-mib", max_body_mib_, "a larger request body is answered 413 unread (default 16)")
      ->check(CLI::Range(0.001, 4096.0));
  c->add_option("--drain-timeout", drain_timeout_s_,
                "seconds that SIGTERM or SIGINT waits for the requests in flight before cutting them (default 30); "
                "a second signal stops at once")
      ->check(CLI::Range(0.0, 86400.0));
}

bool ServeCommand::chosen() const { return command_->parsed(); }

int ServeCommand::run() {
  if (http_.api_key.empty())
    if (const char* key = std::getenv("TANDEM_API_KEY")) http_.api_key = key;
  http_.max_body_bytes = static_cast<int64_t>(max_body_mib_ * (1 << 20));
  CompletionService service(service_);
  http_.threads = static_cast<int>(std::min<int64_t>(1024, service.max_batch() + service_.max_queue + 8));
  HttpServer server(service, http_);
  // The address on a line of its own with the model's name; the description's lines after it.
  log::info(strprintf("serve: %s on http://%s:%d%s", service.model_id().c_str(), http_.host.c_str(), server.port(),
                      http_.api_key.empty() ? "" : " (API key required)"));
  std::string about = service.description();
  while (!about.empty() && about.back() == '\n') about.pop_back();
  log::info("serve: " + about);
  install_stop_handlers("\ntandem serve: signal received, draining (a second signal stops at once)\n");
  while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.refuse_new();
  log::info(strprintf("serve: draining: new requests get 503; those in flight have up to %g s", drain_timeout_s_));
  const int64_t cut = server.drain(std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s_ * 1000)));
  if (cut == 0)
    log::info("serve: drained: every request in flight was answered");
  else
    log::warn(strprintf("serve: the drain timeout cut %lld requests (each answered 503 or ended with an error event)",
                        static_cast<long long>(cut)));
  server.stop();
  return 0;
}

}  // namespace tandem
