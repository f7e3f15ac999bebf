// Reading and writing the safetensors format (huggingface/safetensors), so checkpoints move between
// attn and PyTorch.
//
// NOTE: this header and the reader it includes, safetensors_header.hpp, are the ones that need
// nlohmann-json (<nlohmann/json.hpp>, CMake package nlohmann_json); link attn::checkpoint, which
// brings it, when you include them or train/checkpoint.hpp, averaging.hpp or model_file.hpp. The
// rest of attn needs only Eigen.
//
// Layout of a file:
//   8 bytes        N, the header length, little-endian unsigned 64-bit
//   N bytes        UTF-8 JSON object, padded with spaces to a multiple of 8 (as the reference
//                  writer does):
//                    {"__metadata__": {"key": "value", ...},          (optional, strings only)
//                     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                     ...}
//   the rest       the data buffer: every tensor's raw little-endian bytes, row-major, at
//                  [begin, end) relative to the start of the buffer. The tensors tile the buffer
//                  exactly: no gaps, no overlaps, nothing after the last one.
// The header is read in linear time by safetensors_header.hpp; atomic_file.hpp does the writing.
// load_safetensors checks all of that and throws FormatError saying what is wrong; a file that
// cannot be opened or read is an IOError naming the path. save_safetensors writes atomically:
// either the target afterwards holds the complete new file, or it is untouched.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"
#include "attn/train/atomic_file.hpp"
#include "attn/train/regular_file.hpp"
#include "attn/train/safetensors_header.hpp"
#include "attn/train/safetensors_types.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "attn/train/safetensors.hpp copies raw bytes and supports little-endian hosts only"
#endif

namespace attn {

/// One tensor to write: a view of `nbytes` raw bytes at `data`, kept alive by `owner`.
struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<Index> shape;
  const void* data = nullptr;
  std::size_t nbytes = 0;
  std::shared_ptr<const void> owner;  // keeps `data` valid (a tensor handle or a byte vector)
};

/// An entry viewing `t` (shares its storage; no copy).
template <class T>
TensorEntry tensor_entry(std::string name, const Tensor<T>& t) {
  auto keep = std::make_shared<Tensor<T>>(t);
  return {std::move(name),
          dtype_of<T>(),
          t.shape().to_vector(),
          keep->data(),
          static_cast<std::size_t>(t.numel()) * sizeof(T),
          keep};
}

/// An entry owning `bytes` of any dtype (e.g. F16 data produced elsewhere).
inline TensorEntry bytes_entry(std::string name, Dtype dtype, std::vector<Index> shape,
                               std::vector<unsigned char> bytes) {
  auto keep = std::make_shared<std::vector<unsigned char>>(std::move(bytes));
  return {std::move(name), dtype, std::move(shape), keep->data(), keep->size(), keep};
}

/// A validated safetensors file held in memory.
class SafetensorsFile {
 public:
  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensor names in the order of the file's header.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  std::size_t size() const { return names_.size(); }

  /// FormatError when the file has no tensor `name`.
  const TensorInfo& info(const std::string& name) const {
    auto it = infos_.find(name);
    ATTN_CHECK(it != infos_.end(), FormatError, path_, ": no tensor named '", name, "'");
    return it->second;
  }
  /// Whether the tensors' bytes were read (false for read_safetensors_header's files).
  bool has_data() const { return !buffer_.empty(); }
  /// The tensor's raw bytes (info(name).end - begin of them); StateError without has_data().
  const unsigned char* bytes(const std::string& name) const {
    const TensorInfo& ti = info(name);
    ATTN_CHECK(has_data(), StateError, path_, ": only the header was read, not tensor ", name);
    return buffer_.data() + data_start_ + ti.begin;
  }

  /// A copy of tensor `name` as Tensor<T>; FormatError unless its dtype is dtype_of<T>().
  template <class T>
  Tensor<T> tensor(const std::string& name) const {
    const TensorInfo& ti = info(name);
    ATTN_CHECK(has_data(), StateError, path_, ": only the header was read, not tensor ", name);
    ATTN_CHECK(ti.dtype == dtype_of<T>(), FormatError, path_, ": tensor ", name, " has dtype ",
               ti.dtype, ", expected ", dtype_of<T>());
    ATTN_CHECK(ti.shape.size() <= static_cast<std::size_t>(Shape::kMaxRank), FormatError, path_,
               ": tensor ", name, " has rank ", ti.shape.size(), ", attn supports at most ",
               Shape::kMaxRank);
    Tensor<T> t{Shape(ti.shape)};
    if (ti.end > ti.begin) std::memcpy(t.data(), bytes(name), ti.end - ti.begin);
    return t;
  }

