# FindXXHash: the xxHash library (Debian libxxhash-dev ships no CMake package).
# Defines XXHash_FOUND and the imported target xxHash::xxhash. Where the library carries
# xxHash's x86 run-time dispatcher (xxh_x86dispatch.h and its XXH3_*_dispatch symbols, as
# Debian's does), ZCK_XXH_DISPATCH is set (lib/hash_xxh3.h; -DZCK_XXH_DISPATCH=OFF: not used).
find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY NAMES xxhash)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(XXHash REQUIRED_VARS XXHASH_LIBRARY XXHASH_INCLUDE_DIR)
if(XXHash_FOUND AND NOT DEFINED ZCK_XXH_DISPATCH)
  include(CheckSymbolExists)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_INCLUDES "${XXHASH_INCLUDE_DIR}")
  set(CMAKE_REQUIRED_LIBRARIES "${XXHASH_LIBRARY}")
  set(CMAKE_REQUIRED_QUIET ON)
  check_symbol_exists(XXH3_64bits_update_dispatch "xxh_x86dispatch.h" ZCK_XXH_DISPATCH)
  cmake_pop_check_state()
endif()
if(XXHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    IMPORTED_LOCATION "${XXHASH_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
endif()
mark_as_advanced(XXHASH_INCLUDE_DIR XXHASH_LIBRARY)
