# Use ccache when present. Precompiled headers need ccache's sloppiness settings, which we pass
# through the launcher so no user configuration is required.
find_program(CHORUS_CCACHE ccache)
if(CHORUS_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${CHORUS_CCACHE})
  message(STATUS "chorus: using ccache ${CHORUS_CCACHE}")
endif()
