# Finds cuDNN 9 (header cudnn.h + library libcudnn.so[.9]) and defines the imported target
# CUDNN::cudnn, CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY and CUDNN_VERSION ("9.19.0").
# Search order: -DCUDNN_ROOT / $CUDNN_ROOT, $CUDA_HOME, the CUDA toolkit, /usr/local/cuda,
# the system paths, then the folder of a pip wheel (nvidia-cudnn-cu12/13, what PyTorch ships:
# <site-packages>/nvidia/cudnn/{include,lib}, whose library has no unversioned libcudnn.so).
set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} $ENV{CUDA_HOME} ${CUDAToolkit_LIBRARY_ROOT}
                 ${CUDAToolkit_TARGET_DIR} /usr/local/cuda)
if(NOT CUDNN_ROOT AND NOT DEFINED ENV{CUDNN_ROOT})
  find_program(_cudnn_python NAMES python3 python)
  if(_cudnn_python)
    # nvidia.cudnn is a namespace package in some wheels (no __file__): use __path__.
    execute_process(
      COMMAND ${_cudnn_python} -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _cudnn_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
      RESULT_VARIABLE _cudnn_py_rc)
    if(_cudnn_py_rc EQUAL 0 AND _cudnn_wheel)
      list(APPEND _cudnn_hints ${_cudnn_wheel})
    endif()
  endif()
endif()

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_cudnn_hints}
             PATH_SUFFIXES lib64 lib lib/x64)

if(CUDNN_INCLUDE_DIR)
  set(_cudnn_vh ${CUDNN_INCLUDE_DIR}/cudnn_version.h)
  if(NOT EXISTS ${_cudnn_vh})
    set(_cudnn_vh ${CUDNN_INCLUDE_DIR}/cudnn.h)
  endif()
  file(STRINGS ${_cudnn_vh} _cudnn_lines REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _m "${_cudnn_lines}")
    set(_cudnn_${_part} ${CMAKE_MATCH_1})
  endforeach()
  set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
                                  VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  # SYSTEM include: cuDNN's headers are not ours to keep warning-free.
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION ${CUDNN_LIBRARY}
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
