// Quantized gradients with error feedback (CNTK's 1-bit SGD, Seide et al.
// 2014, and its N-bit variant): the encoding of one rank's gradients into
// an int32 block and the decoding of every rank's blocks into their sum.
// Pure functions over host memory; the exchange of the blocks (one
// all-gather) is the caller's.
//
// A gradient of shape (d0, d1, ...) is a row-major matrix of d0 rows and
// d1 * ... columns (a 1-D gradient is one column, a scalar one row); each
// column is quantized on its own, from v = gradient + residual:
// - 1 bit: code = (v >= 0); the column's two values are the mean of the v
//   whose code is 0 and the mean of those whose code is 1 (0 for none),
//   summed in double from +0 row by row, divided in double, rounded to
//   float;
// - N = 2..8 bits: 2^N levels from the column's min to its max (float
//   compares, row by row, the first of equal values kept); step =
//   (max - min) / (2^N - 1) in float; code = floor((v - min) / step + 0.5)
//   in float, clamped to [0, 2^N - 1] (0 for NaN and where step is 0);
//   decoded = min + code * step in float.
// With a residual, residual = v - decoded afterwards (in float).
//
// Block layout, in int32 words: word 0 is the rank's state (0 once
// encoded; a caller that failed before encoding sends another value, and
// decoding then refuses every block); then the tensors in order; in each,
// its columns in order; each column is its two values as float bit
// patterns (1 bit: the code-0 and code-1 values; N bits: min and step;
// 0 and 0 for a column of no rows), then ceil(rows * N / 32) words of
// codes: row r's code occupies bits [r * N, (r + 1) * N) of the column's
// bit stream, whose bit k is bit k % 32 of word k / 32 (least-significant
// bits first; a code may cross two words; the unused high bits of the last
// word are 0).
#pragma once

#include <cstddef>
#include <cstdint>

#include "nncomm/core/status.hpp"

namespace nncomm {

constexpr int kMinQuantizationBits = 1;
constexpr int kMaxQuantizationBits = 8;

// One gradient as a matrix of `rows` x `cols` floats, row-major.
struct QuantizedTensor {
  // Read by the encoding; the decoding writes the sum here.
  float *gradient;
  // rows * cols floats carried between steps, or null for no error
  // feedback.
  float *residual;
  size_t rows;
  size_t cols;
};

// int32 words a column of `rows` elements takes in a block.
size_t quantized_column_words(size_t rows, int bits);

// int32 words one rank's block of `n` tensors takes.
size_t quantized_block_words(const QuantizedTensor *tensors, size_t n,
                             int bits);

// Encodes `n` tensors into `block` (quantized_block_words words), state
// word included, updating their residuals. Refuses bits out of [1, 8] and
// null or misaligned memory.
Status quantize_encode(const QuantizedTensor *tensors, size_t n, int bits,
                       int32_t *block);

// Writes into each tensor's gradient the sum over `ranks` blocks, laid end
// to end at `blocks`, of their decoded values: rank 0's value, then each
// next rank's added in float, in rank order; with `average`, the sum is
// then divided by `ranks` in float. Residuals are not touched. Refuses,
// writing nothing, when a block's state word is not 0 (RuntimeError naming
// those ranks).
Status quantize_decode_sum(const QuantizedTensor *tensors, size_t n,
                           int bits, const int32_t *blocks, size_t ranks,
                           bool average);

} // namespace nncomm
