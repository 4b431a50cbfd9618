# Finds every dependency and gives each one target (see ../shared/DEPENDENCIES.md).
find_package(Threads REQUIRED)

# CAF 0.17 ships no CMake config and no .pc file.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
if(NOT CAF_INCLUDE_DIR OR NOT CAF_CORE_LIBRARY)
  message(FATAL_ERROR "CAF (libcaf-dev) not found: run scripts/install-deps.sh")
endif()
add_library(CAF::core UNKNOWN IMPORTED)
set_target_properties(CAF::core PROPERTIES
  IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR}
  INTERFACE_LINK_LIBRARIES Threads::Threads)

find_package(ucx CONFIG REQUIRED)
find_package(CapnProto CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)

# CUDA and NCCL: the host code needs find_package(CUDAToolkit) only; the models' kernels
# (models/cuda/) need nvcc too, for sm_90 with PTX (`native` fails without a GPU).
set(TROUPE_HAVE_CUDA OFF)
set(TROUPE_HAVE_CUDA_KERNELS OFF)
set(TROUPE_CUDART CUDA::cudart)
set(TROUPE_CUBLASLT CUDA::cublasLt)
set(TROUPE_NCCL NCCL::nccl)
# TROUPE_CUDA_EMULATION: every CUDA path built on the emulated device of tests/emulation (the
# kernels as C++ on fibers, the runtime calls Troupe makes on host memory, GEMMs on the CPU's BLAS,
# no NCCL), so that the GPU tests and scripts/gpu-elastic.sh run on a machine without a GPU
# (`make emulated`). It checks logic, not the GPU.
option(TROUPE_CUDA_EMULATION "Build the CUDA device emulated on the CPU (tests only)" OFF)
if(TROUPE_CUDA_EMULATION)
  find_package(CUDAToolkit REQUIRED)  # (its headers)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include REQUIRED)
  add_library(troupe_cuda_emulated STATIC ${PROJECT_SOURCE_DIR}/tests/emulation/cuda_emulation.cpp
              ${PROJECT_SOURCE_DIR}/tests/emulation/cudart_emulated.cpp
              ${PROJECT_SOURCE_DIR}/tests/emulation/nccl_emulated.cpp)
  target_include_directories(troupe_cuda_emulated PUBLIC ${PROJECT_SOURCE_DIR}
                             ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
  set_target_properties(troupe_cuda_emulated PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set(TROUPE_CUDART troupe_cuda_emulated)
  set(TROUPE_CUBLASLT "")
  set(TROUPE_NCCL troupe_cuda_emulated)
  set(TROUPE_HAVE_CUDA ON)
  set(TROUPE_HAVE_CUDA_KERNELS ON)
  message(STATUS "troupe: TROUPE_CUDA_EMULATION: the CUDA device emulated on the CPU")
elseif(NOT TROUPE_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  endif()
  if(CUDAToolkit_FOUND AND NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION ${NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    set(TROUPE_HAVE_CUDA ON)
    message(STATUS "troupe: CUDA ${CUDAToolkit_VERSION} and NCCL found: building the CUDA/NCCL code")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
      enable_language(CUDA)
      set(TROUPE_HAVE_CUDA_KERNELS ON)
      message(STATUS "troupe: nvcc found: building the models' CUDA kernels (sm_90 + PTX)")
    else()
      message(STATUS "troupe: no nvcc: the models' CUDA kernels are not built")
    endif()
  elseif(TROUPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found")
  else()
    message(STATUS "troupe: CUDA toolkit or NCCL not found: skipping the CUDA/NCCL code (CPU only)")
  endif()
else()
  message(STATUS "troupe: TROUPE_WITH_CUDA=OFF: skipping the CUDA/NCCL code (CPU only)")
endif()
