# The files compiled with AVX2 / AVX-512 flags (*_avx2.cpp, *_avx512.cpp) may only run after a
# run-time CPU check. Two things in them would run without one: a static initializer (a
# namespace-scope SIMD constant is one; it executes at program start) and a weak (inline or
# template) symbol, which the linker may pick over the plain-ISA copy another file uses.
# Run by CTest as: cmake -DOBJECTS=a.o|b.o|... -DNM=nm -P isa_objects.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
set(problems "")
foreach(obj IN LISTS objects)
  if(NOT obj MATCHES "_avx(2|512)\\.cpp\\.o$")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND ${NM} --defined-only ${obj} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${syms}")
  foreach(line IN LISTS lines)
    # DW.ref.__gxx_personality_v0 is a weak pointer to the C++ unwinder's personality routine
    # (data, the same in every object: sanitizer builds emit it), not code.
    if(line MATCHES "DW\\.ref\\.__gxx_personality_v0$")
      continue()
    endif()
    if(line MATCHES "_GLOBAL__sub_I" OR line MATCHES " [WVu] ")
      get_filename_component(name ${obj} NAME)
      string(APPEND problems "\n  ${name}: ${line}")
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no *_avx2 / *_avx512 object among the ones given: the check checked nothing")
endif()
if(problems)
  message(FATAL_ERROR "ISA-specific objects hold code that runs without a CPU check (static initializers or weak symbols):${problems}")
endif()
message(STATUS "${checked} ISA-specific objects: no static initializers, no weak symbols")
