// The one header users include: the whole of attn.
#pragma once

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

#include "attn/kernels/linear.hpp"

#include "attn/nn/linear.hpp"
#include "attn/nn/module.hpp"
