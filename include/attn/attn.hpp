// The one header users include: the whole of attn but the headers that read or write safetensors
// files (train/safetensors*.hpp, checkpoint.hpp, averaging.hpp, model_file.hpp), which also need
// nlohmann-json (CMake target attn::checkpoint), and their POSIX file writer and reader
// (atomic_file.hpp, regular_file.hpp);
// train/data_parallel.hpp, overlapped_sums.hpp, ring_all_reduce.hpp and replica_agreement.hpp,
// which need MPI (attn::mpi); and
// kernels/gemm_naive.hpp, the tests' reference product.
#pragma once

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

#include "attn/kernels/attention.hpp"
#include "attn/kernels/attention_naive.hpp"
#include "attn/kernels/linear.hpp"

#include "attn/nn/decoder.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/embedding_sum.hpp"
#include "attn/nn/encoder.hpp"
#include "attn/nn/feed_forward.hpp"
#include "attn/nn/gradient_hook.hpp"
#include "attn/nn/layer_norm.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/module.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/nn/positional_encoding.hpp"
#include "attn/nn/residual.hpp"
#include "attn/nn/scored_positions.hpp"
#include "attn/nn/transformer.hpp"

#include "attn/train/adam.hpp"
#include "attn/train/clip.hpp"
#include "attn/train/label_smoothed_loss.hpp"
#include "attn/train/schedule.hpp"

#include "attn/decode/beam.hpp"
#include "attn/decode/beam_search.hpp"
#include "attn/decode/greedy.hpp"
#include "attn/decode/options.hpp"
