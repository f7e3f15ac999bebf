// Writes the fuzz targets' seed corpus: <out>/<target>/*, each a valid input built in-process
// (seeds.hpp, model_file_target.hpp, text_targets.hpp). Usage: attn_fuzz_make_seeds <out>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "model_file_target.hpp"
#include "seeds.hpp"
#include "text_targets.hpp"

namespace {

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
    return ok ? 0 : 1;
  } catch (const attn::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
