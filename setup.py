from setuptools import find_packages, setup

setup(
    name="mxamp",
    version="0.1.0",
    description="Automatic mixed precision (float16 / bfloat16) conversion for MXNet and Gluon",
    packages=find_packages(include=["mxamp", "mxamp.*"]),
    python_requires=">=3.8",
    install_requires=["mxnet==1.9.1", "numpy<1.24"],
    extras_require={"test": ["pytest", "hypothesis", "gluoncv"]},
)
