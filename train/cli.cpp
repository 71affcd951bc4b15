#include "train/cli.h"

#include <fmt/core.h>
#include <omp.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "data/conversations.h"
#include "data/corpus.h"
#include "data/documents.h"
#include "kernels/env.h"
#include "train/checkpoint.h"
#include "train/cli_chat.h"
#include "train/cli_inspect.h"
#include "train/cli_serve.h"
#include "train/cli_tokenizer.h"
#include "train/cli_train.h"
#include "train/comm.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/gguf.h"
#include "train/import_gguf.h"
#include "train/import_hf.h"
#include "train/memory.h"
#include "train/plots.h"
#include "train/run_dir.h"
#include "train/speed.h"
#include "train/trainer.h"
#include "train/training_data.h"

namespace tinygpt {

namespace fs = std::filesystem;

CLI::Option* add_switch(CLI::App* cmd, const std::string& name, bool& value, const std::string& help) {
  return cmd->add_flag(fmt::format("--{0},!--no-{0}", name), value,
                       fmt::format("{} (default: --{}{})", help, value ? "" : "no-", name));
}

namespace {

/// A directory under the system's temporary directory, removed with what it holds when the scope ends.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string templ = (fs::temp_directory_path() / "tinygpt-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr)
      throw Error(fmt::format("cannot make a scratch directory under {}", fs::temp_directory_path().string()));
    path = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

/// CLI11's help without what misreads as a default: the "{false}" marker CLI11 puts after a negatable flag's
/// negative form (add_switch names the default instead), and control characters in a default, escaped (the
/// prompt's newline shows as \n, not as a line break).
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, is_positional);
    for (size_t open; (open = name.find('{')) != std::string::npos;) {
      const size_t close = name.find('}', open);
      if (close == std::string::npos) break;
      name.erase(open, close - open + 1);
    }
    return name;
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    for (char c : CLI::Formatter::make_option_opts(opt)) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else {
        out += c;
      }
    }
    return out;
  }
};

void add_sample_options(CLI::App* cmd, SampleArgs& a) {
  cmd->add_option("--ckpt", a.ckpt, "Checkpoint file, or a run directory (its best checkpoint, else its latest)")
      ->required();
  cmd->add_option("--prompt", a.prompt, "Text to continue (printed first)")->capture_default_str();
  cmd->add_option("--max-new-tokens", a.gen.max_new_tokens, "Tokens to generate per sample")->capture_default_str();
  cmd->add_option("--temperature", a.gen.temperature, "Softmax temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a.gen.top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Random seed (the same seed gives the same text)")->capture_default_str();
  cmd->add_option("--num-samples", a.num_samples, "Independent samples to draw")->capture_default_str();
  cmd->add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  add_switch(cmd, "kv-cache", a.gen.kv_cache, "Reuse cached keys and values instead of rerunning the context");
  add_numerics_flags(cmd, a.numerics);
}

void add_eval_options(CLI::App* cmd, EvalArgs& a) {
  cmd->add_option("--ckpt", a.ckpt, "Checkpoint file, or a run directory (its best checkpoint, else its latest)")
      ->required();
  cmd->add_option("--data", a.data,
                  "Text files, directories or globs, repeatable (a character model needs its characters "
                  "to be in the vocabulary; a BPE takes any text)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--chat-data", a.chat_data,
                  "Instead of --data: JSON lines of conversations, repeatable; prints the "
                  "loss on the assistants' tokens (their replies and ends of turn) over them all")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--chat-template", a.chat_template,
                  "With --chat-data: chatml, llama3 or a Jinja file (default: the "
                  "model's own, else chatml)");
  cmd->add_option("--batch-size", a.batch_size, "Sequences per batch")->capture_default_str();
  cmd->add_option("--eval-iters", a.eval_iters, "Batches per split")->capture_default_str();
  cmd->add_option("--train-fraction", a.train_fraction,
                  "Leading fraction that is the train split (default: the run's, else 0.9)");
  cmd->add_option("--seed", a.seed, "Seed of the batch draw")->capture_default_str();
  cmd->add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  add_numerics_flags(cmd, a.numerics);
}

/// "error: WHAT" on stderr, whatever stderr is (a closed pipe there is not worth an abort).
void print_error(const std::string& what) { std::fprintf(stderr, "error: %s\n", what.c_str()); }

