# A shim for tools that still look for setup.py (and the layout of Lightning's own repository): the metadata live in
# pyproject.toml only (PEP 621), the version in src/lightning_midepoch/__about__.py. Add nothing here.
from setuptools import setup

setup()
