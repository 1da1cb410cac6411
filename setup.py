from setuptools import find_packages, setup

ONEDNN = ["onednn-cpu-gomp==2023.2.0", "onednn-devel-cpu-gomp==2023.2.0"]

setup(
    name="mxamp",
    version="0.1.0",
    description="Automatic mixed precision (float16 / bfloat16) conversion for MXNet and Gluon",
    packages=find_packages(include=["mxamp", "mxamp.*"]),
    py_modules=["mxamp_cli"],  # the command's entry point, importable before mxamp
    python_requires=">=3.8",
    install_requires=["mxnet==1.9.1", "numpy<1.24", "click", "tqdm", "graphviz", "filelock"],
    extras_require={
        # oneDNN 3 (AMX kernels) for the fast bfloat16 backend
        "onednn": ONEDNN,
        # `mxamp zoo`: GluonCV networks, optionally on a Dask cluster
        "zoo": ["gluoncv", "dask[distributed]"],
        # bench/bf16_speed.py (OpenVINO / ONNX Runtime go into their own venv:
        # bench/requirements-anchor.txt); MXNet's ONNX exporter needs onnx<1.16
        "bench": ["onnx>=1.14,<1.16", "gluoncv", "scikit-learn"] + ONEDNN,
        "test": ["pytest", "hypothesis", "gluoncv", "scikit-learn", "dask[distributed]"] + ONEDNN,
    },
    entry_points={"console_scripts": ["mxamp = mxamp_cli:main"]},
)
