// The gradient all-reduce of data-parallel training, measured alone: a model of the given preset
// and vocabulary, DataParallel::all_reduce_gradients() repeated, its overlapped form (every bucket
// started at once, as when backward reports nothing), and MPI_Allreduce (Open MPI's own
// algorithm, order not fixed) on one buffer of the same size.
// Usage: mpirun -np N allreduce_mpi [preset tiny|small|base|big] [vocab] [repeats]
//                                   [gathered|separate] [packed_in_flight]
// `separate` gives every gradient an allocation of its own, as a model that does not call
// Module::gather_gradients has: its buckets are packed, through packed_in_flight buffers.
// Prints on rank 0: parameters, megabytes, buckets (and how many pack), median milliseconds of
// each, and the resident memory the overlapped form's buffers add.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <attn/nn/transformer.hpp>
#include <attn/train/data_parallel.hpp>

namespace {

template <class F>
double median_ms(int repeats, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Resident memory of this process in MB (/proc/self/statm counts pages of the system's page size;
/// 0 where it cannot be read).
double resident_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  const long page_bytes = sysconf(_SC_PAGESIZE);
  return static_cast<double>(resident) * static_cast<double>(page_bytes > 0 ? page_bytes : 0) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string preset = argc > 1 ? argv[1] : "small";
  const attn::Index vocab = argc > 2 ? std::atoll(argv[2]) : 8000;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  const bool separate = argc > 4 && std::string(argv[4]) == "separate";
  attn::DataParallelOptions options;
  if (argc > 5) options.packed_in_flight = std::strtoull(argv[5], nullptr, 10);
  attn::TransformerConfig c;
  try {  // every rank reads the same arguments, so every rank ends here alike
    c = attn::TransformerConfig::named(preset, vocab);
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "allreduce_mpi: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  attn::Transformer<float> model(c);
  auto params = model.parameters();
  for (auto& p : params) {
    if (separate) p.grad = attn::Tensor<float>(p.grad.shape());
    p.grad.vector().setConstant(1.0f);
  }
  attn::DataParallel<float> dp(params, MPI_COMM_WORLD, options);
  const double ring = median_ms(repeats, [&] { dp.all_reduce_gradients(); });
  if (!separate) dp.reduce_during_backward(model);  // (start_remaining needs no hook)
  const double before_overlap = resident_mb();
  const double overlapped = median_ms(repeats, [&] {
    dp.begin_overlapped();
    dp.start_remaining();
    dp.finish_overlapped();
  });
  const double overlap_mb = resident_mb() - before_overlap;
  const attn::Index n = model.num_parameters();
  std::vector<float> buffer(static_cast<std::size_t>(n), 1.0f);
  const double library = median_ms(repeats, [&] {
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  });
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rank == 0)
    std::printf(
        "%s vocab %lld: %lld parameters, %.1f MB, %zu buckets (%zu packed, %zu buffers), %d "
        "ranks: ring %.1f ms, overlapped %.1f ms (its buffers +%.0f MB resident), "
        "MPI_Allreduce %.1f ms (median of %d)\n",
        preset.c_str(), static_cast<long long>(vocab), static_cast<long long>(n),
        4.0 * static_cast<double>(n) / 1e6, dp.buckets(), dp.packed_buckets(), dp.packed_buffers(),
        ranks, ring, overlapped, overlap_mb, library, repeats);
  MPI_Finalize();
  return 0;
}