 private:
  friend SafetensorsFile parse_safetensors(std::vector<unsigned char> bytes,
                                           const std::string& path);
  friend SafetensorsFile load_safetensors(
      const std::string& path, const std::function<void(const SafetensorsFile&)>& check_header);
  friend SafetensorsFile read_safetensors_header(const std::string& path);
  static SafetensorsFile indexed(const RegularFile& file, const std::string& path,
                                 std::vector<unsigned char>& head);
  void index(const unsigned char* head, std::size_t file_size);
  void index_tensors(detail::SafetensorsHeader header, std::size_t data_size);

  std::string path_;
  std::vector<unsigned char> buffer_;  // the whole file
  std::size_t data_start_ = 0;         // 8 + header length
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (in the given order) and `metadata` to `path` atomically
/// (write_file_atomically: on any failure the temporary file is removed, `path` is left as it was,
/// and IOError is thrown; the result's warning says when the directory entry could not be made
/// durable). Names must be unique, non-empty and not "__metadata__", and they and the metadata
/// valid UTF-8 (the header is JSON text); each entry's byte count must match its dtype and shape
/// (ConfigError / ShapeError otherwise, before anything is written).
inline AtomicWriteResult save_safetensors(const std::string& path,
                                          const std::vector<TensorEntry>& tensors,
                                          const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) {
      detail::check_header_text(k, "metadata key", k);
      detail::check_header_text(v, "the value of metadata key", k);
      meta[k] = v;
    }
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    ATTN_CHECK(!t.name.empty() && t.name != "__metadata__", ConfigError,
               "save_safetensors: invalid tensor name '", t.name, "'");
    detail::check_header_text(t.name, "tensor name", t.name);
    ATTN_CHECK(seen.insert(t.name).second, ConfigError, "save_safetensors: tensor name '", t.name,
               "' appears twice");
    // The reader's rule (checked_tensor_info): the product of the non-zero extents, times 8,
    // fits in size_t. A product that wrapped (to 0 for [2^62, 4]) wrote a file it refuses.
    std::size_t numel = 1;
    bool has_zero = false;
    for (Index d : t.shape) {
      ATTN_CHECK(d >= 0, ShapeError, "save_safetensors: tensor ", t.name,
                 " has negative extent in ", shape_str(t.shape));
      if (d == 0) {
        has_zero = true;
        continue;
      }
      ATTN_CHECK(numel <= std::numeric_limits<std::size_t>::max() / 8 / static_cast<std::size_t>(d),
                 ShapeError, "save_safetensors: tensor ", t.name, " of shape ", shape_str(t.shape),
                 " is too large");
      numel *= static_cast<std::size_t>(d);
    }
    if (has_zero) numel = 0;
    ATTN_CHECK(numel * dtype_size(t.dtype) == t.nbytes, ShapeError, "save_safetensors: tensor ",
               t.name, " of dtype ", t.dtype, " and shape ", shape_str(t.shape), " needs ",
               numel * dtype_size(t.dtype), " bytes, got ", t.nbytes);
    ATTN_CHECK(t.nbytes == 0 || t.data != nullptr, ConfigError, "save_safetensors: tensor ", t.name,
               " has no data");
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  return write_file_atomically(path, [&](int fd, std::size_t& written) {
    if (!detail::write_all(fd, len, 8, written) ||
        !detail::write_all(fd, text.data(), text.size(), written))
      return false;
    for (const auto& t : tensors)
      if (!detail::write_all(fd, t.data, t.nbytes, written)) return false;
    return true;
  });
}