/// Every number given on the command line against what its option holds: an integer that does not fit is refused
/// (the parser would wrap an unsigned "-1" and clamp at the limits), and so is a number that is not finite (inf as
/// nan: no option means anything by them).
void check_number_flags(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    for (const std::string& v : opt->results()) {
      const char* s = v.c_str();
      char* end = nullptr;
      errno = 0;
      if (type.rfind("UINT", 0) == 0) {
        (void)std::strtoull(s, &end, 0);
        if (errno == ERANGE || v.find('-') != std::string::npos) {
          throw UsageError(fmt::format("{}: {} is out of range (0 to {})", opt->get_name(), v, ULLONG_MAX));
        }
      } else if (type.rfind("INT", 0) == 0) {
        (void)std::strtoll(s, &end, 0);
        if (errno == ERANGE) {
          throw UsageError(fmt::format("{}: {} is out of range ({} to {})", opt->get_name(), v, LLONG_MIN, LLONG_MAX));
        }
      } else if (type.rfind("FLOAT", 0) == 0) {
        const double x = std::strtod(s, &end);
        if (end != s && !std::isfinite(x))
          throw UsageError(fmt::format("{}: {} is not a finite number", opt->get_name(), v));
      }
    }
  }
  for (const CLI::App* sub : app.get_subcommands({})) check_number_flags(*sub);
}

void validate_sample(const SampleArgs& a) {
  validate_numerics(a.numerics, a.device);
  if (a.gen.max_new_tokens < 0)
    throw Error(fmt::format("--max-new-tokens must not be negative, got {}", a.gen.max_new_tokens));
  if (a.num_samples <= 0) throw Error(fmt::format("--num-samples must be positive, got {}", a.num_samples));
  if (!(a.gen.temperature >= 0))
    throw Error(fmt::format("--temperature must not be negative, got {}", a.gen.temperature));
  if (a.gen.top_k < 0) throw Error(fmt::format("--top-k must not be negative, got {}", a.gen.top_k));
}

void run_sample(const SampleArgs& a) {
  const Device device = parse_device(a.device);
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  check_numerics_over(a.numerics, ckpt, device);
  if (a.prompt.empty()) throw Error("--prompt is empty: give at least one character");
  const std::vector<int32_t> ids = encode_flag_text(ckpt.tokenizer, a.prompt, "--prompt");
  // Memory for the context this sample uses: the prompt and the tokens to come (a KV cache of that many positions).
  const int64_t context = a.gen.kv_cache ? int64_t(ids.size()) + a.gen.max_new_tokens : 0;
  const auto model = model_from(ckpt, device, 1, a.numerics, context);
  const Numerics& n = model->numerics();
  fmt::print(stderr,
             "sampling from {} (iteration {}, val loss {:.4f}), {} cache; decoding with {} weights and "
             "activations, {} products\n",
             ckpt.path.string(), ckpt.state.iter, ckpt.state.best_val_loss, a.gen.kv_cache ? "with KV" : "without KV",
             n.bf16_storage ? "bf16" : "f32",
             n.bf16   ? "bf16"
             : n.tf32 ? "tf32"
                      : "f32");
  Generator gen(a.seed);
  GenerateOptions options = a.gen;
  options.vocab = ckpt.tokenizer.vocab_size();  // a vocabulary padded past the tokenizer: the padding is never drawn
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < a.num_samples; ++s) {
    if (s > 0) fmt::print("\n---------------\n");
    fmt::print("{}", a.prompt);
    generate(*model, ids, options, gen, [&](int32_t id) {
      const std::string bytes = ckpt.tokenizer.token_bytes(uint32_t(id));
      std::fwrite(bytes.data(), 1, bytes.size(),
                  stdout);  // a BPE token may hold part of a character: bytes as they come
      std::fflush(stdout);
    });
  }
  fmt::print("\n");
  std::fflush(stdout);  // the sample's last line is out before stderr's timing line, on a terminal that shows both
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "{} tokens in {:.3f}s ({:.0f} tokens/s)\n", a.gen.max_new_tokens * a.num_samples, secs,
             double(a.gen.max_new_tokens * a.num_samples) / secs);
}

