"""bfloat16 against float32 for a recurrent model written with foreach.

    python bench/foreach_speed.py [--hidden 1024] [--steps 64] [--batch 32]
                                  [--runs 10] [--warmup 2]

The model is example/foreach_rnn.py's Elman cell (two Dense layers and tanh
per step) over `--steps` steps. Rows, timed in one run on the same inputs,
interleaved round by round (benchlib.time_interleaved):

- fp32: the hybridized float32 block;
- bf16 cpu: ``convert_hybrid_block(..., target_dtype="bfloat16")`` for this
  CPU (operators whose bfloat16 kernel measures slower stay float32);
- bf16 any: the same with ``target_device="any"`` (the full bfloat16 graph).

It prints each row's median, its ratio to float32 (above 1: faster), the
CPU model and the instruction sets MXNet's kernels use. On a machine shared
with other work the figures move from run to run; compare rows of one run.
"""
import argparse
import sys

from benchlib import HERE, THREADS, Variant, cpu_description, median, time_interleaved

import mxamp

sys.path.insert(0, str(HERE.parent / "example"))
from foreach_rnn import build, relative_error  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    net, inputs = build(args.hidden, args.steps, args.batch)
    ref = net(*inputs).asnumpy()
    blocks = {"fp32": net,
              "bf16 cpu": mxamp.convert_hybrid_block(net, target_dtype="bfloat16"),
              "bf16 any": mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                                     target_device="any")}
    variants = []
    for name, block in blocks.items():
        variant = Variant(name, block=block)
        try:
            variant.output = block(*inputs).asnumpy()
            variant.run = lambda block=block: block(*inputs).wait_to_read()
        except Exception as err:  # MXNet without bfloat16 kernels here: say so in the row
            variant.error = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        variants.append(variant)
    time_interleaved(variants, args.warmup, args.runs)

    print(f"foreach RNN: hidden {args.hidden}, {args.steps} steps, batch {args.batch}, "
          f"{THREADS} threads, median of {args.runs} interleaved runs")
    print(cpu_description())
    base = median(variants[0])
    for variant in variants:
        if variant.error:
            print(f"{variant.name:9s} {variant.error}")
            continue
        ms = 1e3 * median(variant)
        print(f"{variant.name:9s} {ms:8.1f} ms  x{base / median(variant):.2f} vs fp32  "
              f"error {relative_error(variant.output, ref):.1e}")


if __name__ == "__main__":
    main()
