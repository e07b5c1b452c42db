# Decides whether the CUDA backend is built, and builds it (engine/cuda/).
# Without it, engine/no_cuda.cpp makes `device.backend = "cuda"` a clear runtime error.
set(REMAT_HAVE_CUDA OFF)
if(NOT REMAT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(REMAT_HAVE_CUDA ON)
  elseif(REMAT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "REMAT_CUDA=ON but no CUDA compiler was found (set CUDACXX or put nvcc on PATH)")
  endif()
endif()

if(REMAT_HAVE_CUDA AND EXISTS ${CMAKE_SOURCE_DIR}/engine/cuda/CMakeLists.txt)
  # sm_80 (A100) and sm_90 (H100/H200) machine code plus sm_90 PTX for newer cards; nothing
  # older (cuDNN's flash attention needs sm_80+). Set before enable_language so it is the default.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
  endif()
  enable_language(CUDA)
  add_subdirectory(engine/cuda)
  target_link_libraries(remat_core PUBLIC remat_cuda)
  target_compile_definitions(remat_core PUBLIC REMAT_HAVE_CUDA=1)
  message(STATUS "remat-train: CUDA backend ON")
else()
  set(REMAT_HAVE_CUDA OFF)
  message(STATUS "remat-train: CUDA backend OFF (built without CUDA)")
endif()
