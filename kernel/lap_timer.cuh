// kernel/lap_timer.cuh -- a warp's clock accounting of its phases, for a kernel's timing build
// (kernel.tools.profile): every thread sums in registers the clock64 cycles of each phase, each lap() charging
// the cycles since the last one to a phase, and flush() has lane 0 write the sums to the warp's row of the host's
// buffer, or nothing where the host pointed none (a null row: a timing build run by the tests for its arithmetic).
// With On false every call is empty, so that the builds the API launches hold no clock read. Included by
// the kernels' own timing headers (Kernel B's token_gradients_timing.cuh, the forward's forward_timing.cuh), each
// of which names its phases and its buffer.
#pragma once

template <int Phases, bool On>
struct LapTimer;

template <int Phases>
struct LapTimer<Phases, true> {
    long long last = 0;
    unsigned int t[Phases] = {};
    __device__ __forceinline__ void start() { last = clock64(); }
    __device__ __forceinline__ void lap(int phase) {   // the cycles since the last lap, to ``phase``
        const long long now = clock64();
        t[phase] += static_cast<unsigned int>(now - last);
        last = now;
    }
    __device__ __forceinline__ void flush(unsigned int* row, int lane) const {   // row: the warp's [Phases], or null
        if (lane != 0 || row == nullptr) return;
#pragma unroll
        for (int p = 0; p < Phases; ++p) row[p] = t[p];
    }
};

template <int Phases>
struct LapTimer<Phases, false> {
    __device__ __forceinline__ void start() {}
    __device__ __forceinline__ void lap(int) {}
    __device__ __forceinline__ void flush(unsigned int*, int) const {}
};