namespace detail {

/// The TensorInfo of a header entry after checking its dtype, shape and offsets against a data
/// buffer of `data_size` bytes; FormatError naming the tensor otherwise.
inline TensorInfo checked_tensor_info(const RawTensorEntry& raw, std::size_t data_size,
                                      const std::string& path) {
  const std::string& name = raw.name;
  TensorInfo ti{};
  bool known = false;
  for (const auto& e : dtype_table())
    if (raw.dtype == e.name) ti.dtype = e.dtype, known = true;
  ATTN_CHECK(known, FormatError, path, ": tensor ", name, ": unknown dtype \"", raw.dtype, "\"");
  // The product of the non-zero extents must fit even when a zero extent empties the tensor:
  // Shape::numel multiplies the extents in order, and [2^32, 2^32, 0] would overflow Index.
  std::size_t numel = 1;
  bool overflow = false, has_zero = false;
  for (const std::uint64_t e : raw.shape) {
    ATTN_CHECK(e <= static_cast<std::uint64_t>(std::numeric_limits<Index>::max()), FormatError,
               path, ": tensor ", name, ": shape extent ", e, " is too large");
    ti.shape.push_back(static_cast<Index>(e));
    if (e == 0)
      has_zero = true;
    else if (numel > std::numeric_limits<std::size_t>::max() / 8 / e)
      overflow = true;
    else
      numel *= static_cast<std::size_t>(e);
  }
  ATTN_CHECK(!overflow, FormatError, path, ": tensor ", name, ": shape ", shape_str(ti.shape),
             " is too large");
  if (has_zero) numel = 0;
  const std::uint64_t b = raw.data_offsets[0], e = raw.data_offsets[1];
  ATTN_CHECK(b <= e && e <= data_size, FormatError, path, ": tensor ", name, ": data_offsets [", b,
             ", ", e, "] are out of bounds of the ", data_size, "-byte data buffer");
  ti.begin = static_cast<std::size_t>(b);
  ti.end = static_cast<std::size_t>(e);
  ATTN_CHECK(numel * dtype_size(ti.dtype) == ti.end - ti.begin, FormatError, path, ": tensor ",
             name, ": dtype ", ti.dtype, " and shape ", shape_str(ti.shape), " need ",
             numel * dtype_size(ti.dtype), " bytes, but data_offsets [", b, ", ", e, "] hold ",
             e - b);
  return ti;
}

/// The header length N in a safetensors file's first 8 bytes (little-endian).
inline std::uint64_t header_length(const unsigned char* first8) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  return n;
}

}  // namespace detail

/// Reads the header at `head` of a file of `file_size` bytes into the tables, and checks them and
/// the data buffer's size: everything but the tensors' bytes. `head` holds the file's first 8 + N
/// bytes (N the header length it declares) or, when N is out of bounds, its first 8 (or all of a
/// shorter file). FormatError naming what is wrong.
inline void SafetensorsFile::index(const unsigned char* head, std::size_t file_size) {
  ATTN_CHECK(file_size >= 8, FormatError, path_, ": file is ", file_size,
             " bytes, shorter than the 8-byte header length of a safetensors file");
  const std::uint64_t n = detail::header_length(head);
  ATTN_CHECK(n <= detail::kMaxSafetensorsHeader, FormatError, path_, ": header length ", n,
             " exceeds the limit of ", detail::kMaxSafetensorsHeader, " bytes (corrupt file?)");
  ATTN_CHECK(n <= file_size - 8, FormatError, path_, ": header length ", n,
             " runs past the end of the file (", file_size, " bytes)");
  ATTN_CHECK(n >= 2 && head[8] == '{', FormatError, path_,
             ": header does not start with a JSON object");
  data_start_ = 8 + static_cast<std::size_t>(n);
  index_tensors(detail::parse_safetensors_header(head + 8, head + data_start_, path_),
                file_size - data_start_);
}

