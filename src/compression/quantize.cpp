#include "nncomm/compression/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace nncomm {

namespace {

// Columns handled together: a row of them is one 64-byte cache line of
// floats, where a column alone would read a line per element.
constexpr size_t kColumnGroup = 16;
// Rows of a group's columns coded at a time: they are copied into a tile,
// column by column, and back, so that each line of the tensor is touched
// once however its rows fall into cache sets (a power-of-two row length
// puts them all in one), and each column's bit stream stays in registers.
constexpr size_t kRowChunk = 128;

using Tile = float[kColumnGroup][kRowChunk];

uint32_t top_code(int bits) { return (1u << bits) - 1; }

// How one code width codes and decodes a value, given its column's two
// values a and b (and the highest code).
struct OneBit {
  static uint32_t code(float v, float, float, uint32_t) {
    return v >= 0.0f ? 1 : 0;
  }
  static float decoded(uint32_t code, float a, float b) {
    return code != 0 ? b : a;
  }
};

struct Levels {
  static uint32_t code(float v, float a, float b, uint32_t top) {
    if (b == 0.0f)
      return 0;
    // floor(q) >= top exactly when q >= top, and below that floor is the
    // truncation of a non-negative q (through int32, which SSE2 converts
    // four at a time); NaN fails both compares and takes code 0, never an
    // undefined cast.
    const float q = (v - a) / b + 0.5f;
    if (q >= static_cast<float>(top))
      return top;
    return q >= 0.0f ? static_cast<uint32_t>(static_cast<int32_t>(q)) : 0;
  }
  static float decoded(uint32_t code, float a, float b) {
    return a + static_cast<float>(code) * b;
  }
};

float value(const QuantizedTensor &t, size_t i) {
  return t.residual != nullptr ? t.gradient[i] + t.residual[i]
                               : t.gradient[i];
}

void put_float(uint32_t *word, float f) { std::memcpy(word, &f, sizeof f); }

float get_float(const uint32_t *word) {
  float f;
  std::memcpy(&f, word, sizeof f);
  return f;
}

// A column's codes, least-significant bits first; a code may straddle two
// words, so bits wait in a 64-bit accumulator until a word is full.
class BitWriter {
public:
  void start(uint32_t *out) {
    out_ = out;
    acc_ = 0;
    filled_ = 0;
  }
  void put(uint32_t code, int bits) {
    acc_ |= static_cast<uint64_t>(code) << filled_;
    filled_ += bits;
    if (filled_ >= 32) {
      *out_++ = static_cast<uint32_t>(acc_);
      acc_ >>= 32;
      filled_ -= 32;
    }
  }
  void flush() {
    if (filled_ > 0)
      *out_++ = static_cast<uint32_t>(acc_);
  }

private:
  uint32_t *out_ = nullptr;
  uint64_t acc_ = 0;
  int filled_ = 0;
};

class BitReader {
public:
  void start(const uint32_t *in) {
    in_ = in;
    acc_ = 0;
    available_ = 0;
  }
  // Reads a word only when the code needs it, so never past the column.
  uint32_t get(int bits) {
    if (available_ < bits) {
      acc_ |= static_cast<uint64_t>(*in_++) << available_;
      available_ += 32;
    }
    const uint32_t code = static_cast<uint32_t>(acc_) & top_code(bits);
    acc_ >>= bits;
    available_ -= bits;
    return code;
  }

private:
  const uint32_t *in_ = nullptr;
  uint64_t acc_ = 0;
  int available_ = 0;
};

// Columns [c0, c0 + w) of a tensor whose columns take `words` words each,
// the first of them at `offset` in a block.
struct ColumnGroup {
  size_t c0;
  size_t w;
  size_t words;
  size_t offset;
};

// Calls f(tensor, group) for the tensors' column groups in block order,
// from the block's first word past its state word.
template <typename F>
void for_column_groups(const QuantizedTensor *tensors, size_t n, int bits,
                       F &&f) {
  size_t offset = 1;
  for (size_t k = 0; k < n; ++k) {
    const QuantizedTensor &t = tensors[k];
    const size_t words = quantized_column_words(t.rows, bits);
    for (size_t c0 = 0; c0 < t.cols; c0 += kColumnGroup) {
      f(t, ColumnGroup{c0, std::min(kColumnGroup, t.cols - c0), words,
                       offset + c0 * words});
    }
    offset += t.cols * words;
  }
}

// Calls f(r0, n) for the chunks of rows [r0, r0 + n) of a tensor.
template <typename F> void for_row_chunks(const QuantizedTensor &t, F &&f) {
  for (size_t r0 = 0; r0 < t.rows; r0 += kRowChunk)
    f(r0, std::min(kRowChunk, t.rows - r0));
}

// tile[j][k] = matrix[r0 + k][c0 + j], from a row-major matrix of `cols`
// columns; and back.
void load_tile(const float *matrix, size_t cols, const ColumnGroup &g,
               size_t r0, size_t n, Tile &tile) {
  for (size_t k = 0; k < n; ++k) {
    const float *row = matrix + (r0 + k) * cols + g.c0;
    for (size_t j = 0; j < g.w; ++j)
      tile[j][k] = row[j];
  }
}

void store_tile(const Tile &tile, const ColumnGroup &g, size_t r0, size_t n,
                size_t cols, float *matrix) {
  for (size_t k = 0; k < n; ++k) {
    float *row = matrix + (r0 + k) * cols + g.c0;
    for (size_t j = 0; j < g.w; ++j)
      row[j] = tile[j][k];
  }
}

// The two values of each column of `g`: the means of its code-0 and
// code-1 v (1 bit), or its min and step.
void column_values(const QuantizedTensor &t, const ColumnGroup &g, int bits,
                   float *a, float *b) {
  if (bits == 1) {
    double sum[2][kColumnGroup] = {};
    size_t ones[kColumnGroup] = {};
    for (size_t r = 0; r < t.rows; ++r) {
      for (size_t j = 0; j < g.w; ++j) {
        const float v = value(t, r * t.cols + g.c0 + j);
        const bool one = OneBit::code(v, 0.0f, 0.0f, 1) != 0;
        // A sum that starts at +0 is never -0, so adding +0 leaves it as
        // it is: both sides take every row, without a branch.
        sum[0][j] += one ? 0.0 : v;
        sum[1][j] += one ? v : 0.0;
        ones[j] += one;
      }
    }
    for (size_t j = 0; j < g.w; ++j) {
      const size_t zeros = t.rows - ones[j];
      a[j] = zeros ? static_cast<float>(sum[0][j] / zeros) : 0.0f;
      b[j] = ones[j] ? static_cast<float>(sum[1][j] / ones[j]) : 0.0f;
    }
    return;
  }
  float low[kColumnGroup], high[kColumnGroup];
  for (size_t j = 0; j < g.w; ++j)
    low[j] = high[j] = t.rows > 0 ? value(t, g.c0 + j) : 0.0f;
  for (size_t r = 1; r < t.rows; ++r) {
    for (size_t j = 0; j < g.w; ++j) {
      const float v = value(t, r * t.cols + g.c0 + j);
      low[j] = v < low[j] ? v : low[j];
      high[j] = v > high[j] ? v : high[j];
    }
  }
  for (size_t j = 0; j < g.w; ++j) {
    a[j] = low[j];
    b[j] = (high[j] - low[j]) / static_cast<float>(top_code(bits));
  }
}

template <typename Code>
void encode_group(const QuantizedTensor &t, const ColumnGroup &g, int bits,
                  uint32_t *block) {
  float a[kColumnGroup], b[kColumnGroup];
  BitWriter codes[kColumnGroup];
  column_values(t, g, bits, a, b);
  for (size_t j = 0; j < g.w; ++j) {
    uint32_t *column = block + g.offset + j * g.words;
    put_float(column, a[j]);
    put_float(column + 1, b[j]);
    codes[j].start(column + 2);
  }
  const uint32_t top = top_code(bits);
  Tile v, residual;
  for_row_chunks(t, [&](size_t r0, size_t n) {
    load_tile(t.gradient, t.cols, g, r0, n, v);
    if (t.residual != nullptr) {
      load_tile(t.residual, t.cols, g, r0, n, residual);
      for (size_t j = 0; j < g.w; ++j) {
        for (size_t k = 0; k < n; ++k)
          v[j][k] += residual[j][k];
      }
    }
    // Codes and residuals a chunk at a time (loops the compiler
    // vectorizes); only the bit stream goes element by element.
    for (size_t j = 0; j < g.w; ++j) {
      uint32_t code[kRowChunk];
      for (size_t k = 0; k < n; ++k)
        code[k] = Code::code(v[j][k], a[j], b[j], top);
      for (size_t k = 0; k < n; ++k)
        residual[j][k] = v[j][k] - Code::decoded(code[k], a[j], b[j]);
      for (size_t k = 0; k < n; ++k)
        codes[j].put(code[k], bits);
    }
    if (t.residual != nullptr)
      store_tile(residual, g, r0, n, t.cols, t.residual);
  });
  for (size_t j = 0; j < g.w; ++j)
    codes[j].flush();
}

// Adds one rank's decoded columns into the gradient (writes them for the
// first rank); `divisor`, when not 0, then divides the sum.
template <typename Code>
void decode_group(const QuantizedTensor &t, const ColumnGroup &g, int bits,
                  const uint32_t *block, bool first, float divisor) {
  float a[kColumnGroup], b[kColumnGroup];
  BitReader codes[kColumnGroup];
  for (size_t j = 0; j < g.w; ++j) {
    const uint32_t *column = block + g.offset + j * g.words;
    a[j] = get_float(column);
    b[j] = get_float(column + 1);
    codes[j].start(column + 2);
  }
  Tile sum;
  for_row_chunks(t, [&](size_t r0, size_t n) {
    if (!first)
      load_tile(t.gradient, t.cols, g, r0, n, sum);
    for (size_t j = 0; j < g.w; ++j) {
      uint32_t code[kRowChunk];
      for (size_t k = 0; k < n; ++k)
        code[k] = codes[j].get(bits);
      for (size_t k = 0; k < n; ++k) {
        const float d = Code::decoded(code[k], a[j], b[j]);
        const float total = first ? d : sum[j][k] + d;
        sum[j][k] = divisor != 0.0f ? total / divisor : total;
      }
    }
    store_tile(sum, g, r0, n, t.cols, t.gradient);
  });
}

bool aligned(const void *p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

Status check(const QuantizedTensor *tensors, size_t n, int bits,
             const void *block) {
  if (bits < kMinQuantizationBits || bits > kMaxQuantizationBits) {
    return Status::InvalidArgument("quantization bits must be 1 to 8, not " +
                                   std::to_string(bits));
  }
  for (size_t k = 0; k < n; ++k) {
    const QuantizedTensor &t = tensors[k];
    const std::string what = "tensor " + std::to_string(k) + ": ";
    if (t.rows * t.cols > 0 && t.gradient == nullptr)
      return Status::InvalidArgument(what + "null gradient");
    if (!aligned(t.gradient, alignof(float)) ||
        !aligned(t.residual, alignof(float))) {
      return Status::InvalidArgument(
          what + "gradient or residual not aligned to a float");
    }
  }
  if (block == nullptr || !aligned(block, alignof(int32_t)))
    return Status::InvalidArgument("block null or not aligned to int32");
  return Status::Ok();
}

} // namespace

size_t quantized_column_words(size_t rows, int bits) {
  return 2 + (rows * bits + 31) / 32;
}

size_t quantized_block_words(const QuantizedTensor *tensors, size_t n,
                             int bits) {
  size_t words = 1;
  for (size_t k = 0; k < n; ++k)
    words += tensors[k].cols * quantized_column_words(tensors[k].rows, bits);
  return words;
}

Status quantize_encode(const QuantizedTensor *tensors, size_t n, int bits,
                       int32_t *block) {
  NNCOMM_RETURN_IF_ERROR(check(tensors, n, bits, block));
  uint32_t *words = reinterpret_cast<uint32_t *>(block);
  words[0] = 0;
  for_column_groups(tensors, n, bits,
                    [&](const QuantizedTensor &t, const ColumnGroup &g) {
                      if (bits == 1)
                        encode_group<OneBit>(t, g, bits, words);
                      else
                        encode_group<Levels>(t, g, bits, words);
                    });
  return Status::Ok();
}

Status quantize_decode_sum(const QuantizedTensor *tensors, size_t n,
                           int bits, const int32_t *blocks, size_t ranks,
                           bool average) {
  NNCOMM_RETURN_IF_ERROR(check(tensors, n, bits, blocks));
  const size_t stride = quantized_block_words(tensors, n, bits);
  // Every block is looked at before any gradient is written, so that a
  // failed rank leaves every rank's gradients as they were.
  std::string failed;
  for (size_t k = 0; k < ranks; ++k) {
    if (blocks[k * stride] != 0)
      failed += (failed.empty() ? "" : ", ") + std::to_string(k);
  }
  if (!failed.empty()) {
    return Status::RuntimeError("ranks " + failed +
                                " (in group order) failed before their "
                                "gradients were quantized; nothing was "
                                "reduced");
  }
  for (size_t k = 0; k < ranks; ++k) {
    const uint32_t *block =
        reinterpret_cast<const uint32_t *>(blocks + k * stride);
    const float divisor =
        average && k + 1 == ranks ? static_cast<float>(ranks) : 0.0f;
    for_column_groups(
        tensors, n, bits, [&](const QuantizedTensor &t, const ColumnGroup &g) {
          if (bits == 1)
            decode_group<OneBit>(t, g, bits, block, k == 0, divisor);
          else
            decode_group<Levels>(t, g, bits, block, k == 0, divisor);
        });
  }
  return Status::Ok();
}

} // namespace nncomm
