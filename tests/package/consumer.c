/* Uses the installed libnccl.so.2 through nccl.h. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ncclGetVersion(&version);
  printf("consumer_c: NCCL version code %d\n", version);
  return version == NCCL_VERSION_CODE ? 0 : 1;
}
