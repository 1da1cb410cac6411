"""A batch of GluonCV zoo networks converted, verified and exported, as
`mxamp zoo` does, from Python (mxamp.tools.zoo.run_batch).

    python example/zoo_batch.py [MODEL ...] [--dtype bfloat16 --dtype float16] [--size 64]
                                [--out zoo_batch_out]

Weights are random unless the GluonCV cache holds them (nothing is
downloaded). Each network is compared with float32 natively where this CPU
has every low-precision kernel, else emulated; the table says which.
run_batch hands back the converted files as bytes (its workers may run on
other machines); this script writes them into --out.
"""
import argparse
import os

from mxamp.tools import report, zoo


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["resnet18_v1", "squeezenet1.1"])
    parser.add_argument("--dtype", dest="dtypes", action="append",
                        choices=["bfloat16", "float16"])
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--out", default="zoo_batch_out", help="directory for the models")
    args = parser.parse_args()
    dtypes = args.dtypes or ["bfloat16"]
    os.makedirs(args.out, exist_ok=True)

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
            continue
        for name, data in r["files"].items():
            with open(os.path.join(args.out, name), "wb") as f:
                f.write(data)
        print(f"{r['model']} ({r['dtype']}): casts {r['casts']}, wrote "
              f"{', '.join(os.path.join(args.out, n) for n in r['files'])} "
              f"({sum(map(len, r['files'].values())) / 2**20:.1f} MiB), verified "
              f"{r['verified']}")


if __name__ == "__main__":
    main()
