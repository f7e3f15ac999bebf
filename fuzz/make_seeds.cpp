// Writes the fuzz targets' seed corpus: <out>/<target>/*, each a valid input built in-process
// (seeds.hpp, model_file_target.hpp, text_targets.hpp), and one valid input of close to 1 MB per
// target (large_*), so that a run with -max_len=1048576 executes inputs of that size from the
// start: libFuzzer grows the small seeds only slowly, to ~20 KB after a minute. The replay test
// keeps to the small seeds. Usage: attn_fuzz_make_seeds <out>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "model_file_target.hpp"
#include "seeds.hpp"
#include "text_targets.hpp"

namespace {

using attn::fuzz::Seed;
constexpr std::size_t kLarge = 1000000;  // bytes: a large seed plus its mutations stay under 1 MB

/// A .mo catalog of ~17,000 messages.
Seed large_mo() {
  std::vector<attn::fuzz::MoMessage> messages{{"", "Content-Type: text/plain; charset=UTF-8\n"}};
  for (int i = 0; i < 17000; ++i)
    messages.push_back(
        {"message number " + std::to_string(i), "Meldung Nummer " + std::to_string(i)});
  return {"large_messages.mo", attn::fuzz::build_mo(messages, false, 0, 0)};
}

/// A safetensors file of 15,000 one-byte tensors (a ~940 KB header), through `dir`.
Seed large_safetensors(const std::string& dir) {
  std::vector<attn::TensorEntry> tensors;
  for (int i = 0; i < 15000; ++i)
    tensors.push_back(attn::bytes_entry("t" + std::to_string(i), attn::Dtype::U8, {1},
                                        {static_cast<unsigned char>(i)}));
  return {"large_tensors.safetensors", attn::fuzz::written_safetensors(dir, tensors)};
}

/// The small model file with ~1 MB of metadata beside its config.
Seed large_model_file(const std::string& dir) {
  const attn::TransformerConfig c = attn::fuzz::fuzz_model_config();
  attn::Transformer<float> model(c);
  auto meta = c.to_metadata();
  meta["translate.max_len"] = "32";
  meta["note"] = std::string(kLarge - 4000, 'n');
  std::vector<attn::TensorEntry> entries;
  for (const auto& p : model.parameters()) entries.push_back(attn::tensor_entry(p.name, p.value));
  return {"large_model.safetensors", attn::fuzz::written_safetensors(dir, entries, meta)};
}

/// A training state whose learning curves hold ~16,000 points.
Seed large_train_state() {
  std::string text = attn::fuzz::train_state_seeds().front().second;
  std::vector<attn::translate::CurvePoint> curves;
  for (int i = 1; text.size() + 60 * curves.size() < kLarge; ++i)
    curves.push_back({100 * i, 4.5 / i, 4.25 / i, 0.5 * i});
  text += "curves=" + attn::translate::encode_curves(curves) + "\n";  // the last curves= wins
  return {"large_train_state.txt", text};
}

/// vocab.txt followed by lines the reader does not look at, up to ~1 MB.
Seed large_vocab() {
  std::string text = attn::fuzz::vocab_seeds().front().second;
  while (text.size() < kLarge) text += "padding line of a large vocab.txt\n";
  return {"large_vocab.txt", text};
}

/// A pair of parallel files of ~500 KB each, and one plain file of ~1 MB.
std::vector<Seed> large_parallel_text() {
  std::string half;
  for (int i = 0; half.size() < kLarge / 2; ++i)
    half += "sentence number " + std::to_string(i) + "\n";
  return {{"large_pair.txt", std::string(1, '\1') + half + half},
          {"large_plain.txt", std::string(1, '\0') + half + half}};
}

bool write_all(const std::string& dir, const std::vector<attn::fuzz::Seed>& seeds) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "cannot create " << dir << ": " << std::strerror(errno) << "\n";
    return false;
  }
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::cerr << "cannot write " << dir << "/" << name << "\n";
      return false;
    }
    std::cout << dir << "/" << name << " (" << bytes.size() << " bytes)\n";
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <output directory>\n";
    return 2;
  }
  const std::string out = argv[1];
  if (::mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "cannot create " << out << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  try {
    const bool ok = write_all(out + "/mo_catalog", attn::fuzz::mo_seeds()) &&
                    write_all(out + "/safetensors", attn::fuzz::safetensors_seeds(out)) &&
                    write_all(out + "/model_file", attn::fuzz::model_file_seeds(out)) &&
                    write_all(out + "/train_state", attn::fuzz::train_state_seeds()) &&
                    write_all(out + "/vocab", attn::fuzz::vocab_seeds()) &&
                    write_all(out + "/parallel_text", attn::fuzz::parallel_text_seeds());
    const bool large_ok = ok && write_all(out + "/mo_catalog", {large_mo()}) &&
                          write_all(out + "/safetensors", {large_safetensors(out)}) &&
                          write_all(out + "/model_file", {large_model_file(out)}) &&
                          write_all(out + "/train_state", {large_train_state()}) &&
                          write_all(out + "/vocab", {large_vocab()}) &&
                          write_all(out + "/parallel_text", large_parallel_text());
    return large_ok ? 0 : 1;
  } catch (const attn::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
