// What the MPI tests share (tests/mpi/*.cpp, one executable run under mpirun on 2 and 3 ranks):
// this process's place in MPI_COMM_WORLD, DataParallelOptions with one field changed, a rank's
// share of a batch, and the comparisons of their results.
#pragma once

#include <mpi.h>

#include <attn/train/data_parallel.hpp>

#include <cstring>

#include "training_task.hpp"

namespace attn {
namespace testing {

inline int world_rank() { return detail::comm_rank(MPI_COMM_WORLD); }
inline int world_size() { return detail::comm_size(MPI_COMM_WORLD); }

/// The default options but for the bucket size (bytes).
inline DataParallelOptions buckets_of(std::size_t bytes) {
  DataParallelOptions options;
  options.bucket_bytes = bytes;
  return options;
}

/// The default options but for the fewest buckets a model is cut into.
inline DataParallelOptions at_least(std::size_t buckets) {
  DataParallelOptions options;
  options.min_buckets = buckets;
  return options;
}

/// Rows rank, rank + N, ... of `b`: this rank's share of a batch (padding kept).
inline Batch share_of(const Batch& b, int rank, int ranks) {
  const Index rows = b.src.size(0);
  const Index mine = (rows - rank + ranks - 1) / ranks;
  Batch s;
  s.src = Tensor<TokenId>({mine, b.src.size(1)});
  s.tgt_in = Tensor<TokenId>({mine, b.tgt_in.size(1)});
  s.tgt_out = Tensor<TokenId>({mine, b.tgt_out.size(1)});
  for (Index i = 0; i < mine; ++i) {
    const Index r = rank + i * ranks;
    for (Index j = 0; j < b.src.size(1); ++j) s.src(i, j) = b.src(r, j);
    for (Index j = 0; j < b.tgt_in.size(1); ++j) {
      s.tgt_in(i, j) = b.tgt_in(r, j);
      s.tgt_out(i, j) = b.tgt_out(r, j);
    }
  }
  return s;
}

// Gives the norms of every decoder layer gradients of their own, as a model that does not gather
// its gradients into one buffer has (Module::gather_gradients): the buckets that hold them then
// pack. The optimiser is rebuilt, as it holds handles to the gradients.
template <class T>
void scatter_norm_gradients(testing::Trainer<T>& t) {
  for (auto& layer : t.model.decoder.layers)
    for (LayerNorm<T>* norm : {&layer->norm1, &layer->norm2, &layer->norm3})
      for (Parameter<T>* p : {&norm->weight, &norm->bias}) p->grad = Tensor<T>(p->grad.shape());
  t.adam = Adam<T>(t.model.parameters());
}

/// Whether a and b hold the same number of elements with the same bits.
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.numel())) == 0;
}

}  // namespace testing
}  // namespace attn
