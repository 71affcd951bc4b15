#include "train/serve_engine.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <random>

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// The model's name in the API: --model-name, else the run directory's name (the checkpoint file's folder).
std::string model_name_of(const ServeArgs& a, const Checkpoint& ckpt) {
  if (!a.model_name.empty()) return a.model_name;
  std::error_code ec;
  const fs::path dir = fs::is_directory(a.ckpt, ec) ? fs::path(a.ckpt) : ckpt.path.parent_path();
  fs::path full = fs::absolute(dir, ec).lexically_normal();
  if (!full.has_filename()) full = full.parent_path();  // "runs/x/" reads as "runs/x"
  const std::string name = full.filename().string();
  return name.empty() ? "tinygpt" : name;
}

}  // namespace

/// A request handed to the drawing thread: its prompt and options in, its pieces and result out.
struct ServeEngine::Job {
  const CompletionRequest* request;
  const Prompt* prompt;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::atomic<bool> cancel{false};
  // Under the engine's mutex:
  std::condition_variable changed;
  std::string pending;  // pieces drawn and not yet handed on
  bool started = false, done = false;
  std::exception_ptr error;
  CachedDecoder::Result result;
  Timing timing;
};

ServeEngine::ServeEngine(const ServeArgs& a)
    : ckpt_(load_checkpoint(a.ckpt)),
      template_(data::chat_template_for(ckpt_.tokenizer.config(), a.chat_template)),
      end_of_turn_(template_.end_of_turn(ckpt_.tokenizer.config())),
      max_queue_(size_t(a.max_queue)) {
  const Device device = parse_device(a.device);
  check_numerics_over(a.numerics, ckpt_, device);
  const int64_t window =
      a.context > 0 ? std::min(a.context, ckpt_.config.block_size) : std::min<int64_t>(ckpt_.config.block_size, 4096);
  model_ = model_from(ckpt_, device, 1, a.numerics, window);
  decoder_ = std::make_unique<CachedDecoder>(*model_, ckpt_.tokenizer, window);
  limits_.model = model_name_of(a, ckpt_);
  limits_.vocab = ckpt_.tokenizer.vocab_size();
  limits_.max_text = size_t(a.max_body);
  created_ = int64_t(std::time(nullptr));
  drawer_ = std::thread([this] { draw_loop(); });
}

ServeEngine::~ServeEngine() {
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
    closing_ = true;
    stop_now_ = true;
  }
  work_.notify_all();
  drawer_.join();
}

std::string ServeEngine::describe() const {
  return fmt::format(
      "'{}' from {} (iteration {}): template {}, window {} tokens, one request drawing at a time, "
      "{} waiting at most",
      limits_.model, ckpt_.path.string(), ckpt_.state.iter, template_.name(), window(), max_queue_);
}

std::unique_ptr<ServeEngine::Place> ServeEngine::admit() {
  std::lock_guard lock(mutex_);
  if (closing_) throw ApiError(503, "server_error", "shutting_down", "", "the server is shutting down");
  // One drawing and max_queue waiting.
  if (admitted_ > max_queue_) {
    throw ApiError(503, "server_error", "server_busy", "",
                   fmt::format("{} requests are waiting already (--max-queue): try again later", admitted_ - 1));
  }
  ++admitted_;
  return std::make_unique<Place>(*this);
}

ServeEngine::Place::~Place() {
  std::lock_guard lock(engine_->mutex_);
  --engine_->admitted_;
}

Completion ServeEngine::head(bool chat) {
  Completion c;
  c.model = limits_.model;
  c.created = int64_t(std::time(nullptr));
  std::lock_guard lock(mutex_);
  c.id = fmt::format("{}-{:x}{:06x}", chat ? "chatcmpl" : "cmpl", c.created, next_id_++);
  return c;
}

void ServeEngine::shut_down(bool now) {
  std::lock_guard lock(mutex_);
  closing_ = true;
  if (now) stop_now_ = true;
  work_.notify_all();
}