/// The tables of `header`'s tensors, which must tile the data buffer of `data_size` bytes.
inline void SafetensorsFile::index_tensors(detail::SafetensorsHeader header,
                                           std::size_t data_size) {
  metadata_ = std::move(header.metadata);
  struct Span {
    std::size_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (detail::RawTensorEntry& raw : header.tensors) {
    TensorInfo ti = detail::checked_tensor_info(raw, data_size, path_);
    names_.push_back(std::move(raw.name));
    spans.push_back({ti.begin, ti.end, nullptr});
    infos_.emplace(names_.back(), std::move(ti));
  }
  // names_ may have reallocated: re-point the spans at the final strings.
  for (std::size_t i = 0; i < spans.size(); ++i) spans[i].name = &names_[i];
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t expected = 0;
  const std::string* prev = nullptr;
  for (const Span& s : spans) {
    ATTN_CHECK(s.begin == expected, FormatError, path_, ": tensor ", *s.name, " starts at byte ",
               s.begin, " of the data buffer but ",
               prev ? "the previous tensor " + *prev + " ends at byte "
                    : std::string("data starts at byte "),
               expected, s.begin < expected ? " (overlap)" : " (gap)");
    expected = s.end;
    prev = s.name;
  }
  ATTN_CHECK(expected == data_size, FormatError, path_, ": the tensors cover ", expected,
             " bytes but the data buffer holds ", data_size, " (trailing bytes or truncated file)");
}

/// Validates `bytes` as the content of a safetensors file and takes them; `path` names the source
/// in error messages. FormatError if they are not a well-formed safetensors file.
inline SafetensorsFile parse_safetensors(std::vector<unsigned char> bytes,
                                         const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.index(bytes.data(), bytes.size());
  f.buffer_ = std::move(bytes);
  return f;
}

/// Reads the header of `file` (opened at `path`) into `head` and indexes it: the file as
/// read_safetensors_header returns it.
inline SafetensorsFile SafetensorsFile::indexed(const RegularFile& file, const std::string& path,
                                                std::vector<unsigned char>& head) {
  const std::size_t size = file.size();
  head.resize(std::min<std::size_t>(size, 8));
  file.read_next(head.data(), head.size());
  if (size >= 8) {
    const std::uint64_t n = detail::header_length(head.data());
    if (n <= detail::kMaxSafetensorsHeader && n <= size - 8) {  // else index() says what is wrong
      head.resize(8 + static_cast<std::size_t>(n));
      file.read_next(head.data() + 8, head.size() - 8);
    }
  }
  SafetensorsFile f;
  f.path_ = path;
  f.index(head.data(), size);
  return f;
}

/// The file's header, checked as load_safetensors checks it (the tensors it declares tile the
/// rest of the file exactly), without reading the tensors: names(), info() and metadata() answer,
/// bytes() and tensor() throw StateError. For what a file says about itself (a model's
/// configuration) before deciding to read it.
inline SafetensorsFile read_safetensors_header(const std::string& path) {
  const RegularFile file(path, std::numeric_limits<std::size_t>::max());
  std::vector<unsigned char> head;
  return SafetensorsFile::indexed(file, path, head);
}

/// Reads and validates the whole file. IOError naming the path if it cannot be read or is not a
/// regular file (RegularFile), or does not fit in memory; FormatError if its content is not a
/// well-formed safetensors file. The header is read and checked first, and the rest only once the
/// tensors it declares tile it exactly: a model file extended by a sparse hole of 2 GB was read
/// whole (2.1 GB resident, 10 s) before it was refused, one of 1 TB ended in std::bad_alloc.
/// `check_header`, if given, is called with the file as read_safetensors_header returns it, before
/// the tensors are read: it throws to refuse a file whose names, shapes or sizes the caller would
/// refuse anyway (a tensor the model does not have, declared 1 TB long over a sparse hole, was
/// read whole before load_model refused its name).
inline SafetensorsFile load_safetensors(
    const std::string& path,
    const std::function<void(const SafetensorsFile&)>& check_header = nullptr) {
  const RegularFile file(path, std::numeric_limits<std::size_t>::max());
  const std::size_t size = file.size();
  std::vector<unsigned char> head;
  SafetensorsFile f = SafetensorsFile::indexed(file, path, head);
  if (check_header) check_header(f);
  try {
    f.buffer_.resize(size);
  } catch (const std::bad_alloc&) {
    throw IOError(detail::concat("cannot read ", path, ": its ", size,
                                 " bytes do not fit in this machine's memory"));
  }
  std::memcpy(f.buffer_.data(), head.data(), head.size());
  file.read_next(f.buffer_.data() + head.size(), size - head.size());
  return f;
}

}  // namespace attn
