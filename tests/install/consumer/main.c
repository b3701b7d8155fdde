/* Uses only the installed public header: converts a fp32 value to bf16 and reports. */
#include <stdio.h>
#include <string.h>
#include <zck.h>

int main(int argc, char **argv) {
  float f = 1.00390625f; /* halfway between two bf16 values: rounds to even */
  uint16_t h = 0;
  if (zck_convert(ZCK_BF16, &h, ZCK_F32, &f, 1) != ZCK_OK) return 1;
  printf("zckpt %s bf16(1.00390625)=0x%04x\n", zck_version(), h);
  if (argc > 2) { /* consumer IN OUT: a conversion through the library */
    if (zck_convert_file(argv[1], argv[2], NULL) != ZCK_OK) { fprintf(stderr, "%s\n", zck_last_error()); return 1; }
  }
  return h == 0x3F80 ? 0 : 1;
}
