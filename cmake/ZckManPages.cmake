# Man pages made from the programs' own --help by help2man, when it is installed (Debian:
# help2man), and installed with them, so `man zckpt-consolidate` shows what
# `zckpt consolidate --help` says. One source for both: a page cannot drift from the program.
find_program(ZCK_HELP2MAN help2man)
if(NOT ZCK_HELP2MAN OR CMAKE_CROSSCOMPILING)
  return()
endif()

# page|subcommand|one-line summary (help2man's NAME section)
set(_zck_man_pages
  "zckpt||fast, exact, crash-safe tools for DeepSpeed ZeRO checkpoints"
  "zckpt-consolidate|consolidate|DeepSpeed ZeRO checkpoint to whole tensors (safetensors or .bin)"
  "zckpt-reshard|reshard|DeepSpeed checkpoint to another ZeRO stage and world size"
  "zckpt-to-universal|to-universal|DeepSpeed checkpoint to a universal checkpoint"
  "zckpt-verify|verify|check a checkpoint's structure and checksums"
  "zckpt-inspect|inspect|show the tensors of a checkpoint or state dict"
  "zckpt-convert|convert|convert a state dict between .pt/.bin and safetensors")
set(_zck_man_dir ${PROJECT_BINARY_DIR}/man)
set(_zck_man_files)
foreach(entry IN LISTS _zck_man_pages)
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 page)
  list(GET parts 1 sub)
  list(GET parts 2 summary)
  # help2man names the page after the program it runs: a wrapper named as the page
  file(GENERATE OUTPUT ${_zck_man_dir}/bin/${page}
       CONTENT "#!/bin/sh\nexec '$<TARGET_FILE:zckpt-cli>' ${sub} \"$@\"\n"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  add_custom_command(OUTPUT ${_zck_man_dir}/${page}.1
    COMMAND ${ZCK_HELP2MAN} --no-info --version-string=${PROJECT_VERSION} --name=${summary}
            --output=${_zck_man_dir}/${page}.1 ${_zck_man_dir}/bin/${page}
    DEPENDS zckpt-cli VERBATIM)
  list(APPEND _zck_man_files ${_zck_man_dir}/${page}.1)
endforeach()
if(TARGET zckpt-train)
  add_custom_command(OUTPUT ${_zck_man_dir}/zckpt-train.1
    COMMAND ${ZCK_HELP2MAN} --no-info --version-string=${PROJECT_VERSION}
            "--name=train a small GPT-2 with ZeRO 1/2/3, saving DeepSpeed checkpoints"
            --output=${_zck_man_dir}/zckpt-train.1 $<TARGET_FILE:zckpt-train>
    DEPENDS zckpt-train VERBATIM)
  list(APPEND _zck_man_files ${_zck_man_dir}/zckpt-train.1)
endif()
add_custom_target(zckpt-man ALL DEPENDS ${_zck_man_files})
install(FILES ${_zck_man_files} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