ServeEngine::Prompt ServeEngine::prompt_of(const CompletionRequest& r) const {
  Prompt p;
  p.stops = r.stop;
  try {
    if (r.chat) {
      const std::string text = template_.render(r.messages, true, ckpt_.tokenizer.config());
      const std::vector<uint32_t> ids = ckpt_.tokenizer.encode_rendered(text, "the conversation");
      p.ids.assign(ids.begin(), ids.end());
      if (!end_of_turn_.empty()) p.stops.push_back(end_of_turn_);
    } else {
      if (r.prompt.empty()) throw bad_request("prompt", "'prompt' is empty: give at least one character");
      const std::vector<uint32_t> ids = ckpt_.tokenizer.encode_prompt(r.prompt, "the prompt");
      p.ids.assign(ids.begin(), ids.end());
    }
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {  // the template raised, or the text has what the tokenizer cannot read
    throw bad_request(r.chat ? "messages" : "prompt", e.what());
  }
  if (p.ids.empty()) throw bad_request(r.chat ? "messages" : "prompt", "the prompt comes to no tokens");
  if (int64_t(p.ids.size()) >= window()) {
    throw bad_request(r.chat ? "messages" : "prompt",
                      fmt::format("the prompt is {} tokens: this model's context is {} tokens, a reply included",
                                  p.ids.size(), window()),
                      "context_length_exceeded");
  }
  return p;
}

void ServeEngine::draw_loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return ended_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // ended, nothing waiting
      job = jobs_.front();
      jobs_.pop_front();
      job->started = true;
      if (closing_ || job->cancel) {  // shutting down, or its client left while it waited
        job->error = std::make_exception_ptr(
            closing_ ? ApiError(503, "server_error", "shutting_down", "", "the server is shutting down")
                     : ApiError(499, "server_error", "cancelled", "", "the client went away"));
        job->done = true;
        job->changed.notify_all();
        continue;
      }
    }
    draw(*job);
  }
}

void ServeEngine::draw(Job& job) {
  const CompletionRequest& r = *job.request;
  const Prompt& prompt = *job.prompt;
  const double queued = ms_since(job.t0);
  GenerateOptions o = r.gen;
  o.vocab = ckpt_.tokenizer.vocab_size();
  const int64_t room = window() - int64_t(prompt.ids.size());
  o.max_new_tokens = o.max_new_tokens > 0 ? std::min(o.max_new_tokens, room) : room;
  Generator gen(r.seed ? *r.seed : std::random_device{}());
  double first = -1;
  CachedDecoder::Result d;
  std::exception_ptr error;
  try {
    d = decoder_->draw(
        prompt.ids, prompt.stops, o, gen,
        [&](std::string_view piece) {
          if (first < 0) first = ms_since(job.t0);
          std::lock_guard lock(mutex_);
          job.pending.append(piece);
          job.changed.notify_all();
        },
        [&] { return stop_now_ || job.cancel; });
  } catch (...) {
    error = std::current_exception();
    decoder_->clear();  // what the cache holds is unknown now
  }
  std::lock_guard lock(mutex_);
  job.result = std::move(d);
  job.error = error;
  job.timing = {queued, first < 0 ? ms_since(job.t0) : first, ms_since(job.t0), job.result.read};
  job.done = true;
  job.changed.notify_all();
}

void ServeEngine::answer(Place&, const CompletionRequest& r, const Prompt& prompt, Completion& c,
                         const std::function<void(std::string_view)>& on_piece, const std::function<bool()>& cancelled,
                         Timing* timing) {
  auto job = std::make_shared<Job>();
  job->request = &r;
  job->prompt = &prompt;
  std::unique_lock lock(mutex_);
  if (closing_) throw ApiError(503, "server_error", "shutting_down", "", "the server is shutting down");
  jobs_.push_back(job);
  work_.notify_all();
  while (true) {
    job->changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return job->done || !job->pending.empty(); });
    std::string piece = std::move(job->pending);
    job->pending.clear();
    const bool done = job->done;
    lock.unlock();  // the client is written to and asked without the engine's lock
    if (!piece.empty() && on_piece) on_piece(piece);
    if (!done && !job->cancel && cancelled && cancelled()) job->cancel = true;
    lock.lock();
    if (done && job->pending.empty()) break;
    if (!job->started && (job->cancel || closing_)) {  // leaves the queue at once, its place freed
      std::erase(jobs_, job);
      if (closing_) throw ApiError(503, "server_error", "shutting_down", "", "the server is shutting down");
      throw ApiError(499, "server_error", "cancelled", "", "the client went away");
    }
  }
  if (job->error) std::rethrow_exception(job->error);
  c.text = job->result.text;
  c.prompt_tokens = int64_t(prompt.ids.size());
  c.completion_tokens = job->result.tokens;
  c.finish_reason = job->result.ended || job->result.stopped ? "stop" : "length";
  if (timing != nullptr) *timing = job->timing;
}

}  // namespace tinygpt
