# Helpers that give every chorus target the same flags, so one precompiled header serves all
# libtorch-dependent targets.
# -fPIC for every target, libraries and executables alike: the shared precompiled header is only
# valid where the code model flags match.
# Warnings are errors on the compilers the project is developed with (clang-14, gcc 12);
# CHORUS_WERROR=OFF keeps them warnings for a one-off build elsewhere (scripts/gpu-check on a GPU
# image's newer gcc, whose new warnings must not stop the check).
option(CHORUS_WERROR "Treat compiler warnings as errors" ON)
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
