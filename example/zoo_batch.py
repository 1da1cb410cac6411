"""A batch of GluonCV zoo networks converted, verified and exported, as
`mxamp zoo` does, from Python (mxamp.tools.zoo.run_batch).

    python example/zoo_batch.py [MODEL ...] [--dtype bfloat16 --dtype float16] [--size 64]

Weights are random unless the GluonCV cache holds them (nothing is
downloaded). Each network is compared with float32 natively where this CPU
has every low-precision kernel, else emulated; the table says which.
"""
import argparse

from mxamp.tools import report, zoo


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["resnet18_v1", "squeezenet1.1"])
    parser.add_argument("--dtype", dest="dtypes", action="append",
                        choices=["bfloat16", "float16"])
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    args = parser.parse_args()
    dtypes = args.dtypes or ["bfloat16"]

    def stage(name, what):
        print(f"  {name}: {what}")
    results = [r for model_results in zoo.run_batch(args.models, dtypes,
                                                    shape=(1, 3, args.size, args.size),
                                                    progress=stage)
               for r in model_results]
    print(report.text_table(report.ZOO_HEADERS, report.zoo_rows(results)))
    for r in results:
        if r["status"] != "ok":
            print(f"{r['model']} ({r['dtype']}) failed in {r['failed_in']}: {r['error']}")
        else:
            print(f"{r['model']} ({r['dtype']}): casts {r['casts']}, exported "
                  f"{', '.join(r['files'])} ({sum(map(len, r['files'].values())) / 2**20:.1f} "
                  f"MiB), verified {r['verified']}")


if __name__ == "__main__":
    main()
