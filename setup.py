"""Packaging: the requirements files are the single source of dependencies; the package is not imported here."""

import os
import re

from setuptools import find_packages, setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _read(*parts: str) -> str:
    with open(os.path.join(_HERE, *parts), encoding="utf-8") as file:
        return file.read()


def _requirements(name: str) -> list:
    lines = (line.split("#")[0].strip() for line in _read("requirements", name).splitlines())
    return [line.replace(" ", "") for line in lines if line]


_ABOUT = _read("src", "lightning_midepoch", "__about__.py")


def _about(key: str) -> str:
    return re.search(rf'^{key} = "([^"]+)"', _ABOUT, re.MULTILINE).group(1)


setup(
    name="lightning-midepoch",
    version=_about("__version__"),
    description=_about("__docs__"),
    long_description=_read("README.md"),
    long_description_content_type="text/markdown",
    author=_about("__author__"),
    license=_about("__license__"),
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={"lightning_midepoch": ["py.typed"]},
    python_requires=">=3.9",
    install_requires=_requirements("base.txt"),
    extras_require={
        "lightning": _requirements("lightning.txt"),
        "pytorch-lightning": _requirements("pytorch-lightning.txt"),
        "test": _requirements("test.txt"),
        "demo": _requirements("demo.txt"),
    },
    entry_points={"console_scripts": ["lightning-midepoch=lightning_midepoch.__main__:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Pytest",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: OSI Approved :: Apache Software License",
    ],
)
