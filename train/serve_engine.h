// What `tinygpt serve` answers with, without the HTTP: one model loaded once (a LoRA run merged), its chat template,
// and one thread that draws every reply with one CachedDecoder, taking requests in the order they came (a queue of
// bounded length). One request draws at a time, always on the same thread (one OpenMP team), so a request's tokens
// per second are the model's own; its pieces are handed to the request's own thread, so a slow client never holds up
// the drawing. The cache is kept between requests: a chat client sending its whole conversation again reads only its
// new turn.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "checkpoint.h"
#include "cli.h"
#include "decoder.h"
#include "serve_api.h"

namespace tinygpt {

class ServeEngine {
 public:
  explicit ServeEngine(const ServeArgs& a);
  ~ServeEngine();
  ServeEngine(const ServeEngine&) = delete;
  ServeEngine& operator=(const ServeEngine&) = delete;

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

  /// A place among the requests admitted (waiting or drawing), given back when it is dropped.
  class Place {
   public:
    explicit Place(ServeEngine& e) : engine_(&e) {}
    ~Place();
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;

   private:
    ServeEngine* engine_;
  };
  /// Takes a place; throws ApiError 503 when --max-queue requests wait already or the server is shutting down.
  std::unique_ptr<Place> admit();
  /// The response's id, model and creation time, for the chunks sent before the reply is done.
  Completion head(bool chat);

  /// Queues the request, then hands on_piece each piece of its reply as the drawing thread draws it (on the caller's
  /// thread); fills c's text, finish reason and counts. `cancelled` is asked every 50 ms and after each piece (a client
  /// gone): the request then leaves the queue, or its drawing stops between two tokens. Throws ApiError 503 when the
  /// server shuts down before its turn, 499 when cancelled before it.
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
  struct Job;
  void draw_loop();
  void draw(Job& job);

  Checkpoint ckpt_;
  data::ChatTemplate template_;
  std::string end_of_turn_;
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<CachedDecoder> decoder_;
  ApiLimits limits_;
  int64_t created_ = 0;
  size_t max_queue_;

  mutable std::mutex mutex_;
  std::condition_variable work_;           // the drawing thread waits here for a job
  std::deque<std::shared_ptr<Job>> jobs_;  // waiting, in arrival order
  size_t admitted_ = 0;                    // places held: waiting, drawing or about to queue
  uint64_t next_id_ = 0;
  bool closing_ = false, ended_ = false;
  std::atomic<bool> stop_now_{false};  // read between tokens without the lock
  std::thread drawer_;                 // last: started once everything above is made
};

}  // namespace tinygpt
