// What `tinygpt serve` answers with, without the HTTP: one model loaded once (a LoRA run merged), its chat template,
// and one CachedDecoder that requests take in turn, in the order they came (a queue of bounded length; one request
// draws at a time, so a request's tokens per second are the model's own). The cache is kept between requests: a chat
// client sending its whole conversation again reads only its new turn.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.h"
#include "cli.h"
#include "decoder.h"
#include "serve_api.h"

namespace tinygpt {

class ServeEngine {
 public:
  explicit ServeEngine(const ServeArgs& a);

  const ApiLimits& limits() const { return limits_; }
  int64_t window() const { return decoder_->window(); }
  int64_t created() const { return created_; }
  /// One line for the start-up message: the model, its template and window.
  std::string describe() const;

  struct Timing {
    double queued_ms = 0, first_ms = 0, total_ms = 0;  // waiting its turn; to the first piece; all of it
    int64_t read = 0;                                  // prompt tokens read (the rest came from the cache)
  };
  /// A request's prompt: rendered with the template (chat) or encoded (completions), and where its reply stops.
  struct Prompt {
    std::vector<int32_t> ids;
    std::vector<std::string> stops;
  };
  /// Throws ApiError 400: a template that raised, text the tokenizer cannot read, a prompt that leaves no room.
  Prompt prompt_of(const CompletionRequest& r) const;

  /// A place in the queue, left when it is dropped.
  class Place {
   public:
    Place(ServeEngine& e, uint64_t ticket) : engine_(&e), ticket_(ticket) {}
    ~Place() { engine_->leave(ticket_); }
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;
    uint64_t ticket() const { return ticket_; }

   private:
    ServeEngine* engine_;
    uint64_t ticket_;
  };
  /// Takes a place at the back of the queue; throws ApiError 503 when it is full or the server is shutting down.
  std::unique_ptr<Place> admit();
  /// The response's id, model and creation time, for the chunks sent before the reply is done.
  Completion head(bool chat);

  /// Waits for `place` to come first, then draws the reply to `prompt`, calling on_piece with each piece of text as
  /// it comes; fills c's text, finish reason and counts. `cancelled` is asked while it waits and between tokens (a
  /// client gone). Throws ApiError 503 when the server shuts down while it waits.
  void answer(Place& place, const CompletionRequest& r, const Prompt& prompt, Completion& c,
              const std::function<void(std::string_view)>& on_piece, const std::function<bool()>& cancelled,
              Timing* timing = nullptr);
  /// No new requests (503); those waiting leave with 503; the one drawing finishes (or, with now, stops at once).
  void shut_down(bool now = false);
  bool closing() const {
    std::lock_guard lock(mutex_);
    return closing_;
  }

 private:
  void wait_turn(uint64_t ticket, const std::function<bool()>& cancelled);
  void end_turn();
  void leave(uint64_t ticket);

  Checkpoint ckpt_;
  data::ChatTemplate template_;
  std::string end_of_turn_;
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<CachedDecoder> decoder_;
  ApiLimits limits_;
  int64_t created_ = 0;
  size_t max_queue_;

  mutable std::mutex mutex_;
  std::condition_variable turn_;
  std::deque<uint64_t> queue_;  // tickets waiting, in arrival order
  uint64_t next_ticket_ = 0, next_id_ = 0;
  bool busy_ = false, closing_ = false;
  std::atomic<bool> stop_now_{false};  // read between tokens without the lock
};

}  // namespace tinygpt