void add_export_options(CLI::App& c, ExportArgs& a) {
  c.add_option("--ckpt", a.ckpt, "Checkpoint file, or a run directory (its best checkpoint, else its latest)")
      ->required();
  c.add_option("--format", a.format, "Format to write")->capture_default_str()->check(CLI::IsMember({"hf", "gguf"}));
  c.add_option("--out", a.out,
               "hf: the directory to write (created; its config, weight and tokenizer "
               "files are overwritten); gguf: the file")
      ->required();
  c.add_option("--type", a.type,
               "gguf: the weight matrices' type, f32, f16, bf16 or q8_0 (default f32; "
               "norms and biases stay f32)");
}

void add_import_options(CLI::App& c, ImportArgs& a) {
  c.add_option("--format", a.format, "Format to read")->capture_default_str()->check(CLI::IsMember({"hf", "gguf"}));
  c.add_option("--from", a.from,
               "hf: the model directory (config.json, model.safetensors or its "
               "shards, tokenizer.json); gguf: the .gguf file")
      ->required();
  c.add_option("--out", a.out, "Run directory to write (its ckpt_latest.safetensors)")->required();
}

void validate_export(const ExportArgs& a) {
  if (a.format == "hf" && !a.type.empty()) {
    throw UsageError("--type is for --format gguf (a Hugging Face export keeps f32 weights)");
  }
  GgufType type{};
  if (!a.type.empty() && !parse_gguf_type(a.type, type)) {
    throw UsageError(fmt::format("--type: {} not in {{f32,f16,bf16,q8_0}}", a.type));
  }
}

void run_export_gguf(const ExportArgs& a) {
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  if (std::error_code ec; fs::is_directory(a.out, ec)) {
    throw Error(fmt::format("--out '{}' is a directory; a GGUF export is one file (e.g. {}/model.gguf)", a.out, a.out));
  }
  GgufType type = GgufType::F32;
  if (!a.type.empty()) parse_gguf_type(a.type, type);
  const GgufWritten w = export_gguf(ckpt, a.out, type);
  fmt::print(stderr,
             "wrote {} (GGUF v3, llama.cpp's {} architecture, {} tensors, {:.1f} MiB, weight matrices {}{}, from "
             "{}); run it with llama.cpp (llama-cli -m {}) or ollama\n",
             a.out, w.architecture, w.tensors, double(w.bytes) / (1 << 20), gguf_type_name(type),
             w.as_f16 > 0 ? fmt::format(", {} of them f16 (rows not a multiple of 32)", w.as_f16) : "",
             ckpt.path.string(), a.out);
}

void run_export(const ExportArgs& a) {
  if (a.format == "gguf") return run_export_gguf(a);
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  export_hf(ckpt, a.out);
  fmt::print(stderr,
             "wrote {} ({} and tokenizer, from {}); load it with transformers' "
             "AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained\n",
             a.out, hf_architecture(ckpt.config), ckpt.path.string());
}

void run_import(const ImportArgs& a) {
  const fs::path path = a.format == "gguf" ? import_gguf(a.from, a.out) : import_hf(a.from, a.out);
  fmt::print(stderr,
             "wrote {} from {}; sample with `tinygpt sample --ckpt {}`, fine-tune with `tinygpt train "
             "--init-from {} --data ...`\n",
             path.string(), a.from, a.out, a.out);
}

void validate_eval(const EvalArgs& a) {
  validate_numerics(a.numerics, a.device);
  if (a.data.empty() == a.chat_data.empty())
    throw Error("eval reads --data (text) or --chat-data (conversations): give one");
  if (!a.chat_template.empty() && a.chat_data.empty()) throw Error("--chat-template is for --chat-data");
  if (a.batch_size <= 0 || a.eval_iters <= 0) throw Error("--batch-size and --eval-iters must be positive");
  if (a.train_fraction != 0 && !(a.train_fraction > 0 && a.train_fraction < 1)) {
    throw Error(fmt::format("--train-fraction must be in (0, 1), got {}", a.train_fraction));
  }
}

