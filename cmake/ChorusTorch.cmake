# Finds libtorch 2.x. A libtorch given through CMAKE_PREFIX_PATH or Torch_DIR wins (a CUDA or ROCm
# PyTorch on a GPU machine); otherwise we ask the Python interpreter for the `torch` package's
# CMake prefix, so no path is hard-coded.
find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    # pip's build isolation (`pip install .`) hides the interpreter's own site-packages from the
    # build; the torch there is the one `import torch` loads next to chorus, so it is the one to
    # link (the extension module must use the libtorch the torch module loaded).
    COMMAND ${Python3_EXECUTABLE} -c
      "import sys, sysconfig; sys.path += [sysconfig.get_paths(vars={'base': b, 'platbase': b})[k] for b in (sys.prefix, sys.base_prefix) for k in ('purelib', 'platlib')]; import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE CHORUS_TORCH_PREFIX
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE CHORUS_TORCH_RESULT)
  if(NOT CHORUS_TORCH_RESULT EQUAL 0)
    message(FATAL_ERROR "chorus: libtorch not found; run scripts/setup or set CMAKE_PREFIX_PATH")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${CHORUS_TORCH_PREFIX})
  find_package(Torch REQUIRED CONFIG)
endif()
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "chorus needs libtorch 2.x, found ${Torch_VERSION}")
endif()
get_filename_component(CHORUS_TORCH_ROOT "${TORCH_INSTALL_PREFIX}" ABSOLUTE)
message(STATUS "chorus: libtorch ${Torch_VERSION} at ${CHORUS_TORCH_ROOT}")

# A CUDA torch wheel finds its CUDA libraries (NCCL, cuDNN, ...) in sibling `nvidia/*/lib` folders
# through its RPATH at run time; the linker needs to be told the same, or it picks an older
# system NCCL (e.g. the toolkit's) and misses newer symbols.
file(GLOB CHORUS_WHEEL_LIB_DIRS LIST_DIRECTORIES true "${CHORUS_TORCH_ROOT}/../nvidia/*/lib")
foreach(dir ${CHORUS_WHEEL_LIB_DIRS})
  add_link_options("LINKER:-rpath-link,${dir}")
endforeach()

# The torch wheel ships c10d's ProcessGroupGloo.hpp but not the gloo headers it includes. We compile
# exactly one file (src/comm/gloo_backend.cc) against Debian's libgloo-dev headers; it only calls
# libtorch's out-of-line entry points, and every gloo type it touches is held by pointer.
find_path(CHORUS_GLOO_INCLUDE gloo/rendezvous/store.h PATHS /usr/include /usr/local/include)
if(NOT CHORUS_GLOO_INCLUDE)
  message(FATAL_ERROR "chorus: gloo headers not found (Debian: libgloo-dev); run scripts/setup")
endif()

# NCCL: compiled when libtorch was built with CUDA and nccl.h is found (the toolkit's, or the one
# from the nvidia-nccl wheel next to torch).
set(CHORUS_HAVE_NCCL OFF)
if(CHORUS_WITH_CUDA AND TARGET torch_cuda)
  find_path(CHORUS_NCCL_INCLUDE nccl.h
    PATHS ${CHORUS_TORCH_ROOT}/../nvidia/nccl/include /usr/local/cuda/include /usr/include
    NO_DEFAULT_PATH)
  find_package(CUDAToolkit QUIET)
  if(CHORUS_NCCL_INCLUDE AND CUDAToolkit_FOUND)
    set(CHORUS_HAVE_NCCL ON)
  endif()
endif()
message(STATUS "chorus: NCCL backend ${CHORUS_HAVE_NCCL}")
