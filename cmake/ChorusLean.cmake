# Torch-free subsets of the comm and runtime layers, for the fuzz and sanitizer builds.
#
# The TCP store and the checkpoint files need no libtorch, but the layers that hold them (comm,
# runtime) do, and compiling a torch layer is most of a clean build on a small machine. These
# libraries compile only the files named here, so the fuzz targets (fuzz/) and the sanitizer
# test binaries (sanitize/) over the store and the checkpoint writer build in minutes. When a
# named file moves or gains a torch dependency, update the list here.
include_guard(GLOBAL)

# chorus_lean_store: TcpStore, TcpStoreServer, MemoryStore, PrefixStore and the job secret.
function(chorus_lean_store)
  if(TARGET chorus_lean_store)
    return()
  endif()
  set(sources store.cc store_protocol.cc store_channel.cc memory_store.cc prefix_store.cc
      job_secret.cc tcp_store_client.cc tcp_store_requests.cc tcp_store_server.cc)
  list(TRANSFORM sources PREPEND ${PROJECT_SOURCE_DIR}/src/comm/store/)
  add_library(chorus_lean_store STATIC ${sources})
  target_include_directories(chorus_lean_store PUBLIC ${PROJECT_SOURCE_DIR}/include
                             PRIVATE ${PROJECT_SOURCE_DIR}/src/comm)
  target_link_libraries(chorus_lean_store PUBLIC chorus_core OpenSSL::Crypto Threads::Threads)
  chorus_flags(chorus_lean_store OFF)
endfunction()

# chorus_lean_checkpoint: the checkpoint writer and reader (manifests, checksums, atomic files).
function(chorus_lean_checkpoint)
  if(TARGET chorus_lean_checkpoint)
    return()
  endif()
  chorus_lean_store()
  set(sources checkpoint_writer.cc checkpoint_reader.cc checkpoint_files.cc)
  list(TRANSFORM sources PREPEND ${PROJECT_SOURCE_DIR}/src/runtime/checkpoint/)
  add_library(chorus_lean_checkpoint STATIC ${sources})
  target_include_directories(chorus_lean_checkpoint PUBLIC ${PROJECT_SOURCE_DIR}/include
                             PRIVATE ${PROJECT_SOURCE_DIR}/src/runtime)
  target_link_libraries(chorus_lean_checkpoint PUBLIC chorus_lean_store chorus_core
                                                      OpenSSL::Crypto nlohmann_json::nlohmann_json)
  chorus_flags(chorus_lean_checkpoint OFF)
endfunction()
