"""Package discovery for setuptools (the rest of the build is in pyproject.toml).

`kvedge` is a namespace whose subpackages are the repository's top-level folders (pyproject's
`package-dir`); every folder under them is a package, data folders such as
`apps/demo_kb` included, so none is left out of the build by a hand-kept list.
"""
from setuptools import find_namespace_packages, setup

LAYERS = ("kernels", "common", "cloud", "edge", "apps", "bench")

setup(packages=[name for layer in LAYERS for name in
                [f"kvedge.{layer}", *(f"kvedge.{layer}.{sub}" for sub in
                                      find_namespace_packages(layer, exclude=["*__pycache__*"]))]])
