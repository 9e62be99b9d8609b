// Hugging Face TrainingArguments names (and a few of Axolotl's) in ferry's configuration
// file and in --set, for users who bring their Trainer settings:
//   accepted   a name with one ferry meaning is moved to ferry's key before the file is
//              checked (learning_rate -> optimizer.params.lr, gradient_checkpointing ->
//              activation_checkpointing.enabled, save_steps -> checkpoint.every_steps, ...);
//              a value both spellings set differently is an error naming both;
//   schedule   lr_scheduler_type (linear, cosine, constant, constant_with_warmup),
//              warmup_ratio and warmup_steps become the DeepSpeed scheduler ferry runs, with
//              the Trainer's curve (linear warmup from 0 to the optimizer's lr); they are
//              resolved once the whole document and --set are read (the ratio needs the
//              step count, the peak the lr);
//   hinted     names whose meaning ferry spells otherwise or does not have (num_train_epochs,
//              output_dir, max_seq_length, ...): the unknown-key error says what to set.
// Every accepted key is reported as "trainer key = value -> ferry key = value" (Config::
// trainer_keys), for the run's header. Pure functions; errors are ConfigError naming the
// source and the key as written.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct TrainerKeys {
  std::vector<std::string> applied;  // "learning_rate = 2e-05 -> optimizer.params.lr"
  // The schedule words as given (null: absent) and where each came from.
  nlohmann::json lr_scheduler_type, warmup_ratio, warmup_steps;
  std::string schedule_source;
  std::string adapter_source;  // where Axolotl's `adapter: lora` came from ("" = not given): it needs a rank
};

// Moves the top-level Trainer names of `doc` to ferry's key paths; returns the document
// to check. Throws ConfigError for a bad value or a key set twice.
nlohmann::json translate_trainer_keys(const nlohmann::json& doc, const std::string& source, TrainerKeys& keys);

// A --set argument "learning_rate=1e-5" as {"optimizer.params.lr=1e-5"} (seed gives two
// arguments); a schedule word is kept in `keys` and nothing returned; any other argument
// comes back unchanged.
std::vector<std::string> translate_trainer_override(const std::string& arg, TrainerKeys& keys);

// After the user's document and --set are merged into `user` (ferry paths): writes the
// scheduler the schedule words ask for. Throws ConfigError when they conflict with
// scheduler keys the user set.
void apply_trainer_schedule(nlohmann::json& user, TrainerKeys& keys);

// For a top-level key ferry does not know: what to set instead, when it is a Trainer (or
// Axolotl) name ferry has another spelling for; "" otherwise.
std::string trainer_key_hint(const std::string& key);

}  // namespace ferry::runtime
