# Helpers that give every chorus target the same flags, so one precompiled header serves all
# libtorch-dependent targets.
# -fPIC for every target, libraries and executables alike: the shared precompiled header is only
# valid where the code model flags match.
# Warnings are errors on the compiler the project and its CI build with (clang-14, which
# scripts/setup installs and scripts/build picks), and only there: a user's build with another
# compiler (pip's with g++ 12 or 13, a GPU image's gcc) must never stop on a warning that compiler
# invents (g++ 12's -Wstringop-overflow false positive inside std::string, for one).
# CHORUS_WERROR=ON/OFF decides explicitly.
set(chorus_werror_default OFF)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 14
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
  set(chorus_werror_default ON)
endif()
option(CHORUS_WERROR "Treat compiler warnings as errors" ${chorus_werror_default})
set(CHORUS_WARNINGS -Wall -Wextra -Wno-unused-parameter -fPIC)
if(CHORUS_WERROR)
  list(APPEND CHORUS_WARNINGS -Werror)
endif()

function(chorus_layer name)
  # chorus_layer(<name> [TORCH] [DEPS ...]): a static library from src/<name>/**/*.cc. A layer's
  # private headers are named from its root ("store/store_protocol.h"). Files one build option
  # chooses between (src/comm/nccl) are added by the layer's own CMakeLists.
  cmake_parse_arguments(ARG "TORCH" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  list(FILTER sources EXCLUDE REGEX "/nccl/")
  if(NOT sources)
    message(WARNING "chorus: layer ${name} has no sources yet")
    return()
  endif()
  add_library(chorus_${name} STATIC ${sources})
  target_include_directories(chorus_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                             PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(chorus_${name} PUBLIC ${ARG_DEPS} Threads::Threads)
  chorus_flags(chorus_${name} ${ARG_TORCH})
endfunction()

function(chorus_flags target torch)
  target_compile_options(${target} PRIVATE ${CHORUS_WARNINGS})
  if(torch)
    target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
    target_precompile_headers(${target} REUSE_FROM chorus_torch_pch)
  endif()
endfunction()

# The precompiled header for libtorch, built once and reused by every torch target.
add_library(chorus_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
target_link_libraries(chorus_torch_pch PUBLIC ${TORCH_LIBRARIES})
target_compile_options(chorus_torch_pch PRIVATE ${CHORUS_WARNINGS})
target_precompile_headers(chorus_torch_pch PRIVATE
  <ATen/ATen.h> <torch/torch.h> <torch/csrc/distributed/c10d/Backend.hpp>
  <torch/csrc/distributed/c10d/Store.hpp> <torch/csrc/distributed/c10d/Work.hpp>)
