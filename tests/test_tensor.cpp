// Tensor<T>: shapes, aligned storage, views without copies, Eigen maps, element access, errors.
#include <cstdint>

#include "error_helpers.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(Tensor, ZeroInitialisedAndAligned) {
  Tensor<float> t({2, 3, 4, 5});
  EXPECT_EQ(t.rank(), 4);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (float v : t) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(t.shape().str(), "[2, 3, 4, 5]");
  // Small blocks (calloc clears them) and a large one (fresh pages from the kernel) alike.
  for (Index n : {1, 17, 1000, 1 << 23}) {
    Tensor<double> d({n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d.data()) % 64, 0u) << n;
    EXPECT_EQ(d.vector().cwiseAbs().maxCoeff(), 0.0) << n;
  }
}

TEST(Tensor, RowMajorElementAccess) {
  auto t = Tensor<double>::from({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(t(1, 2), 5.0);
  EXPECT_EQ(t.at({0, 1}), 1.0);
  t(1, 0) = 42;
  EXPECT_EQ(t.data()[3], 42.0);
}

TEST(Tensor, CopiesShareStorageCloneDoesNot) {
  Tensor<float> a({4});
  Tensor<float> b = a;
  b(2) = 7;
  EXPECT_EQ(a(2), 7.0f);
  Tensor<float> c = a.clone();
  c(2) = 1;
  EXPECT_EQ(a(2), 7.0f);
  EXPECT_FALSE(c.same_data(a));
}

TEST(Tensor, ReshapeIsAViewAndInfersOneExtent) {
  auto t = Tensor<float>::from({2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor<float> v = t.reshape({3, -1});
  EXPECT_EQ(v.shape(), Shape({3, 4}));
  EXPECT_TRUE(v.same_data(t));
  EXPECT_EQ(v(2, 1), 9.0f);
  v(0, 0) = -1;
  EXPECT_EQ(t(0, 0), -1.0f);
}

TEST(Tensor, LeadingAxisSlicesAreViews) {
  Tensor<float> t({3, 2, 2});
  for (Index i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(i);
  Tensor<float> s = t.slice(1);
  EXPECT_EQ(s.shape(), Shape({2, 2}));
  EXPECT_EQ(s(0, 0), 4.0f);
  s(1, 1) = 100;
  EXPECT_EQ(t(1, 1, 1), 100.0f);
  Tensor<float> r = t.slice(1, 3);
  EXPECT_EQ(r.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(r(0, 0, 0), 4.0f);
  EXPECT_EQ(r.data(), t.data() + 4);
}

TEST(Tensor, ShapeWithLastExtentAndFromARange) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.with_last(7), Shape({2, 3, 7}));
  EXPECT_EQ(Shape(s.begin() + 1, s.end()), Shape({3, 4}));
  EXPECT_EQ(Shape(s.begin(), s.begin()), Shape());
  EXPECT_THROW(Shape().with_last(3), ShapeError);
  EXPECT_THROW(s.with_last(-1), ShapeError);
}

TEST(Tensor, MatrixViewFlattensLeadingAxes) {
  Tensor<float> t({2, 3, 4});
  auto m = t.matrix();
  EXPECT_EQ(m.rows(), 6);
  EXPECT_EQ(m.cols(), 4);
  m(5, 3) = 9;
  EXPECT_EQ(t(1, 2, 3), 9.0f);
  EXPECT_EQ(t.vector().size(), 24);
}

TEST(Tensor, ResizeReusesOwnedStorage) {
  Tensor<float> t({4, 4});
  const float* before = t.data();
  t.resize({2, 8});
  EXPECT_EQ(t.data(), before);
  t.resize({2, 4});
  EXPECT_EQ(t.data(), before);
  t.resize({5, 5});
  EXPECT_NE(t.data(), before);
  EXPECT_EQ(t.shape(), Shape({5, 5}));
}

TEST(Tensor, ErrorsNameExpectedAndActual) {
  Tensor<float> t({2, 3});
  try {
    t.reshape({4, 2});
    FAIL() << "reshape to a different numel must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.slice(2), IndexError);
  EXPECT_THROW(t.slice(1, 3), IndexError);
  EXPECT_THROW(t.at({0, 3}), IndexError);
  EXPECT_THROW(t.at({0}), IndexError);
  EXPECT_THROW(Tensor<float>({1, 2, 3, 4, 5, 6, 7}), ShapeError);
  EXPECT_THROW(Tensor<float>({2, -1}), ShapeError);
  EXPECT_THROW((Tensor<float>::from({2, 2}, {1, 2, 3})), ShapeError);
  EXPECT_THROW(check_shape(t, Shape({3, 2}), "x"), ShapeError);
  EXPECT_THROW(t.reshape({-1, -1}), ShapeError);
}

TEST(Tensor, ShapesWhoseElementCountOverflowsAreRefusedBeforeAllocating) {
  // 2^32 * 2^32 used to wrap Shape::numel to 0 (UB), and [2^61, 2] floats allocated a wrapped byte
  // count.
  const Index big = Index(1) << 32;
  const std::string msg = testing::error_of<ShapeError>([&] { Shape s({big, big}); });
  EXPECT_NE(msg.find("tensor shape [4294967296, 4294967296] has more elements than an Index"),
            std::string::npos)
      << msg;
  EXPECT_THROW(Shape({big, big, 0}), ShapeError);  // a zero extent does not hide the overflow
  EXPECT_EQ(Shape({big, 0}).numel(), 0);
  EXPECT_EQ(Shape({big, Index(1) << 30}).numel(), Index(1) << 62);
  const std::string alloc = testing::error_of<ShapeError>([&] {
    Tensor<float> t(Shape({Index(1) << 61, 2}));
  });
  EXPECT_NE(alloc.find("elements of 4 bytes is too large to allocate"), std::string::npos) << alloc;
}

TEST(Tensor, ErrorHierarchy) {
  EXPECT_THROW(throw FormatError("x"), IOError);
  EXPECT_THROW(throw ShapeError("x"), Error);
  EXPECT_THROW(ATTN_ASSERT(1 == 2), InternalError);
}

TEST(Random, SeededAndReproducible) {
  Rng a(7), b(7), c(8);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  Rng d(7, a.counter());
  EXPECT_EQ(a.uniform(), d.uniform());
  double sum = 0;
  Rng e(1);
  for (int i = 0; i < 10000; ++i) sum += e.uniform();
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(Random, XavierUniformBound) {
  Tensor<double> w({30, 20});
  Rng rng(3);
  xavier_uniform(w, rng);
  const double a = std::sqrt(6.0 / 50.0);
  double max_abs = 0;
  for (double v : w) max_abs = std::max(max_abs, std::abs(v));
  EXPECT_LE(max_abs, a);
  EXPECT_GT(max_abs, 0.9 * a);
}

}  // namespace
}  // namespace attn
