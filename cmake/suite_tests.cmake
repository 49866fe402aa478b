# Note [One CTest per suite]
# Run after tandem_tests is linked (a POST_BUILD step): lists its tests and writes one CTest per
# GoogleTest suite into OUT, which CTest includes (TEST_INCLUDE_FILES). A process per test cost
# half a second of start-up (loading LibTorch) 1300 times over on CI's two cores; a process per
# suite costs it about 230 times. Tests named in EXCLUDE (":"-separated) are left out of their
# suite and get their own CTest, run alone. A suite all of whose tests skip
# (no GPU) exits 77 (tests/main.cpp), which CTest reports as "Skipped"; one that ran a test reports
# its result.
# Arguments: -DEXE= -DOUT= -DEXCLUDE= -DTIMEOUT= -DWORKDIR=
execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc
                WORKING_DIRECTORY "${WORKDIR}" TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tandem: ${EXE} --gtest_list_tests failed (${rc}); its tests cannot be listed")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(names "")
set(suite "")
foreach(line IN LISTS lines)
  # A suite's line starts in the first column and ends with "." (before an optional comment); its
  # tests follow, indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite MATCHES "^DISABLED_")
      list(APPEND suites "${suite}")
    endif()
  elseif(line MATCHES "^  ([^ ]+)")
    list(APPEND names "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()
set(negative "")
if(EXCLUDE)
  set(negative ":-${EXCLUDE}")
endif()
set(script "")
foreach(suite IN LISTS suites)
  string(APPEND script "add_test([=[${suite}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*${negative}]=])\n")
  string(APPEND script "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY [=[${WORKDIR}]=] "
                       "TIMEOUT ${TIMEOUT} SKIP_RETURN_CODE 77)\n")
endforeach()
# The excluded tests that this build has (TANDEM_TEST_DIRS may leave them out), one CTest each, run
# alone (RUN_SERIAL): they measure time.
string(REPLACE ":" ";" excluded "${EXCLUDE}")
foreach(name IN LISTS excluded)
  list(FIND names "${name}" at)
  if(NOT at EQUAL -1)
    string(APPEND script "add_test([=[${name}]=] [=[${EXE}]=] [=[--gtest_filter=${name}]=])\n")
    string(APPEND script "set_tests_properties([=[${name}]=] PROPERTIES WORKING_DIRECTORY [=[${WORKDIR}]=] "
                         "TIMEOUT 600 RUN_SERIAL TRUE)\n")
  endif()
endforeach()
file(WRITE "${OUT}.new" "${script}")
file(RENAME "${OUT}.new" "${OUT}")
