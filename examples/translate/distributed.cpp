#include "distributed.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <sched.h>

#include <attn/random.hpp>

#include "text.hpp"

#ifdef ATTN_TRANSLATE_WITH_MPI
#include <mpi.h>

#include <attn/train/data_parallel.hpp>
#endif

namespace attn::translate {

namespace {

// The longest row of `rows` in t [B, L], counting up to the last non-pad id.
Index longest(const Tensor<TokenId>& t, const std::vector<Index>& rows, TokenId pad) {
  Index most = 0;
  for (Index r : rows)
    for (Index j = t.size(1); j > most; --j)
      if (t(r, j - 1) != pad) {
        most = j;
        break;
      }
  return most;
}

void copy_rows(const Tensor<TokenId>& from, const std::vector<Index>& rows, Index len,
               Tensor<TokenId>& to) {
  to.resize({static_cast<Index>(rows.size()), len});
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy(from.data() + rows[i] * from.size(1), from.data() + rows[i] * from.size(1) + len,
              to.data() + static_cast<Index>(i) * len);
}

}  // namespace

std::uint64_t rank_seed(std::uint64_t seed, int rank) {
  return rank == 0 ? seed
                   : mix64(seed ^ mix64(0x5851f42d4c957f2dULL * static_cast<unsigned>(rank)));
}

ShareShape share_shape(const Batch& full, int rank, int ranks) {
  ShareShape s;
  for (Index r = rank; r < full.rows(); r += ranks) s.rows.push_back(r);
  const TokenId pad = SubwordVocab::kPad;  // the trainer batches with the vocabulary's ids
  s.src_len = longest(full.src, s.rows, pad);
  s.tgt_len = longest(full.tgt_out, s.rows, pad);
  return s;
}

void share_batch(const Batch& full, int rank, int ranks, Batch& out) {
  const ShareShape s = share_shape(full, rank, ranks);
  copy_rows(full.src, s.rows, s.src_len, out.src);
  copy_rows(full.tgt_in, s.rows, s.tgt_len, out.tgt_in);
  copy_rows(full.tgt_out, s.rows, s.tgt_len, out.tgt_out);
  out.pairs.clear();
  out.src_tokens = out.tgt_tokens = 0;
  for (Index r : s.rows) out.pairs.push_back(full.pairs[static_cast<std::size_t>(r)]);
  for (TokenId id : out.src) out.src_tokens += id != SubwordVocab::kPad;
  for (TokenId id : out.tgt_out) out.tgt_tokens += id != SubwordVocab::kPad;
}

std::string slow_update_warning(double update_seconds, const char* sigkill_timeout) {
  long wait = 1;  // Open MPI 4's default
  if (sigkill_timeout != nullptr && *sigkill_timeout != '\0') {
    char* end = nullptr;
    const long given = std::strtol(sigkill_timeout, &end, 10);
    if (*end == '\0' && given >= 0) wait = given;
  }
  // The update under way, and about as long again to save the checkpoint after it.
  if (!std::isfinite(update_seconds) || 2 * update_seconds <= static_cast<double>(wait)) return {};
  // Room for the update under way and the checkpoint after it, with a margin.
  const long enough = std::max(60L, std::lround(std::ceil(3 * update_seconds)));
  return attn::detail::concat(
      "train: an update takes ", std::lround(update_seconds * 10) / 10.0,
      " s, and mpirun kills the ranks ", wait, wait == 1 ? " second" : " seconds",
      " after it passes Ctrl-C on as SIGTERM (odls_base_sigkill_timeout): too little for the "
      "update under way and the checkpoint the ranks save after it, so the work since the last "
      "checkpoint would be lost. Start mpirun with --mca odls_base_sigkill_timeout ",
      enough, " (README, \"Training on several machines\")");
}

std::uint64_t fingerprint(const std::map<std::string, std::string>& metadata) {
  std::uint64_t h = kFnv1aOffset;
  for (const auto& [key, value] : metadata) {
    h = fnv1a(h, key.data(), key.size() + 1);  // with the terminating 0: "ab"+"c" != "a"+"bc"
    h = fnv1a(h, value.data(), value.size() + 1);
  }
  return h;
}

#ifdef ATTN_TRANSLATE_WITH_MPI
namespace {

// The MPI side: one instance per process, between MPI_Init and MPI_Finalize.
class MpiReplicas final : public Replicas {
 public:
  MpiReplicas(bool overlap, bool max_tokens_per_rank)
      : overlap_(overlap), max_tokens_per_rank_(max_tokens_per_rank) {
    MPI_Init(nullptr, nullptr);
    // MPI_ERRORS_ARE_FATAL would end a rank whose peer died without a word; errors come back as
    // codes instead, and detail::mpi_check turns them into exceptions with MPI's message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    rank_ = detail::comm_rank(MPI_COMM_WORLD);
    size_ = detail::comm_size(MPI_COMM_WORLD);
  }
  ~MpiReplicas() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { detail::mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void agree_on_flags(TrainOptions& options) override {
    std::map<std::string, std::string> flags{
        {"--max-tokens-per-rank", max_tokens_per_rank_ ? "1" : "0"},
        {"--no-overlap-allreduce", overlap_ ? "0" : "1"}};
    std::string names;
    options.visit_options([&](const OptionInfo& info, const auto& value, const auto&) {
      if (!info.agreed) return;
      flags[info.name()] = exact_text(value);
      names += info.name() + ", ";
    });
    try {
      check_same_on_all_ranks(fingerprint(flags),
                              names + "--max-tokens-per-rank or --no-overlap-allreduce");
    } catch (const ConfigError& e) {
      throw AgreedError(e.what());  // every rank saw the same fingerprints
    }
    if (!max_tokens_per_rank_) return;
    ATTN_CHECK(options.max_tokens <= kMaxBatchTokens / size_, AgreedError, "--max-tokens ",
               options.max_tokens, " per rank on ", size_, " ranks is more than ", kMaxBatchTokens,
               " tokens per batch, the most a checkpoint records");
    options.max_tokens *= size_;
  }

  /// Ranks of this job on this machine (they share its cores).
  int local_ranks() const {
    MPI_Comm local;
    detail::mpi_check(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
    const int n = detail::comm_size(local);
    MPI_Comm_free(&local);
    return n;
  }

  void start(Transformer<float>& model, std::uint64_t batches,
             const std::map<std::string, std::string>& metadata,
             const std::function<std::uint64_t()>& state) override {
    try {
      check_same_on_all_ranks(fingerprint(metadata),
                              "training options, model configuration or vocabulary");
      check_same_on_all_ranks(batches,
                              "training batches (the data files; under --bpe-dropout also the "
                              "pieces drawn, which need the same sentencepiece library)");
      check_same_on_all_ranks(parameter_fingerprint(model.parameters()), "starting parameters");
      check_same_on_all_ranks(state(),
                              "update count, data position, Adam moments and dropout stream (the "
                              "training state a checkpoint restores)");
    } catch (const ConfigError& e) {
      throw AgreedError(e.what());  // every rank saw the same fingerprints
    }
    model.random_state().seed = rank_seed(model.random_state().seed, rank_);
    dp_ = std::make_unique<DataParallel<float>>(model.parameters());
    if (overlap_) dp_->reduce_during_backward(model);
  }

  void last_batch_of_update() override {
    if (overlap_) dp_->begin_overlapped();
  }

  bool rank0_decides(bool value) override {
    int v = value;
    detail::mpi_check(MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
    return v != 0;
  }

  int max_over_ranks(int value) override {
    int v = value;
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                      "MPI_Allreduce");
    return v;
  }

  const Batch& share(const Batch& full) override {
    if (!in_update_) update_start_ = std::chrono::steady_clock::now();
    in_update_ = true;
    share_batch(full, rank_, size_, share_);
    return share_;
  }

  LossStats finish_update(const LossStats& local, const std::string& error,
                          Transformer<float>& model) override {
    ATTN_ASSERT(dp_ != nullptr);
    if (overlap_) {
      // This rank's last backward pass did not run to its end (an error, or no rows in its share
      // of the last batch): its sums start now, so that the other ranks' rings complete. Before
      // the statistics, which throw on an error: no sum is left in flight.
      if (!error.empty() || share_.rows() == 0) dp_->start_remaining();
      dp_->finish_overlapped();
    }
    LossStats global;
    try {
      global = dp_->all_reduce(local, error);
    } catch (const ReplicaError& e) {
      throw AgreedError(e.what());
    }
    if (!overlap_) dp_->all_reduce_gradients();
    // Rank 0 always has rows (row 0 of every batch), so its dropout counter has advanced once
    // per dropout call of every batch; a rank whose share was empty catches up here.
    std::uint64_t counter = model.random_state().counter;
    detail::mpi_check(MPI_Bcast(&counter, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    model.random_state().counter = counter;
    warn_of_mpirun_kill();
    return global;
  }

  // From the second update on (the first also fills the buffers), once, on rank 0, under Open
  // MPI's mpirun.
  void warn_of_mpirun_kill() {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - update_start_).count();
    in_update_ = false;
    if (updates_ < 2) ++updates_;
    if (rank_ != 0 || warned_ || updates_ < 2 || !std::getenv("OMPI_COMM_WORLD_SIZE")) return;
    const std::string warning =
        slow_update_warning(seconds, std::getenv("OMPI_MCA_odls_base_sigkill_timeout"));
    if (warning.empty()) return;
    std::cerr << warning << '\n';
    warned_ = true;
  }

  bool report_here(const std::exception& e) override {
    if (dynamic_cast<const AgreedError*>(&e)) return rank_ == 0;
    // One write, not interleaved with another rank's.
    std::cerr << attn::detail::concat("attn-translate: error: rank ", rank_, " of ", size_, ": ",
                                      e.what(), '\n')
              << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may be waiting for this one: stop them
    return false;
  }

 private:
  int rank_ = 0, size_ = 1;
  bool overlap_;              // gradient sums during the last backward pass of each update
  bool max_tokens_per_rank_;  // --max-tokens is one rank's share of a batch
  std::unique_ptr<DataParallel<float>> dp_;
  Batch share_;
  std::chrono::steady_clock::time_point update_start_;  // of the update under way
  bool in_update_ = false;                              // share() has run since finish_update
  int updates_ = 0;                                     // finished, counted up to the second
  bool warned_ = false;                                 // of a kill by mpirun (once)
};

// The CPUs this process may run on (0: unknown). mpirun binds each rank by default (Open MPI 4:
// to one core when it starts at most 2 ranks, to a socket or NUMA node beyond), and threads
// beyond those CPUs only take turns on them.
int bound_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// Rank 0 names the layout (unless quiet); every rank warns of its own oversubscription.
void report_threads(int rank, int ranks, int local, int threads, int cores, int bound, bool quiet) {
  if (rank == 0 && !quiet)
    std::cerr << "train: " << ranks << (ranks == 1 ? " rank (" : " ranks (") << local
              << " on this machine) x " << threads << (threads == 1 ? " thread\n" : " threads\n");
  if (rank == 0 && threads * local > cores)
    std::cerr << "train: " << local << " ranks x " << threads << " threads on " << cores
              << " cores oversubscribe this machine\n";
  if (bound > 0 && threads > bound)
    std::cerr << "train: rank " << rank << " runs " << threads << " threads on the " << bound
              << (bound == 1 ? " CPU" : " CPUs") << " mpirun bound it to; start it with "
              << "--map-by slot:PE=" << threads << " (or --bind-to none)\n";
}

// Set by mpirun (Open MPI), by PMIx launchers and by MPICH's Hydra.
bool started_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

}  // namespace
#endif

int default_rank_threads(int cores, int local_ranks, int bound_cpus) {
  const int share = cores / std::max(1, local_ranks);
  return std::max(1, bound_cpus > 0 ? std::min(share, bound_cpus) : share);
}

std::shared_ptr<Replicas> join_replicas(TrainOptions& options, const ReplicaOptions& replica) {
#ifdef ATTN_TRANSLATE_WITH_MPI
  if (started_by_mpirun()) {
    auto mpi =
        std::make_shared<MpiReplicas>(replica.overlap_all_reduce, replica.max_tokens_per_rank);
    const int local = mpi->local_ranks();
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int bound = bound_cpus();
    if (!replica.threads_given) options.threads = default_rank_threads(cores, local, bound);
    report_threads(mpi->rank(), mpi->size(), local, options.threads, cores, bound, options.quiet);
    if (mpi->rank() != 0) {
      options.quiet = true;
      options.svg = false;
    }
    return mpi;
  }
#endif
  (void)replica;  // one process: its share is the whole batch, nothing to sum
  return std::make_shared<Replicas>();
}

}  // namespace attn::translate
