#include "nncomm/core/readiness.hpp"

#include <stdexcept>
#include <utility>

namespace nncomm {

ReadinessTable::ReadinessTable(const std::vector<uintptr_t> &keys,
                               std::vector<std::vector<size_t>> written,
                               size_t num_gradients)
    : written_(std::move(written)), writers_(num_gradients, 0) {
  if (keys.size() != written_.size())
    throw std::invalid_argument("ReadinessTable: one key per function");
  index_.reserve(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == 0 || !index_.emplace(keys[k], k).second)
      throw std::invalid_argument("ReadinessTable: keys must be distinct "
                                  "and not 0");
    for (size_t i : written_[k]) {
      if (i >= num_gradients)
        throw std::out_of_range("ReadinessTable: no such gradient");
      ++writers_[i];
    }
  }
}

void Readiness::start(std::shared_ptr<const ReadinessTable> table) {
  table_ = std::move(table);
  pending_ = table_->writers();
  called_.assign(table_->num_functions(), 0);
  calls_left_ = table_->num_functions();
  last_ = 0;
}

void Readiness::count(size_t function, uintptr_t key,
                      std::vector<size_t> *ready) {
  called_[function] = 1;
  last_ = key;
  --calls_left_;
  for (size_t i : table_->written(function))
    if (--pending_[i] == 0)
      ready->push_back(i);
}

void Readiness::would_make_final(size_t function,
                                 std::vector<size_t> *ready) const {
  for (size_t i : table_->written(function))
    if (pending_[i] == 1)
      ready->push_back(i);
}

void Readiness::flush(std::vector<size_t> *ready) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i] > 0) {
      pending_[i] = 0;
      ready->push_back(i);
    }
  }
}

} // namespace nncomm