void run_eval_chat(const EvalArgs& a, const Checkpoint& ckpt, nn::GPT& model) {
  const data::ChatTemplate tpl = data::chat_template_for(ckpt.tokenizer.config(), a.chat_template);
  std::vector<data::Messages> all;
  for (const std::string& f : a.chat_data) {
    for (data::Messages& m : data::read_conversations(f)) all.push_back(std::move(m));
  }
  const data::ConversationSet set = data::encode_conversations(all, std::vector<bool>(all.size(), false), tpl,
                                                               ckpt.tokenizer, ckpt.config.block_size);
  if (set.train.size() == 0) throw Error("--chat-data: no conversation with an assistant's reply");
  int64_t targets = 0;
  const double loss = rows_loss(model, set.train.rows(), a.batch_size, set.train.size(), targets);
  if (set.cut > 0 || set.skipped > 0) {
    fmt::print(stderr, "{} conversations longer than the block of {} tokens cut, {} with no reply within it skipped\n",
               set.cut, ckpt.config.block_size, set.skipped);
  }
  fmt::print("chat loss {:.6f} over {} assistant tokens ({} conversations, template {})\n", loss, targets,
             set.train.size(), tpl.name());
}

void run_eval(const EvalArgs& a) {
  const Device device = parse_device(a.device);
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  check_numerics_over(a.numerics, ckpt, device);
  const auto model = model_from(ckpt, device, a.batch_size, a.numerics);
  if (!a.chat_data.empty()) return run_eval_chat(a, ckpt, *model);
  const data::FileList files =
      data::list_text_files(a.data, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
  // The documents split as training splits them, through a token cache in a scratch directory.
  const ScratchDir scratch;
  const std::vector<uint32_t> separator =
      document_separator(ckpt.tokenizer, ckpt.config.doc_separator, files.size(), "the model's document separator");
  const double fraction = a.train_fraction > 0 ? a.train_fraction : run_train_fraction(ckpt);
  const data::DocumentCorpus dc =
      data::load_documents(files, ckpt.tokenizer, separator, fraction, scratch.path / "tokens.bin", /*quiet=*/true);
  const data::Split split = dc.split();
  const double train = estimate_loss(*model, split.train, a.batch_size, a.eval_iters, a.seed, "training split");
  const double val = estimate_loss(*model, split.val, a.batch_size, a.eval_iters, a.seed + 1, "validation split");
  const double bpb = bits_per_byte(val, split.val.size(), source_bytes(split.val, ckpt.tokenizer));
  fmt::print("train loss {:.4f}, val loss {:.4f}, val bits per byte {:.4f}\n", train, val, bpb);
}

}  // namespace

/// The ids of a flag's text; throws naming the flag and the first character outside a character vocabulary.
std::vector<int32_t> encode_flag_text(const data::Tokenizer& tok, const std::string& text, const char* flag) {
  const std::vector<uint32_t> ids = tok.encode_prompt(text, flag);
  return {ids.begin(), ids.end()};
}

