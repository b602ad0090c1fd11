# The compiler-checked thread-safety contracts (common/thread_annotations.h): with
# clang, the target `thread_safety_check` compiles every engine source once more with
# -fsyntax-only and clang's -Wthread-safety as an error, so a member read without the
# mutex that guards it, or a REQUIRES function called without the lock, fails the
# build. No code is generated (no sanitizers, no ccache): the analysis runs in Sema,
# so a check costs about a parse. scripts/fuzz builds it in its clang configuration.

# Shared with the test that proves the check bites (tests/thread_safety/).
set(DELTACAST_THREAD_SAFETY_FLAGS -Wthread-safety -Werror=thread-safety)

# The engine's modules: every library defined in these directories is checked.
set(DELTACAST_THREAD_SAFETY_DIRS common codec layout quant transport topology apply objstore relay
                                 sim agent api python)

function(deltacast_thread_safety_check)
  add_custom_target(thread_safety_check)
  foreach(dir IN LISTS DELTACAST_THREAD_SAFETY_DIRS)
    if(NOT IS_DIRECTORY ${CMAKE_SOURCE_DIR}/${dir})
      continue()
    endif()
    get_property(targets DIRECTORY ${CMAKE_SOURCE_DIR}/${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(lib IN LISTS targets)
      get_target_property(type ${lib} TYPE)
      if(NOT type MATCHES "^(STATIC|SHARED|MODULE|OBJECT)_LIBRARY$")
        continue()
      endif()
      get_target_property(sources ${lib} SOURCES)
      set(checked)
      foreach(src IN LISTS sources)
        if(NOT src MATCHES "\\.cc$")
          continue()  # CUDA and headers: headers are checked through the sources
        endif()
        if(NOT IS_ABSOLUTE ${src})
          set(src ${CMAKE_SOURCE_DIR}/${dir}/${src})
        endif()
        list(APPEND checked ${src})
      endforeach()
      if(NOT checked)
        continue()
      endif()
      set(check ${lib}_thread_safety)
      add_library(${check} OBJECT EXCLUDE_FROM_ALL ${checked})
      # What the library compiles with: its include directories and definitions
      # (with those its link libraries pass on: the generator expression evaluates
      # them transitively, without making the check wait for the libraries to build),
      # and per-source options (instruction-set flags), which CMake keeps per directory.
      target_include_directories(${check} PRIVATE $<TARGET_PROPERTY:${lib},INCLUDE_DIRECTORIES>)
      target_compile_definitions(${check} PRIVATE $<TARGET_PROPERTY:${lib},COMPILE_DEFINITIONS>)
      foreach(src IN LISTS checked)
        get_source_file_property(options ${src} DIRECTORY ${CMAKE_SOURCE_DIR}/${dir} COMPILE_OPTIONS)
        if(options)
          set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${options}")
        endif()
      endforeach()
      # Only the analysis: no sanitizer or fuzzer flags (they change code generation,
      # which does not run), and the launcher leaves the object file the build expects.
      set_target_properties(${check} PROPERTIES
        COMPILE_OPTIONS "-Wall;-Wextra;-fsyntax-only;${DELTACAST_THREAD_SAFETY_FLAGS}"
        CXX_COMPILER_LAUNCHER ${CMAKE_SOURCE_DIR}/cmake/syntax_only_launcher.sh)
      add_dependencies(thread_safety_check ${check})
    endforeach()
  endforeach()
endfunction()
