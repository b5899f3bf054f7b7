# Declarations of PowerSGD's host passes
# (include/nncomm/compression/low_rank.hpp). Nothing but externs.

from libc.stddef cimport size_t


cdef extern from "nncomm/compression/low_rank.hpp" namespace "nncomm" nogil:
    struct LowRankMatrix:
        size_t n
        size_t m
        size_t r
        float* gradient
        float* kept
        const float* p_last
        const float* qt_last

    void low_rank_project(const LowRankMatrix& a, float estimate_scale,
                          const float* qt, float* p)
    void low_rank_back_project(const LowRankMatrix& a, const float* p,
                               float* qt)
    void low_rank_expand(const LowRankMatrix& a, const float* p,
                         const float* qt)