void add_numerics_flags(CLI::App* cmd, NumericsFlags& n) {
  cmd->add_option("--dtype", n.dtype,
                  "fp32, or bf16: matmul operands (on the GPU and on CPUs with a bf16 unit also flash "
                  "attention's) rounded to bf16 (default: as the checkpoint was trained)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_flag_callback(
      "--tf32", [&n] { n.tf32 = true; },
      "On the GPU, TF32 tensor cores for f32 matmuls (default: as the checkpoint was trained)");
  cmd->add_flag_callback(
      "--no-tf32", [&n] { n.tf32 = false; }, "On the GPU, full f32 matmuls");
  cmd->add_option(
      "--attention-math", n.attention_math,
      "Flash attention's operands: f32, bf16, or on the GPU tf32 (default: as the checkpoint was trained, or "
      "as --dtype's and --tf32's default)");
  cmd->add_option("--storage", n.storage,
                  "Weights and activations stored in f32 or bf16 (bf16 needs bf16 products; default: bf16 with "
                  "them on the GPU and on CPUs with AVX512-BF16 or AMX, else f32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

/// The checkpoint's model on `device` in eval mode, after checking it fits with batches of batch_size sequences of
/// `context` tokens (0: the block size).
std::unique_ptr<nn::GPT> model_from(const Checkpoint& ckpt, Device device, int64_t batch_size,
                                    const NumericsFlags& numerics, int64_t context) {
  require_memory(inference_memory(ckpt.config, batch_size, context), device,
                 fmt::format("running {}", ckpt.path.string()), "use a machine with more memory");
  Generator gen = Generator::for_loading();  // the weights are loaded next
  auto model = std::make_unique<nn::GPT>(ckpt.config, gen);
  load_weights(*model, ckpt);
  use_document_separator(*model, ckpt.tokenizer);
  model->set_numerics(numerics.over(ckpt.numerics, device));
  check_numerics(model->numerics(), device, "pass --attention-math f32");
  model->to(device);
  model->train(false);
  return model;
}

void validate_numerics(const NumericsFlags& n, const std::string& device) {
  if (device != "cpu" && device != "cuda") throw Error(fmt::format("--device must be cpu or cuda, got '{}'", device));
  if (!n.attention_math.empty()) check_attention_math_flag(n.attention_math, device);
  if (!n.storage.empty() && n.storage != "f32" && n.storage != "bf16") {
    throw Error(fmt::format("--storage must be f32 or bf16, got '{}'", n.storage));
  }
  if (n.storage == "bf16" && n.dtype == "fp32")
    throw Error("--storage bf16 needs --dtype bf16 (bf16 activations feed bf16 products)");
}

/// The flags' numerics over the checkpoint's, where a contradiction only the checkpoint reveals (--storage bf16 over
/// an f32 run without --dtype bf16) is a usage error too.
void check_numerics_over(const NumericsFlags& n, const Checkpoint& ckpt, Device device) {
  try {
    (void)n.over(ckpt.numerics, device);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

namespace {

/// train's and sft's run: 130 when a signal stopped it (the latest checkpoint saved); a flag that contradicts the
/// --init-from or --resume checkpoint is a UsageError the run throws (exit 2).
std::function<int()> train_run(const TrainConfig& c) {
  return [&c] { return train(c).interrupted ? 130 : 0; };
}

}  // namespace

Cli::Cli() {
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(
      "Exit status: 0 done, 1 error (bad data, checkpoint, file or device), 2 usage error (unknown flag, bad or "
      "contradictory value), 130 stopped by a signal (the latest checkpoint saved).");
  app.require_subcommand(1);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last one wins
  app.set_version_flag("--version", "tinygpt " TINYGPT_VERSION);
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  const auto done = [](auto f) {
    return [f] {
      f();
      return 0;
    };
  };  // a run that ends in 0 unless it throws
  commands = {
      {"train", "Train a GPT on text files, over characters or a byte-level BPE (nanoGPT's shakespeare_char defaults)",
       [this](CLI::App& c) { add_train_options(c, train_config); }, [this] { train_config.validate(); },
       train_run(train_config)},
      {"sft",
       "Fine-tune a model on conversations (JSON lines of OpenAI's messages or ShareGPT's), the loss on the "
       "assistant's replies only (the train flags apply; --init-from is required)",
       [this](CLI::App& c) {
         add_train_options(c, sft_config);
         c.add_option("--chat-template", sft_config.chat_template,
                      "chatml, llama3 or a Jinja file (default: the "
                      "model's own, else chatml)");
       },
       [this] { sft_config.validate(); }, train_run(sft_config)},
      {"sample", "Generate text from a checkpoint (the sample goes to stdout, all else to stderr)",
       [this](CLI::App& c) { add_sample_options(&c, sample_args); }, [this] { validate_sample(sample_args); },
       done([this] { run_sample(sample_args); })},
      {"chat",
       "Talk to a model: a conversation on a terminal, or the replies to --message turns (rendered with its "
       "chat template; --render-only prints the prompt)",
       [this](CLI::App& c) { add_chat_options(c, chat_args); }, [this] { validate_chat(chat_args); },
       done([this] { run_chat(chat_args); })},
      {"serve",
       "Serve a model over HTTP with the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, "
       "streaming) and a chat page at /",
       [this](CLI::App& c) { add_serve_options(c, serve_args); }, [this] { validate_serve(serve_args); },
       done([this] { run_serve(serve_args); })},
      {"eval", "Print a checkpoint's mean loss and bits per byte on the train and val splits of text files",
       [this](CLI::App& c) { add_eval_options(&c, eval_args); }, [this] { validate_eval(eval_args); },
       done([this] { run_eval(eval_args); })},
      {"tokenizer", "Train a byte-level BPE on text files, or encode and decode with one",
       [this](CLI::App& c) { add_tokenizer_options(c, tokenizer_args); },
       [this] { validate_tokenizer(*app.get_subcommand("tokenizer"), tokenizer_args); },
       done([this] { run_tokenizer(*app.get_subcommand("tokenizer"), tokenizer_args); })},
      {"plot", "Draw a run's train and val loss curves as an SVG",
       [this](CLI::App& c) { add_plot_options(c, plot_args); }, [] {}, done([this] { run_plot(plot_args); })},
      {"attention", "Draw a layer's attention weights over a text, per head, as an SVG",
       [this](CLI::App& c) { add_attention_options(c, attention_args); },
       [this] { validate_attention(attention_args); }, done([this] { run_attention(attention_args); })},
      {"export",
       "Write a checkpoint in another library's format (hf: a Hugging Face GPT2LMHeadModel, LlamaForCausalLM "
       "or Qwen2ForCausalLM directory with its tokenizer; gguf: one file llama.cpp and ollama run)",
       [this](CLI::App& c) { add_export_options(c, export_args); }, [this] { validate_export(export_args); },
       done([this] { run_export(export_args); })},
      {"import",
       "Read another library's model as a tinygpt run (hf: a Hugging Face GPT2LMHeadModel, LlamaForCausalLM or "
       "Qwen2ForCausalLM directory with its byte-level BPE tokenizer.json; gguf: a llama.cpp file of the "
       "llama, qwen2 or gpt2 architecture, f32, f16, bf16 or quantized as Q8_0, Q4_0 or Q4_K_M)",
       [this](CLI::App& c) { add_import_options(c, import_args); }, [] {}, done([this] { run_import(import_args); })},
      {"info", "Print a checkpoint's model, parameter count, iteration and losses",
       [this](CLI::App& c) { add_info_options(c, info_ckpt); }, [] {}, done([this] { run_info(info_ckpt); })},
  };
  for (const Command& c : commands) c.options(*app.add_subcommand(c.name, c.help));
  // The global options (declared on `app` above, and only there) in every position: after any subcommand and any
  // sub-subcommand too (`tinygpt tokenizer train ... --threads 2`).
  const auto fall_through = [](auto& self, CLI::App& parent) -> void {
    for (CLI::App* sub : parent.get_subcommands({})) {
      sub->fallthrough();
      self(self, *sub);
    }
  };
  fall_through(fall_through, app);
}

const Command* Cli::chosen() const {
  for (const Command& c : commands) {
    if (app.got_subcommand(c.name)) return &c;
  }
  return nullptr;
}

void Cli::validate() const {
  if (const Command* c = chosen()) c->validate();
}

int Cli::main(int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string command = "tinygpt";
    for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
    print_error(fmt::format("{} (see `{} --help`)", e.what(), command));
    return kUsageError;
  }
  try {
    check_number_flags(app);
  } catch (const UsageError& e) {
    print_error(e.what());
    return kUsageError;
  }
  if (threads > 0) omp_set_num_threads(threads);
  use_cpu_rates_cache();  // before anything asks which bf16 unit to use
  try {
    validate();
  } catch (const std::exception& e) {
    print_error(e.what());
    return kUsageError;
  }
  const Command* command = chosen();
  if (command == nullptr) return kUsageError;  // the parser requires one; a Cli that was not parsed has none
  int status = 0;
  try {
    status = command->run();
  } catch (const UsageError& e) {
    std::fflush(stdout);
    end_job_on_error(e.what());
    print_error(e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    // A write to stdout that failed (a full disk, a closed pipe: fmt throws) is said as such.
    const bool out_failed = std::ferror(stdout) != 0;
    std::fflush(stdout);
    end_job_on_error(e.what());
    print_error(out_failed ? fmt::format("cannot write the output to stdout: {}", e.what()) : std::string(e.what()));
    return 1;
  }
  // What went to stdout (samples, info, encoded ids) must have arrived: a full disk or a closed pipe is an error.
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (!flushed || std::ferror(stdout)) {
    print_error(
        fmt::format("cannot write the output to stdout{}", err != 0 ? ": " + std::string(std::strerror(err)) : ""));
    return 1;
  }
  return status;
}

}  // namespace tinygpt
