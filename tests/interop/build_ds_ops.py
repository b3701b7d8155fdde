"""build_ds_ops.py: builds (or finds cached) the DeepSpeed CPU ops the interop tests use.

DeepSpeed compiles its ops with ninja the first time a run needs them, into torch's
extension cache (~/.cache/torch_extensions). The NVMe-offload op alone takes many minutes
on two cores; inside a test that is time counted against the test's limit, so
scripts/interop_env.sh builds them here first. Once cached, this takes a few seconds.
Run with DS_ACCELERATOR=cpu, as the tests run DeepSpeed.
"""
import sys
import time

from deepspeed.accelerator import get_accelerator

# ShareMemComm: the CPU all-reduce of every multi-rank run; CPUAdam: ZeRO offload;
# FusedAdam: FP16_Optimizer at ZeRO-0; AsyncIO and PinMemory: NVMe offload (AsyncIO needs
# libaio-dev).
OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder", "PinMemoryBuilder", "AsyncIOBuilder")


def main():
    acc = get_accelerator()
    for name in OPS:
        builder = acc.create_op_builder(name)
        if not builder.is_compatible(verbose=False):
            print(f"build_ds_ops: {name} cannot be built here; the tests that need it say so", file=sys.stderr)
            continue
        t0 = time.time()
        builder.load(verbose=False)
        took = time.time() - t0
        if took > 10:
            print(f"build_ds_ops: built DeepSpeed's {name} in {took:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
