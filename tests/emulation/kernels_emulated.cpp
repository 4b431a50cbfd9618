// The models' CUDA kernels and their launchers, compiled as C++ for the emulated CUDA device
// (tests/emulation/cuda_emulation.h, forced in first by the target).
#include "models/cuda/kernels.cu"
