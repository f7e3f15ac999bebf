// Precompiled for every test: attn, Eigen and GoogleTest.
#pragma once
#include <gtest/gtest.h>

#include <attn/attn.hpp>
