// What a training checkpoint of attn-translate stores in its metadata besides the model's identity
// (model_metadata.hpp): the training options that change the result, the data position, the
// learning curves, the log window and whether a signal stopped the run there. All
// of it is read back from a file, so every value is parsed strictly (std::from_chars, the whole
// string, in range) and bounded, and a bad one is a FormatError naming the file and the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "epoch_stream.hpp"    // DataPosition
#include "log_window.hpp"      // LogWindowState
#include "model_metadata.hpp"  // Metadata
#include "train_options.hpp"
#include "train_report.hpp"  // CurvePoint

namespace attn::translate {

/// Writes the options that change what training computes ("train.*", translate.max_len).
void store_options(const TrainOptions& options, Metadata& m);
/// Reads them back into `options`; FormatError naming `file` and the key for a missing,
/// malformed or out-of-range value.
void restore_options(TrainOptions& options, const Metadata& m, const std::string& file);

/// The curves as "step,train_loss,valid_loss,valid_bleu;" items (17 digits; "nan" where not
/// measured), and back. FormatError naming `file` for anything else.
std::string encode_curves(const std::vector<CurvePoint>& curves);
std::vector<CurvePoint> decode_curves(const std::string& text, const std::string& file);
/// The curves under the metadata key "curves" (encode_curves), and back (decode_curves); none in
/// a checkpoint without the key.
void store_curves(const std::vector<CurvePoint>& curves, Metadata& m);
std::vector<CurvePoint> restore_curves(const Metadata& m, const std::string& file);

/// The metadata key that marks a checkpoint written when a signal stopped the run: a point to
/// resume from, not counted under --keep, which the next checkpoint replaces
/// (Trainer::write_checkpoint).
inline constexpr const char* kResumePointKey = "checkpoint.resume_point";
void store_resume_point(Metadata& m);
bool is_resume_point(const Metadata& m);

void store_data_position(const DataPosition& position, Metadata& m);
/// FormatError unless data.epoch and data.batch are integers and batch <= batches_in(epoch), the
/// number of batches of that epoch (called once, after data.epoch is read).
DataPosition restore_data_position(const Metadata& m, const std::string& file,
                                   const std::function<std::size_t(std::uint64_t)>& batches_in);

/// The log window (train_report.hpp) as log.loss_sum (17 digits) and log.updates, so that a run
/// resumed between log points logs what an uninterrupted one would; without them (checkpoints
/// from before session 41), an empty window.
void store_log_window(const LogWindowState& window, Metadata& m);
/// FormatError unless log.loss_sum is finite and >= 0 and log.updates an integer in [0,
/// max_updates].
LogWindowState restore_log_window(const Metadata& m, const std::string& file, Index max_updates);

/// The error of a --resume whose data are not the checkpoint's: the given data, not the
/// checkpoint, are at fault, so no older checkpoint is tried instead.
class OtherDataError : public DataError {
 public:
  using DataError::DataError;
};

/// data.fingerprint: the training batches a checkpoint was trained on (fingerprint(Batcher),
/// distributed.hpp), as 16 hex digits, and the check of --resume against it: OtherDataError when
/// the given data differ (a resume without the interrupted run's --src/--tgt would otherwise go on
/// over the built-in corpus), FormatError if malformed; nothing to check in checkpoints written
/// before the key existed.
void store_data_fingerprint(std::uint64_t fingerprint, Metadata& m);
void check_data_fingerprint(const Metadata& m, const std::string& file, std::uint64_t given);

/// Metadata `key` of `file`; FormatError if missing.
const std::string& metadata_value(const Metadata& m, const std::string& key,
                                  const std::string& file);

}  // namespace attn::translate
