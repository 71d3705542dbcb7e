# Thread-locals read on every call (the group state, the last checked communicator, the log rank) are reached
# through TLS descriptors: in a library loaded at start-up, a load off %fs instead of a __tls_get_addr call
# each, and still safe in a library loaded later with dlopen (perf/RESULTS.md, session 28). GCC has the flag;
# Debian 12's clang does not, so it is probed. Included by the main build and by tests/fuzz (clang), which both
# build src/common.
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-mtls-dialect=gnu2 TOPOCCL_HAVE_TLS_DESCRIPTORS)
function(topoccl_fast_thread_locals target)
  if(TOPOCCL_HAVE_TLS_DESCRIPTORS AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-mtls-dialect=gnu2>)
  endif()
endfunction()
