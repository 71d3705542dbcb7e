// A FIFO of T in one grow-only power-of-two array: push_back and pop_front never allocate once it has grown to
// the largest backlog seen. (std::deque frees and allocates a block every few elements of a steady stream, which
// put a malloc and a free on the transports' per-message path.)
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace topoccl {

template <class T>
class RingQueue {
 public:
  bool empty() const noexcept { return head_ == tail_; }
  size_t size() const noexcept { return tail_ - head_; }
  T& front() noexcept { return slots_[head_ & mask_]; }
  const T& front() const noexcept { return slots_[head_ & mask_]; }
  // The i-th element from the front.
  T& operator[](size_t i) noexcept { return slots_[(head_ + i) & mask_]; }
  const T& operator[](size_t i) const noexcept { return slots_[(head_ + i) & mask_]; }

  void push_back(T value) {
    if (size() == slots_.size()) grow();
    slots_[tail_++ & mask_] = std::move(value);
  }
  void pop_front() noexcept {
    slots_[head_ & mask_] = T{};  // drops what the element holds now, not when its slot is reused
    ++head_;
  }
  void clear() noexcept {
    while (!empty()) pop_front();
  }

 private:
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 16 : 2 * slots_.size());
    const size_t n = size();
    for (size_t i = 0; i < n; ++i) bigger[i] = std::move((*this)[i]);
    slots_ = std::move(bigger);
    mask_ = slots_.size() - 1;
    head_ = 0;
    tail_ = n;
  }

  std::vector<T> slots_;
  size_t mask_ = 0;
  size_t head_ = 0;  // counters, not indices: the slot is counter & mask_
  size_t tail_ = 0;
};

}  // namespace topoccl
